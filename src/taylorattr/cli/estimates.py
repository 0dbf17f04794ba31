"""What a run will cost, said before it starts (issue 20).

Every long command (``validate``, ``assess``, ``reproduce``, ``explain``, ``evaluate``,
``attribute``) counts the rows of each of its stages from the plans of the methods,
reformulations and metrics it will run (:mod:`taylorattr.runtime.cost`: ``BoundMethod.cost``,
``taylor_terms_cost``, ``group_expansions_cost``, ``interactions_cost``,
``infidelity_cost``), times a probe batch on the stage's model architecture (untrained
copies run at the trained models' speed; nothing is trained to estimate), prints one
line per stage on stderr and refuses, with one line and exit status 2 before any work, a
run estimated above ``--budget`` (default :data:`DEFAULT_BUDGET`, on a terminal and in
batch mode alike; ``--budget none`` lifts it and skips the estimate).

Each method's reformulation counts its own rows
(:meth:`taylorattr.methods.reformulations.Reformulation.cost_of`); one without a count is named.
Not counted, and said so in the lines: methods that cannot run on the stage's model
(named), the training of models not yet cached
(``validate``, ``assess``, ``reproduce``), the chunk-size memory probes, plotting and
file writes, and the principles audit of ``reproduce`` (probe networks, no row plan).
"""
from __future__ import annotations

import math
import sys
from dataclasses import dataclass, replace

import torch

from .arguments import CliError
from .jobs import dataset_job, explain_network

__all__ = ["DEFAULT_BUDGET", "TERMINAL_BUDGET", "Stage", "check_estimates", "command_stages"]

#: The budget of a run without ``--budget``, on a terminal and in batch mode alike:
#: generous, so that only runs meant for a GPU are refused (a batch job that means it
#: gives ``--budget none`` or a larger one).
DEFAULT_BUDGET = 4 * 3600.0
TERMINAL_BUDGET = DEFAULT_BUDGET  # the earlier name

_INPUTS = {"infidelity": (1, 28, 28), "taylor_order": (1, 28, 28), "bbox": (1, 64, 64)}
_TRAINING = "training of models not cached under --out not counted"
#: What makes each command cheaper, named when a run is refused.
_CHEAPER = {
    "validate": "fewer --samples, --order, --models, --preset or --seeds",
    "assess": "fewer --samples or --experiment, --quick instead of --full",
    "reproduce": "--quick instead of --full, fewer --preset or --seeds",
    "explain": "fewer --methods, no --interactions",
    "evaluate": "fewer --samples, --methods or --metrics, a smaller --max-side, "
                "--device cuda, several processes (torchrun)",
    "attribute": "fewer --samples, a cheaper --method, --device cuda, several processes "
                 "(torchrun)",
}
@dataclass(frozen=True)
class Stage:
    """One stage's estimate: ``cost`` (timed; None when nothing of it is counted), the
    methods left out of the count and what else is not counted."""

    label: str
    cost: object = None  # taylorattr.runtime.cost.Cost
    skipped: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()

    def line(self) -> str:
        text = self.cost.describe() if self.cost is not None else f"{self.label}: not counted"
        if self.skipped:
            text += f" (not counted: {', '.join(dict.fromkeys(self.skipped))})"
        return text + "".join(f"; {n}" for n in self.notes)


# ----------------------------------------------------------------------- counting helpers

def _stage(label: str, parts, samples: int, skipped=(), notes=()) -> Stage:
    """A stage from ``parts``: ``(costs, model, x)`` per model, each timed on its model
    (parts with no costs are left out)."""
    from ..runtime.cost import estimate, summed
    from ..taylor.mode import timing_pass

    # each part timed on its model at the stage's own call sizes, about 0.1 s per probe call
    total = summed(estimate(summed(costs), model, x[:1], probe_seconds=0.1,
                            taylor_pass=timing_pass(model) if summed(costs).taylor_rows else None)
                   for costs, model, x in parts if costs)
    if total is not None:
        total = replace(total, label=label, samples=samples)
    return Stage(label, total, tuple(skipped), tuple(notes))


def _method_costs(methods, model, x: torch.Tensor, baseline=0.0):
    """``(costs, skipped labels)`` of bound methods on ``x`` (methods that cannot run on
    ``model``, such as Grad-CAM without a convolution, are skipped)."""

    costs, skipped = [], []
    for method in methods:
        try:
            costs.append(method.cost(model, x, baseline))
        except (TypeError, ValueError):  # cannot run on this model: the run records why
            skipped.append(method.label)
    return costs, skipped


def _forwards(rows: int):
    from ..runtime.cost import Cost

    return Cost(forward_rows=rows)


