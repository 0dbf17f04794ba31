r"""Integrated Hessians of the network itself (Janizek et al., JMLR 2021), by quadrature.

On the straight path from ``x~`` to ``x`` (``delta = x - x~``), Integrated Gradients applied to
Integrated Gradients gives the pair matrix

    Gamma_ij = delta_i delta_j  int_0^1 int_0^1 a b  d_i d_j f(x~ + a b delta) da db
               + [i = j] delta_i int_0^1 int_0^1 d_i f(x~ + a b delta) da db,

with ``sum_j Gamma_ij = IG_i`` (completeness). Both double integrals are computed by the
``n_steps``-point Gauss-Legendre rule in *each* path parameter (the integrands are smooth in
``(a, b)``, so the product rule converges exponentially for analytic networks); ``a_k b_l =
a_l b_k``, so the ``n^2`` nodes fall on ``n (n + 1) / 2`` distinct path points. At every point,
one forward, a reverse sweep with the graph kept (the gradient) and one more giving the
Hessian-vector products ``H delta_B`` for every group ``B`` of features at once (a row per
(sample, point, group)), run in chunks of ``internal_batch_size`` rows like IG.

Groups: ``Gamma_AB = sum_{i in A, j in B} Gamma_ij`` (``groups``: integer ids ``0..G-1``
broadcastable to one sample; default every feature its own group).

Error estimate (``return_error=True``): ``|Gamma(n) - Gamma(ceil(n/2))|`` element-wise, the
difference from the rule with half the nodes (for an exponentially converging rule an upper
bound of the finer rule's error; it costs the coarse rule's ``m (m + 1) / 2`` extra points).

:func:`taylorattr.taylor.path_hessians.polynomial_integrated_hessians` is the closed form of
the same definition for the order-K Taylor polynomial of ``f`` at ``x`` (``ta.integrated_hessians``
is its alias); this module is the network's own value, which the polynomial approaches as K grows.
"""
from __future__ import annotations

import math

import torch

from .. import _validation as V
from ..groups import resolve_groups
from ._passes import chunk_ranges, default_chunk_rows
from .integrated_gradients import quadrature

__all__ = ["network_integrated_hessians", "path_points"]


def path_points(n_steps: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(g, w_hess, w_grad)``: the distinct path points ``g = a_k b_l`` of the product
    Gauss-Legendre rule with their weights for the Hessian term (``w_k w_l a_k b_l``, summed
    over the nodes meeting at ``g``) and for the gradient term (``w_k w_l``), float64."""
    a, w = quadrature("gausslegendre", n_steps)
    k, l = torch.triu_indices(n_steps, n_steps, device="cpu")
    twice = torch.where(k == l, 1.0, 2.0).to(torch.float64)
    g = a[k] * a[l]
    w_grad = twice * w[k] * w[l]
    return g, w_grad * g, w_grad


def _gamma(model, x, delta, target, member, n_steps, chunk, show_progress):
    """``Gamma [B, G, G]`` by the ``n_steps`` product rule."""
    B, n = x.shape[0], delta[0].numel()
    G = member.shape[0]
    g, w_hess, w_grad = (t.to(x.device, x.dtype) for t in path_points(n_steps))
    P = g.shape[0]
    flat = delta.reshape(B, n)
    hess = torch.zeros(B, G, G, dtype=x.dtype, device=x.device)
    grad_sum = torch.zeros(B, n, dtype=x.dtype, device=x.device)
    total = B * P * G  # rows (sample, point, group), group fastest
    base = x - delta
    for r0, r1 in chunk_ranges(total, chunk, show_progress, "network Integrated Hessians"):
        r = torch.arange(r0, r1, device=x.device)
        s, p, j = r // (P * G), (r // G) % P, r % G
        rows = (base[s].reshape(-1, n) + g[p, None] * flat[s]).requires_grad_(True)
        with torch.enable_grad():
            out = model(rows.view((-1,) + tuple(x.shape[1:])))
            f = V.select_output(out, None if target is None else target[s])
            (grad,) = torch.autograd.grad(f.sum(), rows, create_graph=True)
            direction = flat[s] * member[j]  # delta restricted to group j
            (hvp,) = torch.autograd.grad((grad * direction).sum(), rows)
        first = j == 0  # one gradient per (sample, point)
        grad_sum.index_add_(0, s[first], w_grad[p[first], None] * grad.detach()[first])
        # Gamma_hess[s, A, j] += w_hess * sum_{i in A} delta_i (H delta_j)_i
        contrib = w_hess[p, None] * (flat[s] * hvp) @ member.T  # [rows, G]
        _accumulate(hess, s, j, contrib)
    diagonal = (flat * grad_sum) @ member.T  # [B, G]
    return hess + torch.diag_embed(diagonal)


def _accumulate(hess: torch.Tensor, s: torch.Tensor, j: torch.Tensor, contrib: torch.Tensor):
    """``hess[s_r, :, j_r] += contrib[r]`` for every row ``r``."""
    B, G, _ = hess.shape
    flat = hess.permute(0, 2, 1).reshape(B * G, G)  # [(sample, column j), A]
    flat.index_add_(0, s * G + j, contrib)
    hess.copy_(flat.view(B, G, G).permute(0, 2, 1))


def network_integrated_hessians(model, inputs: torch.Tensor, baselines=0.0, target=None,
                                groups=None, *, n_steps: int = 16,
                                internal_batch_size: int | None = None,
                                return_error: bool = False, show_progress: bool = False):
    """Integrated Hessians of ``model`` itself, by Gauss-Legendre quadrature (module docstring).

    Args:
        model, inputs, baselines, target: as :func:`taylorattr.taylor_terms` (one tensor
            ``[B, ...]``; ``target`` None is the argmax class).
        groups: integer ids ``0..G-1`` broadcastable to one sample: ``[B, G, G]`` with
            ``Gamma_AB`` summed over the features of A and B. Default: ``[B, n, n]``.
        n_steps: Gauss-Legendre nodes per path parameter (``n (n + 1) / 2`` path points).
        internal_batch_size: rows (sample, point, group) per model call (default automatic).
        return_error: also return the quadrature error estimate (``[B, G, G]``).
        show_progress: a tqdm bar over the chunks.

    Returns ``Gamma`` (``Gamma.sum(-1)`` is Integrated Gradients with the same product rule,
    grouped), or ``(Gamma, error)``.
    """
    V.check_model(model)
    V.check_bool(return_error, "return_error")
    V.check_bool(show_progress, "show_progress")
    n_steps = V.check_positive_int(n_steps, "n_steps")
    if internal_batch_size is not None:
        V.check_positive_int(internal_batch_size, "internal_batch_size")
    x = V.check_inputs(inputs).detach()
    base = V.broadcast_baselines(baselines, x).detach()
    with torch.no_grad():
        t = V.resolve_target(target, V.model_output(model, x))
    shape = tuple(x.shape[1:])
    n = math.prod(shape)
    ids = torch.arange(n, device=x.device) if groups is None else resolve_groups(groups, shape).reshape(-1)
    ids = ids.to(x.device)
    G = int(ids.max()) + 1
    member = (ids[None, :] == torch.arange(G, device=x.device)[:, None]).to(x.dtype)
    chunk = internal_batch_size or default_chunk_rows(x, backward=True, model=model)
    gamma = _gamma(model, x, x - base, t, member, n_steps, chunk, show_progress)
    if not return_error:
        return gamma
    coarse = _gamma(model, x, x - base, t, member, max(1, math.ceil(n_steps / 2)), chunk,
                    show_progress)
    return gamma, (gamma - coarse).abs()
