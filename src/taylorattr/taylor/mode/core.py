"""Taylor mode on a model captured as core ATen operations (:mod:`taylorattr.capture`).

Each input-dependent node of the captured graph gets a :class:`CoreJet`: its value
``x_0`` (the node's own tensor, any shape: no axis is singled out as the batch) and the
coefficients ``x_1..x_K`` stacked as ``series[k-1, r]`` for ``m`` directions ``r``:

    x(t) = x_0 + sum_{k=1..K} x_k t^k     (the node's value along f(x + t v_r))

Rules per core operation:

* linear in its input-dependent arguments (view, permute, convolution, pooling, cat, where
  with a constant condition, ...): ``y_k = L(x_k)``, computed by ``torch.vmap`` of the op
  over the stacked coefficients, so every shape argument (also a static batch size, a
  permute or unbind that moves the batch axis) means what it meant for ``x_0``; additive
  constants (bias, pad value, a constant branch of ``where``) go to ``y_0`` only;
* products (``mul``, ``mm``, ``bmm``, ``addmm`` of two input-dependent operands):
  Cauchy products ``(ab)_k = sum_j a_j b_{k-j}``; quotients by the quotient recurrence;
* smooth elementwise functions: the exact recurrences of :mod:`taylorattr.series`;
* softmax, log-softmax and LayerNorm kept whole (exp / sum / quotient; centred variance and
  power -1/2); BatchNorm in eval mode is affine;
* piecewise-linear ops (relu, hardtanh, clamp, leaky_relu, max-pool, abs, maximum):
  ``y_k = x_k phi'(x_0)``, exact off the kinks (their higher derivatives vanish there);
* an op whose result is not a floating tensor (comparisons, masks, sizes) is locally
  constant: it is evaluated on the values.

Rules registered with ``ta.register_taylor_rule(torch.ops.aten.<op>.<overload>, rule)``
come first; they receive CoreJets, which offer the same arithmetic, ``unary`` and
``linear`` as :class:`~taylorattr.taylor.mode.jet.Jet`.

Why one module: the CoreJet, its arithmetic and the rule table are one unit (every rule
builds CoreJets with the shared ``joint_linear`` / ``bilinear`` / ``binary`` helpers, and
the runner and the sample-separation check dispatch through the same table); split by
family, each file would import the others' private helpers.
"""
from __future__ import annotations

import functools
import math
import operator
from collections.abc import Callable

import torch
from torch.utils import _pytree as pytree

from ... import series as S
from ..._validation import cpu_generator, draw
from ...capture import CoreGraph, op_name, refuse, where
from . import registry as R
from .jet import Jet, SeriesArithmetic, UnsupportedOperation

__all__ = ["CORE_RULES", "PIECEWISE_CORE", "CoreJet", "check", "constant_pad", "core_rule",
           "piecewise_nodes", "propagate_core"]

aten = torch.ops.aten