def reformulation_cost(method, x: torch.Tensor, orders):
    """The rows of ``method``'s Taylor reformulation at ``orders`` as the validation runs
    it (baseline 0, the method's settings), or None where the reformulation does not count
    them (:meth:`taylorattr.methods.reformulations.Reformulation.cost_of`)."""
    return method.spec.reformulation.cost_of(x, 0.0, orders, method.settings)


# ----------------------------------------------------------------------- the commands

def _mnist_digits(mnist_dir, n: int) -> torch.Tensor:
    from .. import data

    return data.mnist_split(*data.load_mnist(mnist_dir), seed=0).held_images[:n]


def validation_costs(methods, model, x: torch.Tensor, orders):
    """``(costs, skipped)`` of one batch of the validation on ``model``: every method
    against its reformulation (a target forward, the method, the reformulation) and the
    approximation unit (``f(x) - f(0)``, the Taylor attribution per order, the
    pre-activation movement)."""
    from ..experiments.diagnostics import nonlinear_layers
    from ..taylor.terms import taylor_attribution_cost

    B = x.shape[0]
    costs, skipped = [], []
    for m in methods:
        reform = reformulation_cost(m, x, orders)
        if reform is None:
            skipped.append(m.label)
            continue
        original = [] if m.spec.reformulation.layerwise else [m.cost(model, x)]
        costs += [_forwards(B), *original, reform]
    costs += [_forwards(2 * B), *(taylor_attribution_cost(x, 0.0, K) for K in orders)]
    if nonlinear_layers(model):
        costs.append(_forwards(2 * B))
    return costs, skipped


def _validation_parts(mnist_dir, models, orders, n_samples: int, seed: int, runs: int = 1,
                      batch_size: int = 25):
    """Per model: ``(costs, model, x)`` of ``runs`` trainings' validation units."""
    from .. import models as M
    from ..experiments.validation import validation_methods

    held = _mnist_digits(mnist_dir, n_samples).double()
    methods = validation_methods()
    out, skipped = {}, []
    for name in models:
        model = M._build(name, seed).double().eval()
        costs = []
        for i in range(0, held.shape[0], batch_size):
            c, s = validation_costs(methods, model, held[i:i + batch_size], tuple(orders))
            costs += c
            skipped += s
        out[name] = (costs * runs, model, held)
    return out, skipped, int(held.shape[0])


def _validate(args) -> list[Stage]:
    from ..experiments.paper import model_label

    runs = len(dict.fromkeys(args.preset)) * (args.seeds or 1)
    parts, skipped, n = _validation_parts(args.mnist_dir, args.models, args.order, args.samples,
                                          args.seed, runs)
    scope = f" ({runs} trainings)" if runs > 1 else ""
    return [_stage(f"validation on {model_label(name)}{scope}", [part], n, skipped, (_TRAINING,))
            for name, part in parts.items()]


def _assessment(experiments, samples: dict, seed: int, labels=None, imagenet=None) -> list:
    """One stage per (experiment, model) of the assessment (``imagenet``: the ImageNet
    route, an :class:`~taylorattr.experiments.assessment.ImagenetRoute`, whose methods run
    at its resolved patch scale, as :func:`~taylorattr.experiments.assessment.run_imagenet`
    runs them)."""
    from .. import models as M
    from ..experiments.assessment import DEFAULT_MODELS, assessment_methods
    from ..experiments.assessment.localisation import scale_patches
    from ..experiments.paper import model_label
    from ..metrics import infidelity_cost
    from ..registry import METHODS

    out = []
    for exp in experiments:
        x = torch.zeros((samples[exp],) + _INPUTS[exp])
        methods = ([METHODS["taylor"].bind(order=k) for k in (1, 2)] if exp == "taylor_order"
                   else assessment_methods(seed, labels))
        for name in DEFAULT_MODELS[exp]:
            model = M._build(name, seed).eval()
            costs, skipped = _method_costs(methods, model, x)
            if exp != "bbox":
                costs.append(infidelity_cost(x))
            out.append(_stage(f"{exp} on {model_label(name)}", [(costs, model, x)], x.shape[0],
                              skipped))
    for name, path in ({} if imagenet is None else imagenet.weights).items():
        crop = imagenet.size[1]
        x = torch.zeros((samples["bbox"], 3, crop, crop))
        model = M.torchvision_model(name, path).eval()
        scale = imagenet.resolved_patch_scale(next(model.parameters()).device)
        methods = scale_patches(assessment_methods(seed, labels), scale)
        costs, skipped = _method_costs(methods, model, x)
        out.append(_stage(f"bbox on {name}", [(costs, model, x)], x.shape[0], skipped,
                          (f"patch scale {scale}",) if scale != 1 else ()))
    return out


