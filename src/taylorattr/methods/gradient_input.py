"""Gradient * Input (Shrikumar et al. 2016; Ancona et al. 2018).

    a_i = x_i * d f(x) / d x_i

Taylor view (DESIGN.md section 2, Thm 1): the first-order term ``T^a_i`` of the expansion
at ``x`` with the zero baseline ``x~ = 0``.
"""
from __future__ import annotations

import torch

from .._validation import check_bool, check_inputs, model_output, resolve_target, select_output
from ._base import AttributionMethod

__all__ = ["GradientInput"]


class GradientInput(AttributionMethod):
    """Gradient times input: ``a = x * grad f(x)``, one forward and one backward pass.

    Equals Captum's ``InputXGradient``. The convergence delta compares with the zero
    baseline: ``delta = sum(a) - (f(x) - f(0))``.
    """

    name = "gradient_input"

    def attribute(self, inputs: torch.Tensor, target=None, *,
                  return_convergence_delta: bool = False):
        """Attributions ``[B, ...]`` shaped like ``inputs`` (see the module docstring).

        Args:
            inputs: ``[B, ...]`` float32/float64 batch.
            target: None (argmax class), an int, or a ``[B]`` integer tensor.
            return_convergence_delta: also return ``sum(a) - (f(x) - f(0))`` per sample.
        """
        check_bool(return_convergence_delta, "return_convergence_delta")
        x = check_inputs(inputs).detach().requires_grad_(True)
        with torch.enable_grad():
            out = model_output(self.model, x)
            t = resolve_target(target, out)
            fx = select_output(out, t)
            (grad,) = torch.autograd.grad(fx.sum(), x)
        x = x.detach()
        attr = x * grad
        if not return_convergence_delta:
            return self._finite(attr)
        f0 = self._explained(torch.zeros_like(x), t)
        return self._with_delta(attr, fx.detach() - f0, True)
