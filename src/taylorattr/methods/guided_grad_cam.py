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
from dataclasses import replace
from typing import Any, Literal, overload

import torch
import torch.nn.functional as F

from ..inputs import as_tuple
from ._base import Attributed, Explanation, ImplicitBaselineMethod, Request
from ._call import CONSTRUCTED, Attributions, Inputs, Target, given
from ._passes import gradient_pass_cost
from .grad_cam import GradCAM
from .guided_backprop import GuidedBackprop

__all__ = ["GuidedGradCam"]


def _per_input(method, request: Request) -> Request | Explanation:
    """GuidedGradCam's route (:attr:`~taylorattr.methods._call.Traits.route`): one tensor
    without extra arguments is the pipeline's call; tuple inputs (or
    ``additional_forward_args``) take Guided Backprop and the layer's Grad-CAM map of the
    whole call, the map upsampled to each input (module docstring)."""
    inputs, shared = request.inputs, request.shared
    extra = shared["additional_forward_args"]
    if isinstance(inputs, torch.Tensor) and extra is None:
        return request
    if shared["return_convergence_delta"]:
        raise ValueError("return_convergence_delta: Guided Grad-CAM has no delta")
    own = dict(request.options)
    mode = own.pop("interpolate_mode", "nearest")
    unmatched = own.pop("unmatched", "raise")
    if unmatched not in ("raise", "empty"):
        raise ValueError(f"unmatched must be 'raise' or 'empty', got {unmatched!r}")
    method._cam._settings({"interpolate_mode": mode})  # checks the mode
    show, model, target = shared["show_progress"], request.model, request.target
    guided = method._guided.explain(inputs, None, target, additional_forward_args=extra,
                                    show_progress=show, model=model)
    cam = method._cam.explain(inputs, None, target, additional_forward_args=extra,
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
                          stacklevel=4)  # _per_input, explain, attribute
            out.append(torch.empty(0, dtype=g.dtype, device=g.device))
            continue
        out.append(g * F.interpolate(cam, tuple(g.shape[2:]), mode=mode))
    return Explanation(tuple(out) if is_tuple else out[0], None, guided.output,
                       guided.target, None)


class GuidedGradCam(ImplicitBaselineMethod):
    """Guided Backprop times the upsampled ReLU'd Grad-CAM map; two forward and backward
    passes. Equals Captum's ``GuidedGradCam`` with the same layer and mode."""

    name = "guided_grad_cam"
    #: tuple inputs and ``additional_forward_args``: the map upsampled to each input
    traits = replace(ImplicitBaselineMethod.traits, route=_per_input)

    def __init__(self, model) -> None:
        super().__init__(model)
        self._guided = GuidedBackprop(model)
        self._cam = GradCAM(model)

    @overload
    def attribute(self, inputs: Inputs, target: Target = ..., *, conv_layer: Any = ...,
                  interpolate_mode: str = ..., conv_layer_input: bool = ...,
                  unmatched: str = ..., return_convergence_delta: Literal[False] = ...,
                  show_progress: bool = ..., strict: bool = ...,
                  additional_forward_args: Any = ..., layer: Any = ...,
                  attribute_to_layer_input: Any = ..., layer_baselines: Any = ...,
                  layer_delta: str = ...) -> Attributions: ...

    @overload
    def attribute(self, inputs: Inputs, target: Target = ..., *, conv_layer: Any = ...,
                  interpolate_mode: str = ..., conv_layer_input: bool = ...,
                  unmatched: str = ..., return_convergence_delta: Literal[True],
                  show_progress: bool = ..., strict: bool = ...,
                  additional_forward_args: Any = ..., layer: Any = ...,
                  attribute_to_layer_input: Any = ..., layer_baselines: Any = ...,
                  layer_delta: str = ...) -> tuple[Attributions, torch.Tensor]: ...

    def attribute(self, inputs: Inputs, target: Target = None, *, conv_layer: Any = None,
                  interpolate_mode: str = "nearest", conv_layer_input: bool = False,
                  unmatched: str = "raise", return_convergence_delta: bool = False,
                  show_progress: bool = False, strict: bool = False,
                  additional_forward_args: Any = None, layer: Any = CONSTRUCTED,
                  attribute_to_layer_input: Any = CONSTRUCTED, layer_baselines: Any = None,
                  layer_delta: str = "layer") -> Attributions | tuple[Attributions, torch.Tensor]:
        """GuidedGradCam: attributions shaped like ``inputs`` (with
        ``return_convergence_delta=True`` and the delta ``[B]``); its options are
        ``_attribute``'s, the shared arguments :data:`~taylorattr.methods._call.SHARED_DOC`."""
        return self.explain(**given(locals())).result()

    def _attribute(self, call, x, baselines, target, fx, *, conv_layer=None,
                   interpolate_mode: str = "nearest", conv_layer_input: bool = False,
                   unmatched: str = "raise", show_progress: bool = False):
        """Options: ``conv_layer`` (default the last convolution), ``interpolate_mode``,
        ``conv_layer_input`` (the layer's input instead of its output), ``unmatched`` (tuple
        inputs: what an input without the map's spatial axes gets; module docstring)."""
        if unmatched not in ("raise", "empty"):
            raise ValueError(f"unmatched must be 'raise' or 'empty', got {unmatched!r}")
        guided = self._guided._attribute(call, x, None, target, fx)
        cam = self._cam._attribute(call, x, None, target, fx, conv_layer=conv_layer,
                                   relu_attributions=True,
                                   interpolate_mode=interpolate_mode,
                                   conv_layer_input=conv_layer_input).attributions
        return Attributed(guided.attributions * cam, guided.references)

    def _cost(self, x, options):
        """Two gradient passes of the batch (Guided Backprop, Grad-CAM); the zero input."""
        return gradient_pass_cost(2 * x.shape[0]), 1
