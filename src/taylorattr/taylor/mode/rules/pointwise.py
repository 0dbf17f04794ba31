"""Elementwise rules. Smooth functions use the exact recurrences of
:mod:`taylorattr.series` (``y_k = (1/k) sum_j j x_j g_{k-j}`` with ``g`` the series of
``phi'``); piecewise-linear ones (relu, hardtanh, clamp, leaky_relu, abs, maximum, max-pool,
amax, ...) give ``y_k = x_k phi'(x_0)``, exact off the kinks, where their higher derivatives
vanish (``ta.smooth`` replaces them by smooth surrogates)."""
from __future__ import annotations

import math

import torch

from .... import series as S
from ..core import CoreJet, is_jet, joint_linear
from ..registry import rule

aten = torch.ops.aten

_SMOOTH = {aten.exp: S.exp, aten.log: S.log, aten.sigmoid: S.sigmoid, aten.tanh: S.tanh,
           aten.erf: S.erf}


def _unary_rule(series_rule):
    return lambda x: x.unary(series_rule)


for _op, _series in _SMOOTH.items():
    rule(_op, family="pointwise")(_unary_rule(_series))


def power(x: CoreJet, p: float) -> CoreJet:
    """``x^p`` by the power recurrence. Where the value is 0 and every coefficient is 0 (a
    constant zero, as a zero-padded token's squared norm in Swin-V2's ``F.normalize``), a
    non-integer or negative power has no derivatives and the recurrence would divide by 0;
    there the result is the constant ``0^p``, exactly (its coefficients are 0)."""
    if float(p).is_integer() and p >= 0:
        return x.unary(lambda c: S.power(c, p))
    series = x.full()
    still = (x.primal == 0) & (series == 0).flatten(0, 1).all(0)
    if not bool(still.any()):
        return x.unary(lambda c: S.power(c, p))
    safe = CoreJet(torch.where(still, 1.0, x.primal), series, x.order).unary(
        lambda c: S.power(c, p))
    return CoreJet(torch.where(still, torch.pow(x.primal, p), safe.primal),
                   torch.where(still, 0.0, safe.series), x.order)


rule(aten.sqrt, family="pointwise")(lambda x: power(x, 0.5))
rule(aten.rsqrt, family="pointwise")(lambda x: power(x, -0.5))
rule(aten.reciprocal, family="pointwise")(lambda x: power(x, -1.0))


@rule(aten.log1p, family="pointwise")
def _log1p(x):
    return (x + 1.0).unary(S.log)


@rule(aten.expm1, family="pointwise")
def _expm1(x):
    return x.unary(S.exp) - 1.0


rule(aten.log2, family="pointwise")(lambda x: x.unary(S.log) * (1 / math.log(2)))
rule(aten.log10, family="pointwise")(lambda x: x.unary(S.log) * (1 / math.log(10)))
rule(aten.gelu, family="pointwise")(
    lambda x, approximate="none": x.unary(lambda c: S.gelu(c, approximate)))
rule(aten.silu, family="pointwise")(lambda x: x * x.unary(S.sigmoid))
rule(aten.softplus, family="pointwise")(lambda x, beta=1, threshold=20: x.unary(
    lambda c: S.softplus(c, float(beta), float(threshold))))
rule(aten.mish, family="pointwise")(lambda x: x * x.unary(lambda c: S.tanh(S.softplus(c))))


@rule(aten.pow, family="pointwise")
def _pow(a, b):
    if is_jet(b):
        if is_jet(a):
            return (a.unary(S.log) * b).unary(S.exp)
        return (b * math.log(float(a))).unary(S.exp) if not isinstance(a, torch.Tensor) \
            else (b * torch.log(a)).unary(S.exp)
    if isinstance(b, torch.Tensor):
        if b.dim() == 0 and not b.is_floating_point():
            b = int(b)
        else:
            return (a.unary(S.log) * b).unary(S.exp)
    return power(a, float(b))


def _masked(x: CoreJet, slope: torch.Tensor, value: torch.Tensor) -> CoreJet:
    slope = slope.to(x.primal.dtype)
    return CoreJet(value, x.series * slope, x.order, x.affine)


@rule(aten.relu, family="piecewise")
def _relu(x):
    return _masked(x, x.primal > 0, torch.relu(x.primal))


