"""Figures. Everything here only consumes results (lists of row dicts, tensors); nothing
computes an attribution or a metric.

Figures are drawn on a bare :class:`matplotlib.figure.Figure` with the Agg canvas, so
importing or calling this module never changes the user's pyplot backend and works
without a display.

Sections:

1. Trend plots (paper Figures 3 and 4): :func:`plot_trend`.
2. Saliency grids (paper Figure 5, ``taylorattr explain``): :func:`saliency_grid`,
   :func:`draw_saliency_grid`, :func:`signed_map`.
"""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path

from .._io import atomic_path

__all__ = [
    "MODEL_COLORS",
    "SIGN_COLORMAPS",
    "assign_markers",
    "draw_saliency_grid",
    "plot_trend",
    "saliency_grid",
    "signed_map",
]

#: Model colours in order of appearance: blue, green, red as in the paper, then more.
MODEL_COLORS = ("tab:blue", "tab:green", "tab:red", "tab:purple", "tab:orange", "tab:brown",
                "tab:pink", "tab:gray")
_FALLBACK_MARKERS = ("P", "X", "h", "p", "<", ">", "8", "H", "d", "x", "+", "1", "2", "3", "4",
                     "|", "_", "$a$", "$b$", "$c$", "$e$", "$f$", "$g$", "$k$")
_LINE_MARKERS = {"x", "+", "1", "2", "3", "4", "|", "_"}  # drawn as lines: no edge colour


def _new_figure(size: tuple[float, float]):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=size, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def _save(fig, path: str | Path, dpi: int = 150) -> Path:
    """Write ``fig`` as PNG atomically (temporary file, then rename); returns the path."""

    out = Path(path)
    with atomic_path(out) as tmp:  # creates the folder
        fig.savefig(tmp, dpi=dpi, format="png", bbox_inches="tight")
    return out


def _finite(v) -> bool:
    return v is not None and isinstance(v, (int, float)) and math.isfinite(v)


# =======================================================================================
# 1. Trend plots (paper Figures 3 and 4)
# =======================================================================================
def assign_markers(labels, preferred=None) -> dict[str, str]:
    """A marker per label: ``preferred[label]`` where given and not taken by an earlier
    label, else the next free fallback marker. Pass every label of a family of figures so
    that a label keeps its marker in all of them."""
    out: dict[str, str] = {}
    for label in labels:
        want = (preferred or {}).get(label)
        if want is not None and want not in out.values():
            out[label] = want
    free = [k for k in _FALLBACK_MARKERS if k not in out.values()] or list(_FALLBACK_MARKERS)
    extra = iter(free * (1 + len(labels)))
    for label in labels:
        if label not in out:
            out[label] = next(extra)
    return out


