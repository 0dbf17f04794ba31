"""Figures. Everything here only consumes results (lists of row dicts, tensors); nothing
computes an attribution or a metric.

Figures are drawn on a bare :class:`matplotlib.figure.Figure` with the Agg canvas, so
importing or calling this module never changes the user's pyplot backend and works
without a display.

Sections:

1. Trend plots (paper Figures 3 and 4): :func:`plot_trend`.
2. Saliency grids (paper Figure 5): :func:`saliency_grid`.
"""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path

__all__ = ["MODEL_COLORS", "plot_trend", "saliency_grid"]

#: Model colours in order of appearance: blue, green, red as in the paper, then more.
MODEL_COLORS = ("tab:blue", "tab:green", "tab:red", "tab:purple", "tab:orange", "tab:brown",
                "tab:pink", "tab:gray")
_FALLBACK_MARKERS = ("P", "X", "h", "p", "<", ">")


def _new_figure(size: tuple[float, float]):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=size, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def _save(fig, path: str | Path, dpi: int = 150) -> Path:
    """Write ``fig`` as PNG atomically (temporary file, then rename); returns the path."""
    from ._io import atomic_path

    out = Path(path)
    with atomic_path(out) as tmp:  # creates the folder
        fig.savefig(tmp, dpi=dpi, format="png", bbox_inches="tight")
    return out


def _finite(v) -> bool:
    return v is not None and isinstance(v, (int, float)) and math.isfinite(v)


# =======================================================================================
# 1. Trend plots (paper Figures 3 and 4)
# =======================================================================================
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
    markers = dict(markers or {})
    extra = iter(_FALLBACK_MARKERS * (1 + len(methods)))
    for m in methods:
        if m not in markers:
            markers[m] = next(extra)
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
            ax.scatter([float(r[x])], [float(r[metric])], marker=markers[r[method_key]],
                       s=70, color=color, edgecolors="black", linewidths=0.5, zorder=2)
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
               title_fontsize=8, frameon=False)
    return _save(fig, path, dpi)


# =======================================================================================
# 2. Saliency grids (paper Figure 5)
# =======================================================================================
def saliency_grid(panels: Sequence, path: str | Path, dpi: int = 150) -> Path:
    """One row per image: the image, then one map per method (paper Figure 5).

    ``panels`` are :class:`taylorattr.experiments.saliency.SaliencyPanel` objects (``image``
    ``[H, W]`` or ``[3, H, W]`` in [0, 1], ``predicted``, ``maps[label]`` a ``[H, W]`` tensor
    or the reason it is missing). Maps use a diverging colormap symmetric about zero (red
    positive, blue negative), each scaled to its own 99th percentile of ``|a|``.
    """
    import textwrap

    import torch

    labels = list(dict.fromkeys(label for p in panels for label in p.maps))
    fig = _new_figure((1.6 * (len(labels) + 1), 1.8 * len(panels)))
    axes = fig.subplots(len(panels), len(labels) + 1, squeeze=False)
    for row, panel in zip(axes, panels):
        image = panel.image.detach().float()
        if image.dim() == 3:
            row[0].imshow(image.permute(1, 2, 0).numpy())
        else:
            row[0].imshow(image.numpy(), cmap="gray")
        row[0].set_title(panel.predicted, fontsize=6)
        for ax, label in zip(row[1:], labels):
            value = panel.maps.get(label, "not computed")
            if isinstance(value, str):
                ax.text(0.5, 0.5, "\n".join(textwrap.wrap(value, 24)[:7]), ha="center",
                        va="center", fontsize=4, transform=ax.transAxes)
            else:
                v = value.detach().float()
                scale = float(torch.quantile(v.abs().flatten(), 0.99)) or 1.0
                ax.imshow(v.numpy(), cmap="bwr", vmin=-scale, vmax=scale)
            ax.set_title(label, fontsize=7)
        for ax in row:
            ax.set_xticks([])
            ax.set_yticks([])
    return _save(fig, path, dpi)
