"""Tests of taylorattr.reporting.plotting: figures are written, are valid PNGs, and only consume rows."""
from __future__ import annotations

import copy
import re

import matplotlib
import pytest
from conftest import device_tolerance
from PIL import Image

from taylorattr.reporting.plotting import plot_trend

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def rows(metric="infidelity"):
    out = []
    counts = {"GI": 0.0, "Occ-1": 1.0, "Occ-2x2": 0.0, "DL": 1.5, "IG": 2.0, "EG": 3.0}
    for k, model in enumerate(("M-sg", "C-sg", "C-sp")):
        for j, (method, x) in enumerate(counts.items()):
            out.append({"model": model, "method": method, "principles": x,
                        metric: 10.0 ** (k - 1) * (1 + j)})
    return out


def check_png(path):
    data = path.read_bytes()
    assert len(data) > 1000 and data[:8] == PNG_SIGNATURE
    with Image.open(path) as img:
        img.verify()
    with Image.open(path) as img:
        assert img.format == "PNG" and img.size[0] > 100 and img.size[1] > 100


def test_trend_plot_is_a_png(tmp_path):
    out = plot_trend(rows(), "infidelity", tmp_path / "sub" / "fig3.png", title="Figure 3")
    assert out == tmp_path / "sub" / "fig3.png"
    check_png(out)


def test_unsupported_rows_are_left_out(tmp_path):
    r = rows("bbox_accuracy")
    r[3]["bbox_accuracy"] = None            # an unsupported method
    r[4]["bbox_accuracy"] = float("nan")
    r[5]["principles"] = None               # no count known
    check_png(plot_trend(r, "bbox_accuracy", tmp_path / "fig4.png", logy=False))


def test_unknown_methods_get_markers_and_scales(tmp_path):
    r = [{"model": "m", "method": name, "principles": float(i), "score": 0.1 * (i + 1)}
         for i, name in enumerate(["A", "B", "GI"])]
    check_png(plot_trend(r, "score", tmp_path / "a.png", logy=True))
    check_png(plot_trend(r, "score", tmp_path / "b.png", x="principles", ylabel="score"))


def test_nothing_to_plot_raises(tmp_path):
    with pytest.raises(ValueError, match="no row"):
        plot_trend([{"model": "m", "method": "GI", "principles": 0, "infidelity": None}],
                   "infidelity", tmp_path / "x.png")
    assert not (tmp_path / "x.png").exists()


def test_backend_and_rows_are_left_alone(tmp_path):
    before, r = matplotlib.get_backend(), rows()
    snapshot = copy.deepcopy(r)
    plot_trend(r, "infidelity", tmp_path / "f.png")
    assert matplotlib.get_backend() == before
    assert r == snapshot  # plotting only consumes the rows


# ------------------------------------------------------------------ saliency grids, explain
import numpy as np
import torch
from torch import nn

from taylorattr import cli
from taylorattr.experiments import explain as E
from taylorattr.models import ImageClassifier
from taylorattr.reporting.plotting import draw_saliency_grid, signed_map


def tiny_classifier(activation) -> ImageClassifier:
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), activation, nn.AvgPool2d(4), nn.Flatten(),
                        nn.Linear(4 * 4 * 4, 3))
    return ImageClassifier(net, (0.5, 0.5, 0.5), (0.25, 0.25, 0.25), ["ant", "bee", "cat"],
                           size=16, resize=16, name="tiny").eval()


def photo(path):
    gen = torch.Generator().manual_seed(1)
    pixels = (torch.rand(16, 16, 3, generator=gen) * 255).to(torch.uint8).cpu().numpy()
    Image.fromarray(pixels).save(path)
    return path


def fast(tmp_path, model, **kw):
    return E.explain(photo(tmp_path / "img.png"), model=model, out_dir=tmp_path / "out", patch=4,
                     ig_steps=4, eg_samples=4, **kw)


@pytest.mark.parametrize("sign", ["all", "positive", "negative", "abs"])
def test_signed_map_matches_numpy(sign):
    a = torch.randn(5, 6, generator=torch.Generator().manual_seed(2))
    a_np = a.cpu().numpy()
    ref = {"all": a_np, "positive": np.maximum(a_np, 0),
           "negative": np.minimum(a_np, 0), "abs": np.abs(a_np)}[sign]
    assert np.array_equal(signed_map(a, sign).numpy(), ref)


