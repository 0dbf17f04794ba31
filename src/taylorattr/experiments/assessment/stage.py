"""What the assessment's experiments share: the workspace, the unit store, the bound
methods, the dtype and batch size, the models they load and the unit bookkeeping."""
from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import torch

from ... import paper_methods
from ...baselines import ReferenceSet
from ...methods import UnsupportedModelError
from .. import paper
from ..workspace import Workspace

__all__ = ["Stage", "collect", "timed"]


class Stage:
    """State shared by the experiments of one :func:`run_assessment` call."""

    def __init__(self, ws: Workspace, methods, batch_size: int, dtype: torch.dtype):
        self.ws, self.methods, self.batch_size, self.dtype = ws, list(methods), batch_size, dtype
        self.store = ws.units("assessment")
        self._models: dict[str, tuple[Any, str]] = {}
        self.model_rows: list[dict] = []

    def spans(self, x: torch.Tensor) -> list[tuple[int, int]]:
        """``(start, stop)`` of every batch of ``batch_size`` samples."""
        return [(i, min(i + self.batch_size, x.shape[0]))
                for i in range(0, x.shape[0], self.batch_size)]

    @staticmethod
    def paper_count(method) -> float | None:
        facts = paper_methods.paper_facts(method.name)
        return None if facts is None else facts.principle_count

    def point_labels(self) -> set[str]:
        """Labels of the methods that explain the change to a point (or the zero) baseline."""
        return {m.label for m in self.methods if m.spec.baseline_kind != "distribution"}

    def model(self, name: str):
        """A trained registered model (cached by the workspace) and its fingerprint."""
        if name not in self._models:
            model, info = self.ws.trained(name, self.dtype)
            self._models[name] = (model, self.ws.fingerprint(model))
            self.model_rows.append({"model": paper.model_label(name),
                                    "held_out_accuracy": info["held_out_accuracy"],
                                    "epochs": info["epochs"], "n_train": info["n_train"],
                                    "n_held_out": info["n_held_out"], "data": info["data"],
                                    "train_seconds": info.get("train_seconds"),
                                    "cached": info.get("cached")})
        return self._models[name]

    @staticmethod
    def attribute(method, model, x, target, baseline, progress: bool = False, desc: str = ""):
        """The attributions of a bound method, or the reason it cannot run on ``model``;
        with ``progress`` (the workspace's) a per-chunk bar described by ``desc`` (the
        unit) and the method's label."""

        refs = method.settings.get("baselines")
        if isinstance(refs, ReferenceSet) and tuple(refs.samples.shape[1:]) != tuple(x.shape[1:]):
            return (f"its reference set holds samples of shape {tuple(refs.samples.shape[1:])}, "
                    f"these inputs are {tuple(x.shape[1:])}: not run")
        try:
            return method(model, x, baseline, target, show_progress=progress,
                          desc=desc).detach()
        except UnsupportedModelError as exc:
            return f"{type(exc).__name__}: {exc}"

    def add_model(self, name: str, model, row: dict):
        """A model from outside the registry (the ImageNet route), with its table row."""
        self._models[name] = (model, self.ws.fingerprint(model))
        self.model_rows.append(row)
        return self._models[name]


def timed(fn):
    start = time.perf_counter()
    out = fn()
    out["seconds"] = time.perf_counter() - start
    return out


def collect(units: dict, model: str, label: str, starts: Sequence[int], key: str
            ) -> tuple[torch.Tensor | None, float, str]:
    """The per-sample values of one (model, method) over its batches, their compute time,
    and the reason when the method could not run."""
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
