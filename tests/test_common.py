"""Common checks for every registered method and variant (as scikit-learn checks every
estimator): a method registered tomorrow is covered here without editing this file.

The checks are :mod:`taylorattr.testing`'s (what ``check_method(MyMethod)`` runs on a
user's own method): for each ``(method, variant)`` of :data:`taylorattr.registry.METHODS`,
bound at cheap settings on small float64 models, the attributions keep the inputs' shape,
dtype (float32 and float64) and device (``TAYLORATTR_DEVICE``) and are finite; two equal
calls agree bit for bit; the rows run equal the declared cost; a method that claims
completeness has no convergence delta; malformed inputs, targets, baselines, an unknown
option and wrongly typed options are refused naming the argument; tuple inputs give a
tuple or a clear refusal. One test per named check (``parametrize_with_checks``).

Below them, every variant on bfloat16 ResNet-18 / ViT-Tiny stays near float32.
The number of variants checked is printed at the end of the run.
"""
from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import taylorattr.paper_methods  # noqa: F401 (the application's variants are registered entries too)
from taylorattr.methods import UnsupportedModelError
from taylorattr.registry import METHODS
from taylorattr.testing import _bind, method_checks, parametrize_with_checks

VARIANTS = [(spec.name, i) for spec in METHODS.values() for i in range(len(spec.variants))]
IDS = [f"{name}-{METHODS[name].variants[i].label}" for name, i in VARIANTS]


@pytest.fixture(scope="module", autouse=True)
def _announce(request):
    request.config.common_variants = len(VARIANTS)  # printed by conftest's summary


@parametrize_with_checks(METHODS.values())
def test_common_check(check):
    check()


def test_every_registered_entry_is_checked():
    """Every registry row has its checks (LayerConductance, whose attributions are a
    layer's, checked at the model's input), and the complete ones their ``complete``."""
    checked = {c.method.split("[")[0] for c in method_checks_all()}
    assert checked == set(METHODS) and "layer_conductance" in checked
    complete = {c.method.split("[")[0] for c in method_checks_all() if c.name == "complete"}
    assert {"deeplift", "deeplift_shap", "shapley"} <= complete
    assert complete == {n for n, s in METHODS.items() if s.complete or s.cls.complete}


def method_checks_all():
    return [c for spec in METHODS.values() for c in method_checks(spec)]


# ---------------------------------------------------------------- half precision (issue 34)
#: bfloat16's machine epsilon: 8 significant bits
BF16_EPS = torch.finfo(torch.bfloat16).eps  # 2^-7


def _resnet18():
    import torchvision

    torch.manual_seed(0)
    m = torchvision.models.resnet18(num_classes=10).train()
    with torch.no_grad():  # calibrate batch norm on random images (random weights)
        for _ in range(3):
            m(torch.randn(8, 3, 16, 16))
    return m.eval()


def _vit_tiny():
    import timm

    torch.manual_seed(0)
    return timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=16,
                             patch_size=8, num_classes=10).eval()


_HALF_MODELS = {"resnet18": _resnet18, "vit_tiny": _vit_tiny}
_half_cache: dict = {}


def _half_pair(name):
    """(float32 model, bfloat16 model, bfloat16 inputs, targets): the float32 model holds
    the bfloat16 model's rounded weights, so the two differ only in the arithmetic."""
    if name not in _half_cache:
        m32 = _HALF_MODELS[name]()
        mb = copy.deepcopy(m32).bfloat16()
        m32.load_state_dict({k: v.float() for k, v in mb.state_dict().items()})
        x = torch.randn(2, 3, 16, 16, generator=torch.Generator().manual_seed(1)).bfloat16()
        with torch.no_grad():
            t = m32(x.float()).argmax(1)
        _half_cache[name] = (m32, mb, x, t)
    return _half_cache[name]


@pytest.mark.slow
@pytest.mark.parametrize("model_name", list(_HALF_MODELS))
@pytest.mark.parametrize("name,i", VARIANTS, ids=IDS)
def test_bfloat16_models_run_and_stay_near_float32(name, i, model_name):
    """Every variant on a bfloat16 ResNet-18 / ViT-Tiny (random weights, 3x16x16 inputs)
    returns bfloat16 attributions within ``L * eps`` of the same variant in float32 on the
    same rounded weights and inputs, ``L`` the model's Linear/Conv layers and ``eps`` =
    2^-7 bfloat16's epsilon: each layer rounds its outputs to bfloat16 (relative error
    <= eps), and to first order these errors add up over the layers. The error is measured
    against the larger of the attribution's scale and the output's, ``max |a_32|`` and
    ``max |f_32(x)|``: a gradient carries relative error, a difference of outputs
    (occlusion, Shapley, LIME) the outputs' absolute error. A variant that refuses the
    float32 model refuses the bfloat16 one alike."""
    m32, mb, x, t = _half_pair(model_name)
    spec = METHODS[name]
    variant = spec.variants[i]
    try:
        a32 = _bind(spec, variant, m32, torch.float32)(m32, x.float(), 0.0, t)
    except (TypeError, ValueError, UnsupportedModelError) as err:
        with pytest.raises(type(err)):
            _bind(spec, variant, mb, torch.bfloat16)(mb, x, 0.0, t)
        return
    ab = _bind(spec, variant, mb, torch.bfloat16)(mb, x, 0.0, t)
    assert ab.dtype == torch.bfloat16 and ab.shape == x.shape and torch.isfinite(ab).all()
    with torch.no_grad():
        f_scale = m32(x.float()).abs().max()
    layers = sum(isinstance(m, (nn.Linear, nn.Conv2d)) for m in m32.modules())
    err = (ab.float() - a32).abs().max() / torch.maximum(a32.abs().max(), f_scale)
    assert err <= layers * BF16_EPS, f"{float(err):.3g} > {layers} x {BF16_EPS}"