class CoreJet(SeriesArithmetic):
    """Truncated Taylor series of one node of a captured graph (module docstring).

    ``primal``: the value; ``series``: ``[K', m, *primal.shape]`` with ``K' = K`` or, for an
    ``affine`` node (coefficients 2..K are zero, as between the input and the first
    nonlinearity), ``K' = 1``."""

    _binary = staticmethod(lambda a, b, op: binary(a, b, op))  # the module's, below

    def __init__(self, primal: torch.Tensor, series: torch.Tensor, order: int,
                 affine: bool = False):
        self.primal, self.series, self._order, self.affine = primal, series, order, affine

    @property
    def order(self) -> int:
        return self._order

    @property
    def m(self) -> int:
        return self.series.shape[1]

    def full(self) -> torch.Tensor:
        """All ``K`` coefficients ``[K, m, *s]`` (zeros appended for an affine node)."""
        if self.series.shape[0] == self._order:
            return self.series
        pad = self.series.new_zeros((self._order - self.series.shape[0],) + self.series.shape[1:])
        return torch.cat([self.series, pad])

    def coeffs(self) -> list[torch.Tensor]:
        """``[x_0, x_1, ..., x_K]`` (``x_0`` without the direction axis: it broadcasts)."""
        out = [self.primal] + list(self.series.unbind(0))
        zero = self.primal.new_zeros(())
        return out + [zero] * (self._order + 1 - len(out))

    @classmethod
    def from_coeffs(cls, coeffs: list, like: CoreJet) -> CoreJet:
        primal = coeffs[0]
        shape = (like.m,) + tuple(primal.shape)
        return cls(primal, torch.stack([torch.as_tensor(c, dtype=primal.dtype,
                                                        device=primal.device).expand(shape)
                                        for c in coeffs[1:]]), like.order)

    def unary(self, rule: Callable) -> CoreJet:
        """Apply a series rule (a function of the coefficient list, e.g. ``series.tanh``)."""
        return CoreJet.from_coeffs(rule(self.coeffs()), self)

    def linear(self, fn: Callable, fn_series: Callable | None = None) -> CoreJet:
        """A map affine in this tensor: ``fn`` on the value, ``fn_series`` (``fn`` without its
        constant part; default ``fn``) on every coefficient, each shaped like the value."""
        primal = fn(self.primal)
        rows = self.series.reshape((-1,) + self.series.shape[2:])
        out = torch.vmap(fn_series or fn)(rows)
        return CoreJet(primal, out.reshape(self.series.shape[:2] + out.shape[1:]), self._order,
                       self.affine)

    def with_rank(self, n: int) -> CoreJet:
        """The same series with leading axes of size 1 added up to rank ``n`` (broadcasting)."""
        d = self.primal.dim()
        if d >= n:
            return self
        shape = (1,) * (n - d) + tuple(self.primal.shape)
        return CoreJet(self.primal.reshape(shape), self.series.reshape(self.series.shape[:2] + shape),
                       self._order, self.affine)

    def __neg__(self):
        return CoreJet(-self.primal, -self.series, self._order, self.affine)


def is_jet(v) -> bool:
    return isinstance(v, CoreJet)


def _rank(v) -> int:
    return v.primal.dim() if is_jet(v) else (v.dim() if isinstance(v, torch.Tensor) else 0)


def binary(a, b, op: str) -> CoreJet:
    """``a op b`` (add/sub/mul/div) with broadcasting, at least one a :class:`CoreJet`."""
    n = max(_rank(a), _rank(b))
    a = a.with_rank(n) if is_jet(a) else a
    b = b.with_rank(n) if is_jet(b) else b
    jet = a if is_jet(a) else b
    if op in ("add", "sub"):
        fn = torch.add if op == "add" else torch.sub
        if is_jet(a) and is_jet(b):
            primal = fn(a.primal, b.primal)
            if a.affine and b.affine:
                sa, sb, affine = a.series, b.series, True
            else:
                sa, sb, affine = a.full(), b.full(), False
            series = fn(sa, sb)
            return CoreJet(primal, series.expand(series.shape[:2] + primal.shape), jet.order, affine)
        if is_jet(a):
            primal = fn(a.primal, b)
            return CoreJet(primal, a.series.expand(a.series.shape[:2] + primal.shape), a.order,
                           a.affine)
        primal = fn(a, b.primal)
        series = b.series.expand(b.series.shape[:2] + primal.shape)
        return CoreJet(primal, -series if op == "sub" else series, b.order, b.affine)
    if op == "mul":
        if is_jet(a) and is_jet(b):
            return CoreJet.from_coeffs(S.mul(a.coeffs(), b.coeffs()), jet)
        c = b if is_jet(a) else a
        primal = jet.primal * c
        series = jet.series * c
        return CoreJet(primal, series.expand(series.shape[:2] + primal.shape), jet.order, jet.affine)
    if op == "div":
        if is_jet(b):
            coeffs = a.coeffs() if is_jet(a) else [torch.as_tensor(a, dtype=b.primal.dtype, device=b.primal.device)] + \
                [b.primal.new_zeros(())] * b.order
            return CoreJet.from_coeffs(S.div(coeffs, b.coeffs()), jet)
        primal = a.primal / b
        series = a.series / b
        return CoreJet(primal, series.expand(series.shape[:2] + primal.shape), a.order, a.affine)
    raise AssertionError(op)


# ----------------------------------------------------------------------------- rule table

CORE_RULES: dict = {}


def core_rule(*ops):
    """Decorator: the rule for ATen overloads or packets (a packet covers every overload)."""
    def deco(rule):
        for op in ops:
            CORE_RULES[op] = rule
            _name(op)
        return rule
    return deco


def _name(op) -> None:
    """Record a core op with a rule for the support table (surrogate module types are
    listed under their own family)."""
    if isinstance(op, (torch._ops.OpOverloadPacket, torch._ops.OpOverload)):
        R.CORE_NAMES.add(str(op).replace("aten::", "aten.") if "::" in str(op)
                         else f"aten.{op.__name__}")


