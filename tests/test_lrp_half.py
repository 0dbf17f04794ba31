"""LRP in half precision (issue 34): a float16/bfloat16 model's relevance pass runs in
float32 and is rounded once to the model's dtype.

Independent routes, in float64 on the half model's own (rounded) weights and inputs:
Zennit's rules and composites (its own hooks) on the CNN and MLP of :mod:`test_lrp_rules`,
Captum's ``LRP`` on the batch-norm CNN of :mod:`test_layerwise_cnn` (epsilon-LRP), and the flat and w-square rules written out by hand on a residual
block built so that half-precision arithmetic cancels its sum ``a + b`` to zero while
float32 keeps it exactly (the cause of the bfloat16 failures of ``lrp_flat`` and
``lrp_w_square`` on ResNet-18: relevance divided by a stabilised zero, ``1/1e-6``).

Tolerance, from the dtypes' epsilons: one rounding of the float32 result to the half type,
``u |ref|`` with ``u = eps / 2`` (2^-8 bfloat16, 2^-11 float16), or half the spacing of
subnormals ``u tiny`` (``tiny`` the smallest normal: float16's 6.1e-5 is within reach of
relevances), plus the float32 pass's
own rounding, ``K eps_32 max|ref|`` with ``K = 64`` (each relevance path through these
3-4 layer models takes a few dozen float32 roundings: forward sums, the rule's
normaliser and division, the backward sums).
"""
from __future__ import annotations

import copy

import pytest
import torch
from _builders import DT, normal
from captum import attr as captum_attr
from test_layerwise_cnn import Branched, data, make
from test_lrp_rules import _ZENNIT_COMPOSITES, _ZENNIT_RULES, _cnn, _mlp, _Residual, _zennit
from zennit import composites as zc
from zennit import types as zt

from taylorattr.methods import EpsilonLRP
from taylorattr.methods.lrp_rules import LRP

HALF = [torch.bfloat16, torch.float16]
EPS32 = torch.finfo(torch.float32).eps
K = 64


def _within(ours, ref, dtype):
    """``|ours - ref| <= u max(|ref|, tiny) + K eps_32 max|ref|`` elementwise (module
    docstring)."""
    assert ours.dtype == dtype and torch.isfinite(ours).all()
    info = torch.finfo(dtype)
    err = (ours.double() - ref).abs()
    bound = info.eps / 2 * ref.abs().clamp(min=info.smallest_normal) + K * EPS32 * ref.abs().max()
    assert (err <= bound).all(), f"{float((err / bound).max()):.3g} x the bound"


def _half(model, shape, dtype, seed=2):
    """(the half model, its float64 twin with the same rounded weights, half inputs)."""
    low = copy.deepcopy(model).to(dtype)
    return low, copy.deepcopy(low).to(DT), normal(shape, seed=seed).to(dtype)


@pytest.mark.parametrize("dtype", HALF, ids=str)
@pytest.mark.parametrize("rule", sorted(_ZENNIT_RULES) + sorted(_ZENNIT_COMPOSITES))
@pytest.mark.parametrize("kind", ["cnn", "mlp"])
def test_half_rule_is_zennit_in_float64_rounded_once(rule, kind, dtype):
    low, ref_model, x = _half(_cnn() if kind == "cnn" else _mlp(),
                              (3, 2, 8, 8) if kind == "cnn" else (3, 2, 4), dtype)
    target = torch.tensor([0, 2, 1])
    if rule in _ZENNIT_RULES:
        composite = zc.LayerMapComposite(zc.layer_map_base() + [(zt.Linear, _ZENNIT_RULES[rule]())])
    else:
        composite = _ZENNIT_COMPOSITES[rule]()
    ref = _zennit(ref_model, composite, x.to(DT), target)
    assert ref.abs().max() > 1e-5  # a non-trivial map
    _within(LRP(low, rule=rule).attribute(x, target=target), ref, dtype)


