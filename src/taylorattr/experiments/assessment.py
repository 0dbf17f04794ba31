"""Paper Figures 3 and 4: attribution quality against the number of principles followed.

Three experiments (the paper's section "Attribution assessment"), each a table of data:

1. ``"infidelity"``: infidelity (Yeh et al. 2019; square removal, every square of side
   1..10 at every position set to the baseline 0, optimal-beta normalisation, output =
   logit of the predicted class) of GI, Occ-1, Occ-2x2 (the patch variant, 2x2 windows),
   DL, IG and EG on M-sg, C-sg and C-sp trained on MNIST, averaged over held-out digits;
   beside it the number of principles each method follows *as the audit measured it*
   (:func:`taylorattr.principles.principles_table`) and, per model, the Spearman rank
   correlation between infidelity and that number (the paper claims a negative one).
2. ``"taylor_order"``: infidelity of the first- and second-order Taylor attribution
   (:func:`taylorattr.taylor.taylor_attribution`, baseline 0) on C-sg and C-sp. The paper
   reports 0.48 (first) vs 0.27 (second) on C-sg and 0.84 vs 0.75 on C-sp: the
   second-order attribution has the *lower* (better) infidelity.
3. ``"bbox"``: bounding-box accuracy (Schulz et al. 2020) of the six methods on the
   localisation models (``loc_c_sg``, ``loc_c_sp``, ``loc_vgg``, ``loc_resnet``) on held-out
   cluttered-MNIST canvases (64x64), with the same correlation (the paper: positive).
   Only images whose box mask covers at most :data:`MAX_MASK_COVERAGE` of the image are
   used; the experiment excludes the others (the metric scores whatever it is given).
   Optionally the paper's ImageNet route: an ILSVRC-style folder of JPEGs with Pascal-VOC
   XML boxes (:class:`taylorattr.data.ImageFolderWithBoxes`, Resize 256 / CenterCrop 224)
   and torchvision's VGG16, VGG19 and ResNet18 with weights the user supplies.

Principle count (the x-axis). ``count = #"follows" + 0.5 * #"partially"`` over the three
principles, from the measured verdicts. The paper's own Table 2 gives GI 0, Occ-1 and
Occ-patch 0.5, DL 1, IG 2, EG 3; those are kept only as a labelled reference column
(``principles_paper``) and a second correlation, never as the measured numbers.

Method settings. Targets are the predicted class (argmax of the logits). Baselines: 0
(the black image) on MNIST and the canvases; on the ImageNet route the black image in
normalised coordinates, ``-mean / std``. IG: 50 Riemann steps. EG: 50 baselines drawn
from ``N(x, s^2)`` with ``s`` the audit's :data:`taylorattr.principles.EG_NOISE_STD`
(0.2; the audit itself draws 256). DL: the Rescale rule; it is reported as unsupported
(``None``, with the reason in ``note``) on networks the layer-wise rules do not handle
(ResNet-style residual blocks, torchvision's VGG/ResNet); such methods are left out of
that model's correlation.

Shared forward passes. The removal set (5,605 squares on 28x28) does not depend on the
method, so the outputs ``f(x) - f(x with square k removed)`` are computed once per
(model, batch) and every method's predicted changes (the sums of its attribution over
each square, from an integral image) are scored against them with the same formula as
:func:`taylorattr.metrics.infidelity`, which the tests check it equals.

Resumability. Every (model, batch) removal set, every (model, method, batch) score and
the principle audit are units of a :class:`~taylorattr.experiments._units.UnitStore`
under ``out_dir/assessment/units``, keyed by a fingerprint of the model's weights and of
the batch's inputs, so an interrupted run resumes and a rerun computes nothing new.
(Units do not know the code that made them: delete the folder after changing a method.)

Sample counts. The paper gives none for these experiments (its Table 3 used 3,000
held-out digits; its ImageNet images are the validation images whose boxes cover less
than 33%). ``quick`` (for ``make reproduce``, a few minutes on 2 CPU cores):
:data:`QUICK_SAMPLES`, 24 held-out digits and 12 canvases per model. Full:
:data:`FULL_SAMPLES`, 1,000 held-out digits (infidelity costs one set of 5,605 removal
forwards per digit and model, shared by the methods) and 200 canvases per localisation
model (Occlusion-1 alone costs 4,096 forwards per 64x64 canvas); about three hours on
2 CPU cores. ``n_samples`` overrides both.

Cost on the ImageNet route: Occlusion-1 needs 50,176 forwards per 224x224 image; on a
CPU leave it out with ``methods=("GI", "Occ-2x2", "DL", "IG", "EG")`` (its row is then
missing from the table and the correlation).
"""
from __future__ import annotations

import hashlib
import inspect
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm

from .. import _io, principles
from .. import models as M
from .._validation import broadcast_baselines, select_output
from ..methods import METHODS, UnsupportedModelError
from ..metrics import bbox_accuracy, square_removal
from ..metrics.fidelity import optimal_beta_score, square_removed_rows, square_sums
from ._units import UnitStore, fingerprint, model_fingerprint

__all__ = [
    "ASSESSMENT_METHODS",
    "DEFAULT_MODELS",
    "EXPERIMENTS",
    "FULL_SAMPLES",
    "MAX_MASK_COVERAGE",
    "PAPER_PRINCIPLE_COUNTS",
    "PAPER_TAYLOR_ORDER",
    "QUICK_SAMPLES",
    "AssessmentResult",
    "format_assessment",
    "infidelity_from_changes",
    "keep_by_coverage",
    "mask_coverage",
    "measured_principle_counts",
    "principle_count",
    "run_assessment",
    "spearman",
    "square_output_changes",
    "square_predictions",
]