def _entry(target):
    if isinstance(target, torch.nn.Module):  # a surrogate put in by ta.smooth
        for cls in type(target).__mro__:
            if cls in CORE_RULES:
                return functools.partial(CORE_RULES[cls], target)
        return None
    user = R.FUNCTION_RULES.get(target)
    if user is not None and user.family == "user":
        return user.rule
    rule = CORE_RULES.get(target)
    if rule is None and isinstance(target, torch._ops.OpOverload):
        rule = CORE_RULES.get(target.overloadpacket)
    return rule


def _jets(tree) -> list[CoreJet]:
    return [v for v in pytree.tree_leaves(tree, is_leaf=is_jet) if is_jet(v)]


def _map(tree, fn):
    return pytree.tree_map(lambda v: fn(v) if is_jet(v) else v, tree, is_leaf=is_jet)


def joint_linear(op, args, kwargs, additive: bool = False, strip: Callable | None = None):
    """``op`` linear in all its input-dependent arguments jointly. ``additive``: floating
    constant tensors among the arguments are additive (a constant branch, a constant part
    of a cat) and become zeros for the coefficients; ``strip(args, kwargs)`` removes other
    constant parts (a bias, a pad value) for the coefficients."""
    jets = _jets((args, kwargs))
    like = jets[0]
    primal = op(*_map(args, lambda j: j.primal), **_map(kwargs, lambda j: j.primal))
    affine = all(j.affine for j in jets)
    stacks = [(j.series if affine else j.full()) for j in jets]
    lead = stacks[0].shape[:2]
    flat = [s.reshape((-1,) + s.shape[2:]) for s in stacks]
    s_args, s_kwargs = (args, kwargs) if strip is None else strip(args, kwargs)
    if additive:
        s_args, s_kwargs = pytree.tree_map(
            lambda v: torch.zeros_like(v) if isinstance(v, torch.Tensor) and not is_jet(v)
            and v.is_floating_point() else v, (s_args, s_kwargs), is_leaf=is_jet)

    def per_row(*rows):
        it = iter(rows)
        a, k = _map((s_args, s_kwargs), lambda _: next(it))
        return op(*a, **k)

    out = torch.vmap(per_row)(*flat)
    wrap = (lambda p, s: CoreJet(p, s.reshape(lead + s.shape[1:]), like.order, affine))
    if isinstance(primal, (tuple, list)):
        return type(primal)(wrap(p, s) for p, s in zip(primal, out))
    return wrap(primal, out)


def bilinear(op, a, b, *rest, **kw) -> CoreJet:
    """``op(a, b, ...)`` linear in ``a`` and in ``b``: ``c_k = sum_j op(a_j, b_{k-j})``."""
    if not (is_jet(a) and is_jet(b)):
        return joint_linear(lambda x, y: op(x, y, *rest, **kw), (a, b), {})
    ca, cb = a.coeffs(), b.coeffs()
    primal = op(ca[0], cb[0], *rest, **kw)
    like = a
    m = a.m
    left = torch.vmap(lambda s: op(ca[0], s, *rest, **kw))(b.full().reshape((-1,) + b.primal.shape))
    right = torch.vmap(lambda s: op(s, cb[0], *rest, **kw))(a.full().reshape((-1,) + a.primal.shape))
    K = a.order
    out = (left + right).reshape((K, m) + primal.shape)
    both = torch.vmap(lambda x, y: op(x, y, *rest, **kw))
    terms = [out[k - 1] for k in range(1, K + 1)]
    for k in range(2, K + 1):
        for j in range(1, k):
            terms[k - 1] = terms[k - 1] + both(ca[j].expand((m,) + a.primal.shape),
                                               cb[k - j].expand((m,) + b.primal.shape))
    return CoreJet(primal, torch.stack(terms), like.order)


# ---------------------------------------------------------------- linear ops

