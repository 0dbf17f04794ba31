"""Normalisation and statistics. BatchNorm in eval mode is affine (its running statistics
are constants); LayerNorm and GroupNorm are kept whole, with the centred variance and the
power -1/2 by the series recurrences:

    y = (x - mean) (var + eps)^(-1/2) w + b,   var = mean((x - mean)^2)

``var`` and ``linalg_vector_norm`` (ord 2: ``(sum x^2)^(1/2)``, :func:`.pointwise.power`)
likewise."""
from __future__ import annotations

import math

import torch

from .... import series as S
from ..core import CoreJet, UnsupportedOperation
from ..registry import rule
from .pointwise import power

aten = torch.ops.aten


@rule(aten._native_batch_norm_legit_no_training, family="normalisation")
def _batch_norm_eval(x, weight, bias, mean, var, momentum, eps):
    shape = (-1,) + (1,) * (x.primal.dim() - 2)
    scale = torch.rsqrt(var + eps)
    if weight is not None:
        scale = scale * weight
    shift = -mean * scale + (bias if bias is not None else 0)
    out = x * scale.view(shape) + shift.view(shape)
    empty = x.primal.new_zeros((0,))
    return out, empty, empty


@rule(aten.native_batch_norm, aten._native_batch_norm_legit, family="normalisation")
def _batch_norm(x, weight, bias, mean, var, training, momentum, eps):
    if training:
        raise UnsupportedOperation("batch_norm with batch statistics (training mode mixes the "
                                   "samples): call model.eval()")
    return _batch_norm_eval(x, weight, bias, mean, var, momentum, eps)



def _moments(x: CoreJet, dims, correction: float = 0.0, keepdim: bool = True):
    mean = x.linear(lambda t: t.mean(dims, keepdim=True))
    c = x - mean
    n = math.prod(x.primal.shape[d] for d in dims) - correction
    var = (c * c).linear(lambda t: t.sum(dims, keepdim=True) / n)
    if not keepdim:
        mean = mean.linear(lambda t: t.squeeze(dims))
        var = var.linear(lambda t: t.squeeze(dims))
    return c, mean, var


@rule(aten.native_layer_norm, family="normalisation")
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


@rule(aten.native_group_norm, family="normalisation")
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


@rule(aten.var, family="normalisation")
def _var(x, dim=None, *, correction=None, keepdim=False):
    return _moments(x, _dims(x, dim), 1.0 if correction is None else float(correction), keepdim)[2]


@rule(aten.var_mean, family="normalisation")
def _var_mean(x, dim=None, *, correction=None, keepdim=False):
    _, mean, var = _moments(x, _dims(x, dim), 1.0 if correction is None else float(correction),
                            keepdim)
    return var, mean


@rule(aten.linalg_vector_norm, family="normalisation")
def _vector_norm(x, ord=2, dim=None, keepdim=False, *, dtype=None):
    if ord != 2:
        raise UnsupportedOperation(f"linalg_vector_norm with ord={ord} (only ord=2)")
    dims = _dims(x, dim)
    return power((x * x).linear(lambda t: t.sum(dims, keepdim=keepdim)), 0.5)