EXPERIMENTS = ("infidelity", "taylor_order", "bbox")

# method label -> (registry name, attribute arguments); EG's noise_std is added at run time
ASSESSMENT_METHODS: dict[str, tuple[str, dict]] = {
    "GI": ("gradient_input", {}),
    "Occ-1": ("occlusion_1", {}),
    "Occ-2x2": ("occlusion_patch", {"patch": 2}),
    "DL": ("deeplift", {}),
    "IG": ("integrated_gradients", {"n_steps": 50}),
    "EG": ("expected_gradients", {"n_samples": 50, "noise_std": principles.EG_NOISE_STD}),
}
#: The paper's Table 2 as counts (follows = 1, partially = 0.5): a reference column only.
PAPER_PRINCIPLE_COUNTS = {"GI": 0.0, "Occ-1": 0.5, "Occ-2x2": 0.5, "DL": 1.0, "IG": 2.0,
                          "EG": 3.0}
#: Infidelity of the order-K Taylor attribution in the paper: model -> {K: value}.
PAPER_TAYLOR_ORDER = {"C-sg": {1: 0.48, 2: 0.27}, "C-sp": {1: 0.84, 2: 0.75}}
#: The sign of the correlation with the principle count the paper reports.
PAPER_CORRELATION_SIGN = {"infidelity": "negative", "bbox": "positive"}
#: Images whose merged box mask covers more than this share of the image are excluded.
MAX_MASK_COVERAGE = 0.33

DEFAULT_MODELS: dict[str, tuple[str, ...]] = {
    "infidelity": ("m_sg", "c_sg", "c_sp"),
    "taylor_order": ("c_sg", "c_sp"),
    "bbox": ("loc_c_sg", "loc_c_sp", "loc_vgg", "loc_resnet"),
}
QUICK_SAMPLES = {"infidelity": 24, "taylor_order": 24, "bbox": 12}
FULL_SAMPLES = {"infidelity": 1000, "taylor_order": 1000, "bbox": 200}
IMAGENET_MODELS = ("vgg16", "vgg19", "resnet18")

MODEL_LABELS = {
    "poly": "Poly", "m_sg": "M-sg", "c_sg": "C-sg", "c_sp": "C-sp",
    "loc_c_sg": "C-sg (loc)", "loc_c_sp": "C-sp (loc)", "loc_vgg": "VGG-style (loc)",
    "loc_resnet": "ResNet-style (loc)", "vgg16": "VGG16", "vgg19": "VGG19",
    "resnet18": "ResNet18",
}
_VERDICT_WEIGHT = {"follows": 1.0, "partially": 0.5, "does not": 0.0}


# =======================================================================================
# Results
# =======================================================================================
@dataclass
class AssessmentResult:
    """Tables of the assessment (data only; see :func:`format_assessment`).

    ``infidelity``: one row per (model, method): ``model, method, principles,
    principles_paper, infidelity`` (mean over samples), ``infidelity_sem`` (standard error),
    ``n, seconds`` (compute time of its units), ``note``.
    ``taylor_order``: ``model, order, infidelity, infidelity_sem, paper, n, seconds``.
    ``bbox``: ``model, method, principles, principles_paper, bbox_accuracy,
    bbox_accuracy_sem, n, n_excluded, seconds, note``.
    ``correlations``: ``experiment, model, metric, spearman`` (against the measured
    counts), ``spearman_paper_counts``, ``spearman_without_eg`` (measured counts, the
    methods other than EG), ``n_methods, paper_sign``.
    ``principles``: ``method, registry, verdict_1..3, principles, principles_paper``.
    """

    infidelity: list[dict] = field(default_factory=list)
    taylor_order: list[dict] = field(default_factory=list)
    bbox: list[dict] = field(default_factory=list)
    correlations: list[dict] = field(default_factory=list)
    principles: list[dict] = field(default_factory=list)
    models: list[dict] = field(default_factory=list)
    settings: dict = field(default_factory=dict)
    timings: dict = field(default_factory=dict)
    figures: list[str] = field(default_factory=list)

    def to_json(self) -> dict:
        return {"infidelity": self.infidelity, "taylor_order": self.taylor_order,
                "bbox": self.bbox, "correlations": self.correlations,
                "principles": self.principles, "models": self.models,
                "settings": self.settings, "timings": self.timings, "figures": self.figures}


# =======================================================================================
# Pure helpers (principle counts, rank correlation, mask rule, infidelity pieces)
# =======================================================================================
def principle_count(verdicts: Mapping[int, str] | Sequence[str]) -> float:
    """``#follows + 0.5 * #partially`` over a method's verdicts (``"follows"``,
    ``"partially"``, ``"does not"``), given as a mapping principle -> verdict or a sequence."""
    values = list(verdicts.values()) if isinstance(verdicts, Mapping) else list(verdicts)
    bad = [v for v in values if v not in _VERDICT_WEIGHT]
    if bad:
        raise ValueError(f"unknown verdict(s) {bad}; expected one of {list(_VERDICT_WEIGHT)}")
    return float(sum(_VERDICT_WEIGHT[v] for v in values))


def _label_of_registry(name: str) -> str | None:
    for label, (reg, _) in ASSESSMENT_METHODS.items():
        if reg == name:
            return label
    return None


