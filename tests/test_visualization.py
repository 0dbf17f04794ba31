"""Issue 36: ``taylorattr.captum.attr.visualization`` draws what Captum's draws: the same
arrays handed to matplotlib (scaled maps, colour maps, ranges) and the same HTML for text,
compared side by side with Captum on the same attributions."""
from __future__ import annotations

import matplotlib
import numpy as np
import pytest
import torch
from captum.attr import visualization as CV

from taylorattr.captum.attr import visualization as TV

matplotlib.use("Agg")


def _images(ax):
    return [(np.asarray(im.get_array()), im.get_clim(), getattr(im.get_cmap(), "name", None),
             im.get_alpha()) for im in ax.images]


def _same_drawing(ours, theirs):
    (_, oa), (_, ta) = ours, theirs
    oi, ti = _images(oa), _images(ta)
    assert len(oi) == len(ti) > 0
    for (a, clim_a, cmap_a, alpha_a), (b, clim_b, cmap_b, alpha_b) in zip(oi, ti):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-12)
        assert (clim_a, cmap_a, alpha_a) == (clim_b, cmap_b, alpha_b)
    assert oa.get_title() == ta.get_title()


@pytest.fixture
def image_and_map():
    rng = np.random.default_rng(0)
    image = rng.uniform(0, 1, (12, 10, 3))
    attr = rng.normal(0, 1, (12, 10, 3))
    return image, attr


@pytest.mark.parametrize("method, sign", [
    ("heat_map", "all"), ("heat_map", "positive"), ("heat_map", "negative"),
    ("heat_map", "absolute_value"), ("blended_heat_map", "all"),
    ("blended_heat_map", "absolute_value"), ("original_image", "all"),
    ("masked_image", "positive"), ("alpha_scaling", "absolute_value")])
def test_visualize_image_attr_draws_captums_arrays(image_and_map, method, sign):
    image, attr = image_and_map
    kw = {"method": method, "sign": sign, "use_pyplot": False, "outlier_perc": 5,
          "title": "t", "show_colorbar": True}
    _same_drawing(TV.visualize_image_attr(attr, image, **kw),
                  CV.visualize_image_attr(attr, image, **kw))


def test_the_scaling_by_hand():
    """Absolute values 1..10: the 2 % outliers' threshold is the smallest value whose
    ascending cumulative sum reaches 98 % of 55 (53.9): 10 (cumulative 55)."""
    attr = np.arange(1.0, 11.0).reshape(2, 5)
    _, ax = TV.visualize_image_attr(attr, sign="absolute_value", use_pyplot=False)
    np.testing.assert_allclose(np.asarray(ax.images[0].get_array()), attr / 10.0)
    _, ax = TV.visualize_image_attr(attr, sign="absolute_value", use_pyplot=False,
                                    outlier_perc=30)
    # 30 %: 38.5 of 55 is first reached at 9 (cumulative 45)
    np.testing.assert_allclose(np.asarray(ax.images[0].get_array()), np.clip(attr / 9, -1, 1))


def test_visualize_image_attr_multiple_equals_captums(image_and_map, tmp_path):
    image, attr = image_and_map
    methods = ["original_image", "heat_map", "blended_heat_map", "masked_image"]
    signs = ["all", "all", "positive", "absolute_value"]
    titles = ["image", "map", "blended", "masked"]
    ours = TV.visualize_image_attr_multiple(attr, image, methods, signs, titles,
                                            use_pyplot=False)
    theirs = CV.visualize_image_attr_multiple(attr, image, methods, signs, titles,
                                              use_pyplot=False)
    assert len(ours[1]) == len(theirs[1]) == 4
    for a, b in zip(ours[1], theirs[1]):
        _same_drawing((ours[0], a), (theirs[0], b))
    ours[0].savefig(tmp_path / "multiple.png")
    assert (tmp_path / "multiple.png").stat().st_size > 1000


