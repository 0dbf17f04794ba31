"""``taylorattr explain IMAGE``: saliency maps and the top-5 classes of one photo.

Every map explains the same difference of the explained logit ``t``,
``df = f_t(x) - f_t(0)`` (baseline 0 in the network's input space; methods with a
reference distribution draw their own),
and is shown channel-summed, ``m(h, w) = sum_c a[c, h, w]``. When both Taylor orders
run, the panel "Taylor-2 - Taylor-1" shows what the second-order terms add,
``m_2 - m_1 = sum_c P_2[c, h, w]``; on a piecewise-linear network (ReLU, ReLU6) it is zero,
and the figure says so.

Outputs, beside each other in ``out_dir``: ``<stem>-saliency.png``, ``<stem>-warnings.txt``
(every warning raised while computing the maps, and every method left out with the
reason; "no warnings" when there are none) and, with ``save_maps``, ``<stem>-maps/<name>.pt``,
``.npy`` and/or ``.png`` (``map_formats``) holding exactly the plotted arrays. A method that cannot run on the network
(DeepLIFT on layers it has no rule for) is left out of the figure, never replaced.

Hook for smoothed Taylor panels: ``taylor_model(net) -> (model, note)`` gives the network
the Taylor panels expand (e.g. a smoothed copy, ``ta.smooth``, with a note such as
``"smoothed, beta = 20 (auto: gap 3% of |df|), output gap 0.02"`` for their titles).

The columns are the methods the registry enters in the saliency grid
(:func:`explain_columns`); each is named by the slug of its label.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from .. import _io, data, models
from ..paper_methods import variants
from ..registry import resolve, slug
from ..reporting import plotting
from ..reporting.interaction_plot import interaction_map
from ..reporting.signs import SIGNS
from ..taylor.pair_interactions import interactions, interactions_cost
from .maps import save_map
from .plans import StageCost, forwards, method_costs
from .saliency import SaliencyPanel, smoothed_taylor_model, taylor_maps

__all__ = ["SIGNS", "ExplainStage", "Explanation", "canonical_method", "explain",
           "explain_columns", "explain_methods"]

DIFFERENCE_LABEL = "Taylor-2 - Taylor-1"


def explain_columns(patch: int = 16, ig_steps: int = 32, eg_samples: int = 32,
                    eg_noise: float | None = None) -> dict:
    """Method name -> bound method of every column of the grid (the registry's saliency
    methods), named by the slug of its label (``gi``, ``occ-16x16``, ``taylor-2``, ...)."""

    context = {"patch": patch, "n_steps": ig_steps, "n_samples": eg_samples}
    if eg_noise is not None:
        context["noise_std"] = eg_noise
    bound = [spec.bind(v, context=context) for spec, v in variants("saliency")]
    return {slug(m.label): m for m in bound}


def explain_methods(patch: int = 16) -> tuple[str, ...]:
    """The names ``--methods`` takes, in the grid's column order."""
    return tuple(explain_columns(patch))


def canonical_method(name: str, patch: int = 16, columns: dict | None = None) -> str:
    """The grid name of ``name``: a name, a label (``"Occ-16x16"``) or a registry name
    (``"integrated_gradients"``, the method's first column), in any case. ``columns``:
    :func:`explain_columns` already built (default: built here)."""

    columns = explain_columns(patch) if columns is None else columns
    key = slug(name)
    return key if key in columns else slug(resolve(name, among=columns.values()).label)


@dataclass
class Explanation:
    top5: list[tuple[str, float]]  # (class name, softmax probability)
    target: int
    panel: object  # a taylorattr.experiments.saliency.SaliencyPanel (maps as plotted inputs)
    figure: Path
    probability: float = 0.0  # softmax probability of ``target``
    chosen: bool = False  # the target was given, not the top class
    top5_indices: list[int] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)  # one line each
    left_out: dict[str, str] = field(default_factory=dict)  # label -> why
    warnings_file: Path | None = None
    map_files: list[Path] = field(default_factory=list)
    interactions_figure: Path | None = None


def _classifier(model, weights):
    if isinstance(model, models.ImageClassifier):
        return model.eval()
    if model == "efficientnet-lite0":
        return models.efficientnet_lite0()
    return models.torchvision_model(model, weights)


