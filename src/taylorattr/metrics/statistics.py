"""Statistics: paired tests, confidence intervals, correlations; the one place for them.

    pearson(a, b)  = sum (a - a_bar)(b - b_bar) / (||a - a_bar|| ||b - b_bar||)
    spearman(a, b) = pearson(rank(a), rank(b))        (ties get their average rank)
    mean_sem(v)    = (mean v, std(v) / sqrt(n))        (std with Bessel's correction)

Undefined correlations (fewer than two values, a constant side) give ``undefined`` (NaN
by default, as ``scipy.stats`` does).

Every experiment that compares two methods (or two orders) measures both on the same
samples, so comparisons are *paired*: with per-sample values ``a_i`` and ``b_i`` the
differences ``d_i = a_i - b_i`` are tested against "no difference".

* :func:`wilcoxon_signed_rank`: ``W+ = sum_{i: d_i > 0} rank(|d_i|)`` (zeros dropped,
  tied ``|d_i|`` share their mean rank). Exact null distribution (every sign pattern
  equally likely, counted by dynamic programming) when there are at most 50 non-zero
  differences and no ties; otherwise the normal approximation
  ``z = (W+ - n(n+1)/4) / sqrt(n(n+1)(2n+1)/24 - sum_t (t^3 - t)/48)``.
* :func:`sign_flip_test`: the permutation test of the mean difference,
  ``p = P(|mean(s * d)| >= |mean(d)|)`` over independent random signs ``s_i = +-1``;
  enumerated exactly up to 16 samples, Monte Carlo (``(hits + 1) / (R + 1)``) beyond.
* :func:`bootstrap_ci`: percentile bootstrap interval of a mean.
* :func:`compare_paired`: the sentence a report prints, "lower (p = 0.003)" or "no
  significant difference (p = 0.41)", from a two-sided test at level ``alpha``.

Only numpy is needed (no scipy).
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from .._validation import check_positive_int

__all__ = ["PairedTest", "bootstrap_ci", "bootstrap_correlation_ci", "compare_paired",
           "correlations", "mean_sem", "pearson", "ranks", "sign_flip_test", "spearman",
           "wilcoxon_signed_rank"]

_EXACT_WILCOXON_MAX = 50
_EXACT_SIGN_FLIP_MAX = 16


@dataclass(frozen=True)
class PairedTest:
    """A two-sided paired test: ``statistic``, ``p_value``, ``n`` pairs used, ``method``,
    and ``direction``: +1 when ``a`` tends to exceed ``b`` (``W+ > W-``, or a positive
    mean difference), -1 when it tends to fall below, 0 when neither."""

    statistic: float
    p_value: float
    n: int
    method: str
    direction: int = 0


def _paired(a, b) -> np.ndarray:
    """``a - b`` as a float64 vector, after checking both are equal-length finite vectors."""
    x = np.asarray(a, dtype=np.float64).reshape(-1)
    y = np.asarray(b, dtype=np.float64).reshape(-1)
    if x.shape != y.shape:
        raise ValueError(f"a and b must hold the same number of paired samples, got {x.size} "
                         f"and {y.size}")
    if x.size == 0:
        raise ValueError("a and b must hold at least one paired sample, got none")
    if not (np.isfinite(x).all() and np.isfinite(y).all()):
        raise ValueError("a and b must be finite; drop the samples with NaN or inf first")
    return x - y


def _signed_rank_counts(n: int) -> np.ndarray:
    """``counts[t]`` = number of subsets of ``{1..n}`` whose sum is ``t``."""
    counts = np.zeros(n * (n + 1) // 2 + 1, dtype=np.float64)
    counts[0] = 1.0
    for k in range(1, n + 1):
        counts[k:] = counts[k:] + counts[:-k].copy()
    return counts


def wilcoxon_signed_rank(a, b) -> PairedTest:
    """Two-sided Wilcoxon signed-rank test of ``a - b`` (see the module docstring).

    ``statistic`` is ``min(W+, W-)``; with no non-zero difference ``p_value`` is 1.
    """
    d = _paired(a, b)
    d = d[d != 0]
    n = int(d.size)
    if n == 0:
        return PairedTest(0.0, 1.0, 0, "no non-zero difference", 0)
    r = ranks(np.abs(d))
    w_plus = float(r[d > 0].sum())
    w_minus = n * (n + 1) / 2 - w_plus
    direction = int(np.sign(w_plus - w_minus))
    _, tie_sizes = np.unique(np.abs(d), return_counts=True)
    if n <= _EXACT_WILCOXON_MAX and tie_sizes.max() == 1:
        counts = _signed_rank_counts(n)
        t = round(min(w_plus, w_minus))
        p = min(1.0, 2.0 * float(counts[:t + 1].sum()) / 2.0 ** n)
        return PairedTest(min(w_plus, w_minus), p, n, "exact", direction)
    mean = n * (n + 1) / 4
    var = n * (n + 1) * (2 * n + 1) / 24 - float(((tie_sizes ** 3) - tie_sizes).sum()) / 48
    z = 0.0 if var <= 0 else (w_plus - mean) / math.sqrt(var)
    return PairedTest(min(w_plus, w_minus), math.erfc(abs(z) / math.sqrt(2)), n, "normal",
                      direction)


def sign_flip_test(a, b, n_resamples: int = 10_000, seed: int = 0) -> PairedTest:
    """Two-sided permutation test of the mean of ``a - b`` by random sign flips.

    Exact (all ``2^n`` sign patterns) for ``n <= 16``; otherwise ``n_resamples`` random
    patterns from ``numpy.random.default_rng(seed)`` and ``p = (hits + 1) / (R + 1)``.
    """
    d = _paired(a, b)
    n = int(d.size)
    observed = abs(d.mean())
    tol = 1e-12 * max(1.0, float(np.abs(d).max()))
    if n <= _EXACT_SIGN_FLIP_MAX:
        patterns = ((np.arange(2 ** n)[:, None] >> np.arange(n)) & 1) * 2 - 1
        means = np.abs(patterns @ d) / n
        return PairedTest(float(d.mean()), float((means >= observed - tol).mean()), n, "exact",
                          int(np.sign(d.mean())))
    if n_resamples < 1:
        raise ValueError(f"n_resamples must be a positive integer, got {n_resamples}")
    signs = np.random.default_rng(seed).choice([-1.0, 1.0], size=(n_resamples, n))
    hits = int((np.abs(signs @ d) / n >= observed - tol).sum())
    return PairedTest(float(d.mean()), (hits + 1) / (n_resamples + 1), n,
                      f"Monte Carlo ({n_resamples} sign patterns)", int(np.sign(d.mean())))


def bootstrap_ci(values, level: float = 0.95, n_resamples: int = 10_000,
                 seed: int = 0) -> tuple[float, float]:
    """Percentile bootstrap interval ``(low, high)`` of the mean of ``values``."""
    v = np.asarray(values, dtype=np.float64).reshape(-1)
    if v.size == 0 or not np.isfinite(v).all():
        raise ValueError("values must be a non-empty vector of finite numbers")
    if not 0.0 < level < 1.0:
        raise ValueError(f"level must lie strictly between 0 and 1, got {level}")
    if n_resamples < 1:
        raise ValueError(f"n_resamples must be a positive integer, got {n_resamples}")
    idx = np.random.default_rng(seed).integers(0, v.size, size=(n_resamples, v.size))
    means = v[idx].mean(axis=1)
    low, high = np.quantile(means, [(1 - level) / 2, (1 + level) / 2])
    return float(low), float(high)


def compare_paired(a, b, alpha: float = 0.05, test: str = "wilcoxon") -> str:
    """How ``a`` compares with ``b`` on the same samples, worded by a two-sided test:

    ``"lower (p = 0.003)"`` or ``"higher (p = ...)"`` when ``p < alpha`` (the direction of
    the mean difference), else ``"no significant difference (p = 0.41)"``. ``test`` is
    ``"wilcoxon"`` (:func:`wilcoxon_signed_rank`) or ``"sign-flip"`` (:func:`sign_flip_test`).
    """
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"alpha must lie strictly between 0 and 1, got {alpha}")
    tests = {"wilcoxon": wilcoxon_signed_rank, "sign-flip": sign_flip_test}
    if test not in tests:
        raise ValueError(f"test must be one of {sorted(tests)}, got {test!r}")
    result = tests[test](a, b)
    p = f"p = {result.p_value:.2g}"
    if result.p_value >= alpha or result.direction == 0:
        return f"no significant difference ({p}, n = {result.n})"
    return f"{'higher' if result.direction > 0 else 'lower'} ({p}, n = {result.n})"


def _vector(v) -> np.ndarray:
    """A sequence or a tensor (flattened) as a float64 vector."""
    t = v.detach().cpu().reshape(-1) if isinstance(v, torch.Tensor) else list(v)
    return np.asarray(torch.as_tensor(t, dtype=torch.float64, device="cpu"))


def ranks(v) -> np.ndarray:
    """Ranks 1..n along the last axis, ties given their average rank:
    ``rank_i = #{j: v_j < v_i} + (#{j: v_j = v_i} + 1) / 2`` (float64, shaped like ``v``)."""
    v = np.asarray(v, dtype=np.float64)
    rows = v.reshape(-1, v.shape[-1]) if v.ndim else v.reshape(1, 1)
    out = np.empty_like(rows)
    for i, row in enumerate(rows):
        s = np.sort(row)
        out[i] = (np.searchsorted(s, row, "left") + np.searchsorted(s, row, "right") + 1) / 2
    return out.reshape(v.shape)


