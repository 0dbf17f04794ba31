"""Saliency (Simonyan et al. 2014): the gradient of the explained output, by default its
absolute value.

    a_i = | d f(x) / d x_i |          (abs=True, the default, as Captum's ``Saliency``)
    a_i =   d f(x) / d x_i            (abs=False)

Taylor view: none. The gradient is the coefficient of the first-order term ``T^a_i`` but
not a share of ``f(x) - f(x~)`` for any baseline (it is not multiplied by ``delta``), and
the absolute value drops the sign, so no weight on the monomials of the expansion gives
it. The reference reported for the convergence delta is the zero input, as for
Gradient*Input (whose attribution is ``x`` times the signed gradient).
"""
from __future__ import annotations

from dataclasses import replace
from typing import Any, Literal, overload

import torch

from .._validation import check_bool
from ..runtime.cost import Cost
from ._base import Attributed, ImplicitBaselineMethod
from ._call import CONSTRUCTED, Attributions, Inputs, Target, given
from ._passes import input_gradient

__all__ = ["Saliency"]


class Saliency(ImplicitBaselineMethod):
    """Saliency: ``|grad f(x)|`` (``abs=False``: the signed gradient); one forward and one
    backward pass. Equals Captum's ``Saliency`` with the same ``abs``."""

    traits = replace(ImplicitBaselineMethod.traits, gradient_at_inputs=True)

    name = "saliency"

    @overload
    def attribute(self, inputs: Inputs, target: Target = ..., *, abs: bool = ...,
                  return_convergence_delta: Literal[False] = ..., show_progress: bool = ...,
                  strict: bool = ..., additional_forward_args: Any = ..., layer: Any = ...,
                  attribute_to_layer_input: Any = ..., layer_baselines: Any = ...,
                  layer_delta: str = ...) -> Attributions: ...

    @overload
    def attribute(self, inputs: Inputs, target: Target = ..., *, abs: bool = ...,
                  return_convergence_delta: Literal[True], show_progress: bool = ...,
                  strict: bool = ..., additional_forward_args: Any = ..., layer: Any = ...,
                  attribute_to_layer_input: Any = ..., layer_baselines: Any = ...,
                  layer_delta: str = ...) -> tuple[Attributions, torch.Tensor]: ...

    def attribute(self, inputs: Inputs, target: Target = None, *, abs: bool = True,
                  return_convergence_delta: bool = False, show_progress: bool = False,
                  strict: bool = False, additional_forward_args: Any = None,
                  layer: Any = CONSTRUCTED, attribute_to_layer_input: Any = CONSTRUCTED,
                  layer_baselines: Any = None,
                  layer_delta: str = "layer") -> Attributions | tuple[Attributions, torch.Tensor]:
        """Saliency: attributions shaped like ``inputs`` (with
        ``return_convergence_delta=True`` and the delta ``[B]``); its options are
        ``_attribute``'s, the shared arguments :data:`~taylorattr.methods._call.SHARED_DOC`."""
        return self.explain(**given(locals())).result()

    def _attribute(self, call, x, baselines, target, fx, *, abs: bool = True,
                   show_progress: bool = False):
        """Options: ``abs`` (default True) takes the absolute value of the gradient."""
        check_bool(abs, "abs")
        grad = input_gradient(call.model, x, target, fx)
        return Attributed(grad.abs() if abs else grad, torch.zeros_like(x.detach()).unsqueeze(1))

    def _cost(self, x, options):
        """One backward pass through the base class's forward of the batch (kept with its
        graph); one (zero) reference."""

        return Cost(backward_rows=x.shape[0]), 1
