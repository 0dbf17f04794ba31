"""DeepLIFT and DeepLiftShap in half precision (issue 34): a float16/bfloat16 model's pass
runs in float32 and the attributions are rounded once to the model's dtype.

Independent routes, in float64 on the half model's own (rounded) weights and inputs:
Captum's ``DeepLift`` on the residual CNN of :mod:`test_layerwise_cnn` (its ``fresh``
variant, on which Captum is complete), and on the small ViT of :mod:`test_layerwise_zoo`
(LayerNorm, softmax attention, GELU: Captum is incomplete there) this library's float64
DeepLIFT, itself checked against Captum, Rescale by hand and completeness to 1e-10 in
float64 by those modules.

Tolerance: :func:`test_lrp_half._within`, one rounding of the float32 result to the half
type, ``u max(|ref|, tiny)`` (``u = eps / 2``: 2^-8 bfloat16, 2^-11 float16), plus the
float32 pass's own rounding, ``64 eps_32 max|ref|``.

The completeness check is judged at the pass's float32 values, so the returned delta is
float32 rounding: ``|delta| <= 1000 eps_32 max(1, |df|)`` (the check's float32 rounding
term, :mod:`taylorattr.runtime.completeness`), ``df`` from the float64 model. In the half
model's own arithmetic it was 1.1e-2 (bfloat16) on the CNN.
"""
from __future__ import annotations

import copy

import pytest
import torch
from _builders import DT, normal
from captum import attr as captum_attr
from test_layerwise_cnn import ResNetLike, data, make
from test_layerwise_zoo import TinyViT
from test_lrp_half import EPS32, HALF, _within

from taylorattr.methods import DeepLift, DeepLiftShap
from taylorattr.runtime.completeness import COMPLETENESS_FACTOR


def _case(kind, dtype):
    """(the half model, its float64 twin with the same rounded weights, half inputs, half
    baselines, targets)."""
    if kind == "resnet":
        model, (x, base, t) = make(ResNetLike(fresh=True)), data()
    else:
        model, t = TinyViT().to(DT).eval(), torch.tensor([0, 1, 4])
        x, base = normal((3, 3, 8, 8), seed=9), 0.3 * normal((3, 3, 8, 8), seed=10)
    low = copy.deepcopy(model).to(dtype)
    return low, copy.deepcopy(low).to(DT), x.to(dtype), base.to(dtype), t


def _reference(kind, model, x, base, t):
    if kind == "resnet":  # Captum's DeepLift in float64
        return captum_attr.DeepLift(model).attribute(x, base, target=t)
    return DeepLift(model).attribute(x, base, target=t)


def _delta_within_float32(delta, model, x, base, t, dtype):
    assert delta.dtype == dtype
    with torch.no_grad():
        df = (model(x.to(DT)) - model(base.to(DT))).gather(1, t[:, None])[:, 0]
    assert (delta.double().abs() <= COMPLETENESS_FACTOR * EPS32 * df.abs().clamp(min=1)).all()


@pytest.mark.parametrize("dtype", HALF, ids=str)
@pytest.mark.parametrize("kind", ["resnet", "vit"])
def test_half_deeplift_is_float64_rounded_once(kind, dtype):
    low, model, x, base, t = _case(kind, dtype)
    ref = _reference(kind, model, x.to(DT), base.to(DT), t)
    assert ref.abs().max() > 1e-3  # a non-trivial map
    ours, delta = DeepLift(low).attribute(x, base, target=t, return_convergence_delta=True,
                                          strict=True)
    _within(ours, ref, dtype)
    _delta_within_float32(delta, model, x, base, t, dtype)


@pytest.mark.parametrize("dtype", HALF, ids=str)
@pytest.mark.parametrize("kind", ["resnet", "vit"])
def test_half_deeplift_shap_is_float64_rounded_once(kind, dtype):
    low, model, x, base, t = _case(kind, dtype)
    refs = base[:2]  # every sample against both references
    if kind == "resnet":
        ref = captum_attr.DeepLiftShap(model).attribute(x.to(DT), refs.to(DT), target=t)
    else:  # the mean of float64 DeepLIFT over the references
        ref = sum(_reference(kind, model, x.to(DT), r.to(DT).expand_as(x), t)
                  for r in refs) / len(refs)
    ours, delta = DeepLiftShap(low).attribute(x, refs, target=t,
                                              return_convergence_delta=True, strict=True)
    _within(ours, ref, dtype)
    assert delta.dtype == dtype and (delta.double().abs() <= COMPLETENESS_FACTOR * EPS32).all()
