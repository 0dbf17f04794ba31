"""Deconvolution (Zeiler & Fergus 2014), as Captum's ``Deconvolution``.

The gradient of the explained output, with every ReLU's backward pass replaced by

    grad_in = relu(grad_out)

(the signal coming back is rectified, whatever the ReLU's input was); every other
operation keeps its true derivative. The attribution is that modified gradient. ReLUs are
``nn.ReLU`` modules; ReLUs called as functions are refused as in
:class:`~taylorattr.methods.GuidedBackprop` (which gates by ``1[z > 0]`` as well).

Taylor view: none, for the reason Guided Backprop has none (the backward rule depends on
the sign of the returning signal, not on the expansion of ``f``).
"""
from __future__ import annotations

import torch

from .guided_backprop import GuidedBackprop

__all__ = ["Deconvolution"]


class _DeconvReLU(torch.autograd.Function):
    """``relu`` forward; backward ``relu(grad)``."""

    @staticmethod
    def forward(ctx, z):
        return z.clamp(min=0)

    @staticmethod
    def backward(ctx, grad):
        return grad.clamp(min=0)


class Deconvolution(GuidedBackprop):
    """Deconvolution: the gradient with each ``nn.ReLU``'s backward rectified; one forward
    and one backward pass. Equals Captum's ``Deconvolution``."""

    name = "deconvolution"
    relu_function = _DeconvReLU