@dataclass(frozen=True)
class ExplainStage:
    """The settings of :func:`explain`'s maps (``methods``: names, default all; the
    occlusion ``patch``, IG's ``ig_steps``, EG's ``eg_samples`` and ``eg_noise``; the pair
    ``interactions``), its columns and its rows (:meth:`cost`)."""

    methods: tuple | None = None
    patch: int = 16
    ig_steps: int = 32
    eg_samples: int = 32
    eg_noise: float | None = None
    interactions: bool = False

    def columns(self) -> dict:
        """Grid name -> bound method of the chosen methods, in grid order."""
        table = explain_columns(self.patch, self.ig_steps, self.eg_samples, self.eg_noise)
        chosen = set(table) if not self.methods else {
            canonical_method(m, self.patch, table) for m in self.methods}
        return {k: m for k, m in table.items() if k in chosen}

    def cost(self, net, x, name: str) -> list:
        """The maps (a target forward and every column) and, with ``interactions``, the
        pairs of the image's patches at order 2, on ``net`` for the input ``x``."""

        costs, skipped = method_costs(list(self.columns().values()), net, x)
        out = [StageCost(f"saliency maps on {name}", (([forwards(1), *costs], net, x),), 1,
                         tuple(skipped))]
        if self.interactions:
            out.append(StageCost(f"pair interactions on {name}",
                                 (([interactions_cost(x, None, 2)], net, x),), 1))
        return out


def _difference_panel(maps: dict, notes: list[str], by_order: dict) -> None:
    """Add "Taylor-2 - Taylor-1" when both orders gave maps (``by_order``: order -> map
    key), with its relative size noted."""
    one, two = (maps.get(by_order.get(k)) for k in (1, 2))
    if one is None or two is None or isinstance(one, str) or isinstance(two, str):
        return
    diff = two - one
    rel = float(diff.abs().max() / one.abs().max().clamp_min(1e-30))
    maps[DIFFERENCE_LABEL] = diff
    if rel > 0.0:
        notes.append(f"{DIFFERENCE_LABEL}: at most {rel:.2g} of Taylor-1's largest |value|")
    else:
        notes.append(f"{DIFFERENCE_LABEL}: identical maps; the network is piecewise linear "
                     "here (second derivatives vanish), so order 2 adds nothing to order 1 "
                     "(and Taylor-1 equals GI)")


def _write_outputs(out: Path, stem: str, plotted: dict, lines: list[str],
                   save_maps: bool, formats=("pt", "npy")) -> tuple[Path, list[Path]]:
    warnings_file = _io.atomic_write_text(out / f"{stem}-warnings.txt",
                                          "\n".join(lines or ["no warnings"]) + "\n")
    files = []
    if save_maps:
        for name, array in plotted.items():
            base = out / f"{stem}-maps" / slug(name)
            files += [save_map(array, base.with_suffix(f".{fmt}"), fmt) for fmt in formats]
    return warnings_file, files


def _interaction_figure(net, x, target: int, taylor_model, out: Path, stem: str, image,
                        show_progress: bool = False) -> Path:
    import torch


    expanded, note = (net, "") if taylor_model is None else taylor_model(net)
    result = interactions(expanded, x, 0.0, torch.tensor([target], device=x.device), order=2,
                          show_progress=show_progress)
    path = out / f"{stem}-interactions.png"
    title = f"pair interactions J_2 of {result.pairs.shape[-1]} patches" + (
        f" ({note})" if note else "")
    interaction_map(image, result, title=title, path=path)
    return path


def class_text(net, index: int) -> str:
    """``"class 3: cat"``, or ``"class 3"`` when the model has no class names."""
    name = net.class_name(index)
    return f"class {index}" if name == str(index) else f"class {index}: {name}"


