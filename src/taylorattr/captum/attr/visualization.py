"""Captum's ``captum.attr.visualization`` on matplotlib: ``visualize_image_attr``,
``visualize_image_attr_multiple``, ``visualize_timeseries_attr`` and ``visualize_text``,
with Captum's signatures and drawings.

Scaling (as Captum's): the attribution map ``a`` (channels summed for ``[H, W, C]``) is kept
by ``sign`` (``positive``: ``max(a, 0)``, ``negative``: ``min(a, 0)``, ``absolute_value``:
``|a|``, ``all``: ``a``) and divided by the threshold ``t``, the smallest ``|a|`` value at
which the ascending cumulative sum of ``|a|`` reaches ``(100 - outlier_perc)`` % of the
total (negated for ``negative``), then clipped to ``[-1, 1]``. The colour maps are Captum's
(red-white-green on ``[-1, 1]`` for ``all``; Greens, Reds, Blues on ``[0, 1]``).

``visualize_text`` returns the HTML table Captum builds (IPython's ``HTML`` when IPython is
installed, displayed as Captum displays it; otherwise an object with the HTML in ``.data``
and ``_repr_html_``), so notebooks and files get the same markup.

Images and arrays are NumPy, ``[H, W]`` or ``[H, W, C]`` (channels last), as Captum's.

Why one module: it is Captum's public module ``captum.attr.visualization`` (one import
path for users), and its image, time-series and text views share the scaling.
"""
from __future__ import annotations

import warnings
from enum import Enum

import numpy as np

__all__ = ["ImageVisualizationMethod", "TimeseriesVisualizationMethod",
           "VisualizationDataRecord", "VisualizeSign", "draw_mask_border", "draw_mask_legend",
           "format_classname", "format_special_tokens", "format_tooltip",
           "format_word_importances", "visualize_image_attr", "visualize_image_attr_multiple",
           "visualize_text", "visualize_timeseries_attr"]


class ImageVisualizationMethod(Enum):
    heat_map = 1
    blended_heat_map = 2
    original_image = 3
    masked_image = 4
    alpha_scaling = 5


class TimeseriesVisualizationMethod(Enum):
    overlay_individual = 1
    overlay_combined = 2
    colored_graph = 3


class VisualizeSign(Enum):
    positive = 1
    absolute_value = 2
    negative = 3
    all = 4


def _member(enum, value: str, what: str):
    try:
        return enum[value]
    except KeyError:
        raise ValueError(f"{what} must be one of {[m.name for m in enum]}, got {value!r}") \
            from None


def _threshold(values: np.ndarray, percentile: float) -> float:
    """The smallest value at which the ascending cumulative sum reaches ``percentile`` % of
    the total."""
    if not 0 <= percentile <= 100:
        raise ValueError(f"outlier_perc must lie in [0, 100], got {100 - percentile}")
    ordered = np.sort(values.flatten())
    cumulative = np.cumsum(ordered)
    return ordered[np.where(cumulative >= cumulative[-1] * 0.01 * percentile)[0][0]]


def _normalize_attr(attr: np.ndarray, sign: str, outlier_perc: float = 2) -> np.ndarray:
    """The attribution scaled to ``[-1, 1]`` (module docstring)."""
    kind = _member(VisualizeSign, sign, "sign")
    kept = {VisualizeSign.all: attr, VisualizeSign.positive: np.maximum(attr, 0),
            VisualizeSign.negative: np.minimum(attr, 0),
            VisualizeSign.absolute_value: np.abs(attr)}[kind]
    t = _threshold(np.abs(kept), 100.0 - outlier_perc)
    t = -t if kind is VisualizeSign.negative else t
    if t == 0:
        raise ValueError("the attributions are all 0 for this sign: nothing to scale "
                         "(pick another sign)")
    if abs(t) < 1e-5:
        warnings.warn("scaling by a value close to 0: the attributions are all close to 0 and "
                      "the picture may mislead", stacklevel=3)
    return np.clip(kept / t, -1, 1)


