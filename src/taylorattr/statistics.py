"""Statistics helpers shared by the experiments: correlations and means with their errors.

    pearson(a, b)  = sum (a - a_bar)(b - b_bar) / (||a - a_bar|| ||b - b_bar||)
    spearman(a, b) = pearson(rank(a), rank(b))        (ties get their average rank)
    mean_sem(v)    = (mean v, std(v) / sqrt(n))        (std with Bessel's correction)

Undefined cases (fewer than two values, a constant side) give ``undefined`` (NaN by
default, as ``scipy.stats`` does).
"""
from __future__ import annotations

import math
from collections.abc import Sequence

import torch

__all__ = ["mean_sem", "pearson", "ranks", "spearman"]


def _vector(v, name: str) -> torch.Tensor:
    t = torch.as_tensor(v if isinstance(v, torch.Tensor) else list(v), dtype=torch.float64)
    return t.reshape(-1) if isinstance(v, torch.Tensor) else t


def pearson(a, b, undefined: float = float("nan")) -> float:
    """Pearson's r of two equally long sequences (tensors are flattened)."""
    x, y = _vector(a, "a"), _vector(b, "b")
    if x.shape != y.shape:
        raise ValueError(f"a and b must have the same length, got {x.numel()} and {y.numel()}")
    if x.numel() < 2:
        return undefined
    x, y = x - x.mean(), y - y.mean()
    den = float(x.norm() * y.norm())
    return float((x * y).sum()) / den if den > 0 else undefined


def ranks(v: torch.Tensor) -> torch.Tensor:
    """Ranks 1..n with ties given their average rank."""
    order = torch.argsort(v, stable=True)
    r = torch.empty_like(v)
    r[order] = torch.arange(1, v.numel() + 1, dtype=v.dtype)
    out = r.clone()
    for value in torch.unique(v):
        tie = v == value
        out[tie] = r[tie].mean()
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
    return pearson(ranks(xs), ranks(ys))


def mean_sem(v: torch.Tensor) -> tuple[float, float]:
    """The mean and its standard error (NaN for a single value)."""
    v = v.to(torch.float64)
    mean = float(v.mean())
    sem = float(v.std() / math.sqrt(v.numel())) if v.numel() > 1 else float("nan")
    return mean, sem
