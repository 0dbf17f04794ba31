"""Order-K Taylor attribution (the paper's "Taylor attribution" of Figures 3 and 5).

    a_i = sum_{k=1..K} (1/k) delta_i d/d(delta_i) P_k(delta),   delta = x - x~

Each monomial of the order-K expansion at ``x`` goes to its features in proportion to
their exponents (Theorem 5), so ``sum_i a_i = g_K = sum_{k<=K} P_k``; order 1 is
Gradient*Input with respect to the baseline. This is the order-K reformulation of
Integrated Gradients, computed directly by :func:`taylorattr.taylor.terms.taylor_attribution`
(one Taylor-mode pass and one backward pass). Its convergence delta is ``-eps_K``, the
truncation error of the expansion.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Any, Literal, overload

import torch

from .._validation import check_positive_int
from ..taylor.terms import taylor_attribution, taylor_attribution_cost
from ._base import Attributed, AttributionMethod
from ._call import CONSTRUCTED, Attributions, Baselines, Inputs, Target, given

__all__ = ["TaylorAttribution"]


class TaylorAttribution(AttributionMethod):
    """Taylor attribution of order ``order`` (option, default 2) against a point baseline."""

    name = "taylor"

    @overload
    def attribute(self, inputs: Inputs, baselines: Baselines = ..., target: Target = ..., *,
                  order: int = ..., return_convergence_delta: Literal[False] = ...,
                  show_progress: bool = ..., strict: bool = ...,
                  additional_forward_args: Any = ..., layer: Any = ...,
                  attribute_to_layer_input: Any = ..., layer_baselines: Any = ...,
                  layer_delta: str = ...) -> Attributions: ...

    @overload
    def attribute(self, inputs: Inputs, baselines: Baselines = ..., target: Target = ..., *,
                  order: int = ..., return_convergence_delta: Literal[True],
                  show_progress: bool = ..., strict: bool = ...,
                  additional_forward_args: Any = ..., layer: Any = ...,
                  attribute_to_layer_input: Any = ..., layer_baselines: Any = ...,
                  layer_delta: str = ...) -> tuple[Attributions, torch.Tensor]: ...

    def attribute(self, inputs: Inputs, baselines: Baselines = 0.0, target: Target = None, *,
                  order: int = 2, return_convergence_delta: bool = False,
                  show_progress: bool = False, strict: bool = False,
                  additional_forward_args: Any = None, layer: Any = CONSTRUCTED,
                  attribute_to_layer_input: Any = CONSTRUCTED, layer_baselines: Any = None,
                  layer_delta: str = "layer") -> Attributions | tuple[Attributions, torch.Tensor]:
        """TaylorAttribution: attributions shaped like ``inputs`` (with
        ``return_convergence_delta=True`` and the delta ``[B]``); its options are
        ``_attribute``'s, the shared arguments :data:`~taylorattr.methods._call.SHARED_DOC`."""
        return self.explain(**given(locals())).result()

    def _attribute(self, call, x, base, t, fx, *, order: int = 2, show_progress: bool = False):
        """Options: ``order`` K >= 1 of the expansion."""
        check_positive_int(order, "order")
        return Attributed(taylor_attribution(call.model, x, base, t, order), base.unsqueeze(1))

    def _cost(self, x, options):
        """What :func:`~taylorattr.taylor.terms.taylor_attribution` runs
        (:func:`~taylorattr.taylor.terms.taylor_attribution_cost`); the baseline is the one
        reference."""
        order = check_positive_int(options.get("order", 2), "order")
        return replace(taylor_attribution_cost(x, 0.0, order), label="", samples=0), 1