def _cmap_range(sign: str):
    kind = _member(VisualizeSign, sign, "sign")
    if kind is VisualizeSign.all:
        from matplotlib.colors import LinearSegmentedColormap
        return LinearSegmentedColormap.from_list("RdWhGn", ["red", "white", "green"]), -1, 1
    return {VisualizeSign.positive: "Greens", VisualizeSign.negative: "Reds",
            VisualizeSign.absolute_value: "Blues"}[kind], 0, 1


def _figure(plt_fig_axis, use_pyplot: bool, fig_size, **kwargs):
    if plt_fig_axis is not None:
        return plt_fig_axis
    if use_pyplot:
        import matplotlib.pyplot as plt
        return plt.subplots(figsize=fig_size, **kwargs)
    from matplotlib.figure import Figure
    fig = Figure(figsize=fig_size)
    return fig, fig.subplots(**kwargs)


def _as_uint8(image: np.ndarray) -> np.ndarray:
    return np.clip(image.astype(int), 0, 255)


def visualize_image_attr(attr, original_image=None, method: str = "heat_map",
                         sign: str = "absolute_value", plt_fig_axis=None, outlier_perc=2,
                         cmap=None, alpha_overlay: float = 0.5, show_colorbar: bool = False,
                         title=None, fig_size=(6, 6), use_pyplot: bool = True):
    """Draw the attribution map ``attr`` (``[H, W]`` or ``[H, W, C]``, channels summed) by
    ``method``: ``heat_map``, ``blended_heat_map`` (over the grey image), ``original_image``,
    ``masked_image`` (image times the scaled map) or ``alpha_scaling`` (the scaled map as
    alpha). Returns ``(figure, axis)``."""
    kind = _member(ImageVisualizationMethod, method, "method")
    fig, ax = _figure(plt_fig_axis, use_pyplot, fig_size)
    if isinstance(ax, list):
        ax = ax[0]
    if original_image is not None:
        if np.max(original_image) <= 1.0:
            original_image = _as_uint8(original_image * 255)
    elif kind is not ImageVisualizationMethod.heat_map:
        raise ValueError("original_image must be given for any method other than heat_map")
    ax.xaxis.set_ticks_position("none")
    ax.yaxis.set_ticks_position("none")
    ax.set_xticklabels([])
    ax.set_yticklabels([])
    ax.grid(visible=False)
    attr = np.asarray(attr)
    if attr.ndim == 3:
        attr = attr.sum(axis=2)
    norm = _normalize_attr(attr, sign, outlier_perc)
    default, vmin, vmax = _cmap_range(sign)
    cmap = default if cmap is None else cmap
    shown = None
    if kind is ImageVisualizationMethod.heat_map:
        shown = ax.imshow(norm, cmap=cmap, vmin=vmin, vmax=vmax)
    elif kind is ImageVisualizationMethod.blended_heat_map:
        ax.imshow(np.mean(original_image, axis=2), cmap="gray")
        shown = ax.imshow(norm, cmap=cmap, vmin=vmin, vmax=vmax, alpha=alpha_overlay)
    elif kind is ImageVisualizationMethod.original_image:
        image = original_image
        if image.ndim > 2 and image.shape[2] == 1:
            image = np.squeeze(image, axis=2)
        ax.imshow(image)
    else:
        if sign == "all":
            raise ValueError(f"method={method!r} cannot show positive and negative attributions "
                             "together; choose sign='positive', 'negative' or "
                             "'absolute_value'")
        if kind is ImageVisualizationMethod.masked_image:
            ax.imshow(_as_uint8(original_image * np.expand_dims(norm, 2)))
        else:
            ax.imshow(np.concatenate([original_image,
                                      _as_uint8(np.expand_dims(norm, 2) * 255)], axis=2))
    if show_colorbar:
        from mpl_toolkits.axes_grid1 import make_axes_locatable
        bar = make_axes_locatable(ax).append_axes("bottom", size="5%", pad=0.1)
        if shown is not None:
            fig.colorbar(shown, orientation="horizontal", cax=bar)
        else:
            bar.axis("off")
    if title:
        ax.set_title(title)
    if use_pyplot:
        import matplotlib.pyplot as plt
        plt.show()
    return fig, ax


