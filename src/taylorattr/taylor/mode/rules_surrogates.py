"""Rules for the smooth surrogates of :mod:`taylorattr.taylor.smoothing` that are not plain
compositions of supported ops (the softplus-based ones are traced through): log-sum-exp
pooling runs its own code on Jets,

    y = s + (1/beta) log sum_o exp(beta (x_o - s)),   s = window max of the primal (a constant)
"""
from __future__ import annotations

from ... import series as S
from ..smoothing import SmoothMaxPool
from .jet import Jet
from .registry import builtin
from .rules_affine import _pad, getitem


@builtin(SmoothMaxPool, family="surrogates")
def _smooth_max_pool(m: SmoothMaxPool, x: Jet) -> Jet:
    return m.log_sum_exp(x, x.primal, lambda j: j.unary(S.exp), lambda j: j.unary(S.log),
                         lambda j, pads, value: _pad(j, pads, "constant", value), getitem)