def explain(image, model="efficientnet-lite0", weights=None, methods=None, target=None,
            out_dir="explain", patch: int = 16, ig_steps: int = 32, eg_samples: int = 32,
            eg_noise: float | None = None, *, sign: str = "all", overlay: bool = False,
            save_maps: bool = False, beta: float | str | None = "auto", taylor_model=None,
            interactions: bool = False, show_progress: bool = False,
            map_formats=("pt", "npy")) -> Explanation:
    """Explain ``image`` (a path) with ``methods`` (:func:`explain_methods`, labels or
    registry names; default all) for class ``target`` (default: the top class).

    ``model`` is ``"efficientnet-lite0"``, a torchvision name with ``weights``, or an
    :class:`taylorattr.models.ImageClassifier`. ``sign`` (:data:`SIGNS`) and ``overlay``
    (maps over a grey copy of the photo) choose the display; ``save_maps`` writes the plotted
    arrays. Writes the files listed in the module docstring and returns what was shown.

    Taylor panels expand ``taylor_model(net)`` when given, else a smoothed copy
    (``ta.smooth(net, beta, inputs=photo)``: every ReLU/ReLU6/max-pool replaced by its smooth
    surrogate; ``beta="auto"``, the default, picks the smallest beta whose output gap on the
    photo is at most 5% of its output change; the beta, its output gap to ``net`` and its
    class are stated in the titles), or ``net`` itself
    with ``beta=None`` (then a piecewise-linear network shows no second-order terms).
    ``interactions``: also draw the exact pair interactions of the image's patches
    (``ta.interactions`` at order 2 on the same network) as ``<stem>-interactions.png``.
    ``show_progress``: a per-chunk bar (``leave=False``) for each method and the pairs.
    ``map_formats``: the files ``save_maps`` writes per map, any of ``pt``, ``npy``, ``png``.
    """
    import torch


    if sign not in SIGNS:
        raise ValueError(f"sign must be one of {', '.join(SIGNS)}, got {sign!r}")
    columns = ExplainStage(None if methods is None else tuple(methods), patch, ig_steps,
                           eg_samples, eg_noise, interactions).columns()
    net = _classifier(model, weights)
    x = net.preprocess(data.load_image(image))
    with torch.no_grad():
        probs = torch.softmax(net(x), 1)[0]
    top = probs.topk(min(5, probs.shape[0]))
    chosen = target is not None
    if target is None:
        target = int(top.indices[0])
    elif not 0 <= target < probs.shape[0]:
        raise ValueError(f"target must lie in [0, {probs.shape[0]}), got {target}")
    if taylor_model is None and beta is not None:
        taylor_model = smoothed_taylor_model(x, target, beta)
    maps, notes, by_order = taylor_maps(net, x, target, columns, taylor_model, show_progress)
    pairs_figure = None if not interactions else _interaction_figure(
        net, x, target, taylor_model, Path(out_dir), Path(image).stem, net.unnormalize(x[0]),
        show_progress)
    _difference_panel(maps, notes, by_order)
    left_out = {k: v.removeprefix("not supported: ").rstrip(": ") for k, v in maps.items()
                if isinstance(v, str)}
    shown = {k: v for k, v in maps.items() if not isinstance(v, str)}
    lines = notes + [f"{k} left out: {why}" for k, why in left_out.items()]

    p = float(probs[target])
    title = (f"{class_text(net, target)}\n"
             f"p = {p:.3g} ({'chosen' if chosen else 'predicted'})")
    panel = SaliencyPanel(Path(image).stem, net.unnormalize(x[0]), title, shown, lines)
    out, stem = Path(out_dir), Path(image).stem
    footer = [f"{k} left out: {why}" for k, why in left_out.items()]
    if chosen and target != int(top.indices[0]):
        footer.append(f"top class: {class_text(net, int(top.indices[0]))} "
                      f"(p = {float(top.values[0]):.3g})")
    # what the panels are (not warnings): in the footer and the warnings file, not printed
    described = [n for n in notes if n.startswith((DIFFERENCE_LABEL + ": at most",
                                                   "Taylor panels: "))]
    footer += described
    lines = [ln for ln in lines if ln not in described]
    plotted = {k: plotting.signed_map(v, sign) for k, v in shown.items()}
    figure = plotting.saliency_grid([panel], out / f"{stem}-saliency.png", sign=sign,
                                    overlay=overlay, footer="\n".join(footer) or None)
    warnings_file, map_files = _write_outputs(out, stem, plotted, lines + described, save_maps,
                                              tuple(map_formats))
    return Explanation([(net.class_name(int(i)), float(q)) for q, i in zip(top.values, top.indices)],
                       target, panel, figure, p, chosen, [int(i) for i in top.indices], lines,
                       left_out, warnings_file, map_files, pairs_figure)