@pytest.mark.parametrize("dtype", HALF, ids=str)
def test_half_epsilon_lrp_is_captum_in_float64_rounded_once(dtype):
    low, ref_model = copy.deepcopy(make(Branched(fresh=True))).to(dtype), None
    ref_model = copy.deepcopy(low).to(DT)
    x, _, target = data()
    x = x.to(dtype)
    # Captum puts an epsilon step (1e-9) between a Conv and its BatchNorm, which is folded
    # here: O(1e-9) relative, far inside the bound
    ref = captum_attr.LRP(ref_model).attribute(x.to(DT), target=target)
    _within(EpsilonLRP(low).attribute(x, target=target), ref, dtype)


def _cancelling(dtype):
    """``b(relu(a(x)) + x)`` (:class:`test_lrp_rules._Residual`) with weights in steps of 1/8
    and inputs in steps of 1/128, so that float32 computes every forward value exactly;
    ``a``'s first row ignores ``x_0``, and ``h_0 = (7 k_1 - 5 k_2 + 6 k_3 + 128) / 1024``
    (``x_i = k_i / 128``) has 12 significant bits (an odd numerator above 2048), more than
    float16's 11 and bfloat16's 8; ``x_0 = -h_0`` rounded to ``dtype``, so that the sum
    ``s_0 = h_0 + x_0`` is a rounding error of ``h_0``: not zero, but zero in ``dtype``.
    Returns (the half model, its float64 twin, half inputs)."""
    gen = torch.Generator().manual_seed(3)
    model = _Residual().to(DT).eval()
    with torch.no_grad():
        for lin in (model.a, model.b):
            lin.weight.copy_(torch.randint(-8, 9, lin.weight.shape, generator=gen) / 8)
            lin.bias.copy_(torch.randint(-4, 5, lin.bias.shape, generator=gen) / 8)
        model.a.weight[0] = torch.tensor([0.0, 0.875, -0.625, 0.75])
        model.a.bias[0] = 0.125
        x = torch.tensor([[0, 127, -126, 127], [0, 125, -120, 119], [0, 121, -124, 125]],
                         dtype=DT) / 128  # numerators 2409, 2317, 2345
        x[:, 0] = -model.a(x)[:, 0].to(dtype).to(DT)
    low = copy.deepcopy(model).to(dtype)
    return low, model, x.to(dtype)


def _hand(model, x, rule, target, eps=1e-6):
    """The flat (``P(W) = 1``, no bias) or w-square (``P(W) = W^2``, ``b^2``) rule on both
    Linear layers, in float64: ``R_in = (R_out / s(P(W) 1 + P(b))) P(W)``; the sum
    ``s = h + x`` sends ``h / s(s) R_s`` to ``h`` and ``x / s(s) R_s`` to the skip
    (Zennit's ``Norm``); relevance passes the ReLU; ``R_z = f(x)`` at the target."""
    def stab(v):
        return v + eps * torch.where(v >= 0, 1.0, -1.0).to(v.dtype)

    def back(lin, r):
        w = torch.ones_like(lin.weight) if rule == "flat" else lin.weight.square()
        b = torch.zeros_like(lin.bias) if rule == "flat" else lin.bias.square()
        return (r / stab(w.sum(1) + b)) @ w

    with torch.no_grad():
        h = torch.relu(model.a(x))
        s = h + x
        z = model.b(s)
        r_z = torch.zeros_like(z)
        r_z[torch.arange(len(x)), target] = z[torch.arange(len(x)), target]
        r_s = back(model.b, r_z)
        return back(model.a, h / stab(s) * r_s) + x / stab(s) * r_s


@pytest.mark.parametrize("dtype", HALF, ids=str)
@pytest.mark.parametrize("rule", ["flat", "w_square"])
def test_flat_and_w_square_through_a_sum_half_precision_cancels(rule, dtype):
    low, model, x = _cancelling(dtype)
    with torch.no_grad():  # the construction: s_0 != 0 exactly, 0 in the model's dtype
        s = torch.relu(model.a(x.to(DT))) + x.to(DT)
        s_low = torch.relu(low.a(x)) + x
    assert (s[:, 0] != 0).all() and (s_low[:, 0] == 0).all()
    target = torch.tensor([0, 1, 0])
    ref = _hand(model, x.to(DT), rule, target)
    _within(LRP(low, rule=rule).attribute(x, target=target), ref, dtype)
