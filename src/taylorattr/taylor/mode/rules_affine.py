"""Affine layers, arithmetic and shape operations: ``y = A x + b`` acts on the primal
with ``b`` and on every coefficient without it (``y_k = A x_k``); products and quotients
with Jets are Cauchy products (:func:`taylorattr.taylor.mode.jet.binary`)."""
from __future__ import annotations

import operator

import torch
import torch.nn.functional as F
from torch import nn

from .jet import BatchSecond, Jet, UnsupportedOperation, batch_dim, binary, is_jet, series_dim
from .registry import builtin

# ---------------------------------------------------------------- arithmetic


def _scaled(b, alpha):
    return b if alpha == 1 else b * alpha


builtin(operator.add, torch.add, "Tensor.add", family="affine", pointwise=True)(
    lambda a, b, alpha=1: binary(a, _scaled(b, alpha), "add"))
builtin(operator.sub, torch.sub, "Tensor.sub", family="affine", pointwise=True)(
    lambda a, b, alpha=1: binary(a, _scaled(b, alpha), "sub"))
builtin(operator.mul, torch.mul, "Tensor.mul", family="affine", pointwise=True)(
    lambda a, b: binary(a, b, "mul"))
builtin(operator.truediv, torch.div, "Tensor.div", family="affine", pointwise=True)(
    lambda a, b: binary(a, b, "div"))
builtin(operator.neg, torch.neg, "Tensor.neg", family="affine", pointwise=True)(
    lambda x: x.linear(torch.neg))
builtin(operator.pos, "Tensor.contiguous", "Tensor.clone", nn.Identity, family="shape",
        pointwise=True)(lambda *args, **_: args[-1] if isinstance(args[0], nn.Module) else args[0])

# ---------------------------------------------------------------- affine layers


@builtin(F.linear, family="affine", pointwise=True)
def linear(x: Jet, weight, bias=None) -> Jet:
    return x.linear(lambda t: F.linear(t, weight, bias), lambda t: F.linear(t, weight))


builtin(nn.Linear, family="affine", pointwise=True)(lambda m, x: linear(x, m.weight, m.bias))


def _conv_fn(fn):
    def rule(x: Jet, weight, bias=None, *args, **kwargs):
        return x.linear(lambda t: fn(t, weight, bias, *args, **kwargs),
                        lambda t: fn(t, weight, None, *args, **kwargs))
    return rule


for _fn in (F.conv1d, F.conv2d, F.conv3d):
    builtin(_fn, family="affine")(_conv_fn(_fn))


@builtin(nn.Conv1d, nn.Conv2d, nn.Conv3d, family="affine")
def _conv_module(m, x: Jet) -> Jet:
    return x.linear(m, lambda t: m._conv_forward(t, m.weight, None))


def _bn_scale(m: nn.modules.batchnorm._BatchNorm) -> torch.Tensor:
    if m.training or m.running_var is None:
        raise UnsupportedOperation(
            f"{type(m).__name__} in training mode or without running statistics (call model.eval())")
    scale = torch.rsqrt(m.running_var + m.eps)
    return scale * m.weight if m.weight is not None else scale


@builtin(nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d, family="normalisation")
def _bn_module(m, x: Jet) -> Jet:
    scale = _bn_scale(m)
    return x.linear(m, lambda t: t * scale.view(1, -1, *[1] * (t.dim() - 2)))


def _linear_fn(fn):
    """An op that is linear (no constant part) in its first argument."""
    return lambda x, *args, **kwargs: x.linear(lambda t: fn(t, *args, **kwargs))


for _fn in (F.avg_pool1d, F.avg_pool2d, F.avg_pool3d, F.adaptive_avg_pool1d,
            F.adaptive_avg_pool2d, F.adaptive_avg_pool3d):
    builtin(_fn, family="affine")(_linear_fn(_fn))
builtin(nn.AvgPool1d, nn.AvgPool2d, nn.AvgPool3d, nn.AdaptiveAvgPool1d, nn.AdaptiveAvgPool2d,
        nn.AdaptiveAvgPool3d, nn.Unflatten, family="affine")(lambda m, x: x.linear(m))


def max_pool(fn):
    def rule(x: Jet, *args, **kwargs) -> Jet:
        kwargs = {k: v for k, v in kwargs.items() if k != "return_indices"}
        primal, idx = fn(x.primal, *args, return_indices=True, **kwargs)
        K, B, m = x.series.shape[:3]
        index = idx.flatten(start_dim=2)[None, :, None].expand(K, B, m, *idx.shape[1:2], -1)
        out = x.series.flatten(start_dim=4).gather(-1, index)
        return Jet(primal, out.reshape(K, B, m, *primal.shape[1:]))
    return rule


for _fn in (F.max_pool1d, F.max_pool2d):
    builtin(_fn, family="piecewise")(max_pool(_fn))
builtin(nn.MaxPool1d, family="piecewise")(lambda m, x: max_pool(F.max_pool1d)(
    x, m.kernel_size, m.stride, m.padding, m.dilation, m.ceil_mode))