def _assess(args) -> list[Stage]:
    from ..experiments.assessment import FULL_SAMPLES, QUICK_SAMPLES, ImagenetRoute

    samples = dict(FULL_SAMPLES if args.full else QUICK_SAMPLES)
    if args.samples:
        samples = {k: args.samples for k in samples}
    route = None if args.imagenet_dir is None else ImagenetRoute(
        args.imagenet_dir, dict(args.weights), patch_scale=args.imagenet_patch_scale)
    return _assessment(args.experiment, samples, args.seed, imagenet=route)


def _merged(label: str, stages, notes=()) -> Stage:
    """One line for several stages (the assessment's (experiment, model) pairs)."""
    from ..runtime.cost import summed

    costs = [s.cost for s in stages if s.cost is not None]
    total = summed(costs)
    if total is not None:
        total = replace(total, label=label, samples=sum(c.samples for c in costs))
    return Stage(label, total, tuple(x for s in stages for x in s.skipped), tuple(notes))


def _saliency(cfg, seed: int) -> Stage:
    from .. import data
    from .. import models as M
    from ..experiments.saliency import saliency_methods

    n_digits = cfg.digits if cfg.digits is not None else (3 if cfg.quick else 6)
    photos = cfg.photos if cfg.photos is not None else (
        ("camera", "chelsea") if cfg.quick else ("camera", "chelsea", "astronaut", "coffee"))
    digits = torch.zeros(1, 1, 28, 28)
    c_sp = M._build("c_sp", seed).eval()
    costs, skipped = _method_costs(saliency_methods(4, 50, 50, seed), c_sp, digits)
    parts = [([_forwards(1), *costs] * n_digits, c_sp, digits)]
    if photos:
        net = M.efficientnet_lite0()
        x = net.preprocess(dict(data.sample_photos())[photos[0]])
        methods = saliency_methods(patch=32 if cfg.quick else 16, steps=16 if cfg.quick else 50,
                                   samples=16 if cfg.quick else 50, seed=seed)
        costs, more = _method_costs(methods, net, x)
        parts.append(([_forwards(1), *costs] * len(photos), net, x))
        skipped += more
    return _stage("saliency on C-sp and EfficientNet-Lite0", parts, n_digits + len(photos),
                  skipped)


def interaction_costs(x: torch.Tensor, order: int):
    """The rows of one interactions unit (:mod:`taylorattr.experiments.interactions`):
    ``f(x) - f(0)``, the whole-input expansion and the exact pair interactions."""
    from ..taylor.pair_interactions import interactions_cost
    from ..taylor.terms import group_expansions_cost

    whole = torch.zeros(x.shape[1:], dtype=torch.long)
    return [_forwards(2 * x.shape[0]), group_expansions_cost(x, 0.0, order, whole),
            interactions_cost(x, None, order)]


def _reproduce(args) -> list[Stage]:
    from .. import models as M
    from ..experiments.assessment import FULL_SAMPLES, QUICK_SAMPLES
    from ..experiments.reproduce import FULL, QUICK

    cfg = FULL if args.full else QUICK
    cfg = replace(cfg, presets=tuple(dict.fromkeys(args.preset)), seeds=args.seeds or cfg.seeds)
    models = ("poly", "m_sg", "c_sg")
    single, skipped, n = _validation_parts(args.mnist_dir, models, cfg.validation_orders,
                                           cfg.validation_samples, args.seed)
    study, more, _ = _validation_parts(args.mnist_dir, models, cfg.study_orders,
                                       cfg.study_samples or cfg.validation_samples, args.seed,
                                       len(cfg.presets) * cfg.seeds)
    parts = [(single[m][0] + study[m][0], single[m][1], single[m][2]) for m in models]
    stages = [_stage("validation", parts, n * len(models), skipped + more, (_TRAINING,)),
              Stage("principles", notes=("probe networks with no row plan (minutes on a CPU)",))]
    samples = dict(FULL_SAMPLES if cfg.quick is False else QUICK_SAMPLES)
    if cfg.assessment_samples is not None:
        samples = {k: cfg.assessment_samples for k in samples}
    labels = None if cfg.assessment_methods is None else list(cfg.assessment_methods)
    stages.append(_merged("assessment", _assessment(("infidelity", "taylor_order", "bbox"),
                                                    samples, args.seed, labels), (_TRAINING,)))
    stages.append(_saliency(cfg, args.seed))
    k = cfg.interaction_samples or (16 if cfg.quick else 100)
    x = _mnist_digits(args.mnist_dir, k).double()
    stages.append(_stage("interactions", [
        (interaction_costs(x, 3), M._build(name, args.seed).double().eval(), x)
        for name in ("m_sg", "c_sg")], 2 * int(x.shape[0])))
    return stages


