"""What a run will cost, said before it starts (issues 20 and 24).

Every long command (``validate``, ``assess``, ``reproduce``, ``explain``, ``evaluate``,
``attribute``) asks its stages for their rows: each stage object owns its settings and
counts its units' rows from the plans of the methods, reformulations and metrics it will
run (``ValidationStage``, ``AssessmentStage``, ``SaliencyStage``, ``InteractionsStage``,
``ExplainStage``, ``DatasetStage``, ``reproduce_costs``; :mod:`taylorattr.experiments.plans`).
This module copies none of their settings: it times a probe batch per stage model
(untrained copies run at the trained models' speed; nothing is trained to estimate),
prints one line per stage on stderr and refuses, with one line and exit status 2 before
any work, a run estimated above ``--budget`` (default :data:`DEFAULT_BUDGET`, on a
terminal and in batch mode alike; ``--budget none`` lifts it and skips the estimate).

Not counted, and said so in the lines: methods that cannot run on the stage's model
(named), reformulations without a row count (named), the training of models not yet
cached (``validate``, ``assess``, ``reproduce``), the chunk-size memory probes, plotting
and file writes, and the principles audit of ``reproduce`` (probe networks, no row plan).
"""
from __future__ import annotations

import math
import sys
from dataclasses import dataclass, replace

from .arguments import CliError
from .jobs import dataset_job, explain_network

__all__ = ["DEFAULT_BUDGET", "Stage", "check_estimates", "command_stages"]

#: The budget of a run without ``--budget``, on a terminal and in batch mode alike:
#: generous, so that only runs meant for a GPU are refused (a batch job that means it
#: gives ``--budget none`` or a larger one).
DEFAULT_BUDGET = 4 * 3600.0

#: What makes each command cheaper, named when a run is refused.
_CHEAPER = {
    "validate": "fewer --samples, --order, --models, --preset or --seeds",
    "assess": "fewer --samples or --experiment, --quick instead of --full",
    "reproduce": "--quick instead of --full, fewer --preset or --seeds",
    "explain": "fewer --methods, no --interactions",
    "evaluate": "fewer --samples, --methods or --metrics, a smaller --max-side or a larger "
                "--infidelity-scale, --device cuda, several processes (torchrun)",
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


def timed(stage) -> Stage:
    """A stage's :class:`~taylorattr.experiments.plans.StageCost` in seconds: each part
    timed on its model at the stage's own call sizes, about 0.1 s per probe call."""
    from ..runtime.cost import estimate, summed
    from ..taylor.mode import timing_pass

    def seconds(costs, model, x):
        cost = summed(costs)
        return estimate(cost, model, x[:1], probe_seconds=0.1,
                        taylor_pass=timing_pass(model) if cost.taylor_rows else None)

    total = summed(seconds(*part) for part in stage.parts if part[0])
    if total is not None:
        total = replace(total, label=stage.label, samples=stage.samples)
    return Stage(stage.label, total, stage.skipped, stage.notes)


# ----------------------------------------------------------------------- the commands

def _validate(args) -> list:
    from ..experiments.validation import ValidationStage

    runs = len(dict.fromkeys(args.preset)) * (args.seeds or 1)
    return ValidationStage(tuple(args.models), tuple(args.order), args.samples, runs=runs,
                           seed=args.seed, mnist_dir=args.mnist_dir).cost()


def _assess(args) -> list:
    from ..experiments.assessment import AssessmentStage, ImagenetRoute

    route = None if args.imagenet_dir is None else ImagenetRoute(
        args.imagenet_dir, dict(args.weights), patch_scale=args.imagenet_patch_scale)
    return AssessmentStage(tuple(args.experiment), not args.full, args.samples, args.seed,
                           imagenet=route).cost()


def _reproduce(args) -> list:
    from ..experiments.reproduce import reproduce_costs, resolve_settings

    cfg = resolve_settings(args.full, presets=list(dict.fromkeys(args.preset)),
                           seeds=args.seeds)
    return reproduce_costs(cfg, args.seed, args.mnist_dir)


def _explain(args) -> list:
    from .. import data
    from ..experiments.explain import ExplainStage

    net = explain_network(args)
    x = net.preprocess(data.load_image(args.image))
    stage = ExplainStage(None if args.methods is None else tuple(args.methods),
                         interactions=args.interactions)
    return stage.cost(net, x, args.model)


def _dataset(args) -> list:
    import torch  # here: the parser and --help do not wait for torch

    from ..experiments.evaluate import DatasetStage

    model, dataset = dataset_job(args)
    evaluate = args.command == "evaluate"
    stage = DatasetStage(tuple(args.methods if evaluate else [args.method]),
                         tuple(args.metrics) if evaluate else (), args.batch_size,
                         args.max_side if evaluate else 10,
                         args.infidelity_scale if evaluate else None)
    device = torch.device(args.device) if args.device else torch.device(
        "cuda" if torch.cuda.is_available() else "cpu")
    try:
        return [stage.cost(model, dataset, f"{args.command} on {args.model}", device)]
    except ValueError as exc:
        raise CliError("--methods" if evaluate else "--method",
                       str(exc).removeprefix("methods: ")) from None


_STAGES = {"validate": _validate, "assess": _assess, "reproduce": _reproduce,
           "explain": _explain, "evaluate": _dataset, "attribute": _dataset}


def command_stages(args) -> list[Stage]:
    """One :class:`Stage` per stage of ``args.command`` (counted and timed, nothing run)."""
    return [timed(stage) for stage in _STAGES[args.command](args)]


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
