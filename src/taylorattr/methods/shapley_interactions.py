r"""Pairwise Shapley interaction index (Grabisch & Roubens 1999), exact or sampled.

For the baseline-removal game of :mod:`.shapley_values` (``v(S) = f(x_S, x~_rest)``, players
``0..G-1``), the Shapley interaction index of a pair ``{i, j}`` is

    SII_ij = sum_{S subset of N \ {i, j}} |S|! (G - |S| - 2)! / (G - 1)!
             * [v(S + i + j) - v(S + i) - v(S + j) + v(S)].

It is returned as a symmetric ``[B, G, G]`` matrix with a zero diagonal.

* ``method="exact"``: all ``2^G`` coalitions (``G <= 16``; ``2^G`` forward rows per sample).
* ``method="sampling"``: ``n_samples`` random orders of the players, shared by the batch; in
  every order each *adjacent* pair ``(pi_k, pi_{k+1})`` gets the discrete derivative above at
  ``S = {pi_1..pi_{k-1}}``. Given that ``i`` and ``j`` are adjacent in a uniform order, the set
  before them has exactly the SII weights (its size uniform on ``0..G-2``, the set uniform
  among those of that size), so the mean over the orders in which ``i`` and ``j`` meet is
  unbiased (each pair meets in ``2 / G`` of the orders). Rows: ``2 (G - 1)`` per order and
  sample (the ``G - 1`` proper prefixes and ``S + pi_{k+1}`` for each adjacent pair) plus one
  baseline. A pair that never met is NaN; ``return_std_error=True`` also returns the standard
  error of every entry (the spread of its draws over the square root of their count; inf for
  a pair met once).
* ``method="auto"`` (default): exact for ``G <= 16``, sampling beyond.

Relation to the Taylor pair interactions (:mod:`taylorattr.taylor.pair_interactions`): those
expand at ``x`` and describe the *removal* game ``w(T) = f(x) - v(N \ T)``, a sum of unanimity
games, one per monomial ``phi(kappa)`` of the order-K polynomial at ``x``, with support ``T``
(the dividends ``d_T = sum_{supp kappa = T} phi(kappa)``). The SII of ``w`` gives a pair
``{i, j}`` the share ``d_T / (|T| - 1)`` of every support ``T`` holding both, while the Taylor
pair interaction ``J_K(i, j)`` is the dividend ``d_{i, j}`` alone. ``w`` is the dual of ``v``,
and the pair index of a dual game changes sign, so

    SII_ij(v) = -SII_ij(w) = -J_K(i, j) - sum_{T >= {i, j}, |T| >= 3} d_T / (|T| - 1).

For K = 2 (and exactly for a quadratic network) ``SII_ij = -J_2(i, j)``; from order 3 the SII
adds the shares of the larger supports. (For ``f = x_1 x_2`` and a zero baseline:
``SII_12 = x_1 x_2``, ``J_2(1, 2) = -x_1 x_2``: at ``x`` the pair monomial of ``df`` is
``-delta_1 delta_2`` and the linear terms carry ``2 x_1 x_2``.)
"""
from __future__ import annotations

import math

import torch

from .. import _validation as V
from ..groups import player_ids
from ._passes import check_optional_positive_int
from .shapley_values import MAX_EXACT_PLAYERS, coalition_values, draw_permutations

__all__ = ["shapley_interactions"]

_METHODS = ("auto", "exact", "sampling")


def _exact(model, x, base, t, ids, G, chunk, show_progress) -> torch.Tensor:
    codes = torch.arange(2 ** G, device=x.device)
    bits = (codes[:, None] >> torch.arange(G, device=x.device)) & 1
    v = coalition_values(model, x, base, t, ids, bits.bool(), chunk, show_progress,
                         "shapley interactions").double()
    size = bits.sum(1)
    fact = [math.factorial(k) for k in range(G + 1)]
    # |S|! (G - |S| - 2)! / (G - 1)! for every coalition size |S| <= G - 2, once
    by_size = torch.tensor([fact[k] * fact[G - k - 2] / fact[G - 1] for k in range(G - 1)],
                           dtype=torch.float64, device=x.device)
    out = torch.zeros(x.shape[0], G, G, dtype=torch.float64, device=x.device)
    for i in range(G):
        for j in range(i + 1, G):
            S = codes[(bits[:, i] == 0) & (bits[:, j] == 0)]
            w = by_size[size[S]]
            d = v[:, S | (1 << i) | (1 << j)] - v[:, S | (1 << i)] - v[:, S | (1 << j)] + v[:, S]
            out[:, i, j] = out[:, j, i] = (d * w).sum(1)
    return out