def test_bad_arguments_are_refused(image_and_map):
    image, attr = image_and_map
    with pytest.raises(ValueError, match="original_image"):
        TV.visualize_image_attr(attr, None, method="blended_heat_map", use_pyplot=False)
    with pytest.raises(ValueError, match="sign"):
        TV.visualize_image_attr(attr, image, method="masked_image", sign="all",
                                use_pyplot=False)
    with pytest.raises(ValueError, match="method must be one of"):
        TV.visualize_image_attr(attr, image, method="heatmap", use_pyplot=False)


@pytest.mark.parametrize("method", ["overlay_individual", "overlay_combined", "colored_graph"])
def test_visualize_timeseries_attr_draws_captums_colours(method, monkeypatch):
    # Captum calls matplotlib.cm.get_cmap, which matplotlib 3.9 removed: given back here
    monkeypatch.setattr(CV.cm, "get_cmap", lambda c: matplotlib.colormaps[c]
                        if isinstance(c, str) else c, raising=False)
    rng = np.random.default_rng(1)
    data, attr = rng.normal(size=(20, 3)), rng.normal(size=(20, 3))
    ours = TV.visualize_timeseries_attr(attr, data, method=method, sign="all",
                                        use_pyplot=False)
    theirs = CV.visualize_timeseries_attr(attr, data, method=method, sign="all",
                                          use_pyplot=False)
    oa = np.atleast_1d(ours[1])
    ta = np.atleast_1d(theirs[1])
    for a, b in zip(oa, ta):
        assert len(a.patches) == len(b.patches)
        for p, q in zip(a.patches, b.patches):
            np.testing.assert_allclose(p.get_facecolor(), q.get_facecolor(), atol=1e-12)
        for p, q in zip(a.collections, b.collections):
            np.testing.assert_allclose(p.get_array(), q.get_array(), atol=1e-12)
        for p, q in zip(a.lines, b.lines):
            np.testing.assert_allclose(p.get_ydata(), q.get_ydata())


def _captum_html(monkeypatch, records, legend):
    class HTML:
        def __init__(self, data):
            self.data = data
    monkeypatch.setattr(CV, "HAS_IPYTHON", True)
    monkeypatch.setattr(CV, "HTML", HTML, raising=False)
    monkeypatch.setattr(CV, "display", lambda h: None, raising=False)
    return CV.visualize_text(records, legend=legend).data


@pytest.mark.parametrize("legend", [True, False])
def test_visualize_text_gives_captums_html(monkeypatch, legend):
    words = ["<s>", "The", "cat", "sat", "</s>"]
    scores = torch.tensor([0.0, 0.5, -0.3, 1.4, -2.0])

    def record(mod):
        return mod.VisualizationDataRecord(scores, 0.83, "pos", "pos", "pos", scores.sum(),
                                           words, 0.01)
    ours = TV.visualize_text([record(TV), record(TV)], legend=legend)
    theirs = _captum_html(monkeypatch, [record(CV), record(CV)], legend)
    assert ours.data == theirs
    assert "hsl(120, 75%, 75%)" in ours.data  # 0.5: green at lightness 100 - 25
    assert ours._repr_html_() == theirs if hasattr(ours, "_repr_html_") else True


def test_text_helpers_equal_captums():
    assert TV.format_word_importances(["a", "<b>"], [0.2, -0.7]) == \
        CV.format_word_importances(["a", "<b>"], [0.2, -0.7])
    assert TV.format_tooltip("x", "y") == CV.format_tooltip("x", "y")
    assert TV.format_classname(3) == CV.format_classname(3)
    assert TV.format_special_tokens("<pad>") == CV.format_special_tokens("<pad>") == "#pad"


def test_mask_border_and_legend_draw_captums(image_and_map):
    from matplotlib.figure import Figure

    mask = np.zeros((12, 10), dtype=bool)
    mask[3:9, 2:7] = True
    drawn = []
    for mod in (TV, CV):
        ax = Figure().subplots()
        mod.draw_mask_border(ax, mask, border_width=2, border_color="red")
        mod.draw_mask_legend(ax, mask, "cat")
        drawn.append((np.asarray(ax.images[0].get_array()), ax.texts[0].get_position()))
    np.testing.assert_array_equal(drawn[0][0], drawn[1][0])
    assert drawn[0][1] == drawn[1][1]
