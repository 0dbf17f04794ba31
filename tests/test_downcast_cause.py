"""A model that computes part of its graph in lower precision than its inputs (issue 35):
the completeness check holds the call to the lowest dtype's tolerance and names the cast.

The pattern is EfficientViT's (timm ``efficientvit_b0``, ``LiteMLA._attn``): ReLU linear
attention computed in float32 (``q.float()``) whatever the inputs' dtype. The miss is
measured here from two forwards of the model, the tolerances by hand from the stated
formula ``max(sqrt(eps) / 2 max(1, |df|), 1000 eps max(1, |f(x)|, |f(x~)|))``; the same
module without the cast is complete to float64 rounding (the cast is the cause).
"""
import dataclasses
import warnings

import pytest
import torch
import torch.nn.functional as F
from _builders import DT
from torch import nn

from taylorattr.capture import capture
from taylorattr.methods import DeepLift, DeepLiftShap
from taylorattr.methods.layerwise import DEEPLIFT_RESCALE, get_plan
from taylorattr.runtime.completeness import (
    CompletenessError,
    CompletenessWarning,
    check_total,
    downcasts,
    lowest_dtype,
)

TARGET = 0


class LinearAttention(nn.Module):
    """``out = q (k^T v) / (q k^T 1 + 1e-15)`` over the pixels of a 3x3 convolution (``q, k``
    through ReLU), computed in ``compute`` (None: the inputs' dtype) and cast back,
    averaged over the pixels, a linear head: timm's ``LiteMLA._attn``."""

    def __init__(self, compute=None):
        super().__init__()
        self.qkv = nn.Conv2d(3, 24, 3, padding=1)
        self.head = nn.Linear(8, 4)
        self.compute = compute

    def forward(self, x):
        q, k, v = self.qkv(x).flatten(2).transpose(1, 2).chunk(3, -1)
        q, k = torch.relu(q), torch.relu(k)
        v = F.pad(v, (0, 1), value=1.0)
        if self.compute is not None:
            q, k, v = q.to(self.compute), k.to(self.compute), v.to(self.compute)
        out = q @ (k.transpose(-1, -2) @ v)
        out = (out[..., :-1] / (out[..., -1:] + 1e-15)).to(x.dtype)
        return self.head(out.mean(1))


def _model(compute):
    torch.manual_seed(1)  # the same weights with and without the cast
    with torch.device("cpu"):  # and on every device (the CPU's draws), then moved
        model = LinearAttention(compute).to(DT).eval()
    return model.to(torch.get_default_device())


def _data():
    g = torch.Generator().manual_seed(1)
    return torch.randn(2, 3, 8, 8, dtype=DT, generator=g), torch.zeros(2, 3, 8, 8, dtype=DT)


def _measured(model, x, base, a, dtype):
    """``(miss, tol)``: the miss from two model forwards, the tolerance of ``dtype``."""
    with torch.no_grad():
        fx, fb = model(x)[:, TARGET], model(base)[:, TARGET]
    miss = (a.reshape(a.shape[0], -1).sum(1) - (fx - fb)).abs()
    eps = torch.finfo(dtype).eps
    scale = torch.stack([torch.ones_like(fx), fx.abs(), fb.abs()]).amax(0)
    return miss, torch.maximum(eps ** 0.5 / 2 * (fx - fb).abs().clamp(min=1), 1000 * eps * scale)


