"""The Shapley rule: each monomial of the order-K Taylor polynomial shared equally (docs/design.md).

Write the order-K expansion at x as monomials ``phi(kappa)`` in ``delta = x - x~`` (support
``S``, degree ``k = |kappa|``). Removing a coalition ``T`` of features (moving them to the
baseline) changes the polynomial by ``v(T) = g_K(delta_T) = sum_kappa phi(kappa) [S in T]``: a sum
of unanimity games, whose Shapley value gives ``phi(kappa) / |S|`` to every feature of ``S``.
Integrated Gradients gives ``phi(kappa) kappa_i / k`` instead (Theorem 5). The two agree when
every exponent in ``S`` is equal, so at K <= 2 the Shapley rule *is* the IG rule. From order 3:

    order 3:  kappa (2,1): IG (2/3, 1/3), Shapley (1/2, 1/2)
    order 4:  (3,1): IG (3/4, 1/4) vs (1/2, 1/2);  (2,1,1): IG (1/2, 1/4, 1/4) vs 1/3 each

With the Euler operators ``E_i = v_i d/dv_i`` (``E_i v^kappa = kappa_i v^kappa``) and
``R_k = sum_j E_j (E_j - 1) c_k = sum_j v_j^2 d^2 c_k / dv_j^2`` (``R v^kappa = sum_j kappa_j
(kappa_j - 1) v^kappa``), the correction ``1/|S| - kappa_i / k`` is, on every monomial of
order 3 and 4 (check the classes above; ``(1,1,1)``, ``(2,2)``, ``(1,1,1,1)`` and the
single-feature ``(k)`` need none),

    corr_3 = [E_i R_3 - 3 E_i (E_i - 1)] / 12,     corr_4 = [E_i R_4 - 4 E_i (E_i - 1)] / 24,

applied to ``c_k(v) = D^k f(x)[v^k] / k!`` at ``v = u = -delta`` (both operators are even in
``v``), so that ``Shapley_i = IG_i - sum_{k=3,4} corr_k c_k(u)``. From order 5 on, monomials
``(3, 2)`` and ``(2, 1, 1, 1)`` need the exponents of *pairs* of features; that is refused.

Groups (players are groups ``A``): the same formulas hold with ``E_A = sum_{i in A} E_i`` and
``R_k = sum_B E_B (E_B - 1) c_k``, since both rules only see the group exponents
``kappa_A = sum_{i in A} kappa_i``. ``E_B (E_B - 1) c = E_B (E_B c) - E_B c`` costs two
reverse sweeps through a Taylor-mode pass along ``G`` copies of ``u`` (one per group),
and ``E_A R_k`` a third: O(G) passes in all, exact.
"""
from __future__ import annotations

import torch
from tqdm.auto import tqdm

from .. import _validation as V
from ..groups import resolve_groups
from ..runtime.cost import Cost
from .mode import propagate
from .pair_interactions import autograd_chunk
from .terms import _ig_shares, _prepare, _select, taylor_attribution_cost

__all__ = ["MAX_ORDER", "shapley_attribution", "shapley_attribution_cost"]

#: The highest order of the exact O(n) correction.
MAX_ORDER = 4
_DENOMINATOR = {3: 12, 4: 24}


def _corrections(gm, inputs, u, target, member, order, chunk, bar) -> torch.Tensor:
    """``sum_{k=3..K} [E_A R_k - k E_A (E_A - 1)] c_k(u) / d_k`` per group: ``[B, G]``
    (``bar`` moves once per Taylor-mode pass)."""
    B, n = u.shape
    G = member.shape[0]
    shape = inputs.shape[1:]
    own = torch.zeros(order + 1, B, G, dtype=u.dtype, device=u.device)  # E_A (E_A - 1) c_k(u)
    grad_r = torch.zeros(order + 1, B, n, dtype=u.dtype, device=u.device)  # grad R_k(u)
    for s in range(0, G, chunk):
        masks = member[s:s + chunk]  # [m, n]
        v = u[:, None, :].expand(B, masks.shape[0], n).clone().requires_grad_(True)
        with torch.enable_grad():
            c = _select(propagate(gm, inputs, v.view(B, -1, *shape), order).series, target)
            for k in range(3, order + 1):
                (g,) = torch.autograd.grad(c[k - 1].sum(), v, create_graph=True)
                euler = (g * v * masks).sum(-1)  # E_{B_r} c_k at copy r
                (h,) = torch.autograd.grad(euler.sum(), v, create_graph=True)
                second = (h * v * masks).sum(-1) - euler  # E_B (E_B - 1) c_k, a function of v
                # every copy is u, so the gradients of the copies add up to grad R_k(u)
                (gr,) = torch.autograd.grad(second.sum(), v, retain_graph=k < order)
                own[k, :, s:s + chunk] = second.detach()
                grad_r[k] += gr.sum(1)
        bar.update(1)
    total = torch.zeros(B, G, dtype=u.dtype, device=u.device)
    for k in range(3, order + 1):
        euler_r = (u * grad_r[k]) @ member.T  # E_A R_k
        total += (euler_r - k * own[k]) / _DENOMINATOR[k]
    return total


