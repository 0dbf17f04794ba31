"""Statistics and normalisation over non-batch axes, composed from exact series ops:

    mean   = affine,                      c = x - mean(x)
    var    = sum(c * c) / (N - correction)      (Cauchy product, then affine)
    norm   = c * (var + eps)^(-1/2)             (power recurrence, Cauchy product)

LayerNorm normalises the last axes; GroupNorm normalises ``[B, G, C/G * spatial]``;
RMS normalisation is ``x * (mean(x^2) + eps)^(-1/2)``. BatchNorm in eval mode is affine
(:mod:`taylorattr.taylor.mode.rules_affine`).
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from ... import series as S
from .jet import Jet, UnsupportedOperation, batch_dim
from .registry import builtin
from .rules_affine import reshape


def _dims(x: Jet, dim, what: str) -> tuple[int, ...]:
    if dim is None:
        raise UnsupportedOperation(f"{what} over all dimensions mixes samples")
    dims = tuple(dim) if isinstance(dim, (tuple, list)) else (dim,)
    return tuple(batch_dim(d, x.primal.dim(), what) for d in dims)


def _count(x: Jet, dims) -> int:
    return math.prod(x.primal.shape[d] for d in dims)


def centred(x: Jet, dims) -> Jet:
    return x - x.linear(lambda t: t.mean(dims, keepdim=True))


def variance(x: Jet, dims, correction: float = 0, keepdim: bool = True) -> Jet:
    c = centred(x, dims)
    n = _count(x, dims) - correction
    return (c * c).linear(lambda t: t.sum(dims, keepdim=keepdim) / n)


def normalise(x: Jet, dims, eps: float) -> Jet:
    """``(x - mean) / sqrt(var + eps)`` with the biased variance over ``dims``."""
    c = centred(x, dims)
    v = (c * c).linear(lambda t: t.mean(dims, keepdim=True))
    return c * (v + eps).unary(lambda s: S.power(s, -0.5))


def _correction(unbiased, correction) -> float:
    if correction is not None:
        return float(correction)
    return 1.0 if unbiased is None or unbiased else 0.0


def _stat(name: str):
    def rule(x: Jet, dim=None, unbiased=None, keepdim=False, *, correction=None):
        if isinstance(dim, bool):  # var(unbiased)
            dim, unbiased = None, dim
        dims = _dims(x, dim, name)
        v = variance(x, dims, _correction(unbiased, correction), keepdim)
        return v if name == "var" else v.unary(lambda s: S.power(s, 0.5))
    return rule


builtin(torch.var, "Tensor.var", family="reduction")(_stat("var"))
builtin(torch.std, "Tensor.std", family="reduction")(_stat("std"))


def _affine(y: Jet, weight, bias) -> Jet:
    if weight is not None:
        y = y * weight
    return y if bias is None else y + bias


def _last_axes_only(args, kwargs, ndim: int) -> bool:
    """A normalisation over the trailing axes is pointwise on a sequence-first tensor
    ``[L, B, ...]`` only if it leaves the batch axis (axis 1) out."""
    if isinstance(args[0], nn.Module):
        shape = args[0].normalized_shape
    else:
        shape = args[1] if len(args) > 1 else kwargs["normalized_shape"]
    return len(shape) <= ndim - 2


@builtin(F.layer_norm, family="normalisation", pointwise=_last_axes_only)
def layer_norm(x: Jet, normalized_shape, weight=None, bias=None, eps=1e-5) -> Jet:
    dims = _dims(x, tuple(range(-len(normalized_shape), 0)), "layer_norm")
    return _affine(normalise(x, dims, eps), weight, bias)


builtin(nn.LayerNorm, family="normalisation", pointwise=_last_axes_only)(
    lambda m, x: layer_norm(x, m.normalized_shape, m.weight, m.bias, m.eps))


@builtin(F.group_norm, family="normalisation")
def group_norm(x: Jet, num_groups: int, weight=None, bias=None, eps=1e-5) -> Jet:
    shape = x.primal.shape
    y = reshape(normalise(reshape(x, shape[0], num_groups, -1), (2,), eps), shape)
    view = (-1,) + (1,) * (len(shape) - 2)
    return _affine(y, None if weight is None else weight.view(view),
                   None if bias is None else bias.view(view))


builtin(nn.GroupNorm, family="normalisation")(
    lambda m, x: group_norm(x, m.num_groups, m.weight, m.bias, m.eps))


@builtin(F.rms_norm, family="normalisation", pointwise=_last_axes_only)
def rms_norm(x: Jet, normalized_shape, weight=None, eps=None) -> Jet:
    dims = _dims(x, tuple(range(-len(normalized_shape), 0)), "rms_norm")
    eps = torch.finfo(x.primal.dtype).eps if eps is None else eps
    mean_square = (x * x).linear(lambda t: t.mean(dims, keepdim=True))
    return _affine(x * (mean_square + eps).unary(lambda s: S.power(s, -0.5)), weight, None)


builtin(nn.RMSNorm, family="normalisation", pointwise=_last_axes_only)(
    lambda m, x: rms_norm(x, m.normalized_shape, m.weight, m.eps))