def _quiet(method, x, base, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("error", CompletenessWarning)
        return method.attribute(x, base, target=TARGET, **kw)


def test_a_float32_region_beyond_float64s_tolerance_warns_naming_the_cast():
    """A float64 call promises float64's completeness: the model's own float32 rounding
    (far within float32's tolerance, beyond float64's) is not silent; the warning names
    the cast as the cause."""
    x, base = _data()
    plain = _model(None)
    a = _quiet(DeepLift(plain), x, base)
    assert (_measured(plain, x, base, a, DT)[0] < 1e-14).all()  # no cast: complete
    model = _model(torch.float32)
    with pytest.warns(CompletenessWarning, match="likely cause: the model computes in float32, "
                                                 "not in float64: it casts float64 to float32"):
        a, delta = DeepLift(model).attribute(x, base, target=TARGET,
                                             return_convergence_delta=True)
    miss, tol64 = _measured(model, x, base, a, DT)
    _, tol32 = _measured(model, x, base, a, torch.float32)
    assert (miss > tol64).all()  # the float32 rounding: beyond float64's tolerance
    assert (miss < tol32 / 100).all()  # far within float32's
    torch.testing.assert_close(delta.abs(), miss, rtol=0, atol=1e-15)
    casts = downcasts(get_plan(model, DEEPLIFT_RESCALE, x).core, DT)
    assert [(c.op, c.source, c.dtype) for c in casts] == \
        [("aten._to_copy.default", DT, torch.float32)] * 3  # q, k, v; not the cast back
    assert all("LinearAttention" in c.at and "test_downcast_cause.py" in c.at for c in casts)


def test_a_miss_beyond_the_lower_precision_names_the_cast():
    x, base = _data()
    model = _model(torch.float32)

    class Broken(DeepLift):  # a miss of 1 % of the change, beyond float32's rounding
        def _attribute(self, *args, **kwargs):
            done = super()._attribute(*args, **kwargs)
            return dataclasses.replace(done, attributions=done.attributions * 1.01)

    with pytest.warns(CompletenessWarning) as caught:
        a = Broken(model).attribute(x, base, target=TARGET)
    miss, tol32 = _measured(model, x, base, a, torch.float32)
    _, tol64 = _measured(model, x, base, a, DT)
    assert (miss > tol32).all()
    message = str(caught[0].message)
    worst = int(miss.argmax())
    with torch.no_grad():
        df = model(x)[worst, TARGET] - model(base)[worst, TARGET]
    assert f"sum(a) - (f(x) - f(x~)) = {float(a[worst].sum() - df):.3g} where f(x) - f(x~) = " \
           f"{float(df):.3g}" in message
    assert f"(tolerance {float(tol64[worst]):.2g} for float64; the model computes in float32 " \
           "in part)" in message
    assert "likely cause: the model computes in float32, not in float64: it casts float64 to " \
           "float32 at (model) (LinearAttention)" in message
    assert "(aten._to_copy.default) (2 more cast(s) below float64)" in message
    assert "; otherwise: an operation whose rule is not exact" in message
    with pytest.raises(CompletenessError, match="casts float64 to float32"):
        Broken(model).attribute(x, base, target=TARGET, strict=True)


class Chain(nn.Module):
    """float64 -> float32 -> bfloat16 -> back to float64, times a weight."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.full((4,), 0.5, dtype=DT))

    def forward(self, x):
        return (torch.tanh(x.float()).bfloat16().double() * self.w).sum(1, keepdim=True)


def test_downcasts_lists_every_cast_below_the_inputs_dtype_and_the_lowest():
    x = torch.ones(2, 4, dtype=DT)
    graph = capture(Chain(), (x,))
    found = [(c.source, c.dtype) for c in downcasts(graph, DT)]
    assert found == [(DT, torch.float32), (torch.float32, torch.bfloat16)]
    assert lowest_dtype(DT, downcasts(graph, DT)) == torch.bfloat16
    # measured against float32 inputs only the cast to bfloat16 is below them
    assert [(c.source, c.dtype) for c in downcasts(graph, torch.float32)] == \
        [(torch.float32, torch.bfloat16)]
    assert downcasts(graph, torch.bfloat16) == ()


def test_deeplift_shap_reads_the_casts_of_its_deeplift_passes():
    x, _ = _data()
    model = _model(torch.float32)
    refs = 0.3 * torch.randn(3, 3, 8, 8, dtype=DT, generator=torch.Generator().manual_seed(2))
    with pytest.warns(CompletenessWarning, match="it casts float64 to float32"):
        a = DeepLiftShap(model).attribute(x, refs, target=TARGET)
    with torch.no_grad():
        fx, fr = model(x)[:, TARGET], model(refs)[:, TARGET].mean()
    miss = (a.reshape(2, -1).sum(1) - (fx - fr)).abs()
    eps64, eps32 = torch.finfo(DT).eps, torch.finfo(torch.float32).eps
    assert (miss > eps64 ** 0.5 / 2).any() and (miss < eps32 ** 0.5 / 200).all()


def test_a_share_check_is_held_to_the_graphs_lowest_dtype():
    """:func:`check_total` (Taylor attribution's share check) with a graph's cast to
    float32: a miss of 1e-4 (beyond float64's tolerance 7.5e-9, within float32's
    ``sqrt(2^-23) / 2 = 1.7e-4``) is silent with it and warns without; a miss of 0.1 warns
    naming the cast."""
    casts = downcasts(capture(Chain(), (torch.ones(2, 4, dtype=DT),)), DT)[:1]
    assert [(c.source, c.dtype) for c in casts] == [(DT, torch.float32)]
    attr = torch.tensor([[0.5, 0.5]], dtype=DT)
    total = torch.tensor([1.0 - 1e-4], dtype=DT)
    with warnings.catch_warnings():
        warnings.simplefilter("error", CompletenessWarning)
        check_total(attr, total, "shares", "a cause", casts=casts)
    with pytest.warns(CompletenessWarning, match=r"tolerance 7\.5e-09 for float64\); likely "
                                                 "cause: a cause"):
        check_total(attr, total, "shares", "a cause")
    with pytest.raises(CompletenessError, match=r"tolerance 0\.00017 for float32.*casts "
                                                r"float64 to float32 at.*otherwise: a cause"):
        check_total(attr, total * 0.9, "shares", "a cause", strict=True, casts=casts)