_LINEAR = [aten.view, aten._unsafe_view, aten.reshape, aten.permute, aten.transpose, aten.t,
           aten.expand, aten.squeeze, aten.unsqueeze, aten.select, aten.slice, aten.clone,
           aten.alias, aten.sum, aten.mean, aten.avg_pool1d, aten.avg_pool2d, aten.avg_pool3d,
           aten._adaptive_avg_pool2d, aten.adaptive_avg_pool1d, aten._adaptive_avg_pool3d,
           aten.upsample_bilinear2d, aten.upsample_nearest2d, aten.upsample_nearest1d,
           aten.upsample_linear1d, aten.upsample_bicubic2d, aten.upsample_nearest3d,
           aten.upsample_trilinear3d, aten.repeat, aten.flip, aten.roll, aten.unfold,
           aten.pixel_shuffle, aten.pixel_unshuffle, aten.index_select, aten.gather, aten.index,
           aten.cumsum, aten.diagonal, aten.narrow, aten.unbind, aten.split, aten.split_with_sizes,
           aten.chunk, aten.neg, aten.reflection_pad1d, aten.reflection_pad2d,
           aten.reflection_pad3d, aten.replication_pad1d, aten.replication_pad2d,
           aten.replication_pad3d, aten.channel_shuffle, aten.as_strided, aten.lift_fresh_copy,
           aten.contiguous, aten.movedim, aten.tile]


def _reshape_rule(x, shape):
    return joint_linear(lambda t, s: aten.reshape(t, s), (x, shape), {})


core_rule(aten.view, aten._unsafe_view, aten.reshape)(_reshape_rule)
def _linear_rule(op):
    return lambda *a, **k: joint_linear(op, a, k)


for _op in _LINEAR:
    if _op not in CORE_RULES:
        core_rule(_op)(_linear_rule(_op))

def _make_additive(op):
    return lambda *a, **k: joint_linear(op, a, k, additive=True)


for _op in (aten.cat, aten.stack, aten.where, aten.slice_scatter, aten.select_scatter,
            aten.copy, aten.index_put, aten.masked_scatter, aten.diagonal_scatter):
    core_rule(_op)(_make_additive(_op))


@core_rule(aten._to_copy)
def _to_copy(x, dtype=None, **kwargs):
    if dtype is not None and dtype != x.primal.dtype and not dtype.is_floating_point:
        return aten._to_copy(x.primal, dtype=dtype, **kwargs)
    return joint_linear(lambda t: aten._to_copy(t, dtype=dtype, **kwargs), (x,), {})


@core_rule(aten.detach)
def _detach(x):
    """``detach`` makes a constant, as it does for autograd."""
    return x.primal.detach()


@core_rule(aten.convolution)
def _convolution(x, weight, bias, *rest):
    if is_jet(weight):
        out = bilinear(lambda a, w: aten.convolution(a, w, None, *rest), x, weight)
        return out if bias is None else out + bias.view(-1, *[1] * (out.primal.dim() - 2))
    return joint_linear(aten.convolution, (x, weight, bias) + rest, {},
                        strip=lambda a, k: ((a[0], a[1], None) + a[3:], k))


@core_rule(aten.constant_pad_nd)
def constant_pad(x, pad, value=0.0):
    """Padding is affine: the pad value goes to the value only."""
    return joint_linear(aten.constant_pad_nd, (x, pad, value), {},
                        strip=lambda a, k: ((a[0], a[1], 0.0), k))


@core_rule(aten.masked_fill)
def _masked_fill(x, mask, value):
    if is_jet(value) or is_jet(mask):
        raise UnsupportedOperation("masked_fill with an input-dependent mask or value")
    return joint_linear(aten.masked_fill, (x, mask, value), {},
                        strip=lambda a, k: ((a[0], a[1], 0.0), k))


def _bilinear_rule(op):
    return lambda a, b: bilinear(op, a, b)


for _op in (aten.mm, aten.bmm, aten.matmul):
    core_rule(_op)(_bilinear_rule(_op))


@core_rule(aten.addmm, aten.baddbmm)
def _addmm(bias, a, b, *, beta=1, alpha=1):
    prod = bilinear(aten.mm if a is not None and _rank(a) == 2 else aten.bmm, a, b)
    if alpha != 1:
        prod = prod * alpha
    return prod + (bias * beta if beta != 1 else bias)


def _add_rule(op):
    def rule(a, b, alpha=1):
        if alpha != 1:
            b = b * alpha
        if op == "rsub":
            return binary(b, a, "sub")
        return binary(a, b, op)
    return rule


core_rule(aten.add)(_add_rule("add"))
core_rule(aten.sub)(_add_rule("sub"))
core_rule(aten.rsub)(_add_rule("rsub"))
core_rule(aten.mul)(lambda a, b: binary(a, b, "mul"))