def correlations(x, y) -> np.ndarray:
    """Pearson's r along the last axis of equally shaped arrays (NaN where a side is
    constant): ``sum (x - x_bar)(y - y_bar) / (||x - x_bar|| ||y - y_bar||)``."""
    x = np.asarray(x, dtype=np.float64)
    y = np.asarray(y, dtype=np.float64)
    x = x - x.mean(axis=-1, keepdims=True)
    y = y - y.mean(axis=-1, keepdims=True)
    den = np.sqrt((x * x).sum(axis=-1) * (y * y).sum(axis=-1))
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(den > 0, (x * y).sum(axis=-1) / np.where(den > 0, den, 1.0), np.nan)


def pearson(a, b, undefined: float = float("nan")) -> float:
    """Pearson's r of two equally long sequences (tensors are flattened); ``undefined``
    for fewer than two values or a constant side."""
    x, y = _vector(a), _vector(b)
    if x.shape != y.shape:
        raise ValueError(f"a and b must have the same length, got {x.size} and {y.size}")
    if x.size < 2:
        return undefined
    r = float(correlations(x, y))
    return r if math.isfinite(r) else undefined


def spearman(x: Sequence[float], y: Sequence[float]) -> float:
    """Spearman's rank correlation: Pearson's r of the (average-tie) ranks.

    NaN when fewer than two pairs remain or either side is constant (undefined), as
    ``scipy.stats.spearmanr`` gives.
    """
    xs = torch.as_tensor(list(x), dtype=torch.float64, device="cpu")
    ys = torch.as_tensor(list(y), dtype=torch.float64, device="cpu")
    if xs.shape != ys.shape or xs.dim() != 1:
        raise ValueError(f"x and y must be 1-D of the same length, got {tuple(xs.shape)} and "
                         f"{tuple(ys.shape)}")
    if xs.numel() < 2:
        return float("nan")
    return pearson(ranks(xs.numpy()), ranks(ys.numpy()))