def test_explain_smooth_model_maps_titles_colour_bar_and_saved_maps(tmp_path):
    model = tiny_classifier(nn.Softplus())
    r = fast(tmp_path, model, save_maps=True, overlay=True)
    # the explained class and its probability, from an independent forward pass
    x = model.preprocess(np.asarray(Image.open(tmp_path / "img.png").convert("RGB")))
    with torch.no_grad():
        probs = torch.softmax(model(x), 1)[0]
    assert r.target == int(probs.argmax()) and not r.chosen
    assert r.probability == pytest.approx(float(probs[r.target]))
    # GI from float64 autograd, channels summed
    x = x.double().requires_grad_(True)
    copy.deepcopy(model).double()(x)[0, r.target].backward()
    gi = (x.grad * x).detach()[0].sum(0)
    # float32 against float64: on CUDA the convolution runs in TF32 (device_tolerance)
    assert torch.allclose(r.panel.maps["GI"].double(), gi,
                          **device_tolerance(1e-5, 1e-5, torch.float32))
    assert "DL" in r.panel.maps and not r.left_out  # DeepLIFT runs on Softplus
    diff = next(k for k in r.panel.maps if k.startswith(E.DIFFERENCE_LABEL))
    assert r.panel.maps[diff].abs().max() > 0  # order 2 adds something on a smooth net
    fig = draw_saliency_grid([r.panel], overlay=True)
    axes = fig.axes
    assert f"class {r.target}: {model.class_name(r.target)}" in axes[0].get_title()
    assert f"p = {r.probability:.3g} (predicted)" in axes[0].get_title()
    assert "attribution" in axes[-1].get_ylabel()  # the row's colour bar
    assert len(axes) == len(r.panel.maps) + 2
    for ax, label in zip(axes[1:-1], r.panel.maps):  # each panel on its own stated scale
        lo, hi = ax.get_images()[-1].get_clim()
        plotted = np.abs(np.asarray(ax.get_images()[-1].get_array(), dtype=np.float64))
        own = np.quantile(plotted, 0.99) or plotted.max() or 1.0
        assert lo == -hi and hi == pytest.approx(own, rel=1e-6), label
        assert f"scale ±{own:.2g}" in ax.get_title(), label
    # every saved map loads and equals the array matplotlib plotted
    files = {p.name for p in r.map_files}
    assert len(files) == 2 * len(r.panel.maps)
    for ax, label in zip(axes[1:-1], r.panel.maps):
        plotted = np.asarray(ax.get_images()[-1].get_array())
        stem = r.map_files[0].parent / (
            __import__("re").sub(r"[^A-Za-z0-9]+", "-", label).strip("-").lower())
        assert np.array_equal(np.load(stem.with_suffix(".npy")), plotted), label
        assert np.array_equal(torch.load(stem.with_suffix(".pt")).numpy(), plotted), label
    written = r.warnings_file.read_text().splitlines()  # the warnings, then what the
    assert written[:len(r.warnings)] == r.warnings   # panels are (the figure's footer)
    assert all(w.startswith(("Taylor panels: ", E.DIFFERENCE_LABEL + ": at most"))
               for w in written[len(r.warnings):]), written
    check_png(r.figure)


def test_explain_runs_deeplift_on_relu6_and_says_order_2_adds_nothing(tmp_path):
    """ReLU6 has a layer-wise rule (Rescale on the captured graph): DeepLIFT runs now."""
    r = fast(tmp_path, tiny_classifier(nn.ReLU6()), target=2, sign="positive", beta=None)
    assert "DL" in r.panel.maps and "DL" not in r.left_out
    assert not any(w.startswith("DL left out: ") for w in r.warnings)
    diff = next(k for k in r.panel.maps if k.startswith(E.DIFFERENCE_LABEL))
    assert float(r.panel.maps[diff].abs().max()) == 0.0
    assert any("identical maps" in w for w in r.warnings)
    assert torch.equal(r.panel.maps["Taylor-1"], r.panel.maps["GI"])
    text = r.warnings_file.read_text()
    assert all(w in text for w in r.warnings)
    fig = draw_saliency_grid([r.panel], sign="positive")
    assert "(chosen)" in fig.axes[0].get_title()
    assert all(a.get_images()[-1].get_clim()[0] == 0 for a in fig.axes[1:-1])


