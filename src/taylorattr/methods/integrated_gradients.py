"""Integrated Gradients (Sundararajan et al. 2017).

    a_i = (x_i - x~_i) * int_0^1 d_i f(x~ + alpha (x - x~)) d alpha
        ~ (x_i - x~_i) * sum_k w_k d_i f(x~ + alpha_k (x - x~))

The default quadrature is Gauss-Legendre with ``n_steps`` nodes, exact when the
integrand is a polynomial in ``alpha`` of degree ``<= 2 n_steps - 1`` (e.g. any network
with polynomial activations of low enough total degree), and far more accurate than a
Riemann sum of the same cost on smooth networks. Riemann rules (left, right, middle,
trapezoid) are options, with Captum's nodes and weights, except that the trapezoid
weights here are the rule's own ``1/(n-1)`` (ends halved), summing to 1: Captum uses
``1/n``, so its trapezoid attributions are ours times ``(n-1)/n``.

``multiply_by_inputs=False`` returns the path-averaged gradient without the factor
``x_i - x~_i`` (Captum's option).

Cost: ``n_steps * B`` forward+backward rows, run in chunks of ``internal_batch_size``
rows (default: grown by measured throughput, :mod:`taylorattr.runtime.batching`).

Precision: the quadrature sum ``sum_k w_k grad_k`` is accumulated in float32 for float16
and bfloat16 inputs (``_validation.accumulation_dtype``: a half-precision running sum of
``n_steps`` terms would lose ``log2(n_steps)`` of its 8 or 11 bits), and the result is
returned in the inputs' dtype.
"""
from __future__ import annotations

import numpy as np
import torch

from .._validation import accumulation_dtype, check_bool, check_positive_int
from ._base import AttributionMethod
from ._passes import (
    check_optional_positive_int,
    default_chunk_rows,
    gradient_pass_cost,
    grid_blocks,
    target_gradient,
)

__all__ = ["QUADRATURE_METHODS", "IntegratedGradients", "quadrature"]

QUADRATURE_METHODS = ("gausslegendre", "riemann_left", "riemann_right", "riemann_middle",
                      "riemann_trapezoid")


def quadrature(method: str, n_steps: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Nodes ``alpha_k`` in [0, 1] and weights ``w_k`` (float64) of a rule on [0, 1]."""
    if not isinstance(method, str):
        raise TypeError(f"method must be a str, got {type(method).__name__}")
    if method not in QUADRATURE_METHODS:
        raise ValueError(f"method must be one of {QUADRATURE_METHODS}, got {method!r}")
    n = check_positive_int(n_steps, "n_steps")
    if method == "gausslegendre":
        nodes, weights = np.polynomial.legendre.leggauss(n)
        return (torch.from_numpy(0.5 * (nodes + 1.0)), torch.from_numpy(0.5 * weights))
    if method == "riemann_trapezoid" and n < 2:
        raise ValueError(f"n_steps must be >= 2 for method='riemann_trapezoid', got {n}")
    k = torch.arange(n, dtype=torch.float64, device="cpu")
    w = torch.full((n,), 1.0 / n, dtype=torch.float64, device="cpu")
    if method == "riemann_left":
        a = k / n
    elif method == "riemann_right":
        a = (k + 1) / n
    elif method == "riemann_middle":
        a = (k + 0.5) / n
    else:  # the trapezoid rule on n equally spaced nodes 0, 1/(n-1), ..., 1
        a = k / (n - 1)
        w = torch.full((n,), 1.0 / (n - 1), dtype=torch.float64, device="cpu")
        w[0] = w[-1] = 0.5 / (n - 1)
    return a, w


class IntegratedGradients(AttributionMethod):
    """Integrated Gradients along the straight path from ``baselines`` to ``inputs``.

    Equals Captum's ``IntegratedGradients`` with the same ``method`` and ``n_steps``.
    """

    name = "integrated_gradients"

    def _attribute(self, call, x, base, t, fx, *, n_steps: int = 50, method: str = "gausslegendre",
                   internal_batch_size: int | None = None, multiply_by_inputs: bool = True,
                   show_progress: bool = False):
        """Options: ``n_steps`` quadrature nodes (gradient evaluations per sample);
        ``method`` ``"gausslegendre"`` or ``"riemann_left|right|middle|trapezoid"``;
        ``internal_batch_size`` rows per forward+backward call (default automatic);
        ``multiply_by_inputs=False``: the path-averaged gradient ``int_0^1 d_i f d alpha``
        without the factor ``x_i - x~_i`` (Captum's option; not a share of
        ``f(x) - f(x~)``)."""
        check_bool(multiply_by_inputs, "multiply_by_inputs")
        chunk = check_optional_positive_int(internal_batch_size, "internal_batch_size")
        alphas, weights = quadrature(method, n_steps)
        diff = x - base
        acc = accumulation_dtype(x.dtype)  # float32 for half-precision inputs
        alphas = alphas.to(x.device, x.dtype)
        weights = weights.to(x.device, acc)
        batch = x.shape[0]
        chunk = chunk or default_chunk_rows(x, backward=True, model=call.model)

        total = torch.zeros_like(x, dtype=acc)
        for k0, k1, s0, s1 in grid_blocks(n_steps, batch, chunk, show_progress,
                                          "integrated gradients"):
            # rows (step k, sample s), step-major as in Captum
            a = alphas[k0:k1].view((-1, 1) + (1,) * (x.dim() - 1))
            rows = torch.addcmul(base[None, s0:s1], a, diff[None, s0:s1])
            rows = rows.reshape((-1,) + tuple(x.shape[1:]))
            tr = None if t is None else t[s0:s1].repeat(k1 - k0)
            grad, _ = target_gradient(call.model, rows, tr)
            grad = grad.reshape(k1 - k0, s1 - s0, -1)
            # total[s] += sum_k w_k grad[k, s]
            total[s0:s1] += torch.einsum("k,kbf->bf", weights[k0:k1], grad.to(acc)).view_as(
                total[s0:s1])
        out = diff.to(acc) * total if multiply_by_inputs else total
        return out.to(x.dtype), base.unsqueeze(1)

    def _cost(self, x, options):
        """``n_steps`` gradient rows per sample; one reference."""
        n_steps = check_positive_int(options.get("n_steps", 50), "n_steps")
        return gradient_pass_cost(n_steps * x.shape[0]), 1