def plot_trend(rows: Sequence[Mapping], metric: str, path: str | Path, *,
               x: str = "principles", model_key: str = "model", method_key: str = "method",
               title: str | None = None, xlabel: str | None = None, ylabel: str | None = None,
               logy: bool | None = None, dpi: int = 150,
               markers: Mapping[str, str] | None = None) -> Path:
    """Metric against the number of principles followed, one colour per model.

    ``rows`` are dicts with ``model_key``, ``method_key``, ``x`` and ``metric`` entries
    (e.g. :attr:`AssessmentResult.infidelity` or ``.bbox``); rows whose ``x`` or ``metric``
    is missing or not finite (an unsupported method) are left out. Each method gets its
    marker from ``markers`` (method -> matplotlib marker, e.g. the registry rows'
    ``marker``; others get distinct fallback markers); each model's trend line joins the mean of its
    methods at each distinct ``x``, in increasing ``x``. ``logy=None`` uses a log scale
    when all values are positive and span more than two decades. Writes a PNG to
    ``path`` (parent folders created) and returns the path.
    """
    pts = [r for r in rows if _finite(r.get(x)) and _finite(r.get(metric))]
    if not pts:
        raise ValueError(f"no row has finite {x!r} and {metric!r} values to plot")
    models = list(dict.fromkeys(r[model_key] for r in pts))
    methods = list(dict.fromkeys(r[method_key] for r in pts))
    markers = assign_markers(methods, markers)
    values = [float(r[metric]) for r in pts]
    if logy is None:
        logy = min(values) > 0 and max(values) / min(values) > 100

    fig = _new_figure((7.0, 4.2))
    ax = fig.add_subplot(1, 1, 1)
    for k, model in enumerate(models):
        color = MODEL_COLORS[k % len(MODEL_COLORS)]
        mine = [r for r in pts if r[model_key] == model]
        xs = sorted({float(r[x]) for r in mine})
        means = [sum(float(r[metric]) for r in mine if float(r[x]) == v)
                 / sum(1 for r in mine if float(r[x]) == v) for v in xs]
        ax.plot(xs, means, "-", color=color, alpha=0.7, linewidth=1.5, zorder=1)
        for r in mine:
            marker = markers[r[method_key]]
            lines = marker in _LINE_MARKERS or marker.startswith("$")
            ax.scatter([float(r[x])], [float(r[metric])], marker=marker, s=70, color=color,
                       edgecolors=None if lines else "black",
                       linewidths=1.2 if lines else 0.5, zorder=2)
    if logy:
        ax.set_yscale("log")
    ax.set_xlabel(xlabel or "number of principles followed (measured)")
    ax.set_ylabel(ylabel or metric.replace("_", " "))
    if title:
        ax.set_title(title)
    ax.grid(True, alpha=0.3)

    from matplotlib.lines import Line2D

    model_handles = [Line2D([0], [0], color=MODEL_COLORS[k % len(MODEL_COLORS)], label=str(m))
                     for k, m in enumerate(models)]
    method_handles = [Line2D([0], [0], marker=markers[m], color="black", linestyle="none",
                             markerfacecolor="white", label=str(m)) for m in methods]
    fig.legend(handles=model_handles, loc="outside right upper", fontsize=8, title="model",
               title_fontsize=8, frameon=False)
    fig.legend(handles=method_handles, loc="outside right lower", fontsize=8, title="method",
               title_fontsize=8, frameon=False, ncols=1 + len(method_handles) // 15)
    return _save(fig, path, dpi)


# =======================================================================================
# 2. Saliency grids (paper Figure 5)
# =======================================================================================
#: ``sign`` -> (colormap, colour bar label); the range is ``[-s, s]``, ``[0, s]``,
#: ``[-s, 0]`` or ``[0, s]`` with ``s`` the panel's own scale (:func:`panel_scale`).
SIGN_COLORMAPS = {"all": ("bwr", "attribution (red +, blue -)"),
                  "positive": ("Reds", "positive part of the attribution"),
                  "negative": ("Blues_r", "negative part of the attribution"),
                  "abs": ("Purples", "|attribution|")}


def signed_map(a, sign: str = "all"):
    """What a panel shows of the map ``a``: ``a`` (``"all"``), ``max(a, 0)``
    (``"positive"``), ``min(a, 0)`` (``"negative"``) or ``|a|`` (``"abs"``), as float32."""
    if sign not in SIGN_COLORMAPS:
        raise ValueError(f"sign must be one of {', '.join(SIGN_COLORMAPS)}, got {sign!r}")
    a = a.detach().float().cpu()
    return {"all": a, "positive": a.clamp(min=0), "negative": a.clamp(max=0),
            "abs": a.abs()}[sign]


def panel_scale(m) -> float:
    """A panel's own colour scale ``s``: the 99th percentile of ``|m|`` (its largest ``|m|``
    where that percentile is 0; 1 for an all-zero map). Methods differ in scale by orders
    of magnitude (occlusion gives every pixel its whole patch's change, so its sum is the
    patch count times the others'), so each panel gets its own symmetric scale, stated in
    its title; values beyond it saturate (the colour bar's arrows)."""
    import torch

    flat = m.abs().flatten().double()
    return float(torch.quantile(flat, 0.99)) or float(flat.max()) or 1.0


_EXTEND = {"all": "both", "positive": "max", "negative": "min", "abs": "max"}


def _norm(sign: str, scale: float):
    from matplotlib.colors import Normalize

    low, high = {"all": (-scale, scale), "negative": (-scale, 0.0)}.get(sign, (0.0, scale))
    return Normalize(vmin=low, vmax=high)


def _show_image(ax, image, grey: bool = False):
    image = image.detach().float().cpu()
    if image.dim() == 3 and not grey:
        ax.imshow(image.permute(1, 2, 0).numpy())
    else:
        ax.imshow((image.mean(0) if image.dim() == 3 else image).numpy(), cmap="gray", vmin=0,
                  vmax=1)


#: Panels per row of a one-image figure (``taylorattr explain``): the maps wrap onto more
#: rows, so that each panel keeps a readable width and its title does not reach the next.
GRID_COLUMNS = 6


def _grid_axes(fig, panels: Sequence, n_maps: int) -> list[list]:
    """Per image, its axes: the image's, then one per map. Several images: one row each
    (paper Figure 5); one image: a grid of :data:`GRID_COLUMNS` columns, row by row (the
    unused cells of the last row removed)."""
    if len(panels) > 1:
        return [list(r) for r in fig.subplots(len(panels), n_maps + 1, squeeze=False)]
    cols = min(n_maps + 1, GRID_COLUMNS)
    rows = -(-(n_maps + 1) // cols)
    grid = fig.subplots(rows, cols, squeeze=False).ravel().tolist()
    for ax in grid[n_maps + 1:]:
        fig.delaxes(ax)
    return [grid[:n_maps + 1]]


def draw_saliency_grid(panels: Sequence, *, sign: str = "all", overlay: bool = False,
                       footer: str | None = None):
    """The figure of :func:`saliency_grid`, not saved (a matplotlib ``Figure``).

    In each map's axes the last image is the plotted array, ``signed_map(map, sign)``;
    ``fig.axes`` lists, per image, its axes (image, then maps in order) and then its
    colour bar.
    """
    import textwrap

    import numpy as np
    from matplotlib.cm import ScalarMappable

    if sign not in SIGN_COLORMAPS:
        raise ValueError(f"sign must be one of {', '.join(SIGN_COLORMAPS)}, got {sign!r}")
    cmap, bar_label = SIGN_COLORMAPS[sign]
    labels = list(dict.fromkeys(label for p in panels for label in p.maps))
    if len(panels) > 1:
        size = (1.9 * (len(labels) + 1) + 1.0, 2.3 * len(panels))
    else:
        cols = min(len(labels) + 1, GRID_COLUMNS)
        size = (2.3 * cols + 1.0, 2.7 * -(-(len(labels) + 1) // cols))
    fig = _new_figure((size[0], size[1] + (0.4 if footer else 0)))
    for row, panel in zip(_grid_axes(fig, panels, len(labels)), panels):
        _show_image(row[0], panel.image)
        row[0].set_title(panel.predicted, fontsize=8)
        shown = {k: signed_map(v, sign) for k, v in panel.maps.items() if not isinstance(v, str)}
        for ax, label in zip(row[1:], labels):
            value = panel.maps.get(label, "not computed")
            scale = panel_scale(shown[label]) if label in shown else 1.0
            norm = _norm(sign, scale)
            if isinstance(value, str):
                ax.text(0.5, 0.5, "\n".join(textwrap.wrap(value, 26)[:7]), ha="center",
                        va="center", fontsize=6, transform=ax.transAxes)
            elif overlay:
                _show_image(ax, panel.image, grey=True)
                v = shown[label].numpy()
                alpha = np.clip(np.abs(v) / max(abs(norm.vmin), abs(norm.vmax)), 0, 1)
                ax.imshow(v, cmap=cmap, norm=norm, alpha=0.85 * alpha)
            else:
                ax.imshow(shown[label].numpy(), cmap=cmap, norm=norm)
            title = "\n".join(textwrap.wrap(label, 26))
            if not isinstance(value, str):
                title += (f"\nsum {float(shown[label].double().sum()):.3g}, "
                          f"scale {'±' if sign == 'all' else ''}{scale:.2g}")
            ax.set_title(title, fontsize=9)
        for ax in row:
            ax.set_xticks([])
            ax.set_yticks([])
        bar = fig.colorbar(ScalarMappable(norm=_norm(sign, 1.0), cmap=cmap), ax=list(row),
                           shrink=0.8, pad=0.01, aspect=15 if len(panels) > 1 else 25,
                           extend=_EXTEND[sign])
        bar.set_label(f"{bar_label}\n/ the panel's scale (title)", fontsize=8)
        bar.ax.tick_params(labelsize=7)
    if footer:
        fig.supxlabel(footer, fontsize=8)
    return fig


def saliency_grid(panels: Sequence, path: str | Path, dpi: int = 150, *, sign: str = "all",
                  overlay: bool = False, footer: str | None = None) -> Path:
    """One row per image: the image, then one map per method (paper Figure 5); a single
    image's panels wrap onto rows of :data:`GRID_COLUMNS`.

    ``panels`` are :class:`taylorattr.experiments.saliency.SaliencyPanel` objects (``image``
    ``[H, W]`` or ``[3, H, W]`` in [0, 1], ``predicted`` (the image's title), ``maps[label]``
    a ``[H, W]`` tensor or the reason it is missing). Each panel shows
    :func:`signed_map` of its map on its own colour scale ``s`` (:func:`panel_scale`,
    the 99th percentile of ``|m|``), symmetric about zero for ``sign="all"`` (red
    positive, blue negative); the colour bar at the row's end is in units of each panel's
    ``s`` (arrows: values beyond it saturate). Each map's title gives its sum (for a
    complete method, the explained output change) and its scale.
    ``overlay`` draws each map over a grey copy of the image, opacity ``|m| / s``.
    ``footer`` is a line of text under the grid. Writes a PNG and returns its path.
    """
    return _save(draw_saliency_grid(panels, sign=sign, overlay=overlay, footer=footer), path, dpi)
