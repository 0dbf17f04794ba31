"""Arithmetic on truncated univariate Taylor series (Taylor mode, as in ``jax.experimental.jet``).

A series is a list ``[x_0, x_1, ..., x_K]`` of tensors standing for

    x(t) = sum_{k=0..K} x_k t^k  (mod t^(K+1)).

The coefficients only need to broadcast against each other (the engine keeps ``x_0``
as ``[B, 1, ...]`` and ``x_k`` as ``[B, m, ...]`` for ``m`` directions). Every rule is
an exact recurrence, so one order costs O(K) tensor products instead of the nested
derivatives of repeated ``jvp``:

* product (Cauchy):  (ab)_k = sum_{j=0..k} a_j b_{k-j}
* quotient:          z_k = (a_k - sum_{j=1..k} b_j z_{k-j}) / b_0
* y = phi(x) with phi'(x) = g(x):  y_k = (1/k) sum_{j=1..k} j x_j g_{k-j}
  (exp: g = y;  sigmoid: g = y - y^2;  tanh: g = 1 - y^2;  softplus: g = sigmoid(x);
  log: g = 1/x)
* real power:        y_k = 1/(k x_0) sum_{j=1..k} (p j - (k - j)) x_j y_{k-j}
* erf (g = 2/sqrt(pi) exp(-x^2)) and the normal CDF Phi (g = exp(-x^2/2)/sqrt(2 pi)), so
  GELU = x Phi(x) and its tanh approximation 0.5 x (1 + tanh(sqrt(2/pi)(x + 0.044715 x^3)))
  are Cauchy products of exact series
"""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch

Series = list  # list[torch.Tensor], coefficient k at index k


def _weighted_products(terms, start: torch.Tensor | None = None) -> torch.Tensor:
    """``start + sum_i w_i a_i b_i`` for ``terms = [(a_i, b_i, w_i), ...]`` by fused
    multiply-adds (``torch.addcmul``), so no pass is spent on ``0 + t``, ``1 * t`` or ``t / 1``."""
    if start is None:
        (a, b, w), *terms = terms
        start = a * b if w == 1 else torch.mul(a, b) * w
    acc = start
    for a, b, w in terms:
        acc = torch.addcmul(acc, a, b, value=w)
    return acc


def mul(a: Sequence[torch.Tensor], b: Sequence[torch.Tensor], op=torch.mul) -> Series:
    """Cauchy product ``(ab)_k = sum_j op(a_j, b_{k-j})``; ``op`` may be ``torch.matmul``."""
    if op is torch.mul:
        return [_weighted_products([(a[j], b[k - j], 1) for j in range(k + 1)])
                for k in range(len(a))]
    return [sum(op(a[j], b[k - j]) for j in range(k + 1)) for k in range(len(a))]


def div(a: Sequence[torch.Tensor], b: Sequence[torch.Tensor]) -> Series:
    """Quotient ``a / b`` by ``z_k = (a_k - sum_{j=1..k} b_j z_{k-j}) / b_0``."""
    z: Series = []
    for k in range(len(a)):
        acc = _weighted_products([(b[j], z[k - j], -1) for j in range(1, k + 1)], start=a[k])
        z.append(acc / b[0])
    return z


def compose(x: Sequence[torch.Tensor], y0: torch.Tensor,
            slope: Callable[[int, Series], torch.Tensor]) -> Series:
    """Series of ``y = phi(x)`` from ``y_0 = phi(x_0)`` and the series ``g`` of ``phi'(x)``.

    ``slope(m, y)`` returns ``g_m`` given ``y_0..y_m``; then
    ``y_k = (1/k) sum_{j=1..k} j x_j g_{k-j}``.
    """
    y: Series = [y0]
    g: Series = []
    for k in range(1, len(x)):
        g.append(slope(k - 1, y))
        y.append(_weighted_products([(x[j], g[k - j], j / k) for j in range(k, 0, -1)]))
    return y