def visualize_image_attr_multiple(attr, original_image, methods: list, signs: list,
                                  titles=None, fig_size=(8, 6), use_pyplot: bool = True,
                                  **kwargs):
    """One panel per ``(method, sign)`` in a row (:func:`visualize_image_attr`); returns
    ``(figure, axis or list of axes)``."""
    if len(methods) != len(signs):
        raise ValueError(f"methods and signs must have one entry each per panel, got "
                         f"{len(methods)} and {len(signs)}")
    if titles is not None and len(titles) != len(methods):
        raise ValueError(f"titles must give one title per method ({len(methods)}), got "
                         f"{len(titles)}")
    if use_pyplot:
        import matplotlib.pyplot as plt
        fig = plt.figure(figsize=fig_size)
    else:
        from matplotlib.figure import Figure
        fig = Figure(figsize=fig_size)
    axes = fig.subplots(1, len(methods), squeeze=True)
    axes = axes if len(methods) == 1 else axes.tolist()
    listed = [axes] if len(methods) == 1 else axes
    for i, (m, s) in enumerate(zip(methods, signs)):
        visualize_image_attr(attr, original_image=original_image, method=m, sign=s,
                             plt_fig_axis=(fig, listed[i]), use_pyplot=False,
                             title=titles[i] if titles else None, **kwargs)
    fig.tight_layout()
    if use_pyplot:
        import matplotlib.pyplot as plt
        plt.show()
    return fig, axes


def _spans(values, ax, x_values, cmap, norm, alpha):
    half = (x_values[1] - x_values[0]) / 2.0
    for v, centre in zip(values, x_values):
        ax.axvspan(xmin=centre - half, xmax=centre + half, facecolor=cmap(norm(v)),
                   edgecolor=None, alpha=alpha)