builtin(nn.MaxPool2d, family="piecewise")(lambda m, x: max_pool(F.max_pool2d)(
    x, m.kernel_size, m.stride, m.padding, m.dilation, m.ceil_mode))


@builtin(F.pad, family="affine")
def _pad(x: Jet, pad, mode="constant", value=None) -> Jet:
    """Padding is affine: the pad value goes to the primal only."""
    return x.linear(lambda t: F.pad(t, pad, mode, value),
                    lambda t: F.pad(t, pad, mode, None if value is None else 0.0))


builtin(nn.modules.padding._ConstantPadNd, family="affine")(
    lambda m, x: _pad(x, m.padding, "constant", m.value))
builtin(nn.modules.padding._ReflectionPadNd, family="affine")(
    lambda m, x: _pad(x, m.padding, "reflect"))
builtin(nn.modules.padding._ReplicationPadNd, family="affine")(
    lambda m, x: _pad(x, m.padding, "replicate"))


@builtin(F.dropout, family="shape", pointwise=True)
def _dropout(x: Jet, p=0.5, training=False, inplace=False) -> Jet:
    if training and p > 0:
        raise UnsupportedOperation("dropout in training mode (call model.eval())")
    return x


builtin(nn.Dropout, nn.Dropout1d, nn.Dropout2d, nn.Dropout3d, family="shape", pointwise=True)(
    lambda m, x: _dropout(x, m.p, m.training))

# ---------------------------------------------------------------- shape and indexing


@builtin("Tensor.detach", family="shape")
def _detach(x: Jet) -> torch.Tensor:
    """``detach`` makes a constant, as it does for autograd: the primal alone."""
    return x.primal.detach()


def _new_like(fn):
    """A new tensor shaped like the Jet: a constant (it does not depend on the values)."""
    return lambda x, *args, **kwargs: fn(x.primal, *args, **kwargs)


for _fn in (torch.zeros_like, torch.ones_like, torch.full_like):
    builtin(_fn, family="shape")(_new_like(_fn))
for _name in ("new_zeros", "new_ones", "new_full"):
    builtin(f"Tensor.{_name}", family="shape")(_new_like(getattr(torch.Tensor, _name)))


@builtin(torch.reshape, "Tensor.reshape", "Tensor.view", family="shape")
def reshape(x: Jet, *shape) -> Jet:
    if len(shape) == 1 and isinstance(shape[0], (tuple, list, torch.Size)):
        shape = tuple(shape[0])
    primal = x.primal.reshape(*shape)
    if primal.shape[0] != x.primal.shape[0]:
        raise UnsupportedOperation(
            f"reshape to {tuple(shape)} changes the batch size {x.primal.shape[0]}")
    K, B, m = x.series.shape[:3]
    return Jet(primal, x.series.reshape(K, B, m, *primal.shape[1:]), affine=x.affine)


@builtin(torch.flatten, "Tensor.flatten", family="shape")
def flatten(x: Jet, start_dim=0, end_dim=-1) -> Jet:
    if start_dim % x.primal.dim() != 0:
        return x.linear(lambda t: torch.flatten(t, start_dim, end_dim))
    return reshape(x, torch.flatten(x.primal, start_dim, end_dim).shape)  # e.g. [B, 1] -> [B]


builtin(nn.Flatten, family="shape")(lambda m, x: flatten(x, m.start_dim, m.end_dim))


@builtin(operator.getitem, family="shape")
def getitem(x, index):
    if isinstance(x, BatchSecond):
        raise UnsupportedOperation("indexing a sequence-first tensor (transpose(0, 1) it back "
                                   "to batch-first first)")
    if not is_jet(x):  # a tuple or list holding Jets (e.g. attention's (output, weights))
        return operator.getitem(x, index)
    idx = index if isinstance(index, tuple) else (index,)
    if any(i is Ellipsis for i in idx):  # spell the Ellipsis out
        at = next(k for k, i in enumerate(idx) if i is Ellipsis)
        named = sum(i is not None and i is not Ellipsis for i in idx)
        idx = idx[:at] + (slice(None),) * (x.primal.dim() - named) + idx[at + 1:]
    if not idx or idx[0] != slice(None):
        raise UnsupportedOperation(f"indexing {index!r} that does not keep the batch axis whole")
    if any(is_jet(i) or isinstance(i, torch.Tensor) for i in idx):
        raise UnsupportedOperation("indexing by a tensor (use a slice, an int or None)")
    return Jet(x.primal[idx], x.series[(slice(None), slice(None)) + idx], affine=x.affine)


getitem.accepts_batch_second = True


