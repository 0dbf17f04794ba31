"""Captum's ``LayerGradCam``, ``GuidedGradCam``, ``Deconvolution`` over the native methods."""
from __future__ import annotations

import torch

from ... import methods as native
from .._mapping import Call, GradientAttribution, LayerAttribution, layer_inputs
from ._gradient import GuidedBackprop, _grad_kwargs

__all__ = ["Deconvolution", "GuidedGradCam", "LayerGradCam"]


class LayerGradCam(LayerAttribution, GradientAttribution):
    """Captum's ``LayerGradCam``: :class:`taylorattr.methods.GradCAM` with
    ``upsample=False`` (the map at the layer's resolution ``[B, 1, ...]``)."""

    def __init__(self, forward_func, layer, device_ids=None) -> None:
        super().__init__(forward_func, layer, device_ids)
        self._native = native.GradCAM(forward_func)

    def has_convergence_delta(self) -> bool:
        return False

    def _call(self, inputs, target=None, additional_forward_args=None,
              attribute_to_layer_input: bool = False, relu_attributions: bool = False,
              attr_dim_summation: bool = True, grad_kwargs=None):
        _grad_kwargs(grad_kwargs)
        return Call(self._native, inputs, None, target, additional_forward_args, False,
                    {"conv_layer": self.layer, "upsample": False,
                     "relu_attributions": relu_attributions,
                     "conv_layer_input": attribute_to_layer_input,
                     "sum_channels": attr_dim_summation})

    def attribute(self, inputs, target=None, additional_forward_args=None,
                  attribute_to_layer_input: bool = False, relu_attributions: bool = False,
                  attr_dim_summation: bool = True, grad_kwargs=None):
        call = self._call(inputs, target, additional_forward_args, attribute_to_layer_input,
                          relu_attributions, attr_dim_summation, grad_kwargs)
        try:
            return call.run()
        except RuntimeError as exc:
            # a layer the forward does not use has zero gradients: with Captum's
            # materialize_grads its map is 0 (of the layer's shape, channels summed)
            if "not have been used in the graph" not in str(exc) or \
                    not (grad_kwargs or {}).get("materialize_grads"):
                raise
            h = layer_inputs(self.forward_func, self.layer, inputs, additional_forward_args,
                             attribute_to_layer_input)
            h = h[0] if isinstance(h, tuple) else h
            shape = (h.shape[0], 1, *h.shape[2:]) if attr_dim_summation else tuple(h.shape)
            return torch.zeros(shape, dtype=h.dtype, device=h.device)


class GuidedGradCam(GradientAttribution):
    """Captum's ``GuidedGradCam``: :class:`taylorattr.methods.GuidedGradCam`."""

    def __init__(self, model, layer, device_ids=None) -> None:
        super().__init__(model)
        self.layer, self.device_ids = layer, device_ids
        self._native = native.GuidedGradCam(model)

    def has_convergence_delta(self) -> bool:
        return False

    def _call(self, inputs, target=None, additional_forward_args=None,
              interpolate_mode: str = "nearest", attribute_to_layer_input: bool = False):
        return Call(self._native, inputs, None, target, additional_forward_args, False,
                    {"conv_layer": self.layer, "interpolate_mode": interpolate_mode,
                     "conv_layer_input": attribute_to_layer_input, "unmatched": "empty"})

    def attribute(self, inputs, target=None, additional_forward_args=None,
                  interpolate_mode: str = "nearest", attribute_to_layer_input: bool = False):
        return self._call(inputs, target, additional_forward_args, interpolate_mode,
                          attribute_to_layer_input).run()


class Deconvolution(GuidedBackprop):
    """Captum's ``Deconvolution``: :class:`taylorattr.methods.Deconvolution`."""

    _native_cls = native.Deconvolution
