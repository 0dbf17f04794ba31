"""Progress inside long units, and the ImageNet route's patch scale (issue 20).

Routes: the bar's updates against the number of chunks computed here from the chunk size
(occlusion's windows per call, the square-removal sets per call); attributions with and
without the bar compared bitwise; the scaled variants against the methods called directly
with the scaled windows, and the route's table row against the metric on those.
"""
from __future__ import annotations

import io
import math
from typing import ClassVar

import pytest
import torch
import tqdm.auto
from _imagenet import write_folder
from torch import nn
from tqdm import std

from taylorattr import data as D
from taylorattr import models as M
from taylorattr.baselines import Point
from taylorattr.experiments import assessment as A
from taylorattr.experiments.assessment import infidelity as AI
from taylorattr.experiments.assessment import localisation as AL
from taylorattr.experiments.assessment.formatting import format_assessment
from taylorattr.experiments.assessment.stage import Stage
from taylorattr.experiments.workspace import Workspace
from taylorattr.metrics import bbox_accuracy
from taylorattr.registry import METHODS


class Recorder(std.tqdm):
    """A tqdm that writes nowhere and keeps every bar with its updates."""

    bars: ClassVar[list] = []

    def __init__(self, *args, **kwargs):
        kwargs["file"] = io.StringIO()
        super().__init__(*args, **kwargs)
        self.updates, self.leave_arg = [], kwargs.get("leave", True)
        self.shown = not kwargs.get("disable", False)
        Recorder.bars.append(self)

    def update(self, n=1):
        self.updates.append(n)
        return super().update(n)


@pytest.fixture
def recorder(monkeypatch):
    Recorder.bars = []
    monkeypatch.setattr(tqdm.auto, "tqdm", Recorder)
    return Recorder


def tiny_cnn(channels=1, classes=4, seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Conv2d(channels, 3, 3, padding=1), nn.Softplus(),
                         nn.AdaptiveAvgPool2d(4), nn.Flatten(), nn.Linear(48, classes)).eval()


