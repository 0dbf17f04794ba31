"""Shape, indexing and copy operations: linear in their input-dependent arguments, so
every coefficient goes through the op itself, ``y_k = L(x_k)`` (:func:`joint_linear`,
``torch.vmap`` over the coefficients); additive constants (a pad value, a constant branch
of ``where``, a constant part of a cat) go to the value ``y_0`` only."""
from __future__ import annotations

import torch

from ..core import UnsupportedOperation, is_jet, joint_linear
from ..registry import rule

aten = torch.ops.aten

_LINEAR = [aten.permute, aten.transpose, aten.t, aten.expand, aten.squeeze, aten.unsqueeze,
           aten.select, aten.slice, aten.clone, aten.alias, aten.repeat, aten.flip, aten.roll,
           aten.unfold, aten.pixel_shuffle, aten.pixel_unshuffle, aten.index_select, aten.gather,
           aten.index, aten.diagonal, aten.narrow, aten.unbind, aten.split,
           aten.split_with_sizes, aten.chunk, aten.reflection_pad1d, aten.reflection_pad2d,
           aten.reflection_pad3d, aten.replication_pad1d, aten.replication_pad2d,
           aten.replication_pad3d, aten.channel_shuffle, aten.as_strided, aten.lift_fresh_copy,
           aten.contiguous, aten.movedim, aten.tile, aten._unsafe_index, aten.im2col, aten.col2im,
           aten.repeat_interleave, aten.permute_copy]
_ADDITIVE = [aten.cat, aten.stack, aten.where, aten.slice_scatter, aten.select_scatter,
             aten.copy, aten.index_put, aten.masked_scatter, aten.diagonal_scatter]


@rule(aten.view, aten._unsafe_view, aten.reshape, aten.view_copy, family="shape")
def _reshape(x, shape):
    """Views become reshapes: the stacked coefficients need not be contiguous."""
    return joint_linear(lambda t, s: aten.reshape(t, s), (x, shape), {})


def _linear(op, additive: bool = False):
    return lambda *a, **k: joint_linear(op, a, k, additive=additive)


for _op in _LINEAR:
    rule(_op, family="shape")(_linear(_op))
for _op in _ADDITIVE:
    rule(_op, family="shape")(_linear(_op, additive=True))


@rule(aten._to_copy, family="shape")
def _to_copy(x, dtype=None, **kwargs):
    if dtype is not None and dtype != x.primal.dtype and not dtype.is_floating_point:
        return aten._to_copy(x.primal, dtype=dtype, **kwargs)
    return joint_linear(lambda t: aten._to_copy(t, dtype=dtype, **kwargs), (x,), {})


@rule(aten.detach, family="shape")
def _detach(x):
    """``detach`` makes a constant, as it does for autograd."""
    return x.primal.detach()


@rule(aten.constant_pad_nd, family="shape")
def constant_pad(x, pad, value=0.0):
    """Padding is affine: the pad value goes to the value only."""
    return joint_linear(aten.constant_pad_nd, (x, pad, value), {},
                        strip=lambda a, k: ((a[0], a[1], 0.0), k))


@rule(aten.masked_fill, family="shape")
def _masked_fill(x, mask, value):
    if is_jet(value) or is_jet(mask):
        raise UnsupportedOperation("masked_fill with an input-dependent mask or value")
    return joint_linear(aten.masked_fill, (x, mask, value), {},
                        strip=lambda a, k: ((a[0], a[1], 0.0), k))


@rule(aten.dropout, family="shape")
def _dropout(x, p, train):
    if train and p > 0:
        raise UnsupportedOperation("dropout in training mode (call model.eval())")
    return x


@rule(aten.native_dropout, family="shape")
def _native_dropout(x, p, train):
    return _dropout(x, p, train), torch.ones_like(x.primal, dtype=torch.bool)
