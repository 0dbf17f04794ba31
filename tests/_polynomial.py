"""Independent routes for the interaction, Integrated-Hessians and Shapley tests.

* closed-form monomials of a one-hidden-layer polynomial network (no Taylor engine):
  ``f(z) = sum_h w_h p(W_h . z + b_h)``, so at a point ``y`` and displacement ``w``,
  ``a_kappa(y) w^kappa = sum_h w_h p^(m)(W_h . y + b_h) W_h^kappa / kappa! w^kappa``;
* the order-K polynomial's removal game ``v(T) = sum_{k<=K} P_k(delta_T)`` by repeated float64
  autograd in ``t`` of ``f(x - t delta_T)`` (one scalar ``t`` per coalition);
* Shapley values by enumerating all ``2^n`` coalitions.
"""
import itertools
import math

import torch
from _builders import DT
from torch import nn

from taylorattr.models import PolyActivation


def poly_net(n: int, coeffs, hidden: int = 5, seed: int = 0) -> nn.Sequential:
    """``Linear(n, hidden), PolyActivation(coeffs), Linear(hidden, 1), Flatten(0)`` in float64."""
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(n, hidden), PolyActivation(coeffs), nn.Linear(hidden, 1),
                         nn.Flatten(0)).to(DT).eval()


def exponents(n: int, degree: int):
    """All multi-indices ``kappa`` with ``1 <= |kappa| <= degree``."""
    for k in range(1, degree + 1):
        for combo in itertools.combinations_with_replacement(range(n), k):
            yield tuple(combo.count(j) for j in range(n))


def monomials(net: nn.Sequential, point: torch.Tensor, w: torch.Tensor) -> dict:
    """``{kappa: a_kappa(point) * w^kappa}`` for one sample (``point``, ``w`` of shape [n])."""
    lin, act, out = net[0], net[1], net[2]
    pre = lin.weight @ point + lin.bias
    W = lin.weight
    terms = {}
    for kappa in exponents(point.numel(), act.degree):
        m = sum(kappa)
        deriv = act.derivative_coeffs(m)
        p_m = sum(c * pre**j for j, c in enumerate(deriv))  # p^(m) at every hidden unit
        W_kappa = torch.prod(W ** torch.tensor(kappa, dtype=DT), dim=1)
        fact = math.prod(math.factorial(e) for e in kappa)
        coeff = (out.weight[0] * p_m * W_kappa).sum() / fact
        terms[kappa] = coeff * torch.prod(w ** torch.tensor(kappa, dtype=DT))
    return terms


def terms_at_x(net, x: torch.Tensor, baseline: torch.Tensor) -> dict:
    """``phi(kappa) = (-1)^(k+1) d^kappa f(x) / kappa! delta^kappa``: monomial drop, expanded at x."""
    return {k: -v for k, v in monomials(net, x, baseline - x).items()}


def subset_masks(n: int) -> torch.Tensor:
    """``[2^n, n]`` float64 membership of every coalition (bit j of the index = player j)."""
    return torch.tensor([[(T >> j) & 1 for j in range(n)] for T in range(2**n)], dtype=DT)


def polynomial_game(model, x: torch.Tensor, directions: torch.Tensor, order: int) -> torch.Tensor:
    """``sum_{k<=order} P_k`` along every row of ``directions`` (``[M, n]``) at one sample ``x``,
    ``P_k = -h^(k)(0)/k!`` for ``h(t) = f(x - t d)``, by nested autograd in ``t``."""
    t = torch.zeros(directions.shape[0], dtype=DT, requires_grad=True)
    t_rows = t.view(-1, *[1] * x.dim())
    cur = model(x[None] - t_rows * directions.reshape(directions.shape[0], *x.shape))
    total = torch.zeros(directions.shape[0], dtype=DT)
    for k in range(1, order + 1):
        (cur,) = torch.autograd.grad(cur.sum(), t, create_graph=True)
        total = total - cur.detach() / math.factorial(k)
    return total


def shapley_by_enumeration(values: torch.Tensor, n: int) -> torch.Tensor:
    """Shapley values of the game ``values[T]`` (``T`` a bit mask over ``n`` players)."""
    phi = torch.zeros(n, dtype=DT)
    for i in range(n):
        for T in range(2**n):
            if (T >> i) & 1:
                continue
            t = T.bit_count()
            weight = math.factorial(t) * math.factorial(n - t - 1) / math.factorial(n)
            phi[i] += weight * (values[T | (1 << i)] - values[T])
    return phi
