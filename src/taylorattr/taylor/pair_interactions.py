"""Exact pairwise Taylor interactions of feature groups, order by order (docs/design.md, section 2).

With ``delta = x - x~``, ``u = -delta`` and the direction coefficients of the expansion at x,
``c_k(v) = D^k f(x)[v, ..., v] / k!`` (so ``P_k(v) = -c_k(-v)``), the pair interaction of two
disjoint feature groups ``A``, ``B`` at order ``k`` is

    J^k(A, B) = P_k(delta_A + delta_B) - P_k(delta_A) - P_k(delta_B)
              = -[c_k(u_A + u_B) - c_k(u_A) - c_k(u_B)]

and ``J_K = sum_{k<=K} J^k = g_K(delta_A + delta_B) - g_K(delta_A) - g_K(delta_B)``: every
monomial whose support meets both A and B and lies inside ``A u B``. ``J^1 = 0`` (P_1 is
linear). ``own[A] = P_k(delta_A)`` is the order-k part of occluding A alone (Theorem 3).

Two exact routes:

* ``"pairs"`` (any K): ``G`` univariate expansions along ``u_A`` and ``G(G-1)/2`` along
  ``u_A + u_B``, propagated ``chunk_size`` directions per Taylor-mode pass.
* ``"gradient"`` (K <= 3): ``G`` expansions along ``u_A`` and one reverse sweep per order with
  respect to the *direction*, ``Gamma_k(A) = grad_v c_k(v) at v = u_A``. Polarising the
  homogeneous ``c_k``:

      k = 2:  c_2(a + b) - c_2(a) - c_2(b) = D^2 f[a, b]                       = Gamma_2(a) . b
      k = 3:  c_3(a + b) - c_3(a) - c_3(b) = (D^3 f[a, a, b] + D^3 f[a, b, b]) / 2
                                           = Gamma_3(a) . b + Gamma_3(b) . a

  (``grad c_k(v) = D^k f[v^(k-1), .] / (k-1)!``). With ``M_k[A, B] = Gamma_k(A) . delta_B``
  this gives ``J^2 = M_2`` and ``J^3 = M_3 + M_3^T``. From order 4 on, ``c_4(a + b)`` has the
  term ``D^4 f[a, a, b, b]``, which no first derivative at ``a`` or ``b`` holds.

``"auto"`` takes the gradient route for K <= 3. Default groups: square patches (all
channels together) of the smallest side with at most ``max_groups`` (64) patches for
``[C, H, W]`` samples; every feature for other samples with at most ``max_groups``
features; otherwise ``groups`` must be given. ``G > max_groups`` is refused with the cost
(number of expansions); raise ``max_groups`` to opt in to pixel-level pairs.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from tqdm.auto import tqdm

from .. import _validation as V
from ..groups import default_groups, resolve_groups
from ..runtime.cost import Cost
from .mode import propagate
from .terms import _default_chunk, _prepare, _select

__all__ = ["Interactions", "autograd_chunk", "interactions",
           "interactions_cost"]

ROUTES = ("auto", "pairs", "gradient")


@dataclass(frozen=True)
class Interactions:
    """Pair interactions of ``G`` feature groups, per order.

    ``pairs``: ``[B, K, G, G]``, ``pairs[:, k-1, A, B] = J^k(A, B)`` (symmetric, zero
    diagonal, ``pairs[:, 0] = 0``). ``own``: ``[B, K, G]``, ``own[:, k-1, A] = P_k(delta_A)``.
    ``groups``: the group id of every feature, shaped like one sample.
    """

    pairs: torch.Tensor
    own: torch.Tensor
    groups: torch.Tensor

    @property
    def order(self) -> int:
        return self.pairs.shape[1]

    def _order(self, order: int | None) -> int:
        if order is None:
            return self.order
        V.check_positive_int(order, "order")
        if order > self.order:
            raise ValueError(f"order must be <= {self.order} (the order computed), got {order}")
        return order

    def total(self, order: int | None = None) -> torch.Tensor:
        """``J_K(A, B) = sum_{k<=K} J^k(A, B)``, ``[B, G, G]`` (K: default all orders computed)."""
        return self.pairs[:, :self._order(order)].sum(1)

    def own_total(self, order: int | None = None) -> torch.Tensor:
        """``g_K(delta_A)``, ``[B, G]``: the order-K reformulation of occluding each group."""
        return self.own[:, :self._order(order)].sum(1)


def autograd_chunk(order: int, batch: int, n_features: int) -> int:
    """Directions per pass when reverse sweeps go through it: the engine's chunk / 8, since
    the kept graph (and a second or third sweep) costs several times the pass's memory."""
    return max(1, _default_chunk(order, batch, n_features) // 8)


def _cost(G: int, order: int) -> str:
    if order <= 3:
        return f"{G} expansions and {G} reverse sweeps (gradient route)"
    return f"{G + G * (G - 1) // 2:,} order-{order} expansions"


def _directions(u: torch.Tensor, masks: torch.Tensor, sample_shape) -> torch.Tensor:
    """``u`` restricted to each mask: ``[B, n] x [m, n] -> [B, m, *sample_shape]``."""
    return (u[:, None, :] * masks[None]).view(u.shape[0], masks.shape[0], *sample_shape)


def _coefficients(gm, inputs, directions, target, order, bar=None) -> torch.Tensor:
    """``c_k`` of every direction: ``[K, B, m]`` (one Taylor-mode pass; ``bar`` advances)."""
    c = _select(propagate(gm, inputs, directions, order).series, target)
    if bar is not None:
        bar.update(1)
    return c


def _pairs_route(gm, inputs, u, target, member, order, chunk, bar=None):
    B, G = u.shape[0], member.shape[0]
    shape = inputs.shape[1:]
    own_c = torch.cat([_coefficients(gm, inputs, _directions(u, member[s:s + chunk], shape),
                                     target, order, bar) for s in range(0, G, chunk)], dim=2)
    a, b = torch.triu_indices(G, G, offset=1, device=u.device)
    joint = []
    for s in range(0, a.numel(), chunk):
        masks = member[a[s:s + chunk]] | member[b[s:s + chunk]]
        joint.append(_coefficients(gm, inputs, _directions(u, masks, shape), target, order, bar))
    pairs = torch.zeros(order, B, G, G, dtype=u.dtype, device=u.device)
    if a.numel():
        cross = -(torch.cat(joint, dim=2) - own_c[:, :, a] - own_c[:, :, b])  # [K, B, P]
        pairs[:, :, a, b] = cross
        pairs[:, :, b, a] = cross
        pairs[0] = 0.0  # P_1 is linear: only rounding is left there
    return pairs, -own_c


def _gradient_route(gm, inputs, u, target, member, order, chunk, bar=None):
    B, G = u.shape[0], member.shape[0]
    shape = inputs.shape[1:]
    delta_in_group = -u[:, :, None] * member.T[None].to(u.dtype)  # [B, n, G]: delta_i [i in B]
    own_c = torch.zeros(order, B, G, dtype=u.dtype, device=u.device)
    M = {k: torch.zeros(B, G, G, dtype=u.dtype, device=u.device) for k in range(2, order + 1)}
    for s in range(0, G, chunk):
        v = (u[:, None, :] * member[None, s:s + chunk]).requires_grad_(True)
        with torch.enable_grad():
            c = _coefficients(gm, inputs, v.view(B, v.shape[1], *shape), target, order, bar)
            for k in range(2, order + 1):
                (grad,) = torch.autograd.grad(c[k - 1].sum(), v, retain_graph=k < order)
                M[k][:, s:s + chunk] = torch.bmm(grad, delta_in_group)  # Gamma_k(A) . delta_B
        own_c[:, :, s:s + chunk] = c.detach()
    pairs = torch.zeros(order, B, G, G, dtype=u.dtype, device=u.device)
    if order >= 2:
        pairs[1] = M[2]
    if order >= 3:
        pairs[2] = M[3] + M[3].transpose(1, 2)
    eye = torch.eye(G, dtype=torch.bool, device=u.device)
    return pairs.masked_fill(eye, 0.0), -own_c


def interactions(model, inputs: torch.Tensor, baselines=0.0, target=None, groups=None,
                 order: int = 2, *, route: str = "auto", max_groups: int = 64,
                 chunk_size: int | None = None, show_progress: bool = False) -> Interactions:
    """Exact pair interactions ``J^k(A, B)`` of feature groups, k = 1..order.

    Args:
        model: an ``nn.Module`` the Taylor engine supports (:mod:`taylorattr.taylor.mode`).
        inputs: ``[B, ...]`` float32/float64.
        baselines: scalar, tensor broadcastable to ``inputs``, or one baseline per sample.
        target: None (argmax class), an int, or a ``[B]`` tensor.
        groups: integer ids ``0..G-1`` broadcastable to one sample (default: see the module
            docstring: patches for images, features for small flat inputs).
        order: K >= 1.
        route: ``"auto"``, ``"pairs"`` (any K) or ``"gradient"`` (K <= 3).
        max_groups: the largest G accepted (64); G x G pixel-level pairs need it raised.
        chunk_size: directions per Taylor-mode pass (default: automatic).
        show_progress: a tqdm bar over the Taylor-mode passes (:func:`interactions_cost`
            counts them).

    Returns an :class:`Interactions` with ``pairs [B, K, G, G]``, ``own [B, K, G]``.
    """
    V.check_positive_int(max_groups, "max_groups")
    V.check_bool(show_progress, "show_progress")
    if route not in ROUTES:
        raise ValueError(f"route must be one of {ROUTES}, got {route!r}")
    if route == "gradient" and order > 3:
        raise ValueError(f"route='gradient' is exact only for order <= 3, got order={order}; "
                         "use route='pairs' (or 'auto')")
    gm, inputs, delta, target, _ = _prepare(model, inputs, baselines, target, order, chunk_size)
    shape = tuple(inputs.shape[1:])
    ids = default_groups(shape, max_groups) if groups is None else resolve_groups(groups, shape)
    G = int(ids.max()) + 1
    if G > max_groups:
        raise ValueError(f"groups has {G} groups (> max_groups={max_groups}); their pairs cost "
                         f"{_cost(G, order)} per batch. Pass coarser groups, or max_groups={G} to "
                         "compute them anyway")
    ids = ids.reshape(-1).to(inputs.device)
    member = ids[None, :] == torch.arange(G, device=ids.device)[:, None]  # [G, n]
    u = -delta.reshape(delta.shape[0], -1)
    use_gradient = route == "gradient" or (route == "auto" and order <= 3)
    chunk = chunk_size or (autograd_chunk if use_gradient else _default_chunk)(
        order, inputs.shape[0], u.shape[1])
    n_passes = -(-G // chunk) + (0 if use_gradient else -(-(G * (G - 1) // 2) // chunk))
    with tqdm(total=n_passes, desc="interactions", unit="pass", disable=not show_progress,
              leave=False) as bar:
        if use_gradient:
            pairs, own = _gradient_route(gm, inputs, u, target, member, order, chunk, bar)
        else:
            with torch.no_grad():
                pairs, own = _pairs_route(gm, inputs, u, target, member, order, chunk, bar)
    return Interactions(pairs=pairs.permute(1, 0, 2, 3).contiguous(),
                        own=own.permute(1, 0, 2).contiguous(), groups=ids.view(shape).cpu())


def interactions_cost(inputs: torch.Tensor, groups=None, order: int = 2, *, route: str = "auto",
                      max_groups: int = 64, chunk_size: int | None = None):
    """The rows :func:`interactions` runs (a :class:`~taylorattr.runtime.cost.Cost`), from its
    plan: one forward of the batch (the inputs, which resolve the target); the gradient route one order-``K`` Taylor-mode row per
    (sample, group), each swept backward ``K - 1`` times; the pairs route one row per
    (sample, group) and one per (sample, pair). Runs no model."""

    V.check_positive_int(order, "order")
    if route not in ROUTES:
        raise ValueError(f"route must be one of {ROUTES}, got {route!r}")
    inputs = V.check_inputs(inputs)
    shape, B = tuple(inputs.shape[1:]), inputs.shape[0]
    ids = default_groups(shape, max_groups) if groups is None else resolve_groups(groups, shape)
    G = int(ids.max()) + 1
    use_gradient = route == "gradient" or (route == "auto" and order <= 3)
    n = math.prod(shape)
    chunk = V.check_positive_int(chunk_size, "chunk_size") if chunk_size is not None else \
        (autograd_chunk if use_gradient else _default_chunk)(order, B, n)
    base = Cost(label="interactions", samples=B, forward_rows=B, order=order)
    if use_gradient:
        return base + Cost(taylor_passes=-(-G // chunk), taylor_rows=B * G,
                           taylor_backward_rows=B * G * (order - 1), order=order)
    pairs = G * (G - 1) // 2
    return base + Cost(taylor_passes=-(-G // chunk) + -(-pairs // chunk),
                       taylor_rows=B * (G + pairs), order=order)