def visualize_timeseries_attr(attr, data, x_values=None, method: str = "overlay_individual",
                              sign: str = "absolute_value", channel_labels=None,
                              channels_last: bool = True, plt_fig_axis=None, outlier_perc=2,
                              cmap=None, alpha_overlay: float = 0.7, show_colorbar: bool = False,
                              title=None, fig_size=(6, 6), use_pyplot: bool = True,
                              **pyplot_kwargs):
    """Attributions ``[N, C]`` of a time series ``data`` ``[N, C]`` (channels first with
    ``channels_last=False``): ``overlay_individual`` (one panel per channel, the scaled
    attribution as background colour), ``overlay_combined`` (one panel, attributions summed
    over the channels) or ``colored_graph`` (each curve coloured by its attribution)."""
    import matplotlib
    from matplotlib import colors

    attr, data = np.asarray(attr), np.asarray(data)
    if attr.ndim != 2 or data.ndim != 2:
        raise ValueError(f"attr and data must be [N, C], got {attr.shape} and {data.shape}")
    if channels_last:
        attr, data = attr.T, data.T
    kind = _member(TimeseriesVisualizationMethod, method, "method")
    channels, length = attr.shape
    if channels > length:
        warnings.warn(f"Number of channels ({channels}) greater than time series length "
                      f"({length}), please verify input format", stacklevel=2)
    panels = channels
    if kind is TimeseriesVisualizationMethod.overlay_combined:
        panels, attr = 1, attr.sum(axis=0)
    if x_values is None:
        x_values = np.arange(length)
    elif x_values.shape[0] != length:
        raise ValueError(f"x_values must have the series' length {length}, got "
                         f"{x_values.shape[0]}")
    fig, ax = _figure(plt_fig_axis, use_pyplot, fig_size, nrows=panels, sharex=True)
    axes = ax if isinstance(ax, np.ndarray) else np.array([ax])
    norm_attr = _normalize_attr(attr, sign, outlier_perc)
    default, vmin, vmax = _cmap_range(sign)
    cmap = matplotlib.colormaps[default] if cmap is None and isinstance(default, str) else \
        (default if cmap is None else (matplotlib.colormaps[cmap] if isinstance(cmap, str)
                                       else cmap))
    cm_norm = colors.Normalize(vmin, vmax)
    if kind is TimeseriesVisualizationMethod.overlay_combined:
        from cycler import cycler
        axes[0].set_prop_cycle(cycler("color", matplotlib.colormaps["Dark2"].colors))
        for c in range(channels):
            axes[0].plot(x_values, data[c], label=channel_labels[c] if channel_labels else None,
                         **pyplot_kwargs)
        _spans(norm_attr, axes[0], x_values, cmap, cm_norm, alpha_overlay)
        axes[0].legend(loc="best")
    else:
        from matplotlib.collections import LineCollection
        for c in range(channels):
            if kind is TimeseriesVisualizationMethod.overlay_individual:
                axes[c].plot(x_values, data[c], **pyplot_kwargs)
                _spans(norm_attr[c], axes[c], x_values, cmap, cm_norm, alpha_overlay)
            else:
                pts = np.array([x_values, data[c]]).T.reshape(-1, 1, 2)
                lines = LineCollection(np.concatenate([pts[:-1], pts[1:]], axis=1), cmap=cmap,
                                       norm=cm_norm, **pyplot_kwargs)
                lines.set_array(norm_attr[c])
                axes[c].add_collection(lines)
                axes[c].set_ylim(1.2 * np.min(data[c]), 1.2 * np.max(data[c]))
            if channel_labels is not None:
                axes[c].set_ylabel(channel_labels[c])
        fig.subplots_adjust(hspace=0)
    axes[-1].set_xlim([x_values[0], x_values[-1]])
    if show_colorbar:
        from matplotlib import cm
        from mpl_toolkits.axes_grid1 import make_axes_locatable
        bar = make_axes_locatable(axes[-1]).append_axes("bottom", size="5%", pad=0.4)
        alpha = 1.0 if kind is TimeseriesVisualizationMethod.colored_graph else alpha_overlay
        fig.colorbar(cm.ScalarMappable(cm_norm, cmap), orientation="horizontal", cax=bar,
                     alpha=alpha)
    if title:
        axes[0].set_title(title)
    if use_pyplot:
        import matplotlib.pyplot as plt
        plt.show()
    return fig, ax


def draw_mask_border(ax, mask: np.ndarray, border_width: int = 1,
                     border_color="black") -> None:
    """Draw the border of the boolean ``mask`` (``[H, W]``): the pixels an erosion by
    ``border_width`` steps (4-neighbours, outside counts as False) removes."""
    from matplotlib import colors

    mask = np.asarray(mask, dtype=bool)
    if not mask.any():
        return
    rgba = np.array(colors.to_rgba(border_color)) if isinstance(border_color, str) \
        else np.asarray(border_color)
    inner = mask.copy()
    for _ in range(border_width):
        padded = np.pad(inner, 1, constant_values=False)
        inner = inner & padded[:-2, 1:-1] & padded[2:, 1:-1] & padded[1:-1, :-2] & \
            padded[1:-1, 2:]
    border = mask & ~inner
    ax.imshow(border[:, :, None] * rgba.reshape(1, 1, -1))


def draw_mask_legend(ax, mask: np.ndarray, label: str, fontsize: int = 10,
                     text_color: str = "white", bbox_facecolor: str = "black",
                     bbox_alpha: float = 0.6) -> None:
    """Write ``label`` at the centroid of the boolean ``mask``."""
    mask = np.asarray(mask, dtype=bool)
    if not mask.any():
        return
    rows, cols = np.where(mask)
    ax.text(cols.mean(), rows.mean(), label, color=text_color, fontsize=fontsize, ha="center",
            va="center", bbox={"boxstyle": "round,pad=0.2", "facecolor": bbox_facecolor,
                               "alpha": bbox_alpha})


