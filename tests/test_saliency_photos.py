"""Figure 5's photos row: Taylor panels of the smoothed network (as ``explain``), the class
name in the title, refusals that give the model's own reason.

The bundled EfficientNet-Lite0 at 224 px is replaced by a small ReLU6 CNN of the same
wrapper (:class:`taylorattr.models.ImageClassifier`) so the row is built in seconds; the
maps are checked against the methods run directly on ``ta.smooth(net, "auto")``.
"""
import numpy as np
import pytest
import torch
from torch import nn

import taylorattr as ta
from taylorattr import data, models
from taylorattr.experiments import saliency
from taylorattr.experiments._units import UnitStore
from taylorattr.models.pretrained import ImageClassifier


def _tiny_lite():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(3, 4, 3, stride=2), nn.ReLU6(), nn.Conv2d(4, 4, 3),
                        nn.ReLU6(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4, 1000))
    names = [f"class-{i}" for i in range(1000)]
    return ImageClassifier(net, (0.5,) * 3, (0.25,) * 3, names, size=16, resize=18).eval()


@pytest.fixture
def tiny_row(monkeypatch, tmp_path):
    model = _tiny_lite()
    rng = np.random.default_rng(0)
    photo = rng.integers(0, 256, (24, 24, 3), dtype=np.uint8)
    monkeypatch.setattr(models, "efficientnet_lite0", lambda: model)
    monkeypatch.setattr(data, "sample_photos", lambda: [("camera", photo)])
    methods = [m for m in saliency.saliency_methods(4, 4, 2)
               if m.label in ("GI", "DL", "Taylor-1", "Taylor-2")]
    (panel,) = saliency._photo_panels(UnitStore(tmp_path), methods, ("camera",))
    return model, model.preprocess(photo), methods, panel


def test_photo_taylor_panels_are_those_of_the_smoothed_network(tiny_row):
    model, x, _, panel = tiny_row
    target = int(model(x).argmax())
    smoothed = ta.smooth(model, "auto", inputs=x)
    assert panel.predicted.startswith(f"EfficientNet-Lite0: class-{target}\n")
    title = " ".join(panel.predicted.split())  # wrapped onto lines
    assert f"beta = {smoothed.beta:g}" in title
    assert f"output gap {smoothed.output_gap:.2g}" in title
    # the panels' maps are stored units, kept on the CPU: the direct maps are compared there
    for order in (1, 2):
        direct = ta.TaylorAttribution(smoothed).attribute(x, 0.0, target=target, order=order)
        torch.testing.assert_close(panel.maps[f"Taylor-{order}"], direct[0].sum(0).float().cpu())
    gi = ta.GradientInput(model).attribute(x, target=target)[0].sum(0).float().cpu()
    torch.testing.assert_close(panel.maps["GI"], gi)
    assert (panel.maps["Taylor-1"] - gi).abs().max() > 1e-4  # not Gradient*Input any more
    dl = ta.DeepLift(model).attribute(x, 0.0, target=target)[0].sum(0).float().cpu()
    torch.testing.assert_close(panel.maps["DL"], dl)


def test_a_refusal_gives_the_models_own_reason():
    try:
        from taylorattr._validation import model_output

        model_output(lambda t: t.view(3, -1) @ torch.ones(5, 2), torch.ones(2, 4),
                     name="model (at the baselines)")
    except ValueError as exc:
        reason = saliency.refusal_reason(exc)
    assert reason.startswith("RuntimeError: ")
    assert "shape" in reason and "expects?" not in reason
    assert saliency.refusal_reason(ValueError("plain\nsecond")) == "plain"
