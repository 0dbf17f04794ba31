"""Gradient * Input (Shrikumar et al. 2016; Ancona et al. 2018).

    a_i = x_i * d f(x) / d x_i

Taylor view (docs/design.md, Thm 1): the first-order term ``T^a_i`` of the expansion at
``x`` with the zero baseline ``x~ = 0``.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Any, Literal, overload

import torch

from ..runtime.cost import Cost
from ._base import Attributed, ImplicitBaselineMethod
from ._call import CONSTRUCTED, Attributions, Inputs, Target, given
from ._passes import input_gradient

__all__ = ["GradientInput"]


class GradientInput(ImplicitBaselineMethod):
    """Gradient times input: ``a = x * grad f(x)``, one forward and one backward pass.

    Equals Captum's ``InputXGradient``. The reference is the zero input: the convergence
    delta is ``sum(a) - (f(x) - f(0))``.
    """

    name = "gradient_input"
    traits = replace(ImplicitBaselineMethod.traits, gradient_at_inputs=True)

    @overload
    def attribute(self, inputs: Inputs, target: Target = ..., *,
                  return_convergence_delta: Literal[False] = ..., show_progress: bool = ...,
                  strict: bool = ..., additional_forward_args: Any = ..., layer: Any = ...,
                  attribute_to_layer_input: Any = ..., layer_baselines: Any = ...,
                  layer_delta: str = ...) -> Attributions: ...

    @overload
    def attribute(self, inputs: Inputs, target: Target = ..., *,
                  return_convergence_delta: Literal[True], show_progress: bool = ...,
                  strict: bool = ..., additional_forward_args: Any = ..., layer: Any = ...,
                  attribute_to_layer_input: Any = ..., layer_baselines: Any = ...,
                  layer_delta: str = ...) -> tuple[Attributions, torch.Tensor]: ...

    def attribute(self, inputs: Inputs, target: Target = None, *,
                  return_convergence_delta: bool = False, show_progress: bool = False,
                  strict: bool = False, additional_forward_args: Any = None,
                  layer: Any = CONSTRUCTED, attribute_to_layer_input: Any = CONSTRUCTED,
                  layer_baselines: Any = None,
                  layer_delta: str = "layer") -> Attributions | tuple[Attributions, torch.Tensor]:
        """GradientInput: attributions shaped like ``inputs`` (with
        ``return_convergence_delta=True`` and the delta ``[B]``); its options are
        ``_attribute``'s, the shared arguments :data:`~taylorattr.methods._call.SHARED_DOC`."""
        return self.explain(**given(locals())).result()

    def _attribute(self, call, x, baselines, target, fx, *, show_progress=False):
        grad = input_gradient(call.model, x, target, fx)
        x = x.detach()
        return Attributed(x * grad, torch.zeros_like(x).unsqueeze(1))

    def _cost(self, x, options):
        """One backward pass through the base class's forward of the batch (kept with its
        graph); one (zero) reference."""

        return Cost(backward_rows=x.shape[0]), 1
