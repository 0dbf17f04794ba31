"""What a run will cost, said before it starts (issues 20 and 24).

Every long command (a command module with ``stages``: ``validate``, ``assess``,
``reproduce``, ``explain``, ``evaluate``, ``attribute``) asks its stages for their rows
(:mod:`taylorattr.cli.commands`): each stage object owns its settings and
counts its units' rows from the plans of the methods, reformulations and metrics it will
run (``ValidationStage``, ``AssessmentStage``, ``SaliencyStage``, ``InteractionsStage``,
``ExplainStage``, ``DatasetStage``, ``reproduce_costs``; :mod:`taylorattr.experiments.plans`).
This module copies none of their settings: it times probe calls per stage model
(untrained copies run at the trained models' speed; nothing is trained to estimate; one
architecture is timed once per kind of pass, :func:`taylorattr.runtime.cost.call_line`, and
the fitted line read at each stage's own call size), prints one line per stage on stderr and refuses, with one line and exit
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
import time
from dataclasses import dataclass, replace

import torch

from ..registry import resolve
from ..runtime import cost as C
from ..runtime.distributed import env_world
from ..taylor.mode import timing_pass
from . import commands
from .arguments import CliError

__all__ = ["DEFAULT_BUDGET", "Stage", "capture_families", "check_estimates", "command_stages",
           "counted_stages", "fixed_costs"]

#: The budget of a run without ``--budget``, on a terminal and in batch mode alike:
#: generous, so that only runs meant for a GPU are refused (a batch job that means it
#: gives ``--budget none`` or a larger one).
DEFAULT_BUDGET = 4 * 3600.0

@dataclass(frozen=True)
class Stage:
    """One stage's estimate: ``cost`` (timed; None when nothing of it is counted), the
    methods left out of the count and what else is not counted."""

    label: str
    cost: object = None  # taylorattr.runtime.cost.Cost
    skipped: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    captures: int = 0  # graph captures its methods make (capture_families)

    def line(self) -> str:
        text = self.cost.describe() if self.cost is not None else f"{self.label}: not counted"
        if self.skipped:
            text += f" (not counted: {', '.join(dict.fromkeys(self.skipped))})"
        return text + "".join(f"; {n}" for n in self.notes)


#: Seconds a probe call may take (:func:`taylorattr.runtime.cost.call_line`): enough
#: that per-call overheads weigh as in the stage's own chunks, few enough that the estimate
#: of a whole ``reproduce`` takes seconds.
PROBE_SECONDS = 0.05


def _captured_pass(model, captures: list):
    """:func:`~taylorattr.taylor.mode.timing_pass` of ``model`` whose first call (the graph
    capture, then one pass) is timed into ``captures``: what one capture costs the run."""
    run = timing_pass(model)

    def timed_run(*args):
        if captures and captures[-1][0] is model:
            return run(*args)
        start = time.perf_counter()
        out = run(*args)
        captures.append((model, time.perf_counter() - start))
        return out
    return timed_run


def capture_families(costs) -> set[str]:
    """The graph captures a stage's methods make, by engine: ``"layer-wise"`` (DeepLIFT,
    DeepLiftShap, LRP: one capture of the model) and ``"taylor"`` (Taylor mode: one of the
    model it expands), read from the registry rows the costs are labelled with."""
    families = set()
    for c in costs:
        if c.taylor_rows:
            families.add("taylor")
        try:
            cls = resolve(c.label).spec.cls
        except ValueError:  # not a method's row (the target's forward, a metric)
            continue
        if any("layerwise" in k.__module__ for k in cls.__mro__):
            families.add("layer-wise")
    return families


def timed(stage, cache: dict | None = None, captures: list | None = None) -> Stage:
    """A stage's :class:`~taylorattr.experiments.plans.StageCost` in seconds: each part
    timed on its model at the stage's own call sizes, at most about :data:`PROBE_SECONDS`
    per probe call; ``cache`` shares the timings of one architecture between parts;
    ``captures`` collects the seconds of the graph captures the probes made."""
    captures = [] if captures is None else captures

    def seconds(costs, model, x):
        cost = C.summed(costs)
        return C.estimate(cost, model, x[:1], probe_seconds=PROBE_SECONDS, cache=cache,
                          taylor_pass=_captured_pass(model, captures) if cost.taylor_rows
                          else None)

    total = C.summed(seconds(*part) for part in stage.parts if part[0])
    if total is not None:
        total = replace(total, label=stage.label, samples=stage.samples)
    families = set().union(*(capture_families(part[0]) for part in stage.parts))
    return Stage(stage.label, total, stage.skipped, stage.notes, len(families))


def counted_stages(args) -> list:
    """The command module's ``stages(args)``: every stage's rows, counted (nothing timed)."""
    threads = torch.get_num_threads()
    # counting rows runs small ops only: one thread (on a busy machine a second one waits
    # for its descheduled sibling at every op, which made counting take a minute)
    torch.set_num_threads(1)
    try:
        return commands.load(args.command).stages(args)
    finally:
        torch.set_num_threads(threads)


def command_stages(args, plans=None, captures: list | None = None) -> list[Stage]:
    """One :class:`Stage` per stage of ``args.command`` (counted and timed, nothing run);
    ``plans``: :func:`counted_stages` already counted; ``captures`` collects the seconds
    of the graph captures the probes made."""
    plans = counted_stages(args) if plans is None else plans
    cache: dict = {}  # one timing per architecture, row shape and call size
    return [timed(stage, cache, captures) for stage in plans]


def fixed_costs(stages, captures: list, started: float) -> tuple[float, str]:
    """``(seconds, words)``: what a run costs besides its rows: the seconds spent since
    ``started`` (start-up, imports, model loading, reading the data, this estimate: the
    run has paid them when it starts its work) and each graph capture the stages' methods
    make, at the seconds of the probes' own capture (the first one, with torch.export's
    imports, an upper bound of the others)."""
    spent = time.perf_counter() - started
    n = sum(s.captures for s in stages)
    each = max((t for _, t in captures), default=None)
    words = f"{C.format_seconds(spent)} spent already (start-up, model, data, this estimate)"
    if n and each is not None:
        words += f", {n} graph capture{'s' if n != 1 else ''} of about {C.format_seconds(each)}"
        return spent + n * each, words
    if n:
        words += f"; {n} graph capture{'s' if n != 1 else ''} not timed"
    return spent, words


def _out_of_reach(plans) -> str:
    """Why a counted stage cannot finish whatever its rows cost ("" when all can)."""
    return "; ".join(dict.fromkeys(c.out_of_reach for stage in plans for costs, *_ in
                                   stage.parts for c in costs if c.out_of_reach))


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
    command = commands.load(args.command)
    if not hasattr(command, "stages"):
        return
    # under torchrun only a given --budget applies: each rank times its own probe, and a
    # default that one rank passes and another refuses would leave the first waiting
    default = DEFAULT_BUDGET if env_world()[1] == 1 else None
    budget = default if args.budget is None else args.budget
    if budget == math.inf:
        budget = None
    dry = getattr(args, "dry_run", False)
    if dry:
        budget = None  # a dry run refuses nothing: it says
    if budget is None and not (args.estimate or dry):
        return
    load = C.machine_load()
    plans = counted_stages(args)
    why = _out_of_reach(plans)
    if why and budget is not None:  # refused before any probe is timed
        raise CliError("--budget", f"{args.command}: out of reach: {why}; cheaper: "
                                   f"{command.CHEAPER}; --budget none runs it anyway")
    captures: list = []
    stages = command_stages(args, plans, captures)
    total = C.summed(s.cost for s in stages if s.cost is not None)
    busy = load is not None and load.busy
    lines = [stage.line() for stage in stages]
    if why:
        lines.append(f"out of reach: {why}")
    if total is not None:
        fixed, words = fixed_costs(stages, captures,
                                   getattr(args, "started", time.perf_counter()))
        total = replace(total, seconds=total.seconds + fixed)
        lines.append(f"{'all stages' if len(stages) > 1 else 'in all'}: about "
                     f"{C.format_seconds(total.seconds)} on {total.device or 'cpu'}, with "
                     f"fixed costs: {words}")
    if busy:
        lines.append(f"the machine was busy while timing (load average {load.average:.1f} on "
                     f"{load.cpus} CPUs): the times hold while it stays so busy, and are "
                     "shorter on the quiet machine")
    if total is not None and budget is not None and total.seconds > budget:
        if busy and args.budget is None:
            lines.append(f"above the default budget of {C.format_seconds(budget)} only as "
                         "timed on the busy machine: running (--budget SECONDS holds it)")
        else:
            total = replace(total, label=f"{args.command}, all stages", notes=())
            try:
                C.check_budget(total, budget)
            except C.CostError:
                given = "" if args.budget is not None else " (the default)"
                raise CliError("--budget", f"{total.describe()} exceeds the budget of "
                                           f"{C.format_seconds(budget)}{given}"
                                           f"{' (timed on a busy machine)' if busy else ''}; "
                                           f"cheaper: {command.CHEAPER}; or raise "
                                           "--budget (--budget none lifts it)") from None
    for line in lines:
        print(f"taylorattr {args.command}: estimate: {line}", file=sys.stderr, flush=True)