class VisualizationDataRecord:
    """One row of :func:`visualize_text`: the tokens, their attributions and the labels."""

    __slots__ = [
        "attr_class",
        "attr_score",
        "convergence_score",
        "pred_class",
        "pred_prob",
        "raw_input_ids",
        "true_class",
        "word_attributions",
    ]

    def __init__(self, word_attributions, pred_prob, pred_class, true_class, attr_class,
                 attr_score, raw_input_ids, convergence_score) -> None:
        self.word_attributions = word_attributions
        self.pred_prob = pred_prob
        self.pred_class = pred_class
        self.true_class = true_class
        self.attr_class = attr_class
        self.attr_score = attr_score
        self.raw_input_ids = raw_input_ids
        self.convergence_score = convergence_score


def _get_color(attr: float) -> str:
    """Green (positive) or red (negative), lighter as ``|attr|`` (clipped to 1) shrinks."""
    attr = max(-1, min(1, attr))
    lightness = 100 - int(50 * attr) if attr > 0 else 100 - int(-40 * attr)
    return f"hsl({120 if attr > 0 else 0}, 75%, {lightness}%)"


def format_classname(classname) -> str:
    return f'<td><text style="padding-right:2em"><b>{classname}</b></text></td>'


def format_special_tokens(token: str) -> str:
    """``<s>`` -> ``#s``."""
    if token.startswith("<") and token.endswith(">"):
        return "#" + token.strip("<>")
    return token


def format_tooltip(item: str, text: str) -> str:
    return (f'<div class="tooltip">{item}        <span class="tooltiptext">{text}</span>'
            '        </div>')


def format_word_importances(words, importances) -> str:
    """One table cell: every word on the colour of its importance."""
    if importances is None or len(importances) == 0:
        return "<td></td>"
    if hasattr(importances, "shape") and len(importances.shape) != 1:
        raise ValueError(f"importances must be 1-D, got shape {tuple(importances.shape)}")
    if len(words) > len(importances):
        raise ValueError(f"importances must give one value per word ({len(words)}), got "
                         f"{len(importances)}")
    tags = ["<td>"]
    for word, importance in zip(words, importances[:len(words)]):
        color, word = _get_color(importance), format_special_tokens(word)
        tags.append(f'<mark style="background-color: {color}; opacity:1.0;                     '
                    f'line-height:1.75"><font color="black"> {word}                    '
                    '</font></mark>')
    tags.append("</td>")
    return "".join(tags)


class _HTML:
    """HTML markup without IPython: ``.data`` and the notebook hook ``_repr_html_``."""

    def __init__(self, data: str) -> None:
        self.data = data

    def _repr_html_(self) -> str:
        return self.data


def visualize_text(datarecords, legend: bool = True):
    """Captum's HTML table of records: true, predicted and attributed label, the score and
    every word on the colour of its attribution; a legend below unless ``legend=False``."""
    dom = ["<table width: 100%>"]
    rows = [("<tr><th>True Label</th><th>Predicted Label</th><th>Attribution Label</th>"
             "<th>Attribution Score</th><th>Word Importance</th>")]
    for r in datarecords:
        rows.append("".join([
            "<tr>", format_classname(r.true_class),
            format_classname(f"{r.pred_class} ({r.pred_prob:.2f})"),
            format_classname(r.attr_class), format_classname(f"{r.attr_score:.2f}"),
            format_word_importances(r.raw_input_ids, r.word_attributions), "<tr>"]))
    if legend:
        dom.append('<div style="border-top: 1px solid; margin-top: 5px;             '
                   'padding-top: 5px; display: inline-block">')
        dom.append("<b>Legend: </b>")
        for value, label in zip([-1, 0, 1], ["Negative", "Neutral", "Positive"]):
            dom.append('<span style="display: inline-block; width: 10px; height: 10px;     '
                       '            border: 1px solid; background-color:                 '
                       f'{_get_color(value)}"></span> {label}  ')
        dom.append("</div>")
    dom.append("".join(rows))
    dom.append("</table>")
    markup = "".join(dom)
    try:
        from IPython.display import HTML, display
    except ImportError:
        return _HTML(markup)
    html = HTML(markup)
    display(html)
    return html