def _check_order(order) -> int:
    V.check_positive_int(order, "order")
    if order > MAX_ORDER:
        raise ValueError(f"order must be <= {MAX_ORDER} for the exact Shapley rule (its O(n) "
                         f"correction covers monomials of degree 3 and 4), got order={order}")
    return order


def _players(groups, shape, device) -> torch.Tensor | None:
    """Flat player ids of every feature, or None (every feature its own player)."""
    return None if groups is None else resolve_groups(groups, shape).reshape(-1).to(device)


def _correction_passes(order: int, B: int, n: int, G: int, chunk_size) -> tuple[int, int]:
    """``(chunk, passes)`` of the order >= 3 correction: ``chunk`` copies per pass."""
    if order < 3:
        return 0, 0
    chunk = chunk_size or autograd_chunk(order, B, n)
    return chunk, -(-G // chunk)


def shapley_attribution_cost(inputs: torch.Tensor, baselines=0.0, order: int = 2, groups=None,
                             *, chunk_size: int | None = None):
    """The rows :func:`shapley_attribution` runs (a :class:`~taylorattr.runtime.cost.Cost`): one
    forward of the batch (the inputs, which resolve the target), those of
    :func:`taylorattr.taylor_attribution_cost` and, for ``order >= 3``, one order-K
    Taylor-mode row per (sample, player), ``chunk_size`` copies per pass, each swept back
    three times per order ``3..K``. Runs no model."""

    _check_order(order)
    if chunk_size is not None:
        V.check_positive_int(chunk_size, "chunk_size")
    inputs = V.check_inputs(inputs)
    cost = taylor_attribution_cost(inputs, baselines, order, check=False) + \
        Cost(forward_rows=inputs.shape[0])
    B, shape = inputs.shape[0], tuple(inputs.shape[1:])
    n = inputs[0].numel()
    ids = _players(groups, shape, inputs.device)
    G = n if ids is None else int(ids.max()) + 1
    _, passes = _correction_passes(order, B, n, G, chunk_size)
    if passes:
        cost = cost + Cost(taylor_passes=passes, taylor_rows=B * G,
                           taylor_backward_rows=3 * (order - 2) * B * G, order=order)
    return cost.labelled("shapley rule", B)


def shapley_attribution(model, inputs: torch.Tensor, baselines=0.0, target=None,
                        order: int = 2, groups=None, *,
                        chunk_size: int | None = None, show_progress: bool = False
                        ) -> torch.Tensor:
    """Shapley values of the order-K Taylor polynomial's removal game, exactly (K <= 4).

    Args:
        model, inputs, baselines, target: as :func:`taylorattr.taylor_terms`.
        order: 1 <= K <= 4 (K <= 2 is the IG reformulation).
        groups: integer ids ``0..G-1`` broadcastable to one sample: the players are the
            groups, and (as Captum's ``feature_mask``) every feature carries its group's value.
            Default: every feature is a player.
        chunk_size: copies of the direction per Taylor-mode pass (default: automatic).
        show_progress: a tqdm bar (``leave=False``) over the Taylor-mode passes
            (:func:`shapley_attribution_cost` counts them).

    Returns an attribution shaped like ``inputs``; without groups it sums to ``g_K``.
    """
    _check_order(order)
    V.check_bool(show_progress, "show_progress")
    gm, inputs, delta, target, _ = _prepare(model, inputs, baselines, target, order, chunk_size)
    B, n = inputs.shape[0], inputs[0].numel()
    ids = _players(groups, tuple(inputs.shape[1:]), inputs.device)
    G = n if ids is None else int(ids.max()) + 1
    chunk, passes = _correction_passes(order, B, n, G, chunk_size)
    with tqdm(total=1 + passes, desc=f"order-{order} Shapley rule", unit="pass",
              disable=not show_progress, leave=False) as bar:
        ig = _ig_shares(gm, inputs, delta, target, order)[2].reshape(B, -1)
        bar.update(1)
        if ids is None and order <= 2:
            return ig.view_as(inputs)
        if ids is None:
            ids = torch.arange(n, device=inputs.device)
        member = (ids[None, :] == torch.arange(G, device=ids.device)[:, None]).to(inputs.dtype)
        value = ig @ member.T  # IG rule per group
        if order >= 3:
            u = -delta.reshape(B, -1)
            value = value - _corrections(gm, inputs, u, target, member, order, chunk, bar)
    return value[:, ids].view_as(inputs)