def _explain(args) -> list[Stage]:
    from .. import data
    from ..experiments.explain import _columns
    from ..taylor.pair_interactions import interactions_cost

    net = explain_network(args)
    x = net.preprocess(data.load_image(args.image))
    methods = list(_columns(args.methods, 16, 32, 32, None).values())
    costs, skipped = _method_costs(methods, net, x)
    stages = [_stage(f"saliency maps on {args.model}", [([_forwards(1), *costs], net, x)], 1,
                     skipped)]
    if args.interactions:
        stages.append(_stage(f"pair interactions on {args.model}",
                             [([interactions_cost(x, None, 2)], net, x)], 1))
    return stages


def _dataset(args, what: str) -> list[Stage]:
    from ..experiments.evaluate import infidelity_scale, resolve_methods
    from ..experiments.evaluation.items import reference_shape
    from ..metrics import infidelity_cost

    model, dataset = dataset_job(args)
    n = len(dataset)
    shape = reference_shape(dataset, n)
    scale = getattr(args, "infidelity_scale", None) or infidelity_scale(shape)
    device = torch.device(args.device) if args.device else torch.device(
        "cuda" if torch.cuda.is_available() else "cpu")
    dtype = next((p.dtype for p in model.parameters() if p.is_floating_point()), torch.float32)
    try:
        methods = resolve_methods(args.methods if what == "evaluate" else [args.method])
    except ValueError as exc:
        raise CliError("--methods" if what == "evaluate" else "--method",
                       str(exc).removeprefix("methods: ")) from None
    metrics = getattr(args, "metrics", ())
    costs, skipped = [], []
    full, rest = divmod(n, args.batch_size)
    for b, units in ((args.batch_size, full), (rest, 1 if rest else 0)):
        if not units:
            continue
        x = torch.zeros((b,) + tuple(shape), dtype=dtype)
        c, skipped = _method_costs(methods, model, x)
        if "infidelity" in metrics:
            c += [infidelity_cost(x, max_side=args.max_side, scale=scale)] * (
                len(methods) - len(skipped))
        costs += c * units
    model = model.to(device)
    x = torch.zeros((1,) + tuple(shape), dtype=dtype, device=device)
    return [_stage(f"{what} on {args.model}", [(costs, model, x)], n, skipped)]


_STAGES = {"validate": _validate, "assess": _assess, "reproduce": _reproduce,
           "explain": _explain, "evaluate": lambda a: _dataset(a, "evaluate"),
           "attribute": lambda a: _dataset(a, "attribute")}


def command_stages(args) -> list[Stage]:
    """One :class:`Stage` per stage of ``args.command`` (counted and timed, nothing run)."""
    return _STAGES[args.command](args)


# ----------------------------------------------------------------------- print and refuse

def check_estimates(args) -> None:
    """Fail, with one line naming ``--budget`` and the cheaper options, before any work,
    when the run is estimated above the budget, else print one estimate line per stage
    to stderr (the budget: ``--budget``, default :data:`DEFAULT_BUDGET` on a terminal and
    in batch mode alike). ``--budget none`` lifts it and, without ``--estimate``, skips the
    estimate."""
    from ..runtime.cost import CostError, check_budget, format_seconds, summed

    if args.command not in _STAGES:
        return
    from ..runtime.distributed import env_world

    # under torchrun only a given --budget applies: each rank times its own probe, and a
    # default that one rank passes and another refuses would leave the first waiting
    default = DEFAULT_BUDGET if env_world()[1] == 1 else None
    budget = default if args.budget is None else args.budget
    if budget == math.inf:
        budget = None
    if budget is None and not args.estimate:
        return
    stages = command_stages(args)
    total = summed(s.cost for s in stages if s.cost is not None)
    if total is not None and budget is not None:
        total = replace(total, label=f"{args.command}, all stages", notes=())
        try:
            check_budget(total, budget)
        except CostError:
            given = "" if args.budget is not None else " (the default)"
            raise CliError("--budget", f"{total.describe()} exceeds the budget of "
                                       f"{format_seconds(budget)}{given}; cheaper: "
                                       f"{_CHEAPER[args.command]}; or raise --budget "
                                       "(--budget none lifts it)") from None
    for stage in stages:
        print(f"taylorattr {args.command}: estimate: {stage.line()}", file=sys.stderr,
              flush=True)