def _sampled(model, x, base, t, fx, ids, G, perms, chunk, show_progress):
    n = perms.shape[0]
    perms = perms.to(x.device)
    rank = torch.empty_like(perms)
    rank.scatter_(1, perms, torch.arange(G, device=x.device).expand(n, G))
    steps = torch.arange(1, G, device=x.device)
    prefix = rank[:, None, :] < steps[None, :, None]  # [n, G-1, G]: the first k players
    # S + pi_{k+1} for every adjacent pair (pi_k, pi_{k+1}), k = 1..G-1: the first k - 1
    # players and the (k+1)-th
    skip = (rank[:, None, :] < steps[None, :, None] - 1) | (rank[:, None, :] == steps[None, :, None])
    coal = torch.cat([prefix, skip], 1).reshape(-1, G)
    v = coalition_values(model, x, base, t, ids, coal, chunk, show_progress,
                         "shapley interactions").double().view(-1, n, 2, G - 1)
    with torch.no_grad():
        f_base = V.select_output(model(base), t).double()
    B = x.shape[0]
    pre = torch.cat([f_base[:, None, None].expand(B, n, 1), v[:, :, 0],
                     fx.detach().double()[:, None, None].expand(B, n, 1)], 2)  # v(first k), k=0..G
    # pair k (players pi_k, pi_{k+1}, 1-based): v(first k+1) - v(first k) - v(S + pi_{k+1})
    # + v(first k-1)
    d = pre[:, :, 2:] - pre[:, :, 1:-1] - v[:, :, 1] + pre[:, :, :-2]  # [B, n, G-1]
    a, b = perms[:, :-1], perms[:, 1:]  # [n, G-1]
    index = (torch.minimum(a, b) * G + torch.maximum(a, b)).reshape(-1)
    count = torch.zeros(G * G, dtype=torch.float64, device=x.device).index_add_(
        0, index, torch.ones_like(index, dtype=torch.float64))
    total = torch.zeros(B, G * G, dtype=torch.float64, device=x.device).index_add_(
        1, index, d.reshape(B, -1))
    square = torch.zeros_like(total).index_add_(1, index, d.reshape(B, -1) ** 2)
    mean = total / count
    var = (square - count * mean ** 2) / (count - 1)
    se = (var.clamp(min=0) / count).sqrt()
    se = torch.where(count > 1, se, torch.full_like(se, math.inf))
    mean, se = mean.view(B, G, G), se.view(B, G, G)
    sym = lambda m: torch.triu(m, 1) + torch.triu(m, 1).transpose(1, 2)
    return sym(mean), sym(se)


def shapley_interactions(model, inputs: torch.Tensor, baselines=0.0, target=None, *,
                         feature_mask=None, patch=None, method: str = "auto",
                         n_samples: int = 100, seed: int = 0,
                         perturbations_per_eval: int | None = None,
                         return_std_error: bool = False, show_progress: bool = False):
    """Pairwise Shapley interaction index of the removal game (module docstring).

    Args:
        model, inputs, baselines, target: a model on one ``[B, ...]`` tensor, the point
            baseline(s), the explained output (None: the argmax class).
        feature_mask: player ids as :class:`~taylorattr.methods.ShapleyValues` takes them
            (shared or per sample); ``patch``: square windows as players. Default: every
            feature a player.
        method: ``"auto"`` | ``"exact"`` | ``"sampling"``.
        n_samples: orders drawn by the sampling method; ``seed`` their generator's seed.
        perturbations_per_eval: rows per model call (default automatic).
        return_std_error: also return the standard errors (zeros when exact).
        show_progress: a tqdm bar over the chunks.

    Returns ``SII [B, G, G]`` (float64, symmetric, zero diagonal), or ``(SII, std_error)``.
    """
    V.check_model(model)
    V.check_bool(return_std_error, "return_std_error")
    V.check_bool(show_progress, "show_progress")
    chunk = check_optional_positive_int(perturbations_per_eval, "perturbations_per_eval")
    if method not in _METHODS:
        raise ValueError(f"method must be one of {list(_METHODS)}, got {method!r}")
    x = V.check_inputs(inputs).detach()
    base = V.broadcast_baselines(baselines, x).detach()
    with torch.no_grad():
        out = V.model_output(model, x)
    t = V.resolve_target(target, out)
    fx = V.select_output(out, t)
    ids, G = player_ids(feature_mask, x, patch)
    if G < 2:
        raise ValueError(f"pair interactions need at least 2 players, got G={G}")
    if method == "exact" or (method == "auto" and G <= MAX_EXACT_PLAYERS):
        if G > MAX_EXACT_PLAYERS:
            raise ValueError(f"method='exact' enumerates 2^G coalitions and takes at most "
                             f"{MAX_EXACT_PLAYERS} players, got G={G}; group features with "
                             "feature_mask or use method='sampling'")
        sii = _exact(model, x, base, t, ids, G, chunk, show_progress)
        se = torch.zeros_like(sii)
    else:
        perms = draw_permutations(G, V.check_positive_int(n_samples, "n_samples"), seed)
        sii, se = _sampled(model, x, base, t, fx, ids, G, perms, chunk, show_progress)
    return (sii, se) if return_std_error else sii
