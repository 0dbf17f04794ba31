"""Integrated Hessians (Janizek et al., JMLR 2021) of the order-K Taylor polynomial, in closed form.

This is the *polynomial's* Integrated Hessians, not the network's: it approaches the
network's value as K grows (not monotonically; on an MLP the relative gap was 22%, 26%, 16%,
3.9%, 10%, 3.8% at K = 1, 2, 3, 4, 6, 8). The network's own Integrated Hessians, by
Gauss-Legendre quadrature of the path integrals, is
:func:`taylorattr.methods.integrated_hessians.network_integrated_hessians`
(``ta.network_integrated_hessians``). ``integrated_hessians`` is the historical name of
:func:`polynomial_integrated_hessians`, kept as an alias.

Janizek et al. explain the Integrated Gradients ``phi_i`` of ``f`` by Integrated Gradients
again, on the same straight path from ``x~`` to ``x`` (``delta = x - x~``):

    Gamma_ij = delta_i delta_j  int_0^1 int_0^1 a b  d_i d_j f(x~ + a b delta) da db
               + [i = j] delta_i int_0^1 int_0^1 d_i f(x~ + a b delta) da db,

and ``sum_j Gamma_ij = phi_i`` (completeness). Here ``f`` is replaced by its order-K Taylor
polynomial at x, ``T_K(x + w) = f(x) + sum_{k<=K} c_k(w)`` with ``c_k(v) = D^k f(x)[v^k] / k!``.
On the path, ``x~ + g delta = x + (1 - g) u`` with ``u = -delta``, and ``c_k`` is homogeneous,
so ``d_i d_j T_K = sum_k (1 - g)^(k-2) d_i d_j c_k(u)`` and ``d_i T_K = sum_k (1 - g)^(k-1)
d_i c_k(u)``. The double integrals are Beta-digamma integrals (the product ``g = a b`` of two
uniforms has density ``-log g``):

    I_k = int int a b (1 - a b)^(k-2) = (H_k - 1) / (k (k - 1)),
    J_k = int int (1 - a b)^(k-1)     = H_k / k,          H_k = 1 + 1/2 + ... + 1/k,

hence, exactly,

    Gamma_ij = delta_i delta_j [Hess psi_I(u)]_ij + [i = j] delta_i [grad psi_J(u)]_i,
    psi_I = sum_{k=2..K} I_k c_k,   psi_J = sum_{k=1..K} J_k c_k      (derivatives in v).

Since ``J_k - (k - 1) I_k = 1/k``, the rows sum to the order-K IG reformulation (each monomial
shared in proportion ``kappa_i / k``). Per monomial ``phi(kappa)`` of the expansion at x the
weights are ``-kappa_i kappa_j I_k`` off the diagonal and ``kappa_i J_k - kappa_i (kappa_i - 1)
I_k`` on it (docs/weights.md); at the baseline they would be ``kappa_i kappa_j / k^2``.

How: one Taylor-mode pass along ``G`` copies of ``u`` (one per group, ``chunk_size`` per pass),
a reverse sweep with the graph kept, and one more giving the Hessian-vector products
``Hess psi_I(u) delta_B`` for every group ``B`` at once. Groups: ``Gamma_AB = sum_{i in A, j in B}
Gamma_ij``; without groups every feature is its own group (``[B, n, n]``, n products).
"""
from __future__ import annotations

from fractions import Fraction

import torch
from tqdm.auto import tqdm

from .. import _validation as V
from ..groups import resolve_groups
from .mode import propagate
from .pair_interactions import autograd_chunk
from .terms import _prepare, _select

__all__ = ["integrated_hessians", "path_weights", "polynomial_integrated_hessians"]


def path_weights(order: int) -> tuple[dict[int, float], dict[int, float]]:
    """``({k: I_k}, {k: J_k})``: the double-path-integral weights of ``c_k``, exact fractions."""
    harmonic = Fraction(0)
    hess, grad = {}, {}
    for k in range(1, order + 1):
        harmonic += Fraction(1, k)
        grad[k] = float(harmonic / k)
        if k >= 2:
            hess[k] = float((harmonic - 1) / (k * (k - 1)))
    return hess, grad