@core_rule(aten.div)
def _div(a, b, rounding_mode=None):
    if rounding_mode is not None:  # floor/trunc: piecewise constant
        return aten.div(a.primal if is_jet(a) else a, b.primal if is_jet(b) else b,
                        rounding_mode=rounding_mode)
    return binary(a, b, "div")


@core_rule(aten._native_batch_norm_legit_no_training)
def _batch_norm_eval(x, weight, bias, mean, var, momentum, eps):
    shape = (-1,) + (1,) * (x.primal.dim() - 2)
    scale = torch.rsqrt(var + eps)
    if weight is not None:
        scale = scale * weight
    shift = -mean * scale + (bias if bias is not None else 0)
    out = x * scale.view(shape) + shift.view(shape)
    empty = x.primal.new_zeros((0,))
    return out, empty, empty


@core_rule(aten.native_batch_norm, aten._native_batch_norm_legit)
def _batch_norm(x, weight, bias, mean, var, training, momentum, eps):
    if training:
        raise UnsupportedOperation("batch_norm with batch statistics (training mode mixes the "
                                   "samples): call model.eval()")
    return _batch_norm_eval(x, weight, bias, mean, var, momentum, eps)


@core_rule(aten.dropout)
def _dropout(x, p, train):
    if train and p > 0:
        raise UnsupportedOperation("dropout in training mode (call model.eval())")
    return x


@core_rule(aten.native_dropout)
def _native_dropout(x, p, train):
    return _dropout(x, p, train), torch.ones_like(x.primal, dtype=torch.bool)


# ---------------------------------------------------------------- elementwise

_SMOOTH = {aten.exp: S.exp, aten.log: S.log, aten.sigmoid: S.sigmoid, aten.tanh: S.tanh,
           aten.erf: S.erf, aten.sqrt: lambda c: S.power(c, 0.5),
           aten.rsqrt: lambda c: S.power(c, -0.5), aten.reciprocal: lambda c: S.power(c, -1)}
def _unary_rule(series_rule):
    return lambda x: x.unary(series_rule)


for _op, _rule in _SMOOTH.items():
    core_rule(_op)(_unary_rule(_rule))


@core_rule(aten.log1p)
def _log1p(x):
    return (x + 1.0).unary(S.log)


@core_rule(aten.expm1)
def _expm1(x):
    return x.unary(S.exp) - 1.0


core_rule(aten.log2)(lambda x: x.unary(S.log) * (1 / math.log(2)))
core_rule(aten.log10)(lambda x: x.unary(S.log) * (1 / math.log(10)))
core_rule(aten.gelu)(lambda x, approximate="none": x.unary(lambda c: S.gelu(c, approximate)))
core_rule(aten.silu)(lambda x: x * x.unary(S.sigmoid))
core_rule(aten.softplus)(lambda x, beta=1, threshold=20: x.unary(
    lambda c: S.softplus(c, float(beta), float(threshold))))
core_rule(aten.mish)(lambda x: x * x.unary(lambda c: S.tanh(S.softplus(c))))


@core_rule(aten.pow)
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
    return a.unary(lambda c: S.power(c, float(b)))


def _masked(x: CoreJet, slope: torch.Tensor, value: torch.Tensor) -> CoreJet:
    slope = slope.to(x.primal.dtype)
    return CoreJet(value, x.series * slope, x.order, x.affine)


@core_rule(aten.relu)
def _relu(x):
    return _masked(x, x.primal > 0, torch.relu(x.primal))


@core_rule(aten.hardtanh)
def _hardtanh(x, lo=-1.0, hi=1.0):
    return _masked(x, (x.primal > lo) & (x.primal < hi), aten.hardtanh(x.primal, lo, hi))


@core_rule(aten.clamp)
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


core_rule(aten.clamp_min)(lambda x, lo: _clamp(x, lo, None))
core_rule(aten.clamp_max)(lambda x, hi: _clamp(x, None, hi))


@core_rule(aten.leaky_relu)
def _leaky_relu(x, slope=0.01):
    factor = torch.where(x.primal > 0, 1.0, float(slope)).to(x.primal.dtype)
    return _masked(x, factor, aten.leaky_relu(x.primal, slope))


@core_rule(aten.abs)
def _abs(x):
    return _masked(x, torch.sign(x.primal), x.primal.abs())


