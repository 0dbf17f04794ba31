"""What a stage will cost, said before it starts: ``assess`` counts the rows of every unit
from the methods' own plans (:mod:`taylorattr.cost`), times a probe batch on the stage's
model, prints one estimate per stage and refuses a run estimated above ``--budget``.

Methods that do not count their rows (the layer-wise rules) are left out of the estimate
and named; the probe models are untrained copies of the stage's architectures, which run
at the trained models' speed.
"""
from __future__ import annotations

import sys
from dataclasses import replace

import torch

from .arguments import CliError

__all__ = ["assess_estimates", "check_assess_budget"]

_INPUTS = {"infidelity": (1, 28, 28), "taylor_order": (1, 28, 28), "bbox": (1, 64, 64)}


def _stage(label: str, model, x: torch.Tensor, methods, removals: bool):
    from ..cost import bound_cost, stage_estimate
    from ..metrics import infidelity_cost

    costs, skipped = [], []
    for method in methods:
        try:
            costs.append(bound_cost(method, model, x))
        except NotImplementedError:
            skipped.append(method.label)
    if removals:
        costs.append(infidelity_cost(x))
    if not costs:
        return None, skipped
    est = stage_estimate(label, costs, model, x[:1])
    return replace(est, label=label, samples=x.shape[0]), skipped


def assess_estimates(args) -> list:
    """One estimated :class:`~taylorattr.cost.Cost` per (experiment, model) of ``assess``."""
    from .. import models as M
    from ..experiments.assessment import (
        DEFAULT_MODELS,
        FULL_SAMPLES,
        QUICK_SAMPLES,
        assessment_methods,
    )
    from ..experiments.paper import model_label
    from ..registry import METHODS

    samples = dict(FULL_SAMPLES if args.full else QUICK_SAMPLES)
    out = []
    for exp in args.experiment:
        n = args.samples or samples[exp]
        x = torch.zeros((n,) + _INPUTS[exp])
        methods = ([METHODS["taylor"].bind(order=k) for k in (1, 2)] if exp == "taylor_order"
                   else assessment_methods(args.seed))
        for name in DEFAULT_MODELS[exp]:
            est, skipped = _stage(f"{exp} on {model_label(name)}", M._build(name, args.seed).eval(),
                                  x, methods, removals=exp != "bbox")
            if est is not None:
                out.append((est, skipped))
    if args.imagenet_dir is not None:
        x = torch.zeros((args.samples or samples["bbox"], 3, 224, 224))
        for name, path in dict(args.weights).items():
            model = M.torchvision_model(name, path).eval()
            est, skipped = _stage(f"bbox on {name}", model, x, assessment_methods(args.seed),
                                  removals=False)
            out.append((est, skipped))
    return out


def check_assess_budget(args, show: bool) -> None:
    """Print the estimates to stderr (``show``); fail (one line, before any work) above
    ``--budget``."""
    from ..cost import CostError, check_budget

    estimates = assess_estimates(args)
    total = None
    for est, skipped in estimates:
        note = f" (not counted: {', '.join(skipped)})" if skipped else ""
        if show:
            print(f"taylorattr assess: estimate: {est.describe()}{note}", file=sys.stderr)
        total = est if total is None else total + est
    if total is None or args.budget is None:
        return
    try:
        check_budget(replace(total, label="assess, all stages"), args.budget)
    except CostError as exc:
        raise CliError("--budget", str(exc)) from None