def polynomial_integrated_hessians(model, inputs: torch.Tensor, baselines=0.0, target=None,
                                   order: int = 2, groups=None, *,
                                   chunk_size: int | None = None,
                                   show_progress: bool = False) -> torch.Tensor:
    """Integrated Hessians of the order-K Taylor polynomial at ``inputs``, in closed form.

    Args:
        model, inputs, baselines, target: as :func:`taylorattr.taylor_terms`.
        order: K >= 1 (K = 1 gives the diagonal matrix of Gradient*Input w.r.t. the baseline).
        groups: integer ids ``0..G-1`` broadcastable to one sample: returns ``[B, G, G]`` with
            ``Gamma_AB`` summed over the features of A and B. Default: ``[B, n, n]``.
        chunk_size: copies of the direction per Taylor-mode pass (default: automatic).
        show_progress: a tqdm bar (``leave=False``) over the Taylor-mode passes
            (``ceil(G / chunk_size)``; one at order 1).

    Returns ``Gamma`` with ``Gamma.sum(-1)`` equal to the order-K IG reformulation (grouped).
    """
    V.check_bool(show_progress, "show_progress")
    gm, inputs, delta, target, _ = _prepare(model, inputs, baselines, target, order, chunk_size)
    shape = tuple(inputs.shape[1:])
    B = inputs.shape[0]
    flat_delta = delta.reshape(B, -1)
    n = flat_delta.shape[1]
    ids = torch.arange(n, device=inputs.device) if groups is None else resolve_groups(groups, shape).reshape(-1)
    ids = ids.to(inputs.device)
    G = int(ids.max()) + 1
    member = (ids[None, :] == torch.arange(G, device=ids.device)[:, None]).to(inputs.dtype)
    hess_w, grad_w = path_weights(order)
    chunk = chunk_size or autograd_chunk(order, B, n)
    gamma = torch.zeros(B, G, G, dtype=inputs.dtype, device=inputs.device)
    grad_psi_j = None
    starts = range(0, G, chunk) if order > 1 else range(1)  # order 1: the gradient alone
    with tqdm(total=len(starts), desc=f"order-{order} Integrated Hessians", unit="pass",
              disable=not show_progress, leave=False) as bar:
        for s in starts:
            masks = member[s:s + chunk]  # [m, n]
            v = (-flat_delta)[:, None, :].expand(B, masks.shape[0], n).clone().requires_grad_(True)
            with torch.enable_grad():
                c = _select(propagate(gm, inputs, v.view(B, -1, *shape), order).series, target)
                if grad_psi_j is None:
                    psi_j = sum(w * c[k - 1] for k, w in grad_w.items())
                    (g,) = torch.autograd.grad(psi_j.sum(), v, retain_graph=order > 1)
                    grad_psi_j = g[:, 0].detach()  # every copy is u
                if order > 1:
                    psi_i = sum(w * c[k - 1] for k, w in hess_w.items())
                    (g,) = torch.autograd.grad(psi_i.sum(), v, create_graph=True)
                    (hvp,) = torch.autograd.grad((g * flat_delta[:, None, :] * masks).sum(), v)
                    # Gamma[A, B_r] = sum_{i in A} delta_i (Hess psi_I delta_{B_r})_i
                    gamma[:, :, s:s + chunk] = ((flat_delta[:, None, :] * hvp.detach())
                                                @ member.T).transpose(1, 2)
            bar.update(1)
    diagonal = (flat_delta * grad_psi_j) @ member.T  # [B, G]
    return gamma + torch.diag_embed(diagonal)


#: The historical name: the Integrated Hessians of the order-K *polynomial*
#: (:func:`polynomial_integrated_hessians`); the network's own is
#: :func:`taylorattr.methods.integrated_hessians.network_integrated_hessians`.
integrated_hessians = polynomial_integrated_hessians
