"""Tests of taylorattr.plotting: figures are written, are valid PNGs, and only consume rows."""
from __future__ import annotations

import copy

import matplotlib
import pytest
from PIL import Image

from taylorattr.plotting import plot_trend

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