# ------------------------------------------------------------------ bars per chunk
def test_a_long_unit_moves_its_bar_once_per_chunk(recorder):
    model, x = tiny_cnn(), torch.rand(2, 1, 12, 12)
    rows_per_call = 6
    method = METHODS["occlusion_patch"].bind(patch=2, perturbations_per_eval=rows_per_call)
    target = model(x).argmax(1)
    attr = Stage.attribute(method, model, x, target, Point(0.0), True, "bbox tiny")
    assert isinstance(attr, torch.Tensor)
    (bar,) = recorder.bars
    windows = (12 // 2) ** 2
    # whole runs over the batch: rows_per_call // batch windows per call
    chunks = math.ceil(windows / (rows_per_call // x.shape[0]))
    assert len(bar.updates) == 1 + chunks  # the forward of x, then one update per chunk
    assert bar.total == x.shape[0] * (windows + 1) == sum(bar.updates)
    assert bar.desc.startswith("bbox tiny: Occ-2x2") and bar.leave_arg is False


def test_no_bar_without_progress(recorder):
    model, x = tiny_cnn(), torch.rand(2, 1, 12, 12)
    Stage.attribute(METHODS["occlusion_1"].bind(), model, x, torch.tensor([0, 1]), Point(0.0))
    assert recorder.bars == []


def test_the_square_removals_move_their_bar_once_per_chunk(recorder):
    model, x = tiny_cnn(), torch.rand(2, 1, 12, 12)
    target = torch.tensor([0, 3])
    quiet = AI.square_output_changes(model, x, target, batch_size=64)
    shown = AI.square_output_changes(model, x, target, batch_size=64, show_progress=True,
                                     desc="infidelity tiny: square removals")
    assert torch.equal(quiet, shown)
    squares = sum((12 - s + 1) ** 2 for s in range(1, 11))
    (bar,) = [b for b in recorder.bars if b.shown]
    assert len(bar.updates) == math.ceil(squares / (64 // x.shape[0]))
    assert bar.total == sum(bar.updates) == x.shape[0] * squares
    assert bar.desc.startswith("infidelity tiny") and bar.leave_arg is False


@pytest.mark.parametrize("name,settings", [
    ("occlusion_1", {}),
    ("occlusion_patch", {"patch": 3}),
    ("integrated_gradients", {"n_steps": 8}),
    ("shapley", {"patch": 4, "method": "sampling", "n_samples": 3, "seed": 1}),
    ("kernel_shap", {"patch": 4, "n_samples": 20, "seed": 1}),
    ("expected_gradients", {"noise_std": 0.2, "n_samples": 4, "seed": 1}),
])
def test_the_bar_changes_no_bit(recorder, name, settings):
    model, x = tiny_cnn(), torch.rand(2, 1, 12, 12)
    method = METHODS[name].bind(**settings)
    plain = method(model, x, Point(0.0), torch.tensor([1, 2]))
    shown = method(model, x, Point(0.0), torch.tensor([1, 2]), show_progress=True, desc="unit")
    assert torch.equal(plain, shown)
    assert [b.desc for b in recorder.bars] == [f"unit: {method.label}"]


def test_show_progress_is_checked():
    with pytest.raises(TypeError, match="show_progress"):
        METHODS["occlusion_1"].bind()(tiny_cnn(), torch.rand(1, 1, 12, 12), show_progress=1)


# ------------------------------------------------------------------ the ImageNet route
def _folder(tmp_path):
    return write_folder(tmp_path / "val", [("a", "n01440764", (10, 12, 30, 34)),
                                           ("c", "n01443537", (36, 20, 60, 44))],
                        width=72, height=64)


def test_scaled_variants_equal_the_scaled_windows():
    model, x = tiny_cnn(3, 10), torch.rand(2, 3, 24, 24)
    t = model(x).argmax(1)
    occ2, occ1, shap = (METHODS["occlusion_patch"].bind("Occ-{patch}x{patch}"),
                        METHODS["occlusion_1"].bind(), METHODS["shapley"].bind("Shapley-4x4"))
    ig = METHODS["integrated_gradients"].bind(n_steps=4)
    s2, s1, ss, sig = AL.scale_patches([occ2, occ1, shap, ig], 3)
    assert (s2.label, s1.label, ss.label) == ("Occ-2x2", "Occ-1", "Shapley-4x4")
    assert (s2.settings["patch"], s1.settings["patch"], ss.settings["patch"]) == (6, 3, 12)
    assert sig is ig  # no window setting: unchanged
    assert torch.equal(s2(model, x, Point(0.0), t), METHODS["occlusion_patch"](
        model, x, target=t, patch=6))
    assert torch.equal(s1(model, x, Point(0.0), t), METHODS["occlusion_patch"](
        model, x, target=t, patch=3))
    assert AL.scale_patches([occ1], 1)[0] is occ1


def test_imagenet_route_runs_the_scaled_windows(tmp_path, monkeypatch):
    folder = _folder(tmp_path)
    net = tiny_cnn(3, 1000).cpu()  # the automatic scale of a CPU model, on every device
    monkeypatch.setattr(M, "torchvision_model", lambda name, path: net)
    route = A.ImagenetRoute(folder, {"resnet18": tmp_path / "unused.pt"}, (64, 56))
    assert route.resolved_patch_scale("cpu") == 2 and route.resolved_patch_scale("cuda") == 1
    r = A.run_assessment(Workspace(tmp_path / "out", epochs=0, progress=False),
                         experiments=("bbox",), models={"bbox": ()},
                         methods=("Occ-1", "Occ-2x2"), n_samples=2, batch_size=2,
                         principle_counts={"Occ-1": 0.5, "Occ-2x2": 0.5}, imagenet=route,
                         plots=False)
    info = r.settings["imagenet"]
    assert info["patch_scale"] == 2 and info["patch_scale_source"] == "automatic (cpu)"
    assert info["windows"] == {"Occ-1": {"patch": 2}, "Occ-2x2": {"patch": 4}}
    assert info["rows_per_image"] == {"Occ-1": 1 + 28 * 28, "Occ-2x2": 1 + 14 * 14}
    assert info["gpu_scale"] == []
    rows = {row["method"]: row for row in r.bbox}
    assert rows["Occ-2x2"]["note"] == "patch scale 2: patch=4"
    text = format_assessment(r)
    assert "ImageNet route: patch scale 2 (automatic (cpu))" in text
    assert "Occ-1 785" in text

    # independent route: the dataset, the black baseline and occlusion with 4x4 windows
    ds = D.ImageFolderWithBoxes(folder, size=56, resize=64)
    x = torch.stack([ds[i][0] for i in range(2)])
    masks = torch.stack([ds[i][1] for i in range(2)])
    black = -torch.tensor(D.IMAGENET_MEAN, device="cpu").view(1, 3, 1, 1) / torch.tensor(
        D.IMAGENET_STD, device="cpu").view(1, 3, 1, 1)
    t = net(x).argmax(1)
    for label, patch in (("Occ-2x2", 4), ("Occ-1", 2)):
        a = METHODS["occlusion_patch"](net, x, baselines=black, target=t, patch=patch)
        assert rows[label]["bbox_accuracy"] == pytest.approx(
            float(bbox_accuracy(a.double(), masks).mean()), rel=1e-6)


def test_pixel_level_on_a_cpu_is_flagged_gpu_scale():
    route = A.ImagenetRoute(".", {"resnet18": "w.pt"}, patch_scale=1)

    class _Stage:
        methods: ClassVar[list] = [METHODS["occlusion_1"].bind(),
                                   METHODS["integrated_gradients"].bind(n_steps=4)]

    result = A.AssessmentResult()
    x = torch.zeros(1, 3, 224, 224, device="cpu")  # on a CPU, whatever the default device
    AL._scaled_methods(_Stage, route, tiny_cnn(3, 1000).cpu(), x, Point(0.0), result)
    info = result.settings["imagenet"]
    assert info["gpu_scale"] == ["Occ-1"] and info["rows_per_image"]["Occ-1"] == 224 * 224 + 1
    assert "Occ-1" in AL._window_notes(info) and "GPU-scale" in AL._window_notes(info)["Occ-1"]


@pytest.mark.parametrize("bad", [0, -1, 2.0, True, "8"])
def test_patch_scale_is_checked(bad):
    with pytest.raises(ValueError, match="patch_scale must be None"):
        A.ImagenetRoute(".", {"resnet18": "w.pt"}, patch_scale=bad)


def test_cli_passes_the_patch_scale(tmp_path, monkeypatch):
    from taylorattr import cli

    weights = tmp_path / "resnet18.pt"
    weights.write_bytes(b"")
    seen = {}
    monkeypatch.setattr(A, "run_assessment", lambda ws, **kw: seen.update(kw)
                        or A.AssessmentResult())
    monkeypatch.setattr(A, "format_assessment", lambda result: "table")
    argv = ["assess", "--experiment", "bbox", "--imagenet-dir", str(tmp_path), "--weights",
            f"resnet18={weights}", "--out", str(tmp_path / "out"), "--budget", "none"]
    assert cli.main(argv + ["--imagenet-patch-scale", "4"]) == 0
    assert seen["imagenet"].patch_scale == 4
    assert cli.main(argv) == 0 and seen["imagenet"].patch_scale is None
    with pytest.raises(SystemExit):
        cli.main(argv + ["--imagenet-patch-scale", "0"])
    with pytest.raises(SystemExit):
        cli.main(["assess", "--imagenet-patch-scale", "2"])


@pytest.mark.parametrize("name", ["deeplift", "deeplift_shap", "lrp_z_plus"])
def test_layerwise_engines_move_the_bar_per_plan_run(recorder, name):
    """The layer-wise rules run a traced plan of the model's modules, not its forward: the
    bar then moves at each run of the plan, by the rows the method counts
    for its forward passes (its cost, computed without running it)."""

    model, x = tiny_cnn(), torch.rand(2, 1, 12, 12)
    method = METHODS[name].bind()
    attr = Stage.attribute(method, model, x, torch.tensor([0, 1]), Point(0.0), True, "t")
    assert isinstance(attr, torch.Tensor)
    (bar,) = recorder.bars
    assert len(bar.updates) >= 2  # the forward of x, then the plan's passes
    assert sum(bar.updates) == bar.total == method.cost(model, x).forward_rows