def test_cli_explain_prints_every_warning_to_stderr(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(E, "_classifier", lambda model, weights: tiny_classifier(nn.ReLU6()))
    img = photo(tmp_path / "img.png")
    assert cli.main(["explain", str(img), "--methods", "gi", "DL", "taylor-1", "taylor-2",
                     "--beta", "0", "--out", str(tmp_path / "o"), "--save-maps",
                     "--budget", "none"]) == 0
    captured = capsys.readouterr()
    lines = (tmp_path / "o" / "img-warnings.txt").read_text().splitlines()
    assert any("identical maps" in line for line in lines)  # ReLU6 unsmoothed: order 2 adds 0
    assert lines and [f"taylorattr explain: warning: {w}" for w in lines] == \
        captured.err.strip().splitlines()
    assert "img-saliency.png" in captured.out and "maps:" in captured.out


def test_explain_smooths_a_relu6_network_for_its_taylor_panels(tmp_path):
    """By default the Taylor panels expand ta.smooth(net, "auto"): second order then differs
    from first order, and the title states the beta chosen. Checked by the definition with
    fixed betas (the independent route): at that beta the smoothed copy's output gap on the
    photo is at most 5% of |f(x) - f(0)|, at the next smaller candidate it is not."""
    import taylorattr as ta
    from taylorattr import data
    from taylorattr.taylor.smoothing import AUTO_BETAS

    net = tiny_classifier(nn.ReLU6())
    r = fast(tmp_path, net, target=2)
    diff = next(k for k in r.panel.maps if k.startswith(E.DIFFERENCE_LABEL))
    assert float(r.panel.maps[diff].abs().max()) > 0
    x = net.preprocess(data.load_image(tmp_path / "img.png"))
    title = next(k for k in r.panel.maps if k.startswith("Taylor-2 ("))  # "smooth β=20"
    note = next(w for w in r.warnings_file.read_text().splitlines()
                if w.startswith("Taylor panels: "))  # the whole note, in the footer too
    beta = float(note.split("beta = ")[1].split(" ")[0])
    assert title == f"Taylor-2 (smooth β={beta:g})", title
    with torch.no_grad():
        df = float((net(x) - net(torch.zeros_like(x))).abs().max())

        def gap(b):
            return float((ta.smooth(net, b)(x) - net(x)).abs().max())

        assert gap(beta) <= 0.05 * df
        smaller = [b for b in AUTO_BETAS if b < beta]
        assert not smaller or gap(smaller[-1]) > 0.05 * df
        assert "(auto: gap" in note and f"output gap {gap(beta):.2g}" in note


def test_unnamed_classes_short_taylor_titles_and_the_real_top_count(tmp_path, capsys,
                                                                   monkeypatch):
    """Without class names the title reads "class k" (not "class k: k"); the Taylor
    panels' titles (smoothed copy, "Taylor-2 - Taylor-1") hold at most 2 lines, their
    details in the footer; the CLI prints "top-2 classes" for a 2-class model, each
    index once."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                        nn.Flatten(), nn.Linear(4 * 8 * 8, 2))
    model = ImageClassifier(net, (0.5,) * 3, (0.25,) * 3, None, size=16, resize=16).eval()
    r = fast(tmp_path, model, methods=["gi", "taylor-1", "taylor-2"])
    fig = draw_saliency_grid([r.panel])
    head = fig.axes[0].get_title().splitlines()[0]
    assert head == f"class {r.target}", head
    titles = {label: ax.get_title() for ax, label in zip(fig.axes[1:-1], r.panel.maps)}
    taylor = [t for k, t in titles.items() if k.startswith("Taylor")]
    assert len(taylor) == 3 and all(len(t.splitlines()) <= 2 for t in taylor), taylor
    assert any("smooth β=" in t for t in taylor), taylor  # ReLU and max-pool: smoothed
    assert any("Taylor panels: smoothed, beta = " in w
               for w in r.warnings_file.read_text().splitlines())
    # the CLI's text: the real count, and no "1 1"
    from _user_model import write_package, write_photo

    write_package(tmp_path)
    write_photo(tmp_path / "p.png", seed=3, size=16)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    assert cli.main(["explain", "p.png", "--model", "mypkg.nets:small_cnn", "--model-args",
                     '{"classes": 2}', "--methods", "gi", "--out", "o", "--budget",
                     "none"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == "top-2 classes:", out
    rows = out[1:3]
    assert all(re.fullmatch(r"\s+[0-9.]+%\s+[01](  <- explained)?", row) for row in rows), rows
