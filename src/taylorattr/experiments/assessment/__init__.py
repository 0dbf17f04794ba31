"""Paper Figures 3 and 4: attribution quality against the number of principles followed.

Three experiments (the paper's section "Attribution assessment"), each a table of data:

1. ``"infidelity"``: infidelity (Yeh et al. 2019; square removal, every square of side
   1..10 at every position set to the baseline 0, optimal-beta normalisation, output =
   logit of the predicted class) of every method registered for the assessment
   (:func:`taylorattr.paper_methods.variants`; by default the paper's six) on M-sg, C-sg and C-sp trained on MNIST, averaged over held-out digits;
   beside it the number of principles each method follows *as the audit measured it*
   (:func:`taylorattr.principles.principles_table`) and, per model, the Spearman rank
   correlation between infidelity and that number (the paper claims a negative one).
2. ``"taylor_order"``: infidelity of the first- and second-order Taylor attribution
   (:func:`taylorattr.taylor.terms.taylor_attribution`, baseline 0) on C-sg and C-sp. The paper
   reports 0.48 (first) vs 0.27 (second) on C-sg and 0.84 vs 0.75 on C-sp: the
   second-order attribution has the *lower* (better) infidelity.
3. ``"bbox"``: bounding-box accuracy (Schulz et al. 2020) of the same methods on the
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
normalised coordinates, ``-mean / std``. Each method runs with the settings of its
registry row (e.g. IG with 50 Gauss-Legendre nodes, 50 references drawn for a method
with a noise baseline; the audit itself draws 256). DL: the Rescale rule; it is reported as unsupported
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

Cost on the ImageNet route. The registry's windows and players were chosen for 28x28
digits; :class:`ImagenetRoute` multiplies every window/player setting (``patch``,
``stride``) by its ``patch_scale``: by default 1 where the models run on CUDA and
``crop / 28`` = 8 on a CPU (the assessment runs its models on the CPU), so each window
covers the share of the image it covers on MNIST. Forwards per 224x224 image, scale 8
(scale 1, the paper's pixel level, in brackets): Occ-1 785 (50,177), Occ-2x2 197 (12,545),
Shapley-4x4 1,227 (78,402), KernelSHAP-4x4 301 (301), PredDiff-4x4 393 (25,089); IG, EG,
GS and the SmoothGrad family 51 forwards and 50 backwards, GI and Saliency one of each. A
ResNet-18 row takes about 0.25 s on two CPU cores, so the defaults cost about 15 minutes
per image, the pixel level about 11 hours. Labels stay the registry's; the scale, the
windows and the rows per image are in ``settings["imagenet"]`` and a note line of the
table, and a method above :data:`taylorattr.runtime.cost.GPU_SCALE_ROWS` rows per image on a CPU
(:attr:`taylorattr.runtime.cost.Cost.gpu_scale`) is flagged in its row's note. With the
workspace's ``progress`` every unit shows a per-chunk bar (rows, totalled by the method's
planned rows), also inside one long attribution.

Modules: :mod:`.infidelity` (experiments 1 and 2), :mod:`.localisation` (experiment 3),
:mod:`.ranking` (principle counts and rank correlations), :mod:`.formatting` (Markdown).
:class:`AssessmentStage` holds the settings (sample counts, methods per experiment) that
:func:`run_assessment` runs and counts their rows before they run.

Why one module: the stage's settings, its cost and :func:`run_assessment` resolve the same
defaults (:data:`QUICK_SAMPLES`, :data:`DEFAULT_MODELS`); apart, one would copy the other's.
"""
from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import torch

from ... import _io
from ... import models as M
from ...baselines import Noise, describe
from ...metrics import infidelity_cost
from ...paper_methods import marker, variants
from ...reporting.plotting import assign_markers, plot_trend
from .. import paper
from ..plans import StageCost, architecture, method_costs
from ..workspace import Workspace
from .formatting import format_assessment
from .infidelity import (
    infidelity_from_changes,
    run_infidelity,
    run_taylor_order,
    square_output_changes,
    square_predictions,
    taylor_order_methods,
)
from .localisation import (
    MAX_MASK_COVERAGE,
    ImagenetRoute,
    keep_by_coverage,
    mask_coverage,
    run_bbox,
    run_imagenet,
    scale_patches,
)
from .ranking import correlation_rows, measured_principle_counts
from .stage import Stage

