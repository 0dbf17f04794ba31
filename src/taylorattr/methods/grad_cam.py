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

import warnings
from dataclasses import replace
from typing import Any, Literal, overload

import torch
import torch.nn.functional as F
from torch import nn

from .._validation import check_bool, run_model, select_output
from ..inputs import as_tuple, check_additional_args, check_batch
from ._base import Attributed, Explanation, ImplicitBaselineMethod, Request
from ._call import CONSTRUCTED, Attributions, Inputs, Target, given
from ._passes import gradient_pass_cost
from .layerwise import UnsupportedModelError

__all__ = ["GradCAM", "cam", "find_layer"]

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


def _layer_output_and_gradient(model, layer, args, target, to_input=False):
    """``(A, dA)``: the layer's output (its input with ``to_input``) and the gradient of the
    explained output w.r.t. it, for ``model(*args)``; tuples for a layer returning (with
    ``to_input``: receiving) several tensors. Warns when ``A`` is a model input's image
    through a stem or patch embedding (the layer receives an input tensor itself)."""
    seen, received = [], []

    def keep(module, inputs, output):
        seen.append((inputs if len(inputs) > 1 else inputs[0]) if to_input else output)
        received.append(inputs[0] if inputs else None)

    handle = layer.register_forward_hook(keep)
    try:
        with torch.enable_grad():
            out = select_output(model(*args), target)
            if len(seen) != 1:
                raise ValueError(f"conv_layer must run exactly once per forward pass, it ran "
                                 f"{len(seen)} times (pick a layer the model calls once)")
            acts = seen[0] if isinstance(seen[0], tuple) else (seen[0],)
            if not all(isinstance(a, torch.Tensor) and a.requires_grad for a in acts):
                raise ValueError("conv_layer must return a tensor (or a tuple of tensors) that "
                                 f"depends on the inputs, got {type(seen[0]).__name__}")
            grads = torch.autograd.grad(out.sum(), acts)
    finally:
        handle.remove()
    if any(received[0] is a for a in args if isinstance(a, torch.Tensor)):
        warnings.warn(f"conv_layer ({type(layer).__name__}) receives the model's input: it is a "
                      "stem or patch embedding, where Grad-CAM is a smoothed gradient-times-"
                      "input map, not a map of the class evidence in the late features; pass "
                      "conv_layer= a later layer (ViT/Swin/Mixer/LeViT: the last block, "
                      "reshaped to [B, C, h, w] by a module of your model)", stacklevel=5)
    acts = tuple(a.detach() for a in acts)
    if isinstance(seen[0], tuple):
        return acts, grads
    return acts[0], grads[0]


def cam(model, layer, args, target, relu: bool, to_input: bool = False,
        sum_channels: bool = True):
    """The Grad-CAM map at the layer's resolution: ``sum_c alpha_c A_c`` ``[B, 1, *spatial]``
    (``sum_channels=False``: ``alpha_c A_c`` ``[B, C, *spatial]``); a layer without spatial
    dimensions (``[B, C]``) has ``alpha_c = dA_c``, so its map ``[B, 1]`` is the sum of
    gradient times activation. A layer returning a tuple has a map per tensor (a tuple)."""
    act, grad = _layer_output_and_gradient(model, layer, args, target, to_input)
    if isinstance(act, tuple):
        return tuple(_map(a, g, relu, sum_channels) for a, g in zip(act, grad))
    return _map(act, grad, relu, sum_channels)


def _map(act, grad, relu: bool, sum_channels: bool) -> torch.Tensor:
    weights = grad.mean(dim=tuple(range(2, grad.dim())), keepdim=True) if grad.dim() > 2 else grad
    cam = weights * act
    if sum_channels:
        cam = cam.sum(1, keepdim=True)
    return F.relu(cam) if relu else cam