def _self_product_terms(y: Series, m: int, scale: float) -> list:
    """``scale * sum_{i=0..m} y_i y_{m-i}`` as weighted terms, each symmetric pair once."""
    terms = [(y[i], y[m - i], 2 * scale) for i in range((m + 1) // 2)]
    if m % 2 == 0:
        terms.append((y[m // 2], y[m // 2], scale))
    return terms


def exp(x: Sequence[torch.Tensor]) -> Series:
    """``exp(x)``: phi' = phi."""
    return compose(x, torch.exp(x[0]), lambda m, y: y[m])


def sigmoid(x: Sequence[torch.Tensor]) -> Series:
    """``sigmoid(x)``: phi' = phi - phi^2."""
    return compose(x, torch.sigmoid(x[0]), lambda m, y: _weighted_products(
        _self_product_terms(y, m, -1.0), start=y[m]))


def tanh(x: Sequence[torch.Tensor]) -> Series:
    """``tanh(x)``: phi' = 1 - phi^2."""
    def slope(m, y):
        minus_square = _weighted_products(_self_product_terms(y, m, -1.0))
        return 1.0 + minus_square if m == 0 else minus_square
    return compose(x, torch.tanh(x[0]), slope)


def softplus(x: Sequence[torch.Tensor], beta: float = 1.0, threshold: float = 20.0) -> Series:
    """``softplus(x) = log(1 + exp(beta x)) / beta``: phi' = sigmoid(beta x).

    Where ``beta * x_0 > threshold`` PyTorch returns ``x`` itself, and so do we.
    """
    bx = [beta * c for c in x]
    s = sigmoid(bx)
    y = compose(x, torch.nn.functional.softplus(x[0], beta, threshold), lambda m, _: s[m])
    linear = beta * x[0] > threshold
    if not bool(linear.any()):
        return y
    return [torch.where(linear, xk, yk) for xk, yk in zip(x, y)]


def _gaussian_slope(x: Sequence[torch.Tensor], a: float, scale: float) -> Series:
    """Series of ``scale * exp(-a x^2)``, the slope of erf (a=1) and of Phi (a=1/2)."""
    e = exp([-a * c for c in mul(x, x)])
    return [scale * c for c in e]


def erf(x: Sequence[torch.Tensor]) -> Series:
    """``erf(x)``: phi' = 2/sqrt(pi) exp(-x^2)."""
    g = _gaussian_slope(x, 1.0, 2.0 / math.sqrt(math.pi))
    return compose(x, torch.erf(x[0]), lambda m, _: g[m])


def normal_cdf(x: Sequence[torch.Tensor]) -> Series:
    """``Phi(x) = (1 + erf(x / sqrt 2)) / 2``: phi' = exp(-x^2/2) / sqrt(2 pi)."""
    g = _gaussian_slope(x, 0.5, 1.0 / math.sqrt(2.0 * math.pi))
    return compose(x, 0.5 * (1.0 + torch.erf(x[0] * math.sqrt(0.5))), lambda m, _: g[m])


def gelu(x: Sequence[torch.Tensor], approximate: str = "none") -> Series:
    """``GELU(x) = x Phi(x)``, or with ``approximate="tanh"``
    ``0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))`` (PyTorch's two forms)."""
    if approximate == "none":
        return mul(x, normal_cdf(x))
    if approximate != "tanh":
        raise ValueError(f"approximate must be 'none' or 'tanh', got {approximate!r}")
    c = math.sqrt(2.0 / math.pi)
    half_one_plus = [0.5 + 0.5 * t if k == 0 else 0.5 * t
                     for k, t in enumerate(tanh(polynomial(x, [0.0, c, 0.0, 0.044715 * c])))]
    return mul(x, half_one_plus)


def log(x: Sequence[torch.Tensor]) -> Series:
    """``log(x)``: phi' = 1/x."""
    one = [torch.ones_like(x[0])] + [torch.zeros_like(c) for c in x[1:]]
    inv = div(one, x)
    return compose(x, torch.log(x[0]), lambda m, _: inv[m])


def power(x: Sequence[torch.Tensor], p: float) -> Series:
    """``x ** p``: repeated products for integer ``p >= 0`` (exact at ``x_0 = 0``), else
    ``y_k = 1/(k x_0) sum_{j=1..k} (p j - (k - j)) x_j y_{k-j}``."""
    if float(p).is_integer() and p >= 0:
        result: Series = [torch.ones_like(x[0])] + [torch.zeros_like(c) for c in x[1:]]
        base, n = list(x), int(p)
        while n:
            if n & 1:
                result = mul(result, base)
            n >>= 1
            if n:
                base = mul(base, base)
        return result
    y: Series = [torch.pow(x[0], p)]
    for k in range(1, len(x)):
        acc = _weighted_products([(x[j], y[k - j], p * j - (k - j)) for j in range(k, 0, -1)])
        y.append(acc / (k * x[0]))
    return y


def polynomial(x: Sequence[torch.Tensor], coeffs: Sequence[float]) -> Series:
    """``sum_k coeffs[k] x^k`` by Horner's rule on series."""
    result: Series = [torch.full_like(x[0], float(coeffs[-1]))] + [torch.zeros_like(c) for c in x[1:]]
    for c in reversed(coeffs[:-1]):
        result = mul(result, x)
        result[0] = result[0] + float(c)
    return result


def masked(x: Sequence[torch.Tensor], keep: torch.Tensor, y0: torch.Tensor) -> Series:
    """Piecewise-linear functions (ReLU, ReLU6): ``y_k = x_k * keep`` for ``k >= 1``.

    Exact wherever ``x_0`` is not on a kink; higher derivatives there are zero.
    """
    keep = keep.to(x[0].dtype)
    return [y0] + [c * keep for c in x[1:]]
