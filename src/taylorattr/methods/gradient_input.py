"""Gradient * Input (Shrikumar et al. 2016; Ancona et al. 2018).

    a_i = x_i * d f(x) / d x_i

Taylor view (docs/design.md, Thm 1): the first-order term ``T^a_i`` of the expansion at
``x`` with the zero baseline ``x~ = 0``.
"""
from __future__ import annotations

import torch

from ..runtime.cost import Cost
from ._base import ImplicitBaselineMethod
from ._passes import input_gradient

__all__ = ["GradientInput"]


class GradientInput(ImplicitBaselineMethod):
    """Gradient times input: ``a = x * grad f(x)``, one forward and one backward pass.

    Equals Captum's ``InputXGradient``. The reference is the zero input: the convergence
    delta is ``sum(a) - (f(x) - f(0))``.
    """

    name = "gradient_input"
    gradient_at_inputs = True

    def _attribute(self, call, x, baselines, target, fx, *, show_progress=False):
        grad = input_gradient(call.model, x, target, fx)
        x = x.detach()
        return x * grad, torch.zeros_like(x).unsqueeze(1)

    def _cost(self, x, options):
        """One backward pass through the base class's forward of the batch (kept with its
        graph); one (zero) reference."""

        return Cost(backward_rows=x.shape[0]), 1