def _select_max(a, b, take_max: bool):
    pa = a.primal if is_jet(a) else a
    pb = b.primal if is_jet(b) else b
    first = pa >= pb if take_max else pa <= pb
    return joint_linear(lambda u, v: torch.where(first, u, v), (a, b), {}, additive=True)


core_rule(aten.maximum)(lambda a, b: _select_max(a, b, True))
core_rule(aten.minimum)(lambda a, b: _select_max(a, b, False))


def _pool_with_indices(op, spatial: int):
    """Max pooling: each output takes the coefficients of its window's arg-max (indices
    into the flattened spatial axes)."""
    def rule(x, *args):
        primal, idx = op(x.primal, *args)
        start = x.primal.dim() - spatial

        def pick(t):
            return t.flatten(start).gather(start, idx.flatten(start)).view(idx.shape)
        out = joint_linear(pick, (x,), {})
        return CoreJet(primal, out.series, x.order, x.affine), idx
    return rule


core_rule(aten.max_pool2d_with_indices)(_pool_with_indices(aten.max_pool2d_with_indices, 2))
core_rule(aten.max_pool3d_with_indices)(_pool_with_indices(aten.max_pool3d_with_indices, 3))


def _extreme(take_max: bool):
    def rule(x, dim=(), keepdim=False):
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
    return rule


core_rule(aten.amax)(_extreme(True))
core_rule(aten.amin)(_extreme(False))


def _max_rule(take_max: bool):
    def rule(x, dim=None, keepdim=False):
        if dim is None:
            return _extreme(take_max)(x)
        out = _extreme(take_max)(x, [dim], keepdim)
        return out, (x.primal.argmax if take_max else x.primal.argmin)(dim, keepdim)
    return rule


core_rule(aten.max)(_max_rule(True))
core_rule(aten.min)(_max_rule(False))

# ---------------------------------------------------------------- softmax and norms


def _shifted_exp(x: CoreJet, dim: int):
    shift = x.primal.amax(dim, keepdim=True).detach()
    shift = torch.where(torch.isfinite(shift), shift, torch.zeros_like(shift))
    e = CoreJet(x.primal - shift, x.series, x.order, x.affine).unary(S.exp)
    return e, e.linear(lambda t: t.sum(dim, keepdim=True)), shift


@core_rule(aten._softmax)
def _softmax(x, dim, half_to_float=False):
    e, total, _ = _shifted_exp(x, dim)
    return e / total


@core_rule(aten._log_softmax)
def _log_softmax(x, dim, half_to_float=False):
    _, total, shift = _shifted_exp(x, dim)
    return (x - shift) - total.unary(S.log)


def _moments(x: CoreJet, dims, correction: float = 0.0, keepdim: bool = True):
    mean = x.linear(lambda t: t.mean(dims, keepdim=True))
    c = x - mean
    n = math.prod(x.primal.shape[d] for d in dims) - correction
    var = (c * c).linear(lambda t: t.sum(dims, keepdim=True) / n)
    if not keepdim:
        mean = mean.linear(lambda t: t.squeeze(dims))
        var = var.linear(lambda t: t.squeeze(dims))
    return c, mean, var


@core_rule(aten.native_layer_norm)
def _layer_norm(x, normalized_shape, weight, bias, eps):
    dims = tuple(range(x.primal.dim() - len(normalized_shape), x.primal.dim()))
    c, mean, var = _moments(x, dims)
    rstd = (var + eps).unary(lambda s: S.power(s, -0.5))
    y = c * rstd
    if weight is not None:
        y = y * weight
    if bias is not None:
        y = y + bias
    return y, mean, rstd


@core_rule(aten.native_group_norm)
def _group_norm(x, weight, bias, N, C, HxW, group, eps):
    grouped = x.linear(lambda t: t.reshape(t.shape[0], group, -1))
    c, mean, var = _moments(grouped, (2,))
    rstd = (var + eps).unary(lambda s: S.power(s, -0.5))
    shape = (-1,) + (1,) * (x.primal.dim() - 2)
    y = (c * rstd).linear(lambda t: t.reshape(x.primal.shape))
    if weight is not None:
        y = y * weight.view(shape)
    if bias is not None:
        y = y + bias.view(shape)
    return y, mean.linear(lambda t: t.reshape(t.shape[0], group)), \
        rstd.linear(lambda t: t.reshape(t.shape[0], group))


