"""Guided Grad-CAM (Selvaraju et al. 2017), as Captum's ``GuidedGradCam``.

    a = GuidedBackprop(x) * upsample(relu(Grad-CAM at conv_layer))

the Guided Backprop gradient (:class:`~taylorattr.methods.GuidedBackprop`) times the
ReLU'd Grad-CAM map (:class:`~taylorattr.methods.GradCAM`) upsampled to the input's
spatial size (``interpolate_mode``, Captum's default ``"nearest"``) and shared by the
channels of a pixel. Tuple inputs (and ``additional_forward_args``): the map at the layer's
resolution is upsampled to every input; an input without the map's number of spatial axes
is refused (``unmatched="raise"``) or gets an empty tensor and a warning
(``unmatched="empty"``, Captum's way).

Taylor view: none (neither factor has one).
"""
from __future__ import annotations

import warnings

import torch
import torch.nn.functional as F

from ..inputs import as_tuple
from ._base import Explanation, ImplicitBaselineMethod
from ._call import SHARED_NAMES
from ._passes import gradient_pass_cost
from .grad_cam import GradCAM
from .guided_backprop import GuidedBackprop

__all__ = ["GuidedGradCam"]


class GuidedGradCam(ImplicitBaselineMethod):
    """Guided Backprop times the upsampled ReLU'd Grad-CAM map; two forward and backward
    passes. Equals Captum's ``GuidedGradCam`` with the same layer and mode."""

    name = "guided_grad_cam"

    def __init__(self, model) -> None:
        super().__init__(model)
        self._guided = GuidedBackprop(model)
        self._cam = GradCAM(model)

    def explain(self, inputs, baselines=None, target=None, *, model=None, **kw):
        """One tensor without extra arguments: the base class's call; else per input
        (module docstring)."""
        extra = kw.get("additional_forward_args")
        if isinstance(inputs, torch.Tensor) and extra is None:
            return super().explain(inputs, baselines, target, model=model, **kw)
        own = {k: kw.pop(k) for k in tuple(kw) if k not in SHARED_NAMES}
        self._check_options(own)
        if kw.get("return_convergence_delta", False):
            raise ValueError("return_convergence_delta: Guided Grad-CAM has no delta")
        mode = own.pop("interpolate_mode", "nearest")
        unmatched = own.pop("unmatched", "raise")
        if unmatched not in ("raise", "empty"):
            raise ValueError(f"unmatched must be 'raise' or 'empty', got {unmatched!r}")
        self._cam._settings({"interpolate_mode": mode})  # checks the mode
        show = kw.get("show_progress", False)
        guided = self._guided.explain(inputs, None, target, additional_forward_args=extra,
                                      show_progress=show, model=model)
        cam = self._cam.explain(inputs, None, target, additional_forward_args=extra,
                                show_progress=show, model=model, **own, upsample=False,
                                relu_attributions=True).attributions
        parts, is_tuple = as_tuple(guided.attributions)
        out = []
        for i, g in enumerate(parts):
            if g.dim() != cam.dim():
                if unmatched == "raise":
                    raise ValueError(
                        f"inputs[{i}] {tuple(g.shape)} has not the {cam.dim() - 2} spatial "
                        f"axes of the layer's map {tuple(cam.shape)}, so Guided Grad-CAM "
                        "cannot upsample the map to it; pass unmatched='empty' for an empty "
                        "tensor there")
                warnings.warn(f"Guided Grad-CAM: inputs[{i}] {tuple(g.shape)} has not the "
                              f"{cam.dim() - 2} spatial axes of the layer's map "
                              f"{tuple(cam.shape)}; its attributions are an empty tensor",
                              stacklevel=3)
                out.append(torch.empty(0, dtype=g.dtype, device=g.device))
                continue
            out.append(g * F.interpolate(cam, tuple(g.shape[2:]), mode=mode))
        return Explanation(tuple(out) if is_tuple else out[0], None, guided.output,
                           guided.target, None)

    def _attribute(self, call, x, baselines, target, fx, *, conv_layer=None,
                   interpolate_mode: str = "nearest", conv_layer_input: bool = False,
                   unmatched: str = "raise", show_progress: bool = False):
        """Options: ``conv_layer`` (default the last convolution), ``interpolate_mode``,
        ``conv_layer_input`` (the layer's input instead of its output), ``unmatched`` (tuple
        inputs: what an input without the map's spatial axes gets; module docstring)."""
        if unmatched not in ("raise", "empty"):
            raise ValueError(f"unmatched must be 'raise' or 'empty', got {unmatched!r}")
        guided, refs = self._guided._attribute(call, x, None, target, fx)
        cam, _ = self._cam._attribute(call, x, None, target, fx, conv_layer=conv_layer,
                                      relu_attributions=True,
                                      interpolate_mode=interpolate_mode,
                                      conv_layer_input=conv_layer_input)
        return guided * cam, refs

    def _cost(self, x, options):
        """Two gradient passes of the batch (Guided Backprop, Grad-CAM); the zero input."""
        return gradient_pass_cost(2 * x.shape[0]), 1