@builtin(torch.cat, torch.concat, family="shape")
def cat(tensors, dim=0) -> Jet:
    jet = next(t for t in tensors if is_jet(t))
    d = batch_dim(dim, jet.primal.dim(), "cat")
    primal = torch.cat([t.primal if is_jet(t) else t for t in tensors], d)
    parts = []
    for t in tensors:
        if is_jet(t):
            parts.append(t.series)
        else:  # a constant (a class token): zero coefficients
            if t.shape[0] != jet.primal.shape[0]:
                raise UnsupportedOperation(f"cat of a constant with batch size {t.shape[0]} "
                                           f"(expand it to {jet.primal.shape[0]} first)")
            parts.append(t.new_zeros(jet.series.shape[:3] + t.shape[1:]))
    affine = all(t.affine for t in tensors if is_jet(t))
    return Jet(primal, torch.cat(parts, d + 2), affine=affine)


def _split_rule(name: str):
    def rule(x: Jet, arg, dim=0):
        d = series_dim(dim, x.primal.dim(), name)
        primals = getattr(torch, name)(x.primal, arg, d - 2)
        series = getattr(torch, name)(x.series, arg, d)
        return tuple(Jet(p, s, affine=x.affine) for p, s in zip(primals, series))
    return rule


builtin(torch.chunk, "Tensor.chunk", family="shape")(_split_rule("chunk"))
builtin(torch.split, "Tensor.split", family="shape")(_split_rule("split"))


@builtin("Tensor.expand", family="shape")
def expand(x: Jet, *sizes) -> Jet:
    primal = x.primal.expand(*sizes)
    if primal.shape[0] != x.primal.shape[0] or primal.dim() != x.primal.dim():
        raise UnsupportedOperation(f"expand to {tuple(primal.shape)} changes the batch axis "
                                   f"of {tuple(x.primal.shape)}")
    return Jet(primal, x.series.expand(*x.series.shape[:3], *primal.shape[1:]), affine=x.affine)


builtin("Tensor.expand_as", family="shape")(
    lambda x, other: expand(x, other.primal.shape if is_jet(other) else other.shape))


def _transpose(x, d0, d1):
    """Swapping the batch axis with axis 1 gives a lazy :class:`BatchSecond` (sequence-first,
    as ``nn.MultiheadAttention(batch_first=False)`` takes); swapping back undoes it."""
    n = (x.jet if isinstance(x, BatchSecond) else x).primal.dim()
    swaps_batch = sorted((d0 % n, d1 % n)) == [0, 1]
    if isinstance(x, BatchSecond):
        if not swaps_batch:
            raise UnsupportedOperation(f"transpose({d0}, {d1}) of a sequence-first tensor "
                                       "(transpose(0, 1) back to batch-first first)")
        return x.jet
    if swaps_batch:
        if n < 3:
            raise UnsupportedOperation(f"transpose({d0}, {d1}) of a [B, n] tensor moves the batch "
                                       "axis last")
        return BatchSecond(x)
    batch_dim(d0, n, "transpose")
    batch_dim(d1, n, "transpose")
    return x.linear(lambda t: t.transpose(d0, d1))


_transpose.accepts_batch_second = True
builtin(torch.transpose, torch.swapaxes, "Tensor.transpose", "Tensor.swapaxes", family="shape")(
    _transpose)


@builtin(torch.permute, "Tensor.permute", family="shape")
def _permute(x: Jet, *dims):
    flat = tuple(dims[0]) if len(dims) == 1 and isinstance(dims[0], (tuple, list)) else dims
    n = x.primal.dim() if is_jet(x) else x.jet.primal.dim()
    norm = [d % n for d in flat]
    if norm[2:] == list(range(2, n)) and norm[:2] == [1, 0]:
        return _transpose(x, 0, 1)
    if not is_jet(x) or norm[0] != 0:
        raise UnsupportedOperation(f"permute {tuple(flat)} moves the batch dimension")
    return x.linear(lambda t: t.permute(*flat))


_permute.accepts_batch_second = True


def _axes(name: str, extra: int = 0):
    """unsqueeze / squeeze with an explicit dim other than the batch axis."""
    def rule(x: Jet, *dims):
        flat = dims[0] if len(dims) == 1 and isinstance(dims[0], (tuple, list)) else dims
        if not flat:  # squeeze() would also drop a batch (or direction) axis of size 1
            raise UnsupportedOperation(f"{name} without a dim (name the dims to {name})")
        for d in flat:
            batch_dim(d, x.primal.dim() + extra, name)
        return x.linear(lambda t: getattr(t, name)(*dims))
    return rule


builtin(torch.unsqueeze, "Tensor.unsqueeze", family="shape")(_axes("unsqueeze", extra=1))
builtin(torch.squeeze, "Tensor.squeeze", family="shape")(_axes("squeeze"))


def reduce(name: str):
    def rule(x: Jet, dim=None, keepdim=False, **kw):
        if dim is None:
            raise UnsupportedOperation(f"{name} over all dimensions mixes samples")
        dims = dim if isinstance(dim, (tuple, list)) else (dim,)
        for d in dims:
            batch_dim(d, x.primal.dim(), name)
        return x.linear(lambda t: getattr(torch, name)(t, dim, keepdim=keepdim, **kw))
    return rule


builtin(torch.sum, "Tensor.sum", family="reduction")(reduce("sum"))
builtin(torch.mean, "Tensor.mean", family="reduction")(reduce("mean"))