__all__ = [
    "DEFAULT_MODELS",
    "EXPERIMENTS",
    "FULL_SAMPLES",
    "INPUT_SHAPES",
    "MAX_MASK_COVERAGE",
    "QUICK_SAMPLES",
    "AssessmentResult",
    "AssessmentStage",
    "ImagenetRoute",
    "assessment_methods",
    "format_assessment",
    "infidelity_from_changes",
    "keep_by_coverage",
    "mask_coverage",
    "measured_principle_counts",
    "reference_distributions",
    "run_assessment",
    "square_output_changes",
    "square_predictions",
]

EXPERIMENTS = ("infidelity", "taylor_order", "bbox")
DEFAULT_MODELS: dict[str, tuple[str, ...]] = {
    "infidelity": ("m_sg", "c_sg", "c_sp"),
    "taylor_order": ("c_sg", "c_sp"),
    "bbox": ("loc_c_sg", "loc_c_sp", "loc_vgg", "loc_resnet"),
}
QUICK_SAMPLES = {"infidelity": 24, "taylor_order": 24, "bbox": 12}
FULL_SAMPLES = {"infidelity": 1000, "taylor_order": 1000, "bbox": 200}


#: Input shapes (without the batch axis) of each experiment: MNIST digits, and the
#: cluttered canvases of :func:`taylorattr.data.cluttered_mnist` (its default canvas).
INPUT_SHAPES = {"infidelity": (1, 28, 28), "taylor_order": (1, 28, 28), "bbox": (1, 64, 64)}


@dataclass(frozen=True)
class AssessmentStage:
    """The assessment's settings, resolved as :func:`run_assessment` resolves them
    (:attr:`samples` from ``quick`` and ``n_samples``; :meth:`methods` per experiment),
    and its rows (:meth:`cost`)."""

    experiments: tuple = EXPERIMENTS
    quick: bool = True
    n_samples: int | None = None
    seed: int = 0
    labels: tuple | None = None
    imagenet: ImagenetRoute | None = None
    orders: tuple = (1, 2)

    @property
    def samples(self) -> dict[str, int]:
        """Samples per experiment: :data:`QUICK_SAMPLES` or :data:`FULL_SAMPLES`, or
        ``n_samples`` for all."""
        if self.n_samples is not None:
            return {k: int(self.n_samples) for k in QUICK_SAMPLES}
        return dict(QUICK_SAMPLES if self.quick else FULL_SAMPLES)

    def methods(self, experiment: str) -> list:
        if experiment == "taylor_order":
            return taylor_order_methods(self.orders)
        return assessment_methods(self.seed, None if self.labels is None else list(self.labels))

    def cost(self) -> list:
        """One :class:`~taylorattr.experiments.plans.StageCost` per (experiment, model),
        untrained copies (the methods, and the square removals of infidelity), then one per
        model of the ImageNet route at its resolved patch scale."""

        out, samples = [], self.samples
        for exp in self.experiments:
            x = torch.zeros((samples[exp],) + INPUT_SHAPES[exp], device=torch.get_default_device())
            methods = self.methods(exp)
            for name in DEFAULT_MODELS[exp]:
                model = architecture(name, self.seed)
                costs, skipped = method_costs(methods, model, x)
                if exp != "bbox":
                    costs.append(infidelity_cost(x))
                out.append(StageCost(f"{exp} on {paper.model_label(name)}",
                                     ((costs, model, x),), int(x.shape[0]), tuple(skipped)))
        route = self.imagenet
        for name, path in ({} if route is None else route.weights).items():
            x = torch.zeros((samples["bbox"], 3, route.size[1], route.size[1]), device=torch.get_default_device())
            model = M.torchvision_model(name, path).eval()
            scale = route.resolved_patch_scale(M.model_device(model))
            methods = scale_patches(self.methods("bbox"), scale)
            costs, skipped = method_costs(methods, model, x)
            out.append(StageCost(f"bbox on {name}", ((costs, model, x),), int(x.shape[0]),
                                 tuple(skipped),
                                 (f"patch scale {scale}",) if scale != 1 else ()))
        return out


