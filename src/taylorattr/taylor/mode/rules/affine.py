"""Arithmetic, convolutions, matrix products, pooling and sums: affine in each
input-dependent argument. Linear maps act on every coefficient (``y_k = L(x_k)``, bias to
``y_0`` only); a product of two input-dependent operands is a Cauchy product
``(ab)_k = sum_j a_j b_{k-j}`` (:func:`bilinear`); a quotient uses the quotient recurrence."""
from __future__ import annotations

import torch

from ..core import bilinear, binary, is_jet, joint_linear, rank
from ..registry import rule

aten = torch.ops.aten

_LINEAR = [aten.sum, aten.mean, aten.cumsum, aten.neg, aten.avg_pool1d, aten.avg_pool2d,
           aten.avg_pool3d, aten._adaptive_avg_pool2d, aten.adaptive_avg_pool1d,
           aten._adaptive_avg_pool3d, aten.upsample_bilinear2d, aten.upsample_nearest2d,
           aten.upsample_nearest1d, aten.upsample_linear1d, aten.upsample_bicubic2d,
           aten.upsample_nearest3d, aten.upsample_trilinear3d]


def _linear(op):
    return lambda *a, **k: joint_linear(op, a, k)


for _op in _LINEAR:
    rule(_op, family="affine")(_linear(_op))


@rule(aten.convolution, family="affine")
def _convolution(x, weight, bias, *rest):
    if is_jet(weight):
        out = bilinear(lambda a, w: aten.convolution(a, w, None, *rest), x, weight)
        return out if bias is None else out + bias.view(-1, *[1] * (out.primal.dim() - 2))
    return joint_linear(aten.convolution, (x, weight, bias) + rest, {},
                        strip=lambda a, k: ((a[0], a[1], None) + a[3:], k))


def _product(op):
    return lambda a, b: bilinear(op, a, b)


for _op in (aten.mm, aten.bmm, aten.matmul):
    rule(_op, family="affine")(_product(_op))


@rule(aten.addmm, aten.baddbmm, family="affine")
def _addmm(bias, a, b, *, beta=1, alpha=1):
    prod = bilinear(aten.mm if a is not None and rank(a) == 2 else aten.bmm, a, b)
    if alpha != 1:
        prod = prod * alpha
    return prod + (bias * beta if beta != 1 else bias)


def _add(op):
    def add_rule(a, b, alpha=1):
        if alpha != 1:
            b = b * alpha
        if op == "rsub":
            return binary(b, a, "sub")
        return binary(a, b, op)
    return add_rule


rule(aten.add, family="affine")(_add("add"))
rule(aten.sub, family="affine")(_add("sub"))
rule(aten.rsub, family="affine")(_add("rsub"))
rule(aten.mul, family="affine")(lambda a, b: binary(a, b, "mul"))


@rule(aten.div, family="affine")
def _div(a, b, rounding_mode=None):
    if rounding_mode is not None:  # floor/trunc: piecewise constant
        return aten.div(a.primal if is_jet(a) else a, b.primal if is_jet(b) else b,
                        rounding_mode=rounding_mode)
    return binary(a, b, "div")
