"""Rules for the smooth surrogates of :mod:`taylorattr.taylor.smoothing`:
:func:`~taylorattr.taylor.smoothing.smooth_graph` puts surrogate modules in place of the
piecewise-linear nodes of a captured graph, and each runs its own formula on CoreJets:

    softplus_beta(x) = log(1 + exp(beta x)) / beta                  (series.softplus)
    y = s + (1/beta) log sum_o exp(beta (x_o - s)),   s = window max of the value (a constant)
"""
from __future__ import annotations

from .... import series as S
from ...smoothing import (
    SmoothClamp,
    SmoothLeakyReLU,
    SmoothMaxPool,
    SmoothPReLU,
    SmoothReLU,
    SmoothReLU6,
)
from ..core import CoreJet
from ..registry import rule
from .shape import constant_pad


def _softplus(x: CoreJet, beta: float) -> CoreJet:
    return x.unary(lambda c: S.softplus(c, beta))


@rule(SmoothReLU, family="surrogates")
def _relu(m: SmoothReLU, x):
    return _softplus(x, m.beta)


@rule(SmoothReLU6, family="surrogates")
def _relu6(m: SmoothReLU6, x):
    return _softplus(x, m.beta) - _softplus(x - 6.0, m.beta)


@rule(SmoothLeakyReLU, family="surrogates")
def _leaky(m: SmoothLeakyReLU, x):
    a = m.negative_slope
    return x * a + _softplus(x, m.beta) * (1.0 - a)


@rule(SmoothClamp, family="surrogates")
def _clamp(m: SmoothClamp, x):
    return m.apply_to(x, _softplus)


@rule(SmoothPReLU, family="surrogates")
def _prelu(m: SmoothPReLU, x):
    a = m.weight.view(-1, *[1] * (x.primal.dim() - 2)) if x.primal.dim() > 1 and \
        m.weight.numel() > 1 else m.weight
    return x * a + _softplus(x, m.beta) * (1.0 - a)


@rule(SmoothMaxPool, family="surrogates")
def _max_pool(m: SmoothMaxPool, x):
    return m.log_sum_exp(x, x.primal, lambda j: j.unary(S.exp), lambda j: j.unary(S.log),
                         lambda j, pads, value: constant_pad(j, pads, value),
                         lambda j, index: j.linear(lambda t: t[index]))