@dataclass
class AssessmentResult:
    """Tables of the assessment (data only; see :func:`format_assessment`).

    ``infidelity``: one row per (model, method): ``model, method, principles,
    principles_paper, infidelity`` (mean over samples), ``infidelity_sem`` (standard error),
    ``n, seconds`` (compute time of its units), ``note``.
    ``taylor_order``: ``model, order, infidelity, infidelity_sem, paper, n, seconds``.
    ``taylor_tests``: ``model, order, against, p_value, n, test, statement``: each order's
    per-sample infidelities against the order before, by a paired Wilcoxon signed-rank test.
    ``bbox``: ``model, method, principles, principles_paper, bbox_accuracy,
    bbox_accuracy_sem, n, n_excluded, seconds, note``.
    ``correlations``: ``experiment, model, metric, spearman`` (against the measured
    counts), ``spearman_paper_counts``, ``spearman_point_baselines`` (measured counts, the
    methods with a point baseline), ``n_methods, paper_sign``.
    ``principles``: ``method, registry, verdict_1..3, principles, principles_paper``.
    """

    infidelity: list[dict] = field(default_factory=list)
    taylor_order: list[dict] = field(default_factory=list)
    taylor_tests: list[dict] = field(default_factory=list)
    bbox: list[dict] = field(default_factory=list)
    correlations: list[dict] = field(default_factory=list)
    principles: list[dict] = field(default_factory=list)
    models: list[dict] = field(default_factory=list)
    settings: dict = field(default_factory=dict)
    timings: dict = field(default_factory=dict)
    figures: list[str] = field(default_factory=list)

    def to_json(self) -> dict:
        return {"infidelity": self.infidelity, "taylor_order": self.taylor_order,
                "taylor_tests": self.taylor_tests,
                "bbox": self.bbox, "correlations": self.correlations,
                "principles": self.principles, "models": self.models,
                "settings": self.settings, "timings": self.timings, "figures": self.figures}


def assessment_methods(seed: int = 0, labels: Sequence[str] | None = None,
                       method_kwargs: Mapping[str, Mapping] | None = None) -> list:
    """The bound methods of the assessment: every registered variant that takes part,
    seeded with ``seed``; ``labels`` keeps a subset; ``method_kwargs`` overrides settings
    per label (``{"IG": {"n_steps": 200}}``)."""
    bound = [spec.bind(v, context={"seed": seed}) for spec, v in variants("assessment")]
    known = [m.label for m in bound]
    chosen = known if labels is None else list(labels)
    unknown = [m for m in chosen if m not in known]
    unknown += [m for m in (method_kwargs or {}) if m not in known]
    if unknown:
        raise ValueError(f"methods must be among {known}, got {unknown}")
    extra = dict(method_kwargs or {})
    by_label = {m.label: m for m in bound}
    return [by_label[label].spec.bind(by_label[label].variant, context={"seed": seed},
                                      **dict(extra.get(label, {}))) for label in chosen]


def reference_distributions(methods) -> dict[str, str]:
    """``{label: description}`` of the reference distribution each bound method draws from
    (methods whose ``baseline_kind`` is ``"distribution"``; the others take the point 0)."""

    out = {}
    for m in methods:
        if m.spec.baseline_kind != "distribution":
            continue
        ref = m.settings.get("baselines")
        if ref is None and m.settings.get("noise_std") is not None:
            ref = Noise(float(m.settings["noise_std"]))
        out[m.label] = "given by the caller" if ref is None else describe(ref)
    return out