def _dims(x, dim):
    n = x.primal.dim()
    if dim is None or (isinstance(dim, (list, tuple)) and not dim):
        return tuple(range(n))
    return tuple(d % n for d in (dim if isinstance(dim, (list, tuple)) else (dim,)))


@core_rule(aten.var)
def _var(x, dim=None, *, correction=None, keepdim=False):
    return _moments(x, _dims(x, dim), 1.0 if correction is None else float(correction), keepdim)[2]


@core_rule(aten.var_mean)
def _var_mean(x, dim=None, *, correction=None, keepdim=False):
    _, mean, var = _moments(x, _dims(x, dim), 1.0 if correction is None else float(correction),
                            keepdim)
    return var, mean


@core_rule(aten.linalg_vector_norm)
def _vector_norm(x, ord=2, dim=None, keepdim=False, *, dtype=None):
    if ord != 2:
        raise UnsupportedOperation(f"linalg_vector_norm with ord={ord} (only ord=2)")
    dims = _dims(x, dim)
    return (x * x).linear(lambda t: t.sum(dims, keepdim=keepdim)).unary(lambda s: S.power(s, 0.5))


# ----------------------------------------------------------------------------- running

#: Piecewise-linear core ops: exact off their kinks, higher derivatives zero there.
PIECEWISE_CORE = {aten.relu, aten.hardtanh, aten.clamp, aten.clamp_min, aten.clamp_max,
                  aten.leaky_relu, aten.max_pool2d_with_indices, aten.max_pool3d_with_indices,
                  aten.abs, aten.maximum, aten.minimum, aten.amax, aten.amin, aten.max, aten.min,
                  aten._prelu_kernel, aten.prelu}

_VALUE_FREE = {aten.sym_size, aten.sym_stride, aten.sym_numel, aten.sym_storage_offset,
               aten.zeros_like, aten.ones_like, aten.full_like, aten.empty_like, aten.new_zeros,
               aten.new_ones, aten.new_full, aten.new_empty, aten.rand_like, aten.randn_like}


def _packet(target):
    return target.overloadpacket if isinstance(target, torch._ops.OpOverload) else target


def _constant_result(node) -> bool:
    """Whether the node's value is locally constant in the input: not a floating tensor
    (a comparison, a mask, a size), or an op that reads only the input's shape."""
    if _packet(node.target) in _VALUE_FREE:
        return True
    val = node.meta.get("val")
    vals = val if isinstance(val, (tuple, list)) else (val,)
    if not vals or any(isinstance(v, torch.Tensor) and v.is_floating_point() for v in vals):
        return False
    return val is not None


def supported(node) -> bool:
    return node.target is operator.getitem or _constant_result(node) or \
        _entry(node.target) is not None


ADVICE = ("What you can do: register an exact rule for each with "
          "ta.register_taylor_rule(torch.ops.aten.<op>.<overload>, rule) (docs/supported_ops.md "
          "lists the operations with rules), or replace the op in the model by supported ones.")


#: Ops that draw random numbers: a capture cannot replay the eager model's draws.
RANDOM = {aten.rand, aten.randn, aten.rand_like, aten.randn_like, aten.randint,
          aten.randint_like, aten.randperm, aten.bernoulli, aten.normal, aten.uniform,
          aten.multinomial, aten.exponential, aten.poisson}


def check(graph: CoreGraph) -> None:
    """Raise one :class:`UnsupportedOperation` listing every op without a rule (and every
    random op, input-dependent or not: its draws differ from the eager model's)."""
    if getattr(graph, "checked", False):
        return
    found = graph.unsupported(supported)
    for node in graph.nodes:
        if _packet(node.target) in RANDOM:
            found.setdefault(f"{op_name(node.target)} (random numbers drawn in forward: make "
                             "them a buffer)", []).append(node)
    refuse(graph, found, "Taylor mode", ADVICE, UnsupportedOperation)
    graph.checked = True


def piecewise_nodes(graph: CoreGraph) -> list[str]:
    """``op at module (Type)`` for each input-dependent piecewise-linear node."""
    return [f"{op_name(n.target)} at {where(n).split(',')[0]}" for n in graph.nodes
            if graph.depends_on_input(n) and _packet(n.target) in PIECEWISE_CORE]


def _primal(v):
    return v.primal if is_jet(v) else v


