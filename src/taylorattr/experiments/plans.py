"""What a stage will run, counted before it runs (issue 24: every stage owns its plan).

Each stage (validation, assessment, saliency, interactions, explain, evaluate, attribute)
is an object holding its settings (defaults resolved in one place, where the stage runs
them) with a ``cost(...)`` method returning a :class:`StageCost`: per model, the rows its
units run (:class:`taylorattr.runtime.cost.Cost` from the methods' and metrics' own
plans), the model they run on and one input to time them on, plus the methods that
cannot run there (``skipped``) and what is not counted (``notes``). Nothing runs a
model here; turning rows into seconds is the caller's (the command line's estimate).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..models import _build
from ..runtime.cost import Cost

__all__ = ["TRAINING_NOTE", "StageCost", "architecture", "forwards", "merged", "method_costs"]

#: Said by every stage whose models are trained on the way.
TRAINING_NOTE = "training of models not cached under --out not counted"


@dataclass(frozen=True)
class StageCost:
    """One stage's rows: ``parts`` is ``((costs, model, x), ...)``, each list of costs run
    on ``model`` and timed on the input ``x``; ``samples`` the inputs it explains."""

    label: str
    parts: tuple = ()
    samples: int = 0
    skipped: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()


def merged(label: str, stages, notes=()) -> StageCost:
    """One :class:`StageCost` of several (the assessment's (experiment, model) pairs)."""
    stages = list(stages)
    return StageCost(label, tuple(p for s in stages for p in s.parts),
                     sum(s.samples for s in stages),
                     tuple(x for s in stages for x in s.skipped), tuple(notes))


def forwards(rows: int) -> Cost:
    """``rows`` forward rows (a target forward, ``f(x) - f(0)``, ...)."""
    return Cost(forward_rows=rows)


def method_costs(methods, model, x: torch.Tensor, baseline=0.0) -> tuple[list, list]:
    """``(costs, skipped labels)`` of bound methods on ``x`` (methods that cannot run on
    ``model``, such as Grad-CAM without a convolution, are skipped)."""
    costs, skipped = [], []
    for method in methods:
        try:
            costs.append(method.cost(model, x, baseline))
        except (TypeError, ValueError):  # cannot run on this model: the run records why
            skipped.append(method.label)
    return costs, skipped


def architecture(name: str, seed: int = 0) -> torch.nn.Module:
    """The registered model ``name``, untrained, in eval mode, with the initial weights
    training starts from (:func:`taylorattr.models.training._build`: the default device):
    it runs at the trained model's speed, so the estimate times it without training."""

    return _build(name, seed).eval()
