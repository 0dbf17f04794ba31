r"""The coalition designs of KernelSHAP (:mod:`.kernel_shap`): which coalitions, and their weights.

With ``G`` players the Shapley kernel's total weight of coalitions of size ``s`` is
``K_s = (G - 1) / (s (G - s))`` (``0 < s < G``).

* :func:`paired_design` (``sampler="paired"``), for ``rows`` coalitions per sample:

  1. *enumeration* of the sizes with the largest kernel weight (as SHAP's KernelExplainer):
     sizes ``s`` and ``G - s`` together, ``s = 1, 2, ...``, are enumerated completely while
     the rows left, shared in proportion to the kernel weight left, cover all ``C(G, s)``
     (twice for ``s != G - s``) coalitions; each has weight ``K_s / C(G, s)``;
  2. *paired, stratified sampling* of the other sizes: ``U = floor(rows / 2)`` pairs
     ``(S, complement of S)``; stratum ``{s, G - s}`` gets ``U p_h`` pairs in expectation
     (``p_h`` its share of the remaining kernel weight) by systematic sampling; ``S`` is
     uniform among the coalitions of size ``s``, drawn without replacement where the
     stratum's pairs are at least 1% of its coalitions (``s != G / 2``; the combinatorial
     number system unranks them); each coalition of a pair weighs ``W_h / (2 U p_h)``
     (``W_h = K_s + K_{G-s}``, or ``K_s`` for ``s = G / 2``), an unbiased design.

* :func:`draw_coalitions` (``sampler="captum"``): Captum's ``KernelShap`` draws (all
  players, none, then sizes ``k ~ (G - 1) / (k (G - k))``, uniform within a size), from a
  CPU generator seeded with ``seed`` in Captum's order.
"""
from __future__ import annotations

import itertools
import math

import torch

from .._validation import check_seed, cpu_generator

__all__ = ["draw_coalitions", "paired_design", "plan"]

#: A stratum is sampled without replacement when its pairs are at least 1 / this of its
#: coalitions.
_DISTINCT_SHARE = 100


def _kernel_sizes(G: int) -> torch.Tensor:
    """``K_s = (G - 1) / (s (G - s))`` for ``s = 0..G`` (0 at the end points), float64."""
    s = torch.arange(G + 1, dtype=torch.float64, device="cpu")
    k = (G - 1) / (s * (G - s))
    k[0] = k[G] = 0.0
    return k


def _enumerate_size(G: int, s: int) -> torch.Tensor:
    """All ``C(G, s)`` coalitions of size ``s``, ``[C(G, s), G]`` bool."""
    if 2 * s > G:
        return ~_enumerate_size(G, G - s)
    idx = torch.tensor(list(itertools.combinations(range(G), s)), dtype=torch.long, device="cpu")
    out = torch.zeros(math.comb(G, s), G, dtype=torch.bool, device="cpu")
    if s:
        out.scatter_(1, idx.view(-1, s), True)
    return out