@rule(aten.hardtanh, family="piecewise")
def _hardtanh(x, lo=-1.0, hi=1.0):
    return _masked(x, (x.primal > lo) & (x.primal < hi), aten.hardtanh(x.primal, lo, hi))


@rule(aten.clamp, family="piecewise")
def _clamp(x, lo=None, hi=None):
    if is_jet(lo) or is_jet(hi):  # clamp(x, min=y) = maximum(x, y)
        out = x
        if lo is not None:
            out = _select_max(out, lo, True)
        if hi is not None:
            out = _select_max(out, hi, False)
        return out
    keep = torch.ones_like(x.primal, dtype=torch.bool)
    if lo is not None:
        keep = keep & (x.primal > lo)
    if hi is not None:
        keep = keep & (x.primal < hi)
    return _masked(x, keep, torch.clamp(x.primal, lo, hi))


rule(aten.clamp_min, family="piecewise")(lambda x, lo: _clamp(x, lo, None))
rule(aten.clamp_max, family="piecewise")(lambda x, hi: _clamp(x, None, hi))


@rule(aten.leaky_relu, family="piecewise")
def _leaky_relu(x, slope=0.01):
    factor = torch.where(x.primal > 0, 1.0, float(slope)).to(x.primal.dtype)
    return _masked(x, factor, aten.leaky_relu(x.primal, slope))


@rule(aten.abs, family="piecewise")
def _abs(x):
    return _masked(x, torch.sign(x.primal), x.primal.abs())


def _select_max(a, b, take_max: bool):
    pa = a.primal if is_jet(a) else a
    pb = b.primal if is_jet(b) else b
    first = pa >= pb if take_max else pa <= pb
    return joint_linear(lambda u, v: torch.where(first, u, v), (a, b), {}, additive=True)


rule(aten.maximum, family="piecewise")(lambda a, b: _select_max(a, b, True))
rule(aten.minimum, family="piecewise")(lambda a, b: _select_max(a, b, False))


def _pool_with_indices(op, spatial: int):
    """Max pooling: each output takes the coefficients of its window's arg-max (indices
    into the flattened spatial axes)."""
    def pool_rule(x, *args):
        primal, idx = op(x.primal, *args)
        start = x.primal.dim() - spatial

        def pick(t):
            return t.flatten(start).gather(start, idx.flatten(start)).view(idx.shape)
        out = joint_linear(pick, (x,), {})
        return CoreJet(primal, out.series, x.order, x.affine), idx
    return pool_rule


for _op, _spatial in ((aten.max_pool2d_with_indices, 2), (aten.max_pool3d_with_indices, 3),
                      (aten.adaptive_max_pool2d, 2), (aten.adaptive_max_pool3d, 3)):
    rule(_op, family="piecewise")(_pool_with_indices(_op, _spatial))


def _extreme(take_max: bool):
    def extreme_rule(x, dim=(), keepdim=False):
        dims = [d % x.primal.dim() for d in (dim if dim else range(x.primal.dim()))]
        rest = [d for d in range(x.primal.dim()) if d not in dims]
        perm = rest + dims

        def flat(t):
            return t.permute(perm).reshape([t.shape[d] for d in rest] + [-1])
        values = flat(x.primal)
        idx = (values.argmax(-1) if take_max else values.argmin(-1)).unsqueeze(-1)
        out = joint_linear(lambda t: flat(t).gather(-1, idx).squeeze(-1), (x,), {})
        if keepdim:
            out = out.linear(lambda t: t.reshape([1 if d in dims else x.primal.shape[d]
                                                  for d in range(x.primal.dim())]))
        return out
    return extreme_rule


rule(aten.amax, family="piecewise")(_extreme(True))
rule(aten.amin, family="piecewise")(_extreme(False))


def _max_rule(take_max: bool):
    def max_rule(x, dim=None, keepdim=False):
        if dim is None:
            return _extreme(take_max)(x)
        out = _extreme(take_max)(x, [dim], keepdim)
        return out, (x.primal.argmax if take_max else x.primal.argmin)(dim, keepdim)
    return max_rule


rule(aten.max, family="piecewise")(_max_rule(True))
rule(aten.min, family="piecewise")(_max_rule(False))