def run_assessment(ws: Workspace, experiments: Sequence[str] = EXPERIMENTS,
                   n_samples: int | None = None, *,
                   principle_counts: Mapping[str, float] | None = None,
                   models: Mapping[str, Sequence[str]] | None = None,
                   methods: Sequence[str] | None = None,
                   method_kwargs: Mapping[str, Mapping] | None = None,
                   orders: Sequence[int] = (1, 2), batch_size: int = 8,
                   dtype: torch.dtype = torch.float32, bbox_target: str = "predicted",
                   imagenet: ImagenetRoute | None = None, plots: bool = True
                   ) -> AssessmentResult:
    """Run the assessment experiments; returns the tables and writes them under
    ``ws.out/assessment`` (``assessment.json``, one CSV per table, PNG figures).

    Args:
        ws: the workspace (output folder, seed, quick/full, data, training).
        experiments: any of ``"infidelity"``, ``"taylor_order"``, ``"bbox"``.
        n_samples: overrides the sample count of every experiment (default
            :data:`QUICK_SAMPLES` or :data:`FULL_SAMPLES` by ``ws.quick``).
        principle_counts: ``{method label: count}`` for the x-axis; default: measured by
            the principle audit (:func:`measured_principle_counts`).
        models: ``{experiment: model names}`` overriding :data:`DEFAULT_MODELS`.
        methods: labels of the methods to run (default: every registered one taking part).
        method_kwargs: ``{label: {setting: value}}`` overriding a method's settings.
        orders: Taylor orders of the ``"taylor_order"`` experiment.
        batch_size: samples per unit.
        dtype: the models' and inputs' dtype (float32 by default, for speed).
        bbox_target: ``"predicted"`` (argmax class) or ``"label"`` (the true class).
        imagenet: the paper's ImageNet route (:class:`ImagenetRoute`) for the bbox experiment.
        plots: write the trend figures (Figures 3 and 4) as PNG.
    """
    bad = [e for e in experiments if e not in EXPERIMENTS]
    if bad:
        raise ValueError(f"experiments must be among {EXPERIMENTS}, got {bad}")
    if bbox_target not in ("predicted", "label"):
        raise ValueError(f"bbox_target must be 'predicted' or 'label', got {bbox_target!r}")
    if imagenet is not None and not isinstance(imagenet, ImagenetRoute):
        raise TypeError(f"imagenet must be an ImagenetRoute, got {type(imagenet).__name__}")
    bound = assessment_methods(ws.seed, methods, method_kwargs)
    chosen = {**DEFAULT_MODELS, **(dict(models) if models else {})}
    samples = AssessmentStage(quick=ws.quick, n_samples=n_samples).samples
    stage = Stage(ws, bound, batch_size, dtype)
    result = AssessmentResult()

    needs_counts = "infidelity" in experiments or "bbox" in experiments
    if principle_counts is None and needs_counts:
        start = time.perf_counter()
        counts, rows = measured_principle_counts(bound, ws.seed, stage.store)
        result.principles = rows
        result.timings["principle audit (s)"] = round(time.perf_counter() - start, 3)
        counts_source = "measured by taylorattr.principles.principles_table"
    else:
        counts = {k: float(v) for k, v in (principle_counts or {}).items()}
        paper_counts = {m.label: stage.paper_count(m) for m in bound}
        result.principles = [{"method": k, "principles": v, "principles_paper": paper_counts.get(k)}
                             for k, v in counts.items()]
        counts_source = "given by the caller"
    missing = [m.label for m in bound if m.label not in counts] if needs_counts else []
    if missing:
        raise ValueError(f"principle_counts lacks {missing}")

    result.settings = {
        "quick": ws.quick, "seed": ws.seed, "batch_size": batch_size, "dtype": str(dtype),
        "samples": {e: samples[e] for e in experiments},
        "models": {e: list(chosen[e]) for e in experiments},
        "methods": {m.label: {"registry": m.name, **{k: _plain(v) for k, v in m.settings.items()}}
                    for m in bound},
        "orders": list(orders), "bbox_target": bbox_target,
        "max_mask_coverage": MAX_MASK_COVERAGE, "principle_counts_source": counts_source,
        "principle_count_rule": "follows = 1, partially = 0.5, does not = 0",
        "infidelity": "square removal, sides 1..10, baseline 0, normalize=True, "
                      "target = predicted class",
    }
    points = stage.point_labels()
    for exp in experiments:
        start = time.perf_counter()
        if exp == "infidelity":
            run_infidelity(stage, chosen[exp], samples[exp], counts, result)
            result.correlations += correlation_rows(result.infidelity, "infidelity", "infidelity",
                                                    points)
        elif exp == "taylor_order":
            run_taylor_order(stage, chosen[exp], samples[exp], tuple(orders), result)
        else:
            run_bbox(stage, chosen[exp], samples[exp], counts, result, bbox_target)
            if imagenet is not None:
                run_imagenet(stage, imagenet, samples[exp], counts, result, bbox_target)
            result.correlations += correlation_rows(result.bbox, "bbox", "bbox_accuracy", points)
        result.timings[f"{exp} (s)"] = round(time.perf_counter() - start, 3)
    result.models = stage.model_rows
    if ws.is_main:  # under torchrun every rank has the tables; rank 0 writes them
        _write(ws, result, plots, _markers(bound))
    return result


def _markers(bound) -> dict[str, str]:
    """One marker per method label for both figures (registry markers first; variants of
    one method get distinct fallback markers), so a label keeps its marker in each."""

    return assign_markers([m.label for m in bound], {m.label: marker(m.name) for m in bound})


def _plain(value):
    return value if isinstance(value, (int, float, str, bool, type(None))) else repr(value)


def _write(ws: Workspace, result: AssessmentResult, plots: bool, markers) -> None:
    folder = ws.out / "assessment"
    if plots:
        if result.infidelity:
            result.figures.append(str(plot_trend(
                result.infidelity, "infidelity", folder / "figure3_infidelity.png",
                title="Infidelity vs principles followed (Figure 3)", markers=markers)))
        if result.bbox:
            result.figures.append(str(plot_trend(
                result.bbox, "bbox_accuracy", folder / "figure4_bbox_accuracy.png",
                title="Bounding-box accuracy vs principles followed (Figure 4)",
                markers=markers)))
    _io.save_json(result.to_json(), folder / "assessment.json")
    for name in ("infidelity", "taylor_order", "bbox", "correlations", "principles", "models"):
        rows = getattr(result, name)
        if rows:
            _io.save_csv(rows, folder / f"{name}.csv")