def _layer_resolution(method, request: Request) -> Request | Explanation:
    """GradCAM's route (:attr:`~taylorattr.methods._call.Traits.route`): ``upsample=False``
    is the layer's map for any inputs (not shaped like them), from one forward and backward
    of the user's model (:meth:`GradCAM._layer_map`); else the pipeline's call, for one
    input tensor."""
    own = request.options
    for key in ("upsample", "sum_channels"):
        check_bool(own.get(key, True), key)
    if own.get("upsample", True):
        if not isinstance(request.inputs, torch.Tensor):
            raise ValueError("Grad-CAM upsamples its map to the spatial size of one input; "
                             "for tuple inputs pass upsample=False (the map at the layer's "
                             "resolution) and upsample it to each input yourself")
        return request
    if check_bool(request.shared["return_convergence_delta"], "return_convergence_delta"):
        raise ValueError("return_convergence_delta: the layer-resolution Grad-CAM map "
                         "(upsample=False) is not shaped like the inputs; no delta")
    return method._layer_map(request.inputs, request.target,
                             request.shared["additional_forward_args"], own,
                             method.model if request.model is None else request.model)


class GradCAM(ImplicitBaselineMethod):
    """Grad-CAM at ``layer``, upsampled to the input (see the module docstring): one forward
    and one backward pass. Equals Captum's ``LayerGradCam`` +
    ``LayerAttribution.interpolate`` with the same ``relu_attributions`` and mode, expanded
    over the input channels; ``upsample=False`` is ``LayerGradCam`` itself (the map at the
    layer's resolution, also for tuple inputs and ``additional_forward_args``)."""

    name = "grad_cam"

    #: ``layer=`` names ``conv_layer`` (Grad-CAM has no other use for a layer); ``upsample=False``
    #: answers by its own path (:func:`_layer_resolution`)
    traits = replace(ImplicitBaselineMethod.traits, layer_option=("conv_layer", "conv_layer_input"),
                     route=_layer_resolution)

    def _layer_map(self, inputs, target, extra, opts, model) -> Explanation:
        """The map at the layer's resolution for any inputs, from one forward and backward
        of the user's model. Token ids and other integer inputs reach the model as they are:
        the map is differentiated at the layer, never at the inputs."""
        parts, _ = as_tuple(inputs)
        batch = check_batch(parts, floats=False)
        extra = check_additional_args(extra, batch)
        parts = tuple(p.detach().clone().requires_grad_(p.is_floating_point()) for p in parts)
        with torch.no_grad():
            out = run_model(lambda _: model(*parts, *extra), parts[0])
        read = self._read_output(out, parts, target, discrete=False, layer=None)
        module, relu = self._settings(opts)
        m = cam(read.wrap(model, (None,) * len(parts)), module, parts + extra, read.target, relu,
                opts.get("conv_layer_input", False), opts.get("sum_channels", True))
        return Explanation(m, None, read.fx.detach(), read.target, None)

    def _settings(self, opts):
        relu = check_bool(opts.get("relu_attributions", False), "relu_attributions")
        mode = opts.get("interpolate_mode", "nearest")
        if mode not in _MODES:
            raise ValueError(f"interpolate_mode must be one of {list(_MODES)}, got {mode!r}")
        for key in ("upsample", "conv_layer_input", "sum_channels"):
            check_bool(opts.get(key, key != "conv_layer_input"), key)
        unknown = sorted(set(opts) - set(self.options()))
        if unknown:
            raise TypeError(f"GradCAM.attribute got unexpected keyword argument(s) "
                            f"{', '.join(map(repr, unknown))}")
        return find_layer(self._model, opts.get("conv_layer")), relu

    @overload
    def attribute(self, inputs: Inputs, target: Target = ..., *, conv_layer: Any = ...,
                  relu_attributions: bool = ..., interpolate_mode: str = ...,
                  upsample: bool = ..., conv_layer_input: bool = ..., sum_channels: bool = ...,
                  return_convergence_delta: Literal[False] = ..., show_progress: bool = ...,
                  strict: bool = ..., additional_forward_args: Any = ..., layer: Any = ...,
                  attribute_to_layer_input: Any = ..., layer_baselines: Any = ...,
                  layer_delta: str = ...) -> Attributions: ...

    @overload
    def attribute(self, inputs: Inputs, target: Target = ..., *, conv_layer: Any = ...,
                  relu_attributions: bool = ..., interpolate_mode: str = ...,
                  upsample: bool = ..., conv_layer_input: bool = ..., sum_channels: bool = ...,
                  return_convergence_delta: Literal[True], show_progress: bool = ...,
                  strict: bool = ..., additional_forward_args: Any = ..., layer: Any = ...,
                  attribute_to_layer_input: Any = ..., layer_baselines: Any = ...,
                  layer_delta: str = ...) -> tuple[Attributions, torch.Tensor]: ...

    def attribute(self, inputs: Inputs, target: Target = None, *, conv_layer: Any = None,
                  relu_attributions: bool = False, interpolate_mode: str = "nearest",
                  upsample: bool = True, conv_layer_input: bool = False,
                  sum_channels: bool = True, return_convergence_delta: bool = False,
                  show_progress: bool = False, strict: bool = False,
                  additional_forward_args: Any = None, layer: Any = CONSTRUCTED,
                  attribute_to_layer_input: Any = CONSTRUCTED, layer_baselines: Any = None,
                  layer_delta: str = "layer") -> Attributions | tuple[Attributions, torch.Tensor]:
        """GradCAM: attributions shaped like ``inputs`` (with
        ``return_convergence_delta=True`` and the delta ``[B]``); its options are
        ``_attribute``'s, the shared arguments :data:`~taylorattr.methods._call.SHARED_DOC`."""
        return self.explain(**given(locals())).result()

    def _attribute(self, call, x, baselines, target, fx, *, conv_layer=None, relu_attributions: bool = False,
                   interpolate_mode: str = "nearest", upsample: bool = True,
                   conv_layer_input: bool = False, sum_channels: bool = True,
                   show_progress: bool = False):
        """Options: ``conv_layer`` (submodule or its name; default the last convolution),
        ``relu_attributions`` (ReLU of the map, as published), ``interpolate_mode``
        (``torch.nn.functional.interpolate``'s mode, default ``"nearest"`` as Captum);
        ``upsample=False``: the map at the layer's resolution (Captum's ``LayerGradCam``);
        ``conv_layer_input``: use the layer's input instead of its output;
        ``sum_channels=False``: the per-channel terms ``alpha_c A_c`` (Captum's
        ``attr_dim_summation=False``, with ``upsample=False``)."""
        module, relu = self._settings({"conv_layer": conv_layer, "relu_attributions":
                                       relu_attributions, "interpolate_mode": interpolate_mode,
                                       "conv_layer_input": conv_layer_input})
        m = cam(call.model, module, (x.clone().requires_grad_(True),), target, relu,
                conv_layer_input, sum_channels)
        if isinstance(m, tuple):  # a valid layer; upsampling is what does not fit it
            raise ValueError(f"conv_layer ({type(module).__name__}) returns {len(m)} tensors, "  # noqa: TRY004
                             "so Grad-CAM has one map per tensor; pass upsample=False for the "
                             "tuple of maps at the layer's resolution")
        if m.dim() != x.dim():
            if m.dim() == 2:
                raise ValueError(f"conv_layer output {tuple(m.shape)} has no spatial dimensions, "
                                 "so its Grad-CAM map (one value per sample) cannot be upsampled "
                                 "to the inputs; pass upsample=False for the map [B, 1]")
            raise ValueError(f"conv_layer output must be [B, C, *spatial] with the inputs' "
                             f"{x.dim() - 2} spatial dimension(s), got a map of shape "
                             f"{tuple(m.shape)} for inputs {tuple(x.shape)}")
        if not sum_channels:
            raise ValueError("sum_channels=False gives per-channel maps; use it with "
                             "upsample=False")
        m = F.interpolate(m, tuple(x.shape[2:]), mode=interpolate_mode)
        return Attributed(m.expand_as(x).contiguous(), torch.zeros_like(x).unsqueeze(1))

    def _cost(self, x, options):
        """One forward of the batch with its graph, swept back from the explained output to
        the layer (a backward row each); the zero input is the one reference."""
        return gradient_pass_cost(x.shape[0]), 1
