"""Rules for the smooth surrogates of :mod:`taylorattr.taylor.smoothing`, for both engines.

On the torch.fx route the softplus-based surrogates are traced through and log-sum-exp
pooling runs its own code on Jets; on a captured core graph, where
:func:`~taylorattr.taylor.smoothing.smooth_graph` put surrogate modules in place of
piecewise-linear nodes, each surrogate runs its own formula on CoreJets:

    softplus_beta(x) = log(1 + exp(beta x)) / beta                  (series.softplus)
    y = s + (1/beta) log sum_o exp(beta (x_o - s)),   s = window max of the value (a constant)
"""
from __future__ import annotations

from ... import series as S
from ..smoothing import (
    SmoothClamp,
    SmoothLeakyReLU,
    SmoothMaxPool,
    SmoothPReLU,
    SmoothReLU,
    SmoothReLU6,
)
from . import core
from .jet import Jet
from .registry import builtin
from .rules_affine import _pad, getitem


@builtin(SmoothMaxPool, family="surrogates")
def _smooth_max_pool(m: SmoothMaxPool, x: Jet) -> Jet:
    return m.log_sum_exp(x, x.primal, lambda j: j.unary(S.exp), lambda j: j.unary(S.log),
                         lambda j, pads, value: _pad(j, pads, "constant", value), getitem)


def _softplus(x: core.CoreJet, beta: float) -> core.CoreJet:
    return x.unary(lambda c: S.softplus(c, beta))


@core.core_rule(SmoothReLU)
def _core_relu(m: SmoothReLU, x):
    return _softplus(x, m.beta)


@core.core_rule(SmoothReLU6)
def _core_relu6(m: SmoothReLU6, x):
    return _softplus(x, m.beta) - _softplus(x - 6.0, m.beta)


@core.core_rule(SmoothLeakyReLU)
def _core_leaky(m: SmoothLeakyReLU, x):
    a = m.negative_slope
    return x * a + _softplus(x, m.beta) * (1.0 - a)


@core.core_rule(SmoothClamp)
def _core_clamp(m: SmoothClamp, x):
    return m.apply_to(x, _softplus)


@core.core_rule(SmoothPReLU)
def _core_prelu(m: SmoothPReLU, x):
    a = m.weight.view(-1, *[1] * (x.primal.dim() - 2)) if x.primal.dim() > 1 and \
        m.weight.numel() > 1 else m.weight
    return x * a + _softplus(x, m.beta) * (1.0 - a)


@core.core_rule(SmoothMaxPool)
def _core_max_pool(m: SmoothMaxPool, x):
    return m.log_sum_exp(x, x.primal, lambda j: j.unary(S.exp), lambda j: j.unary(S.log),
                         lambda j, pads, value: core.constant_pad(j, pads, value),
                         lambda j, index: j.linear(lambda t: t[index]))