def plan(G: int, rows: int) -> tuple[list[int], list[int], int]:
    """``(enumerated sizes, sampled strata (their smaller size s), pairs U)`` for ``rows``
    coalitions besides the baseline (module docstring, steps 1-2)."""
    k = _kernel_sizes(G)
    strata = list(range(1, G // 2 + 1))
    weight = {s: float(k[s] + (k[G - s] if G - s != s else 0.0)) for s in strata}
    left_w = sum(weight.values())
    if rows >= 2 ** G - 2:  # every coalition
        return [s for s in range(1, G)], [], 0
    enumerated = []
    for s in strata:
        count = math.comb(G, s) * (2 if G - s != s else 1)
        if rows * weight[s] / left_w < count - 1e-9:
            break
        enumerated += [s] if G - s == s else [s, G - s]
        rows -= count
        left_w -= weight[s]
    sampled = [s for s in strata if s not in enumerated]
    return enumerated, sampled, (rows // 2 if sampled else 0)


def paired_design(G: int, rows: int, batch: int, seed: int):
    """The paired sampler's coalitions for ``rows`` coalitions per sample besides the baseline.

    Returns ``(coalitions [B, R, G] bool, weights [B, R] float64, unit [B, R] long, stratum
    [B, R] long)``: ``unit`` is the pair of a sampled coalition (``-1`` for enumerated ones)
    and ``stratum`` its stratum (the smaller size ``s``; ``-1`` when enumerated).
    """
    k = _kernel_sizes(G)
    enumerated, sampled, U = plan(G, rows)
    fixed = [_enumerate_size(G, s) for s in enumerated]
    fixed_w = [torch.full((c.shape[0],), float(k[s]) / c.shape[0], dtype=torch.float64, device="cpu")
               for c, s in zip(fixed, enumerated)]
    fixed = torch.cat(fixed) if fixed else torch.zeros(0, G, dtype=torch.bool, device="cpu")
    fixed_w = torch.cat(fixed_w) if fixed_w else torch.zeros(0, dtype=torch.float64, device="cpu")
    n_fixed = fixed.shape[0]
    coal = fixed[None].expand(batch, -1, -1)
    weights = fixed_w[None].expand(batch, -1)
    unit = torch.full((batch, n_fixed), -1, dtype=torch.long, device="cpu")
    stratum = torch.full((batch, n_fixed), -1, dtype=torch.long, device="cpu")
    if U == 0:
        return coal.contiguous(), weights.contiguous(), unit, stratum
    gen = cpu_generator(check_seed(seed))
    sizes = torch.tensor(sampled, device="cpu")
    w_h = k[sizes] + torch.where(G - sizes != sizes, k[G - sizes], torch.zeros((), device="cpu"))
    share = w_h / w_h.sum()
    # systematic sampling: pair j of sample b falls in the stratum whose cumulative share
    # holds (j + u_b) / U, so stratum h gets U p_h pairs up to less than one
    offset = torch.rand(batch, 1, generator=gen, dtype=torch.float64, device="cpu")
    points = (torch.arange(U, dtype=torch.float64, device="cpu")[None] + offset) / U
    edges = torch.cumsum(share, 0)
    h = torch.searchsorted(edges, points.contiguous(), right=True).clamp(max=len(sampled) - 1)
    size = sizes[h]  # [B, U]
    ranks = torch.rand(batch, U, G, generator=gen, device="cpu").argsort(-1).argsort(-1)
    first = ranks < size[..., None]  # uniform among the coalitions of size s
    for b in range(batch):  # small strata: distinct coalitions (sampling without replacement)
        for value in torch.unique(size[b]).tolist():
            where = (size[b] == value).nonzero()[:, 0]
            total = math.comb(G, value)
            if 2 * value == G or len(where) * _DISTINCT_SHARE < total or len(where) > total:
                continue  # (drawn with replacement, duplicates are rare: under 1 in 200)
            pick = torch.randperm(total, generator=gen, device="cpu")[:len(where)]
            first[b, where] = _unrank(G, value, pick)
    pair_w = (w_h[h] / (2 * U * share[h])).to(torch.float64)  # each coalition of the pair
    units = torch.arange(U, device="cpu")[None].expand(batch, U)
    coal = torch.cat([coal, first, ~first], 1)
    weights = torch.cat([weights, pair_w, pair_w], 1)
    unit = torch.cat([unit, units, units], 1)
    stratum = torch.cat([stratum, size, size], 1)
    return coal, weights, unit, stratum


def _unrank(G: int, s: int, ranks: torch.Tensor) -> torch.Tensor:
    """The coalitions of size ``s`` with lexicographic ranks ``ranks`` (``[m]`` long, each
    below ``C(G, s)``), ``[m, G]`` bool (the combinatorial number system), on the device of
    ``ranks``."""
    m, at = ranks.shape[0], ranks.device
    out = torch.zeros(m, G, dtype=torch.bool, device=at)
    left = torch.full((m,), s, dtype=torch.long, device=at)
    r = ranks.clone()
    cap = math.comb(G, s) + 1  # counts above every rank compare alike
    table = torch.tensor([[min(math.comb(n, k), cap) if k >= 0 else 0 for k in range(-1, s)]
                          for n in range(G)], dtype=torch.long, device=at)  # table[n, k + 1] = C(n, k)
    for i in range(G):
        # coalitions (lexicographic) holding player i next: C(G - i - 1, left - 1)
        count = table[G - i - 1, left.clamp(min=0)]  # C(G - i - 1, left - 1)
        take = (left > 0) & (r < count)
        out[:, i] = take
        r = torch.where(~take & (left > 0), r - count, r)
        left = left - take.long()
    return out


def draw_coalitions(n_players: int, n_samples: int, batch: int, seed) -> torch.Tensor:
    """``[batch, n_samples, G]`` boolean coalitions, Captum's sampling (``sampler="captum"``),
    from a CPU generator seeded with ``seed``, or from ``seed`` itself when it is a
    ``torch.Generator`` (the global generator of the default device, ``torch.default_generator``
    or CUDA's: Captum's very draws, which come from it, and it left as Captum leaves it),
    drawn on the generator's device as Captum draws there."""
    G = n_players
    gen = seed if isinstance(seed, torch.Generator) else \
        cpu_generator(check_seed(seed))
    at = gen.device
    sizes = torch.arange(G, dtype=torch.float, device=at)
    probs = torch.tensor(G - 1, device=at) / (sizes * (G - sizes))  # Captum's float32 arithmetic
    probs[0] = 0.0
    probs = (probs / probs.sum(-1, keepdim=True)).reshape(1, -1)
    out = torch.zeros(batch, n_samples, G, dtype=torch.bool, device="cpu")
    for b in range(batch):
        out[b, 0] = True
        for s in range(2, n_samples):
            k = int(torch.multinomial(probs, 1, True, generator=gen))
            vals = torch.randn(1, G, generator=gen, device=at)
            threshold = torch.kthvalue(vals, G - k).values.item()
            out[b, s] = (vals > threshold)[0].cpu()
        # Captum's fit of each sample takes draws from the same (global) generator: its
        # DataLoader's base seed and the default initialisation of an nn.Linear(G, 1)
        # surrogate. Take them too, so that batches stay in step with Captum.
        torch.empty((), dtype=torch.int64, device=at).random_(generator=gen)
        torch.empty(1, G, device=at).uniform_(generator=gen)
        torch.empty(1, device=at).uniform_(generator=gen)
    return out