def _principle_rows(seed: int) -> list[dict]:
    rows = principles.principles_table(methods=[reg for reg, _ in ASSESSMENT_METHODS.values()],
                                       seed=seed)
    out = []
    for r in rows:
        label = _label_of_registry(r["method"])
        if label is None:
            continue
        verdicts = [r[f"verdict_{p}"] for p in (1, 2, 3)]
        out.append({"method": label, "registry": r["method"],
                    **{f"verdict_{p}": verdicts[p - 1] for p in (1, 2, 3)},
                    **{f"score_{p}": float(r[f"score_{p}"]) for p in (1, 2, 3)},
                    "principles": principle_count(verdicts),
                    "principles_paper": PAPER_PRINCIPLE_COUNTS[label]})
    return out


def _principles_fingerprint() -> str:
    """A hash of the principles module's source, so cached audits follow code changes."""
    try:
        text = inspect.getsource(principles)
    except (OSError, TypeError):  # pragma: no cover - no source shipped
        return "nosource"
    return hashlib.sha1(text.encode()).hexdigest()[:10]


def measured_principle_counts(seed: int = 0, store: UnitStore | None = None
                              ) -> tuple[dict[str, float], list[dict]]:
    """The number of principles each of the six methods follows, as the audit measures it.

    Runs :func:`taylorattr.principles.principles_table` (about a second on 2 cores) and
    counts ``follows`` as 1 and ``partially`` as 0.5. Returns ``(counts, rows)`` with
    ``counts[label]`` keyed by the labels of :data:`ASSESSMENT_METHODS` and one row per
    method (verdicts, scores, count, the paper's count). With ``store`` the audit is a
    unit keyed by the seed and a hash of the principles module's source.
    """
    if store is None:
        rows = _principle_rows(seed)
    else:
        key = f"principles-seed{seed}-src{_principles_fingerprint()}"
        rows = store.get(key, lambda: {"rows": _principle_rows(seed)})["rows"]
    return {r["method"]: float(r["principles"]) for r in rows}, rows


def _ranks(v: torch.Tensor) -> torch.Tensor:
    """Ranks 1..n with ties given their average rank."""
    order = torch.argsort(v, stable=True)
    ranks = torch.empty_like(v)
    ranks[order] = torch.arange(1, v.numel() + 1, dtype=v.dtype)
    out = ranks.clone()
    for value in torch.unique(v):
        tie = v == value
        out[tie] = ranks[tie].mean()
    return out


def spearman(x: Sequence[float], y: Sequence[float]) -> float:
    """Spearman's rank correlation: Pearson's r of the (average-tie) ranks.

    NaN when fewer than two pairs remain or either side is constant (undefined), as
    ``scipy.stats.spearmanr`` gives.
    """
    xs = torch.as_tensor(list(x), dtype=torch.float64)
    ys = torch.as_tensor(list(y), dtype=torch.float64)
    if xs.shape != ys.shape or xs.dim() != 1:
        raise ValueError(f"x and y must be 1-D of the same length, got {tuple(xs.shape)} and "
                         f"{tuple(ys.shape)}")
    if xs.numel() < 2:
        return float("nan")
    rx, ry = _ranks(xs), _ranks(ys)
    rx, ry = rx - rx.mean(), ry - ry.mean()
    den = rx.norm() * ry.norm()
    if den == 0:
        return float("nan")
    return float((rx * ry).sum() / den)


def mask_coverage(masks: torch.Tensor) -> torch.Tensor:
    """Share of the image each mask covers, ``[B]`` float64 (masks ``[B, H, W]``)."""
    if masks.dim() == 4 and masks.shape[1] == 1:
        masks = masks[:, 0]
    if masks.dim() != 3:
        raise ValueError(f"masks must be [B, H, W] or [B, 1, H, W], got {tuple(masks.shape)}")
    m = masks.to(torch.bool).flatten(1)
    return m.sum(1).to(torch.float64) / m.shape[1]


def keep_by_coverage(masks: torch.Tensor, max_coverage: float = MAX_MASK_COVERAGE
                     ) -> torch.Tensor:
    """``[B]`` bool: the images the experiment keeps, those whose mask covers at most
    ``max_coverage`` of the image (and at least one pixel: bbox accuracy needs ``n >= 1``)."""
    cov = mask_coverage(masks)
    return (cov <= max_coverage) & (cov > 0)