def mean_sem(v: torch.Tensor) -> tuple[float, float]:
    """The mean and its standard error (NaN for a single value)."""
    v = v.to(torch.float64)
    mean = float(v.mean())
    sem = float(v.std() / math.sqrt(v.numel())) if v.numel() > 1 else float("nan")
    return mean, sem


def bootstrap_correlation_ci(xs, ys, method: str = "pearson", level: float = 0.95,
                             n_resamples: int = 2000, seed: int = 0
                             ) -> tuple[float, float, float]:
    """``(r, low, high)``: a correlation averaged over groups and its percentile bootstrap
    interval over the samples.

    ``xs`` and ``ys`` are sequences of ``G`` equally long vectors measured on the *same*
    ``n`` samples (one group per training seed, say; a single pair of vectors is one group).
    ``r = 1/G sum_g corr(xs[g], ys[g])`` with ``corr`` Pearson's r or Spearman's rho
    (``method``). Each resample draws ``n`` sample indices with replacement and recomputes
    ``r`` on those rows of every group, so the interval reflects which samples were
    drawn. Resamples where a correlation is undefined (a constant side) are dropped;
    ``(nan, nan, nan)`` when fewer than 3 samples.
    """
    if method not in ("pearson", "spearman"):
        raise ValueError(f"method must be 'pearson' or 'spearman', got {method!r}")
    if not 0.0 < level < 1.0:
        raise ValueError(f"level must lie strictly between 0 and 1, got {level}")
    check_positive_int(n_resamples, "n_resamples")
    if isinstance(xs, (np.ndarray, torch.Tensor)) and np.ndim(xs) == 1:
        xs, ys = [xs], [ys]
    gx = [np.asarray(torch.as_tensor(v, dtype=torch.float64, device="cpu").reshape(-1)) for v in xs]
    gy = [np.asarray(torch.as_tensor(v, dtype=torch.float64, device="cpu").reshape(-1)) for v in ys]
    if not gx or len(gx) != len(gy) or len({v.size for v in gx + gy}) != 1:
        raise ValueError("xs and ys must hold the same number (>= 1) of vectors, all of one length")
    n = gx[0].size
    if n < 3:
        return float("nan"), float("nan"), float("nan")
    if not all(np.isfinite(v).all() for v in gx + gy):
        raise ValueError("xs and ys must be finite")
    idx = np.random.default_rng(seed).integers(0, n, size=(n_resamples, n))
    idx = np.concatenate([np.arange(n)[None], idx])  # row 0: the sample itself

    def corr(a, b):
        if method == "spearman":
            a, b = ranks(a), ranks(b)
        return correlations(a, b)

    r = np.mean([corr(a[idx], b[idx]) for a, b in zip(gx, gy)], axis=0)
    boot = r[1:][np.isfinite(r[1:])]
    if boot.size == 0:
        return float(r[0]), float("nan"), float("nan")
    low, high = np.quantile(boot, [(1 - level) / 2, (1 + level) / 2])
    return float(r[0]), float(low), float(high)
