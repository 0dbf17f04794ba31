"""Interactions (beyond the paper): how much of the output change is interactive, order by
order, and which patch pairs carry it, on the MNIST models.

For held-out digits ``x`` (baseline 0, predicted class) and square patches ``A`` (the
default groups of :func:`taylorattr.interactions`: 4x4 on 28x28, 49 patches), order ``k``
of the expansion splits exactly into

    P_k(delta) = sum_A P_k(delta_A)  +  sum_{A<B} J^k(A, B)  +  R_k

``own``: terms inside one patch (what occluding it alone sees, Theorem 3), ``pairs``: terms
joining exactly two patches, ``R_k``: terms spanning three or more. Each is reported as a
share of ``|df|``, ``df = f(x) - f(0)``, averaged over digits (signed: terms of different
signs cancel), beside the truncation error of the order-K expansion.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch

from .. import _io, data
from ..reporting.interaction_plot import interaction_map, strongest_pairs
from ..reporting.report import markdown_table
from ..taylor.pair_interactions import Interactions, interactions, interactions_cost
from ..taylor.terms import group_expansions, group_expansions_cost
from . import paper
from ._units import fingerprint
from .plans import StageCost, architecture, forwards
from .validation import predicted_drop
from .workspace import Workspace

__all__ = ["InteractionResult", "InteractionsStage", "format_interactions", "run_interactions",
           "unit_costs"]


def unit_costs(x: torch.Tensor, order: int) -> list:
    """The rows of one interactions unit (:func:`_split`): ``f(x) - f(0)``, the
    whole-input expansion and the exact pair interactions."""
    whole = torch.zeros(x.shape[1:], dtype=torch.long, device=x.device)
    return [forwards(2 * x.shape[0]), group_expansions_cost(x, 0.0, order, whole),
            interactions_cost(x, None, order)]


@dataclass(frozen=True)
class InteractionsStage:
    """The interactions stage of ``reproduce``: ``models`` at ``order`` on ``samples``
    held-out digits (``n_samples``, default 16 when ``quick``, else 100); :meth:`cost`
    counts the rows."""

    quick: bool = True
    n_samples: int | None = None
    order: int = 3
    models: tuple = ("m_sg", "c_sg")
    seed: int = 0
    mnist_dir: object = None

    @property
    def samples(self) -> int:
        return self.n_samples or (16 if self.quick else 100)

    def run(self, ws) -> InteractionResult:
        return run_interactions(ws, self.models, self.samples, self.order)

    def cost(self) -> StageCost:
        x = data.held_out_digits(self.mnist_dir)[0]  # read on the CPU; the models are on
        x = x[:self.samples].to(torch.get_default_device(), torch.float64)  # the default device
        parts = tuple((unit_costs(x, self.order), architecture(name, self.seed).double(), x)
                      for name in self.models)
        return StageCost("interactions", parts, len(self.models) * int(x.shape[0]))


@dataclass
class InteractionResult:
    """``rows``: one per (model, order): ``own``, ``pairs``, ``rest`` (mean signed shares of
    ``|df|``), ``total`` (``P_k / |df|``); ``error``: per model, mean ``|eps_K| / |df|``;
    ``top_pairs``: per model, the strongest pairs of the first digit; ``figure``."""

    rows: list[dict] = field(default_factory=list)
    error: dict = field(default_factory=dict)
    top_pairs: dict = field(default_factory=dict)
    n_samples: int = 0
    order: int = 3
    figures: list[str] = field(default_factory=list)

    def to_json(self) -> dict:
        return {"rows": self.rows, "error": self.error, "top_pairs": self.top_pairs,
                "n_samples": self.n_samples, "order": self.order, "figures": self.figures}


def _split(model, x: torch.Tensor, order: int, progress: bool = False) -> dict:
    """Per sample and order: P_k, own, pairs (``[B, K]``), the result and ``df``."""
    target, df = predicted_drop(model, x)
    whole = torch.zeros(x.shape[1:], dtype=torch.long, device=x.device)
    total = group_expansions(model, x, 0.0, target, order, whole,
                             show_progress=progress)[:, 0]  # [B, K]
    result = interactions(model, x, 0.0, target, order=order, show_progress=progress)
    pairs = result.pairs.triu(1).sum((-1, -2))  # [B, K]
    return {"total": total, "own": result.own.sum(-1), "pairs": pairs, "df": df,
            "pairs0": result.pairs[:1], "own0": result.own[:1], "groups": result.groups}


def run_interactions(ws: Workspace, models=("m_sg", "c_sg"), n_samples: int = 8,
                     order: int = 3, plots: bool = True) -> InteractionResult:
    """The interaction shares per order on ``models`` (one resumable unit per model)."""
    x = ws.held_out_digits(n_samples).double()
    store = ws.units("interactions")
    result = InteractionResult(n_samples=int(x.shape[0]), order=order)
    for name in models:
        model, _ = ws.trained(name, torch.float64)
        key = f"{name}-{ws.fingerprint(model)}-order{order}-x{fingerprint([('x', x)])}"
        unit = store.get(key, lambda model=model: _split(model, x, order, ws.progress))
        scale = unit["df"].abs()[:, None]
        own, pairs, total = unit["own"] / scale, unit["pairs"] / scale, unit["total"] / scale
        label = paper.model_label(name)
        for k in range(1, order + 1):
            result.rows.append({"model": label, "order": k,
                                "total": float(total[:, k - 1].mean()),
                                "own": float(own[:, k - 1].mean()),
                                "pairs": float(pairs[:, k - 1].mean()),
                                "rest": float((total - own - pairs)[:, k - 1].mean())})
        error = (unit["df"] - unit["total"].sum(1)).abs() / unit["df"].abs()
        result.error[label] = float(error.mean())
        shown = Interactions(pairs=unit["pairs0"], own=unit["own0"], groups=unit["groups"])
        result.top_pairs[label] = strongest_pairs(shown, top=5)
        if plots and ws.is_main:
            result.figures.append(str(_figure(ws.out, label, x[0], shown, order)))
    if ws.is_main:
        _io.save_json(result.to_json(), ws.out / "interactions" / "interactions.json")
        _io.save_csv(result.rows, ws.out / "interactions" / "interactions.csv")
    return result


def _figure(out: Path, label: str, image: torch.Tensor, shown, order: int) -> Path:
    path = out / "figures" / f"interactions_{label.lower().replace('-', '_')}.png"
    interaction_map(image, shown, title=f"{label}: pair interactions J_{order} of 4x4 patches",
                    path=path)
    return path


def format_interactions(result: InteractionResult) -> str:
    """Markdown: the shares per model and order, the truncation error and the top pairs."""
    lines = [(f"Shares of |df| by order, {result.n_samples} held-out digits, baseline 0, "
              "predicted class, 4x4 patches (signed means: terms of opposite signs cancel)."), "",
             markdown_table(["model", "order k", "P_k", "inside one patch", "between two patches",
                             "three or more patches"],
                            [[r["model"], r["order"], *(f"{r[k]:+.3f}" for k in
                                                        ("total", "own", "pairs", "rest"))]
                             for r in result.rows]), ""]
    for model, err in result.error.items():
        top = ", ".join(f"patches {a}-{b}: {v:+.3g}" for a, b, v in result.top_pairs[model][:3])
        lines.append(f"- {model}: mean |eps_{result.order}|/|df| = {err:.3g}; strongest pairs of "
                     f"the first digit: {top}.")
    return "\n".join(lines)