def square_output_changes(model, inputs: torch.Tensor, target: torch.Tensor, baselines=0.0,
                          max_side: int = 10, batch_size: int = 1024) -> torch.Tensor:
    """``f(x) - f(x with square k set to the baseline)`` for every square of
    :func:`taylorattr.metrics.square_removal`, ``[B, N]`` float64.

    ``f`` is the logit of ``target`` (``[B]``). These are the true changes of
    :func:`taylorattr.metrics.infidelity`'s square removal; they do not depend on the
    attribution, so one set serves every method.
    """
    x = inputs.detach()
    b, _, h, w = x.shape
    t = target.to(torch.long)
    base = broadcast_baselines(baselines, x)
    changes = []
    with torch.no_grad():
        fx = select_output(model(x), t).to(torch.float64)
        for rows in square_removed_rows(x, base, square_removal(h, w, max_side),
                                        max(1, batch_size // b)):
            m = rows.shape[1]
            f = select_output(model(rows.reshape((b * m,) + tuple(x.shape[1:]))),
                              t.repeat_interleave(m))
            changes.append(fx[:, None] - f.to(torch.float64).view(b, m))
    return torch.cat(changes, 1)


def square_predictions(attributions: torch.Tensor, max_side: int = 10) -> torch.Tensor:
    """The sum of the (channel-summed) attribution over every square of
    :func:`taylorattr.metrics.square_removal`, ``[B, N]`` float64, from an integral image."""
    _, _, h, w = attributions.shape
    return square_sums(attributions.detach(), square_removal(h, w, max_side))


def infidelity_from_changes(predictions: torch.Tensor, changes: torch.Tensor,
                            normalize: bool = True) -> torch.Tensor:
    """``mean_k (beta * pred_k - change_k)^2`` per sample, ``[B]`` float64, with the optimal
    ``beta`` of :func:`taylorattr.metrics.infidelity` (or ``beta = 1``)."""
    return optimal_beta_score(predictions.to(torch.float64), changes.to(torch.float64), normalize)


# =======================================================================================
# Attributions and units
# =======================================================================================
def _attribute(method: tuple[str, dict], model, x, target, baselines, seed: int):
    name, kw = method
    spec = METHODS[name]
    kw = dict(kw)
    if name == "expected_gradients":
        kw["seed"] = seed
    if spec.uses_baselines and name != "expected_gradients":
        kw["baselines"] = baselines
    return spec(model, x, target=target, **kw).detach()


def _timed(fn):
    start = time.perf_counter()
    out = fn()
    out["seconds"] = time.perf_counter() - start
    return out


def _settings_tag(kw: dict) -> str:
    return ",".join(f"{k}={kw[k]}" for k in sorted(kw)) or "default"


# =======================================================================================
# The experiments
# =======================================================================================
def _mean_sem(v: torch.Tensor) -> tuple[float, float]:
    v = v.to(torch.float64)
    mean = float(v.mean())
    sem = float(v.std() / math.sqrt(v.numel())) if v.numel() > 1 else float("nan")
    return mean, sem


def _mnist_held(mnist_dir, n: int) -> torch.Tensor:
    from .. import data

    images, labels = data.load_mnist(mnist_dir)
    held = data.mnist_split(images, labels, seed=0).held_images
    if n > held.shape[0]:
        raise ValueError(f"n_samples={n} exceeds the {held.shape[0]} held-out digits")
    return held[:n]


def _batches(x: torch.Tensor, batch_size: int) -> list[tuple[int, int]]:
    return [(i, min(i + batch_size, x.shape[0])) for i in range(0, x.shape[0], batch_size)]


class _Runner:
    """State shared by the experiments of one :func:`run_assessment` call."""

    def __init__(self, out: Path, seed: int, quick: bool, mnist_dir, show_progress: bool,
                 batch_size: int, epochs: int | None, dtype: torch.dtype,
                 methods: Sequence[str], method_kwargs: Mapping[str, Mapping] | None = None):
        self.out, self.seed, self.quick, self.mnist_dir = out, seed, quick, mnist_dir
        self.show_progress, self.batch_size, self.epochs, self.dtype = (
            show_progress, batch_size, epochs, dtype)
        self.store = UnitStore(out / "assessment" / "units")
        extra = dict(method_kwargs or {})
        self.methods = {label: (ASSESSMENT_METHODS[label][0],
                                {**ASSESSMENT_METHODS[label][1], **dict(extra.get(label, {}))})
                        for label in methods}
        self._models: dict[str, tuple[Any, str]] = {}
        self.model_rows: list[dict] = []

    def model(self, name: str):
        """A trained registered model (cached by get_trained) and its fingerprint."""
        if name not in self._models:
            model, info = M.get_trained(name, self.out, seed=self.seed, quick=self.quick,
                                        epochs=self.epochs, mnist_dir=self.mnist_dir,
                                        show_progress=self.show_progress)
            model = model.to(self.dtype).eval()
            self._models[name] = (model, model_fingerprint(model))
            self.model_rows.append({"model": MODEL_LABELS.get(name, name),
                                    "held_out_accuracy": info["held_out_accuracy"],
                                    "epochs": info["epochs"], "n_train": info["n_train"],
                                    "n_held_out": info["n_held_out"], "data": info["data"],
                                    "train_seconds": info.get("train_seconds"),
                                    "cached": info.get("cached")})
        return self._models[name]

    # ---- infidelity (experiments 1 and 2) ----------------------------------------------
    def _changes(self, name, model, mfp, x, xfp):
        key = f"changes-{name}-{mfp}-{xfp}"

        def compute():
            with torch.no_grad():
                target = model(x).argmax(1)
            return {"target": target,
                    "changes": square_output_changes(model, x, target, 0.0)}
        return self.store.get(key, lambda: _timed(compute))

    def infidelity_units(self, models: Sequence[str], x: torch.Tensor, labels: Sequence[str],
                         desc: str) -> dict:
        """Scores per (model, label, batch); labels are method labels or 'Taylor-K<k>'."""
        spans = _batches(x, self.batch_size)
        units = [(m, s) for m in models for s in spans]
        out: dict = {}
        bar = tqdm(total=len(units) * len(labels), desc=desc, disable=not self.show_progress)
        for m, (i0, i1) in units:
            model, mfp = self.model(m)
            xb = x[i0:i1].to(self.dtype)
            xfp = fingerprint([("x", xb)])
            ch = self._changes(m, model, mfp, xb, xfp)
            out[(m, "changes", i0)] = ch
            for label in labels:
                bar.set_postfix_str(f"{m} {label} {i0}:{i1}")
                out[(m, label, i0)] = self.store.get(
                    f"infidelity-{m}-{label}-{self._label_tag(label)}-seed{self.seed}-{mfp}-{xfp}",
                    lambda label=label, model=model, xb=xb, ch=ch: _timed(
                        lambda: self._score(label, model, xb, ch)))
                bar.update(1)
        bar.close()
        return out

    def _label_tag(self, label: str) -> str:
        if label.startswith("Taylor-K"):
            return "taylor"
        return _settings_tag(self.methods[label][1])

    def _score(self, label, model, xb, ch) -> dict:
        target = ch["target"]
        if label.startswith("Taylor-K"):
            from ..taylor import taylor_attribution

            attr = taylor_attribution(model, xb, 0.0, target, int(label[len("Taylor-K"):]))
        else:
            try:
                attr = _attribute(self.methods[label], model, xb, target, 0.0, self.seed)
            except UnsupportedModelError as exc:
                return {"error": f"{type(exc).__name__}: {exc}"}
        pred = square_predictions(attr)
        return {"infidelity": infidelity_from_changes(pred, ch["changes"])}

    # ---- bounding boxes (experiment 3) -------------------------------------------------
    def bbox_units(self, name: str, model, mfp: str, x: torch.Tensor, masks: torch.Tensor,
                   labels_true: torch.Tensor, baselines, target_mode: str) -> dict:
        spans = _batches(x, self.batch_size)
        out = {}
        bar = tqdm(total=len(spans) * len(self.methods), desc=f"bbox {name}",
                   disable=not self.show_progress)
        for i0, i1 in spans:
            xb = x[i0:i1].to(self.dtype)
            mb = masks[i0:i1]
            if target_mode == "label":
                target = labels_true[i0:i1].to(torch.long)
            else:
                with torch.no_grad():
                    target = model(xb).argmax(1)
            xfp = fingerprint([("x", xb), ("mask", mb), ("target", target)])
            for label, method in self.methods.items():
                bar.set_postfix_str(f"{label} {i0}:{i1}")

                def compute(method=method, xb=xb, mb=mb, target=target):
                    try:
                        attr = _attribute(method, model, xb, target, baselines, self.seed)
                    except UnsupportedModelError as exc:
                        return {"error": f"{type(exc).__name__}: {exc}"}
                    return {"accuracy": bbox_accuracy(attr.to(torch.float64), mb)}
                out[(name, label, i0)] = self.store.get(
                    f"bbox-{name}-{label}-{_settings_tag(method[1])}-seed{self.seed}-{mfp}-{xfp}",
                    lambda: _timed(compute))
                bar.update(1)
        bar.close()
        return out


def _collect(units: dict, model: str, label: str, starts: Sequence[int], key: str
             ) -> tuple[torch.Tensor | None, float, str]:
    parts, seconds, note = [], 0.0, ""
    for i0 in starts:
        u = units[(model, label, i0)]
        seconds += float(u.get("seconds", 0.0))
        if "error" in u:
            note = str(u["error"])
            continue
        parts.append(u[key])
    if note or not parts:
        return None, seconds, note or "no samples"
    return torch.cat(parts), seconds, ""


def _correlation_rows(rows: list[dict], experiment: str, metric: str) -> list[dict]:
    out = []
    for model in dict.fromkeys(r["model"] for r in rows):
        valid = [r for r in rows if r["model"] == model and r[metric] is not None
                 and math.isfinite(r[metric])]
        no_eg = [r for r in valid if r["method"] != "EG"]
        out.append({"experiment": experiment, "model": model, "metric": metric,
                    "spearman": spearman([r["principles"] for r in valid],
                                         [r[metric] for r in valid]),
                    "spearman_without_eg": spearman([r["principles"] for r in no_eg],
                                                    [r[metric] for r in no_eg]),
                    "spearman_paper_counts": spearman([r["principles_paper"] for r in valid],
                                                      [r[metric] for r in valid]),
                    "n_methods": len(valid), "paper_sign": PAPER_CORRELATION_SIGN[experiment]})
    return out


def _experiment_infidelity(run: _Runner, models, n, counts, result: AssessmentResult):
    x = _mnist_held(run.mnist_dir, n)
    labels = list(run.methods)
    units = run.infidelity_units(models, x, labels, "infidelity")
    starts = [i0 for i0, _ in _batches(x, run.batch_size)]
    for m in models:
        for label in labels:
            v, seconds, note = _collect(units, m, label, starts, "infidelity")
            mean, sem = _mean_sem(v) if v is not None else (None, None)
            result.infidelity.append({
                "model": MODEL_LABELS.get(m, m), "method": label,
                "principles": counts.get(label), "principles_paper": PAPER_PRINCIPLE_COUNTS[label],
                "infidelity": mean, "infidelity_sem": sem, "n": 0 if v is None else v.numel(),
                "seconds": round(seconds, 3), "note": note})
        ch = sum(float(units[(m, "changes", i0)].get("seconds", 0.0)) for i0 in starts)
        result.timings[f"infidelity removal forwards {MODEL_LABELS.get(m, m)} (s)"] = round(ch, 3)
    result.correlations += _correlation_rows(result.infidelity, "infidelity", "infidelity")


def _experiment_taylor(run: _Runner, models, n, orders, result: AssessmentResult):
    x = _mnist_held(run.mnist_dir, n)
    labels = [f"Taylor-K{k}" for k in orders]
    units = run.infidelity_units(models, x, labels, "taylor order")
    starts = [i0 for i0, _ in _batches(x, run.batch_size)]
    for m in models:
        mlabel = MODEL_LABELS.get(m, m)
        for k, label in zip(orders, labels):
            v, seconds, note = _collect(units, m, label, starts, "infidelity")
            mean, sem = _mean_sem(v) if v is not None else (None, None)
            result.taylor_order.append({
                "model": mlabel, "order": k, "infidelity": mean, "infidelity_sem": sem,
                "paper": PAPER_TAYLOR_ORDER.get(mlabel, {}).get(k),
                "n": 0 if v is None else v.numel(), "seconds": round(seconds, 3), "note": note})


def _select(masks: torch.Tensor, n: int) -> tuple[torch.Tensor, int]:
    """Indices of the first ``n`` kept images, and how many were excluded before the last."""
    keep = keep_by_coverage(masks)
    idx = torch.nonzero(keep).flatten()[:n]
    scanned = int(idx[-1]) + 1 if idx.numel() else masks.shape[0]
    return idx, scanned - idx.numel()


def _bbox_rows(run: _Runner, name: str, label_model: str, units: dict, starts, counts,
               n_excluded: int, result: AssessmentResult):
    for label in run.methods:
        v, seconds, note = _collect(units, name, label, starts, "accuracy")
        mean, sem = _mean_sem(v) if v is not None else (None, None)
        result.bbox.append({
            "model": label_model, "method": label, "principles": counts.get(label),
            "principles_paper": PAPER_PRINCIPLE_COUNTS[label], "bbox_accuracy": mean,
            "bbox_accuracy_sem": sem, "n": 0 if v is None else v.numel(),
            "n_excluded": n_excluded, "seconds": round(seconds, 3), "note": note})


def _experiment_bbox(run: _Runner, models, n, counts, result: AssessmentResult,
                     target_mode: str):
    if not models:
        return
    canv = M.held_out_canvases(run.mnist_dir)
    idx, n_excluded = _select(canv.masks, n)
    x, masks, labels = canv.images[idx], canv.masks[idx], canv.labels[idx]
    starts = [i0 for i0, _ in _batches(x, run.batch_size)]
    for name in models:
        model, mfp = run.model(name)
        units = run.bbox_units(name, model, mfp, x, masks, labels, 0.0, target_mode)
        _bbox_rows(run, name, MODEL_LABELS.get(name, name), units, starts, counts, n_excluded,
                   result)


def _experiment_imagenet(run: _Runner, root, weights: Mapping[str, Any], n, counts,
                         result: AssessmentResult, target_mode: str, size: tuple[int, int],
                         synsets):
    from .. import data
    unknown = sorted(set(weights) - set(IMAGENET_MODELS))
    if unknown:
        raise ValueError(f"weights names must be among {IMAGENET_MODELS}, got {unknown}")
    resize, crop = size
    ds = data.ImageFolderWithBoxes(root, size=crop, resize=resize, synsets=synsets)
    xs, ms, ys, excluded = [], [], [], 0
    for i in range(len(ds)):
        if len(xs) >= n:
            break
        img, mask, label, _ = ds[i]
        if bool(keep_by_coverage(mask[None])[0]):
            xs.append(img), ms.append(mask), ys.append(label)
        else:
            excluded += 1
    if not xs:
        raise ValueError(f"no image under {root} has a box mask covering at most "
                         f"{MAX_MASK_COVERAGE:.0%} of the cropped image")
    x, masks, labels = torch.stack(xs), torch.stack(ms), torch.tensor(ys)
    mean = torch.tensor(data.IMAGENET_MEAN, dtype=run.dtype).view(1, 3, 1, 1)
    std = torch.tensor(data.IMAGENET_STD, dtype=run.dtype).view(1, 3, 1, 1)
    black = -mean / std
    starts = [i0 for i0, _ in _batches(x, run.batch_size)]
    for name in IMAGENET_MODELS:
        if name not in weights:
            continue
        model = M.torchvision_model(name, weights[name]).to(run.dtype).eval()
        mfp = model_fingerprint(model)
        run.model_rows.append({"model": MODEL_LABELS[name], "weights": str(weights[name]),
                               "held_out_accuracy": None, "data": f"ImageNet-style folder {root}"})
        units = run.bbox_units(name, model, mfp, x, masks, labels, black, target_mode)
        _bbox_rows(run, name, MODEL_LABELS[name], units, starts, counts, excluded, result)


def run_assessment(out_dir: str | Path, experiments: Sequence[str] = EXPERIMENTS,
                   quick: bool = True, n_samples: int | None = None, seed: int = 0,
                   mnist_dir=None, show_progress: bool = True,
                   principle_counts: Mapping[str, float] | None = None, *,
                   models: Mapping[str, Sequence[str]] | None = None,
                   methods: Sequence[str] | None = None,
                   method_kwargs: Mapping[str, Mapping] | None = None,
                   orders: Sequence[int] = (1, 2),
                   batch_size: int = 8, epochs: int | None = None,
                   dtype: torch.dtype = torch.float32, bbox_target: str = "predicted",
                   imagenet_dir=None, weights: Mapping[str, Any] | None = None,
                   imagenet_size: tuple[int, int] = (256, 224), synsets=None,
                   plots: bool = True) -> AssessmentResult:
    """Run the assessment experiments; returns the tables and writes them under
    ``out_dir/assessment`` (``assessment.json``, one CSV per table, PNG figures).

    Args:
        out_dir: results folder; trained models are cached in ``out_dir/models`` (shared
            with the other experiments), units in ``out_dir/assessment/units``.
        experiments: any of ``"infidelity"``, ``"taylor_order"``, ``"bbox"``.
        quick: :data:`QUICK_SAMPLES` and briefly trained models; else :data:`FULL_SAMPLES`
            and fully trained models.
        n_samples: overrides the sample count of every experiment.
        principle_counts: ``{method label: count}`` for the x-axis; default: measured by
            the principle audit (:func:`measured_principle_counts`).
        models: ``{experiment: model names}`` overriding :data:`DEFAULT_MODELS`.
        methods: subset of the labels of :data:`ASSESSMENT_METHODS` (default all six).
        method_kwargs: ``{label: {argument: value}}`` overriding a method's settings,
            e.g. ``{"IG": {"n_steps": 200}, "EG": {"n_samples": 256}}``.
        orders: Taylor orders of the ``"taylor_order"`` experiment.
        batch_size: samples per unit.
        epochs: training epochs override passed to ``get_trained`` (``0``: untrained).
        dtype: the models' and inputs' dtype (float32 by default, for speed).
        bbox_target: ``"predicted"`` (argmax class) or ``"label"`` (the true class).
        imagenet_dir: an ILSVRC-style folder of images with Pascal-VOC XML boxes; with
            ``weights`` (``{"vgg16" | "vgg19" | "resnet18": state-dict path}``) the bbox
            experiment also runs those torchvision models on it.
        imagenet_size: ``(resize, crop)``, ``(256, 224)`` as the paper.
        synsets: class order for the folder (see ``ImageFolderWithBoxes``).
        plots: write the trend figures (Figures 3 and 4) as PNG.
    """
    bad = [e for e in experiments if e not in EXPERIMENTS]
    if bad:
        raise ValueError(f"experiments must be among {EXPERIMENTS}, got {bad}")
    if bbox_target not in ("predicted", "label"):
        raise ValueError(f"bbox_target must be 'predicted' or 'label', got {bbox_target!r}")
    labels = list(ASSESSMENT_METHODS) if methods is None else list(methods)
    unknown = [m for m in labels if m not in ASSESSMENT_METHODS]
    unknown += [m for m in (method_kwargs or {}) if m not in ASSESSMENT_METHODS]
    if unknown:
        raise ValueError(f"methods must be among {list(ASSESSMENT_METHODS)}, got {unknown}")
    if imagenet_dir is not None and not weights:
        raise ValueError("the ImageNet route needs weights={'vgg16'|'vgg19'|'resnet18': path} "
                         "(no weights are downloaded)")
    chosen = {**DEFAULT_MODELS, **(dict(models) if models else {})}
    samples = dict(QUICK_SAMPLES if quick else FULL_SAMPLES)
    if n_samples is not None:
        samples = {k: int(n_samples) for k in samples}
    out = Path(out_dir)
    run = _Runner(out, seed, quick, mnist_dir, show_progress, batch_size, epochs, dtype, labels,
                  method_kwargs)
    result = AssessmentResult()

    needs_counts = "infidelity" in experiments or "bbox" in experiments
    if principle_counts is None and needs_counts:
        start = time.perf_counter()
        counts, rows = measured_principle_counts(seed, run.store)
        result.principles = rows
        result.timings["principle audit (s)"] = round(time.perf_counter() - start, 3)
        counts_source = "measured by taylorattr.principles.principles_table"
    else:
        counts = {k: float(v) for k, v in (principle_counts or {}).items()}
        result.principles = [{"method": k, "principles": v,
                              "principles_paper": PAPER_PRINCIPLE_COUNTS.get(k)}
                             for k, v in counts.items()]
        counts_source = "given by the caller"
    missing = [m for m in labels if m not in counts] if needs_counts else []
    if missing:
        raise ValueError(f"principle_counts lacks {missing}")

    result.settings = {
        "quick": quick, "seed": seed, "batch_size": batch_size, "dtype": str(dtype),
        "samples": {e: samples[e] for e in experiments}, "models": {e: list(chosen[e])
                                                                 for e in experiments},
        "methods": {label: {"registry": name, **kw} for label, (name, kw) in run.methods.items()},
        "eg_noise_std": principles.EG_NOISE_STD, "orders": list(orders), "bbox_target": bbox_target,
        "max_mask_coverage": MAX_MASK_COVERAGE, "principle_counts_source": counts_source,
        "principle_count_rule": "follows = 1, partially = 0.5, does not = 0",
        "infidelity": "square removal, sides 1..10, baseline 0, normalize=True, "
                      "target = predicted class",
    }
    for exp in experiments:
        start = time.perf_counter()
        if exp == "infidelity":
            _experiment_infidelity(run, chosen[exp], samples[exp], counts, result)
        elif exp == "taylor_order":
            _experiment_taylor(run, chosen[exp], samples[exp], tuple(orders), result)
        else:
            _experiment_bbox(run, chosen[exp], samples[exp], counts, result, bbox_target)
            if imagenet_dir is not None:
                _experiment_imagenet(run, imagenet_dir, weights, samples[exp], counts, result,
                                     bbox_target, tuple(imagenet_size), synsets)
            result.correlations += _correlation_rows(result.bbox, "bbox", "bbox_accuracy")
        result.timings[f"{exp} (s)"] = round(time.perf_counter() - start, 3)
    result.models = run.model_rows

    folder = out / "assessment"
    if plots:
        from ..plotting import plot_trend

        if result.infidelity:
            result.figures.append(str(plot_trend(
                result.infidelity, "infidelity", folder / "figure3_infidelity.png",
                title="Infidelity vs principles followed (Figure 3)")))
        if result.bbox:
            result.figures.append(str(plot_trend(
                result.bbox, "bbox_accuracy", folder / "figure4_bbox_accuracy.png",
                title="Bounding-box accuracy vs principles followed (Figure 4)")))
    _io.save_json(result.to_json(), folder / "assessment.json")
    for name in ("infidelity", "taylor_order", "bbox", "correlations", "principles", "models"):
        rows = getattr(result, name)
        if rows:
            _io.save_csv(rows, folder / f"{name}.csv")
    return result


# =======================================================================================
# Markdown
# =======================================================================================
def _fmt(v, spec=".4g") -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "n/a"
    return format(v, spec)


def _trend_table(rows: list[dict], metric: str, sem: str) -> list[str]:
    models = list(dict.fromkeys(r["model"] for r in rows))
    methods = list(dict.fromkeys(r["method"] for r in rows))
    look = {(r["model"], r["method"]): r for r in rows}
    head = ["method", "principles (measured)", "principles (paper)"] + models
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for meth in methods:
        first = next(r for r in rows if r["method"] == meth)
        cells = [meth, _fmt(first["principles"], "g"), _fmt(first["principles_paper"], "g")]
        for m in models:
            r = look.get((m, meth))
            if r is None or r[metric] is None:
                cells.append("unsupported" if r is not None and r.get("note") else "")
            else:
                cells.append(f"{r[metric]:.4g} ± {_fmt(r[sem], '.2g')}")
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def _correlation_table(result: AssessmentResult, experiment: str) -> list[str]:
    rows = [r for r in result.correlations if r["experiment"] == experiment]
    if not rows:
        return []
    sign = PAPER_CORRELATION_SIGN[experiment]
    lines = ["", f"Spearman rank correlation with the number of principles (paper: {sign}):", "",
             "| model | measured counts | paper's counts | measured, without EG | methods |",
             "|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['model']} | {_fmt(r['spearman'], '.3f')} | "
                     f"{_fmt(r['spearman_paper_counts'], '.3f')} | "
                     f"{_fmt(r.get('spearman_without_eg'), '.3f')} | {r['n_methods']} |")
    lines += ["", ("Without EG: its baselines are drawn from N(x, s^2), so it explains "
                   "f(x) - E f(x + noise), not the removal to 0 that the square perturbations "
                   "test.")]
    return lines


def format_assessment(result: AssessmentResult) -> str:
    """Markdown: each experiment's table beside the paper's claims."""
    s = result.settings
    lines: list[str] = []
    if result.principles:
        lines += ["### Principles followed (x-axis)", "",
                  ("Count = #follows + 0.5 x #partially, from the measured verdicts "
                   f"({s.get('principle_counts_source', '')})."), "",
                  "| method | principle 1 | principle 2 | principle 3 | count | paper's count |",
                  "|---|---|---|---|---|---|"]
        for r in result.principles:
            v = [r.get(f"verdict_{p}", "") for p in (1, 2, 3)]
            lines.append(f"| {r['method']} | {v[0]} | {v[1]} | {v[2]} | "
                         f"{_fmt(r['principles'], 'g')} | {_fmt(r.get('principles_paper'), 'g')} |")
        lines.append("")
    if result.infidelity:
        n = result.settings.get("samples", {}).get("infidelity")
        lines += ["### Infidelity vs principles (paper Figure 3)", "",
                  ("Square removal (sides 1..10, baseline 0), optimal beta, predicted-class "
                   f"logit; mean ± standard error over {n} held-out MNIST digits. Lower is "
                   "better. Occ-2x2 is Occlusion-patch with 2x2 windows."), ""]
        lines += _trend_table(result.infidelity, "infidelity", "infidelity_sem")
        lines += _correlation_table(result, "infidelity")
        lines.append("")
    if result.taylor_order:
        n = result.settings.get("samples", {}).get("taylor_order")
        lines += ["### Infidelity of first- vs second-order Taylor attribution", "",
                  f"Baseline 0, predicted-class logit, {n} held-out digits. The paper: "
                  "second order lower (better) on both models. Our infidelity is in squared "
                  "logit units, the paper's scale is not stated, so compare directions. "
                  "Paper: " + "; ".join(f"{m} {d[1]} (first) vs {d[2]} (second)"
                                        for m, d in PAPER_TAYLOR_ORDER.items()) + ".", "",
                  "| model | order | infidelity | paper |", "|---|---|---|---|"]
        for r in result.taylor_order:
            val = "n/a" if r["infidelity"] is None else (
                f"{r['infidelity']:.4g} ± {_fmt(r['infidelity_sem'], '.2g')}")
            lines.append(f"| {r['model']} | {r['order']} | {val} | {_fmt(r['paper'], 'g')} |")
        by_model: dict[str, dict[int, float]] = {}
        for r in result.taylor_order:
            by_model.setdefault(r["model"], {})[r["order"]] = r["infidelity"]
        for m, d in by_model.items():
            if d.get(1) is not None and d.get(2) is not None:
                verdict = "lower" if d[2] < d[1] else "not lower"
                lines.append(f"\n{m}: second-order infidelity is {verdict} than first-order "
                             f"({d[2]:.4g} vs {d[1]:.4g}; paper: lower).")
        lines.append("")
    if result.bbox:
        n = result.settings.get("samples", {}).get("bbox")
        excl = {r["model"]: r["n_excluded"] for r in result.bbox}
        lines += ["### Bounding-box accuracy vs principles (paper Figure 4)", "",
                  f"Up to {n} held-out images per model whose box covers at most "
                  f"{MAX_MASK_COVERAGE:.0%} of the image (excluded: "
                  + ", ".join(f"{m} {k}" for m, k in excl.items()) + f"); target: "
                  f"{s.get('bbox_target', 'predicted')} class. Higher is better.", ""]
        lines += _trend_table(result.bbox, "bbox_accuracy", "bbox_accuracy_sem")
        notes = {}
        for r in result.bbox:
            if r.get("note"):
                notes.setdefault(" ".join(r["note"].splitlines()[:2])[:240], []).append(
                    f"{r['method']} on {r['model']}")
        for note, where in notes.items():
            lines.append(f"\n{', '.join(where)}: {note}")
        lines += _correlation_table(result, "bbox")
        lines.append("")
    if result.models:
        acc = ", ".join(f"{m['model']} {100 * m['held_out_accuracy']:.1f}%"
                        for m in result.models if m.get("held_out_accuracy") is not None)
        if acc:
            lines.append(f"Held-out accuracy of the models: {acc}.")
    if result.timings:
        lines.append("Timings: " + ", ".join(f"{k} {v}" for k, v in result.timings.items()) + ".")
    return "\n".join(lines)
