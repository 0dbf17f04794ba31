"""Grad-CAM (Selvaraju et al. 2017) at a convolution layer, upsampled to the input.

For the output ``A`` ``[B, C, h, w]`` of ``conv_layer`` (any number of spatial dimensions),

    alpha_c = mean_{spatial} d f(x) / d A_c           (one weight per channel)
    cam     = sum_c alpha_c A_c                       ([B, 1, h, w]; relu(cam) if asked)
    a       = interpolate(cam, size of the input's spatial dimensions, mode)

expanded over the input's channels, so the attribution has the shape of the inputs (each
channel of a pixel gets the pixel's value). This is Captum's
``LayerAttribution.interpolate(LayerGradCam(model, layer).attribute(x, target,
relu_attributions=...), x.shape[2:], interpolate_mode=...)``. The class defaults are
Captum's: ``relu_attributions=False`` (both signs kept) and ``interpolate_mode="nearest"``;
the registry's "Grad-CAM" row uses the published method, ReLU and bilinear upsampling.

``conv_layer`` is a submodule of the model (or its dotted name); by default the last
convolution (``nn.Conv1d/2d/3d``) in ``model.modules()`` order. A model without a
convolution is refused with a ValueError. The layer must return one tensor
``[B, C, *spatial]`` with as many spatial dimensions as the inputs and run once per
forward pass.

Taylor view: none. The channel weights average the gradient over positions and the
product with the activations (then ReLU) is not a weight on the monomials of the
expansion of ``f`` in the input; with ReLU gating there is no reformulation either.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .._validation import check_bool, select_output
from ._base import ImplicitBaselineMethod
from ._passes import gradient_pass_cost
from .layerwise import UnsupportedModelError

__all__ = ["GradCAM", "find_layer"]

_CONVS = (nn.Conv1d, nn.Conv2d, nn.Conv3d)
_MODES = ("nearest", "nearest-exact", "linear", "bilinear", "bicubic", "trilinear", "area")


def find_layer(model: nn.Module, layer=None) -> nn.Module:
    """``layer`` as a submodule of ``model``: a module of it, a dotted name, or None for the
    last convolution in ``model.modules()`` order."""
    if layer is None:
        convs = [m for m in model.modules() if isinstance(m, _CONVS)]
        if not convs:
            raise UnsupportedModelError(f"conv_layer: Grad-CAM needs a convolution layer, and "
                             f"{type(model).__name__} has no nn.Conv1d/2d/3d; pass conv_layer= "
                             "(a submodule with output [B, C, *spatial])")
        return convs[-1]
    if isinstance(layer, str):
        try:
            return model.get_submodule(layer)
        except AttributeError as exc:
            raise ValueError(f"conv_layer must name a submodule of the model, got {layer!r}") from exc
    if isinstance(layer, nn.Module):
        if not any(m is layer for m in model.modules()):
            raise ValueError(f"conv_layer must be a submodule of the model, got a "
                             f"{type(layer).__name__} that is not part of it")
        return layer
    raise TypeError(f"conv_layer must be None, a submodule of the model or its dotted name, got "
                    f"{type(layer).__name__}")


def _layer_output_and_gradient(model, layer, x, target):
    """``(A, dA)``: the layer's output and the gradient of the explained output w.r.t. it."""
    seen = []

    def keep(module, args, output):
        seen.append(output)

    handle = layer.register_forward_hook(keep)
    try:
        with torch.enable_grad():
            out = select_output(model(x), target)
            if len(seen) != 1:
                raise ValueError(f"conv_layer must run exactly once per forward pass, it ran "
                                 f"{len(seen)} times (pick a layer the model calls once)")
            (act,) = seen
            if not isinstance(act, torch.Tensor) or not act.requires_grad:
                raise ValueError("conv_layer must return a tensor that depends on the inputs, got "
                                 f"{type(act).__name__}")
            (grad,) = torch.autograd.grad(out.sum(), act)
    finally:
        handle.remove()
    return act.detach(), grad


class GradCAM(ImplicitBaselineMethod):
    """Grad-CAM at ``layer``, upsampled to the input (see the module docstring): one forward
    and one backward pass. Equals Captum's ``LayerGradCam`` +
    ``LayerAttribution.interpolate`` with the same ``relu_attributions`` and mode, expanded
    over the input channels."""

    name = "grad_cam"

    def _attribute(self, x, baselines, target, fx, *, conv_layer=None, relu_attributions: bool = False,
                   interpolate_mode: str = "nearest", show_progress: bool = False):
        """Options: ``conv_layer`` (submodule or its name; default the last convolution),
        ``relu_attributions`` (ReLU of the map, as published), ``interpolate_mode``
        (``torch.nn.functional.interpolate``'s mode, default ``"nearest"`` as Captum)."""
        check_bool(relu_attributions, "relu_attributions")
        if interpolate_mode not in _MODES:
            raise ValueError(f"interpolate_mode must be one of {list(_MODES)}, got "
                             f"{interpolate_mode!r}")
        module = find_layer(self.model, conv_layer)
        act, grad = _layer_output_and_gradient(self.model, module, x.clone().requires_grad_(True),
                                               target)
        if act.dim() != x.dim():
            raise ValueError(f"conv_layer output must be [B, C, *spatial] with the inputs' "
                             f"{x.dim() - 2} spatial dimension(s), got shape {tuple(act.shape)} "
                             f"for inputs {tuple(x.shape)}")
        weights = grad.mean(dim=tuple(range(2, grad.dim())), keepdim=True)
        cam = (weights * act).sum(1, keepdim=True)
        if relu_attributions:
            cam = F.relu(cam)
        cam = F.interpolate(cam, tuple(x.shape[2:]), mode=interpolate_mode)
        return cam.expand_as(x).contiguous(), torch.zeros_like(x).unsqueeze(1)

    def _cost(self, x, options):
        """One forward of the batch with its graph, swept back from the explained output to
        the layer (a backward row each); the zero input is the one reference."""
        return gradient_pass_cost(x.shape[0]), 1