def _handle(node, args, kwargs):
    if node.target is operator.getitem:
        return args[0][args[1]]
    if _constant_result(node) or not _jets((args, kwargs)):  # e.g. fed only by masks
        return node.target(*_map(args, _primal), **_map(kwargs, _primal))
    rule = _entry(node.target)
    if rule is None:
        raise UnsupportedOperation(f"{op_name(node.target)} has no Taylor-mode rule")
    out = rule(*args, **kwargs)
    if isinstance(out, Jet):
        raise UnsupportedOperation(f"the rule for {op_name(node.target)} returned a batch-first "
                                   "Jet; rules on core ops build CoreJets")
    return out


MIXING_ADVICE = (
    "Taylor terms are per sample, so each sample must be computed on its own; this op mixes "
    "the samples of the batch (as softmax/var/einsum over the batch dimension, or a batch-first "
    "tensor fed to MultiheadAttention(batch_first=False), do). What you can do: keep the batch "
    "dimension out of it, or give the op a per-sample rule with ta.register_taylor_rule; for a "
    "ReLU/max-pool network analyse ta.smooth(model) instead.")


def _batch_axes(node, inputs: torch.Tensor, graph: CoreGraph) -> list[int]:
    """The axes of ``node``'s value that may be its batch axis: those of the symbolic batch
    size in a dynamic capture, else those of size ``B``."""
    val = node.meta.get("val")
    if not isinstance(val, torch.Tensor):
        return []
    batch = graph.inputs[0].meta["val"].shape[0]
    if graph.batch_dynamic:
        return [i for i, n in enumerate(val.shape) if str(n) == str(batch)]
    return [i for i, n in enumerate(val.shape) if n == inputs.shape[0]]


def _coupled(jet: CoreJet, axes: list[int]) -> bool:
    """Whether samples other than 0 move along every candidate batch axis."""
    first = jet.series[0, 0]
    return bool(axes) and all(bool((first.narrow(a, 1, first.shape[a] - 1).abs() > 0).any())
                              for a in axes)


def check_samples_separate(graph: CoreGraph, inputs: torch.Tensor) -> None:
    """Refuse a graph in which one sample's value depends on another sample's input: one
    first-order pass along a direction that moves sample 0 only. In a dynamic capture the
    batch axis of every node is known (its symbolic size) and the first node where another
    sample moves is named; otherwise the output (batch axis first) decides and the first
    node with a moving axis of size ``B`` is named. Done once per graph."""
    if getattr(graph, "samples_separate", False) or inputs.dim() == 0 or inputs.shape[0] < 2:
        return
    direction = torch.zeros_like(inputs)
    # a local generator: the check must not move the user's global random stream
    direction[0] = draw(torch.randn, inputs[0].shape, generator=cpu_generator(0),
                        device=inputs.device, dtype=torch.float64).to(inputs.dtype)
    suspects = []

    def watch(node, args, kwargs):
        out = _handle(node, args, kwargs)
        if is_jet(out) and not suspects and _coupled(out, _batch_axes(node, inputs, graph)):
            if graph.batch_dynamic:
                raise UnsupportedOperation(f"{graph.describe(node)}: {MIXING_ADVICE}")
            suspects.append(node)
        return out

    with torch.no_grad():
        out = graph.run(CoreJet(inputs.detach(), direction[None, None], 1, affine=True),
                        handler=watch)
    if is_jet(out) and out.primal.dim() > 0 and out.primal.shape[0] == inputs.shape[0] \
            and _coupled(out, [0]):
        node = suspects[0] if suspects else graph.output_node
        raise UnsupportedOperation(f"{graph.describe(node)}: {MIXING_ADVICE}")
    graph.samples_separate = True


def propagate_core(graph: CoreGraph, inputs: torch.Tensor, directions: torch.Tensor,
                   order: int) -> Jet:
    """Taylor coefficients of ``t -> model(inputs + t v)`` for every direction, on a captured
    graph. ``directions``: ``[B, m, *s]``; returns a :class:`Jet` (``series`` ``[K, B, m, ...]``)."""
    check(graph)
    check_samples_separate(graph, inputs)
    x = CoreJet(inputs, directions.transpose(0, 1).unsqueeze(0), order, affine=True)
    out = graph.run(x, handler=_handle)
    if not is_jet(out):
        raise UnsupportedOperation(
            f"model output is {type(out).__name__}, not a single tensor that depends on the input")
    return Jet(out.primal, out.full().transpose(1, 2), affine=out.affine and order > 0)
