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
rows (default: grown by measured throughput, :mod:`taylorattr.runtime.batching`), and
``B`` forward rows at the baselines for the self-check (none for ``riemann_left`` and
``riemann_trapezoid``, whose first node is the baseline itself, nor with
``multiply_by_inputs=False``); the convergence delta reads the same ``f(x~)``.

Self-check: the attributions sum to the rule's value of ``int_0^1 d/dalpha f(x~ + alpha
(x - x~)) d alpha = f(x) - f(x~)``, so their miss ``|sum_i a_i - (f(x) - f(x~))|`` is
exactly the quadrature error of that one integral. Every call (``multiply_by_inputs``)
measures it from ``f(x)`` (the call's target forward) and ``f(x~)`` and warns
(``strict=True``: raises) where it exceeds

    max(rounding tolerance, QUADRATURE_RTOL * max(|df|, sum_i |a_i|)),   QUADRATURE_RTOL = 0.05

(:mod:`taylorattr.runtime.completeness`): the per-feature quadrature errors sum to the
miss, so a miss beyond 5 % of ``sum_i |a_i|`` means some attribution is off by more than
5 % of its size; 5 % of ``f(x) - f(x~)`` is also the accuracy Sundararajan et al. ask of
the integral ("within 5%", Section 3). A smooth network meets it with few nodes (a tanh
MLP: 4e-3 at 3 nodes); a network with kinks (ReLU, max-pool), whose path derivative
jumps, needs many (a ReLU MLP: 0.50 at 2 nodes, 0.016 at 50): raise ``n_steps``.

Precision: the quadrature sum ``sum_k w_k grad_k`` is accumulated in float32 for float16
and bfloat16 inputs (``_validation.accumulation_dtype``: a half-precision running sum of
``n_steps`` terms would lose ``log2(n_steps)`` of its 8 or 11 bits), and the result is
returned in the inputs' dtype.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Any, Literal, overload

import numpy as np
import torch

from .._validation import accumulation_dtype, check_bool, check_positive_int
from ..runtime.cost import Cost
from ._base import Attributed, AttributionMethod
from ._call import CONSTRUCTED, Attributions, Baselines, Inputs, Target, given
from ._passes import (
    check_optional_positive_int,
    default_chunk_rows,
    gradient_pass_cost,
    grid_blocks,
    target_gradient,
)

__all__ = ["QUADRATURE_METHODS", "QUADRATURE_RTOL", "IntegratedGradients", "quadrature"]

QUADRATURE_METHODS = ("gausslegendre", "riemann_left", "riemann_right", "riemann_middle",
                      "riemann_trapezoid")
#: The self-check's scale: a miss beyond this share of ``max(|df|, sum_i |a_i|)`` warns.
QUADRATURE_RTOL = 0.05
#: The rules whose first node is ``alpha = 0``: ``f(x~)`` comes from their own rows.
_STARTS_AT_BASELINE = ("riemann_left", "riemann_trapezoid")


def quadrature(method: str, n_steps: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Nodes ``alpha_k`` in [0, 1] and weights ``w_k`` (float64, on the CPU: a table the
    method moves to the inputs' device) of a rule on [0, 1]."""
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
    traits = replace(AttributionMethod.traits, complete_within=QUADRATURE_RTOL, incomplete_cause=(
        "too few n_steps for this path: the quadrature misses the integral "
        "of the path derivative, which jumps where a ReLU, max-pool or "
        "other kink switches along the path; raise n_steps (or smooth the "
        "model, ta.smooth)"))

    @overload
    def attribute(self, inputs: Inputs, baselines: Baselines = ..., target: Target = ..., *,
                  n_steps: int = ..., method: str = ..., internal_batch_size: int | None = ...,
                  multiply_by_inputs: bool = ...,
                  return_convergence_delta: Literal[False] = ..., show_progress: bool = ...,
                  strict: bool = ..., additional_forward_args: Any = ..., layer: Any = ...,
                  attribute_to_layer_input: Any = ..., layer_baselines: Any = ...,
                  layer_delta: str = ...) -> Attributions: ...

    @overload
    def attribute(self, inputs: Inputs, baselines: Baselines = ..., target: Target = ..., *,
                  n_steps: int = ..., method: str = ..., internal_batch_size: int | None = ...,
                  multiply_by_inputs: bool = ..., return_convergence_delta: Literal[True],
                  show_progress: bool = ..., strict: bool = ...,
                  additional_forward_args: Any = ..., layer: Any = ...,
                  attribute_to_layer_input: Any = ..., layer_baselines: Any = ...,
                  layer_delta: str = ...) -> tuple[Attributions, torch.Tensor]: ...

    def attribute(self, inputs: Inputs, baselines: Baselines = 0.0, target: Target = None, *,
                  n_steps: int = 50, method: str = "gausslegendre",
                  internal_batch_size: int | None = None, multiply_by_inputs: bool = True,
                  return_convergence_delta: bool = False, show_progress: bool = False,
                  strict: bool = False, additional_forward_args: Any = None,
                  layer: Any = CONSTRUCTED, attribute_to_layer_input: Any = CONSTRUCTED,
                  layer_baselines: Any = None,
                  layer_delta: str = "layer") -> Attributions | tuple[Attributions, torch.Tensor]:
        """IntegratedGradients: attributions shaped like ``inputs`` (with
        ``return_convergence_delta=True`` and the delta ``[B]``); its options are
        ``_attribute``'s, the shared arguments :data:`~taylorattr.methods._call.SHARED_DOC`."""
        return self.explain(**given(locals())).result()

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
        own_start = method in _STARTS_AT_BASELINE  # step 0 is x~ itself: f(x~) from its rows
        f_ref = torch.zeros(batch, dtype=x.dtype, device=x.device)
        for k0, k1, s0, s1 in grid_blocks(n_steps, batch, chunk, show_progress,
                                          "integrated gradients"):
            # rows (step k, sample s), step-major as in Captum
            a = alphas[k0:k1].view((-1, 1) + (1,) * (x.dim() - 1))
            rows = torch.addcmul(base[None, s0:s1], a, diff[None, s0:s1])
            rows = rows.reshape((-1,) + tuple(x.shape[1:]))
            tr = None if t is None else t[s0:s1].repeat(k1 - k0)
            grad, f_rows = target_gradient(call.model, rows, tr)
            if own_start and k0 == 0:
                f_ref[s0:s1] = f_rows.reshape(k1 - k0, s1 - s0)[0]
            grad = grad.reshape(k1 - k0, s1 - s0, -1)
            # total[s] += sum_k w_k grad[k, s]
            total[s0:s1] += torch.einsum("k,kbf->bf", weights[k0:k1], grad.to(acc)).view_as(
                total[s0:s1])
        if not multiply_by_inputs:  # the path-averaged gradient: no share of f(x) - f(x~)
            return Attributed(total.to(x.dtype), base.unsqueeze(1))
        # the self-check's f(x~) (and the delta's): B forward rows unless step 0 had it
        return Attributed((diff.to(acc) * total).to(x.dtype), base.unsqueeze(1), reference_outputs=(
            f_ref if own_start else self._explained(call, base, t, int(chunk))))

    def _cost(self, x, options):
        """``n_steps`` gradient rows per sample and, for the self-check, one forward row
        at the baseline (none where the rule's first node is the baseline); the delta reads
        that ``f(x~)``. With ``multiply_by_inputs=False`` no check: one reference for the
        delta."""
        n_steps = check_positive_int(options.get("n_steps", 50), "n_steps")
        own = gradient_pass_cost(n_steps * x.shape[0])
        if not options.get("multiply_by_inputs", True):
            return own, 1
        if options.get("method", "gausslegendre") in _STARTS_AT_BASELINE:
            return own, 0
        return own + Cost(forward_rows=x.shape[0]), 0
