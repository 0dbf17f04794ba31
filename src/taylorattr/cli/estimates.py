"""What a run will cost, said before it starts (issues 20 and 24).

Every long command (``validate``, ``assess``, ``reproduce``, ``explain``, ``evaluate``,
``attribute``) asks its stages for their rows: each stage object owns its settings and
counts its units' rows from the plans of the methods, reformulations and metrics it will
run (``ValidationStage``, ``AssessmentStage``, ``SaliencyStage``, ``InteractionsStage``,
``ExplainStage``, ``DatasetStage``, ``reproduce_costs``; :mod:`taylorattr.experiments.plans`).
This module copies none of their settings: it times probe calls per stage model
(untrained copies run at the trained models' speed; nothing is trained to estimate; one
architecture is timed once, :func:`taylorattr.runtime.cost.per_row_seconds` at the stage's
own call size), prints one line per stage on stderr and refuses, with one line and exit
status 2 before any work, a run estimated above ``--budget`` (default
:data:`DEFAULT_BUDGET`, on a terminal and in batch mode alike; ``--budget none`` lifts it
and skips the estimate). The times are those of the machine as it is: on a busy machine
(load average at least half the CPUs) the lines say so and the default budget refuses
nothing.

Not counted, and said so in the lines: methods that cannot run on the stage's model
(named), reformulations without a row count (named), the training of models not yet
cached (``validate``, ``assess``; ``reproduce`` counts its trainings, optimiser steps
aside), the chunk-size memory probes, plotting and file writes, and the principles audit
of ``reproduce`` (probe networks, no row plan).
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


#: Seconds a probe call may take (:func:`taylorattr.runtime.cost.per_row_seconds`): enough
#: that per-call overheads weigh as in the stage's own chunks, few enough that the estimate
#: of a whole ``reproduce`` takes seconds.
PROBE_SECONDS = 0.05


def timed(stage, cache: dict | None = None) -> Stage:
    """A stage's :class:`~taylorattr.experiments.plans.StageCost` in seconds: each part
    timed on its model at the stage's own call sizes, at most about :data:`PROBE_SECONDS`
    per probe call; ``cache`` shares the timings of one architecture between parts."""
    from ..runtime.cost import estimate, summed
    from ..taylor.mode import timing_pass

    def seconds(costs, model, x):
        cost = summed(costs)
        return estimate(cost, model, x[:1], probe_seconds=PROBE_SECONDS, cache=cache,
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
    return reproduce_costs(cfg, args.seed, args.mnist_dir, args.out)


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
    import torch

    threads = torch.get_num_threads()
    # counting rows runs small ops only: one thread (on a busy machine a second one waits
    # for its descheduled sibling at every op, which made counting take a minute)
    torch.set_num_threads(1)
    try:
        plans = _STAGES[args.command](args)
    finally:
        torch.set_num_threads(threads)
    cache: dict = {}  # one timing per architecture, row shape and call size
    return [timed(stage, cache) for stage in plans]


# ----------------------------------------------------------------------- print and refuse

def check_estimates(args) -> None:
    """Fail, with one line naming ``--budget`` and the cheaper options, before any work,
    when the run is estimated above the budget, else print one estimate line per stage
    (and the total, for several) to stderr (the budget: ``--budget``, default
    :data:`DEFAULT_BUDGET` on a terminal and in batch mode alike). ``--budget none`` lifts
    it and, without ``--estimate``, skips the estimate.

    The probes time the machine as it is, so the estimate holds for the load of the
    moment. When other work keeps the machine busy
    (:func:`~taylorattr.runtime.cost.machine_load`, read before the probes) the lines say
    so, and the default budget refuses nothing: a run is not refused for the load of the
    moment (a given ``--budget`` still holds)."""
    from ..runtime.cost import CostError, check_budget, format_seconds, machine_load, summed

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
    load = machine_load()
    stages = command_stages(args)
    total = summed(s.cost for s in stages if s.cost is not None)
    busy = load is not None and load.busy
    lines = [stage.line() for stage in stages]
    if total is not None and len(stages) > 1:
        lines.append(f"all stages: about {format_seconds(total.seconds)} on "
                     f"{total.device or 'cpu'}")
    if busy:
        lines.append(f"the machine was busy while timing (load average {load.average:.1f} on "
                     f"{load.cpus} CPUs): the times hold while it stays so busy, and are "
                     "shorter on the quiet machine")
    if total is not None and budget is not None and total.seconds > budget:
        if busy and args.budget is None:
            lines.append(f"above the default budget of {format_seconds(budget)} only as "
                         "timed on the busy machine: running (--budget SECONDS holds it)")
        else:
            total = replace(total, label=f"{args.command}, all stages", notes=())
            try:
                check_budget(total, budget)
            except CostError:
                given = "" if args.budget is not None else " (the default)"
                raise CliError("--budget", f"{total.describe()} exceeds the budget of "
                                           f"{format_seconds(budget)}{given}"
                                           f"{' (timed on a busy machine)' if busy else ''}; "
                                           f"cheaper: {_CHEAPER[args.command]}; or raise "
                                           "--budget (--budget none lifts it)") from None
    for line in lines:
        print(f"taylorattr {args.command}: estimate: {line}", file=sys.stderr, flush=True)
