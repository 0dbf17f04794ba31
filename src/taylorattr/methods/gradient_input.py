"""Gradient * Input (Shrikumar et al. 2016; Ancona et al. 2018).

    a_i = x_i * d f(x) / d x_i

Taylor view (docs/design.md, Thm 1): the first-order term ``T^a_i`` of the expansion at
``x`` with the zero baseline ``x~ = 0``.
"""
from __future__ import annotations

import torch

from ._base import ImplicitBaselineMethod, gradient_pass_cost, target_gradient

__all__ = ["GradientInput"]


class GradientInput(ImplicitBaselineMethod):
    """Gradient times input: ``a = x * grad f(x)``, one forward and one backward pass.

    Equals Captum's ``InputXGradient``. The reference is the zero input: the convergence
    delta is ``sum(a) - (f(x) - f(0))``.
    """

    name = "gradient_input"

    def _attribute(self, x, baselines, target, fx, *, show_progress=False):
        grad, _ = target_gradient(self.model, x.clone(), target)
        return x * grad, torch.zeros_like(x).unsqueeze(1)

    def _cost(self, x, options):
        """One forward + backward pass of the batch; one (zero) reference."""
        return gradient_pass_cost(x.shape[0]), 1
