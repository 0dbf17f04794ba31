"""Captum's ``Neuron*`` attributions: the Captum-compatible method on
:class:`taylorattr.inputs.NeuronView` (the selected neuron of a layer as the model's output
``[B]``), so every number comes from the same native method as the input attributions
(DeepLIFT's layer-wise engine captures the view's graph up to the neuron)."""
from __future__ import annotations

from ...inputs import NeuronView
from .._mapping import NeuronAttribution
from ._cam import Deconvolution
from ._gradient import (
    DeepLift,
    DeepLiftShap,
    GradientShap,
    GuidedBackprop,
    IntegratedGradients,
    Saliency,
)
from ._perturbation import FeatureAblation

__all__ = ["NeuronDeconvolution", "NeuronDeepLift", "NeuronDeepLiftShap",
           "NeuronFeatureAblation", "NeuronGradient", "NeuronGradientShap",
           "NeuronGuidedBackprop", "NeuronIntegratedGradients"]


class _Neuron(NeuronAttribution):
    _compat: type = IntegratedGradients

    def __init__(self, forward_func, layer, device_ids=None, **kw) -> None:
        super().__init__(forward_func, layer, device_ids)
        self._kw = kw
        self._multiply_by_inputs = kw.get("multiply_by_inputs", False)

    def _method(self, neuron_selector, attribute_to_neuron_input: bool):
        view = NeuronView(self.forward_func, self.layer, neuron_selector,
                          attribute_to_neuron_input)
        return self._compat(view, **self._kw)


class NeuronIntegratedGradients(_Neuron):
    """Captum's ``NeuronIntegratedGradients``."""

    def __init__(self, forward_func, layer, device_ids=None,
                 multiply_by_inputs: bool = True) -> None:
        super().__init__(forward_func, layer, device_ids, multiply_by_inputs=multiply_by_inputs)

    def attribute(self, inputs, neuron_selector, baselines=None, additional_forward_args=None,
                  n_steps: int = 50, method: str = "gausslegendre", internal_batch_size=None,
                  attribute_to_neuron_input: bool = False):
        return self._method(neuron_selector, attribute_to_neuron_input).attribute(
            inputs, baselines, None, additional_forward_args, n_steps, method,
            internal_batch_size)


class NeuronGradientShap(_Neuron):
    """Captum's ``NeuronGradientShap`` (Captum's draws, as ``GradientShap``)."""

    _compat = GradientShap

    def __init__(self, forward_func, layer, device_ids=None,
                 multiply_by_inputs: bool = True) -> None:
        super().__init__(forward_func, layer, device_ids, multiply_by_inputs=multiply_by_inputs)

    def attribute(self, inputs, neuron_selector, baselines, n_samples: int = 5,
                  stdevs=0.0, additional_forward_args=None,
                  attribute_to_neuron_input: bool = False):
        return self._method(neuron_selector, attribute_to_neuron_input).attribute(
            inputs, baselines, n_samples, stdevs, None, additional_forward_args)


class NeuronFeatureAblation(_Neuron):
    """Captum's ``NeuronFeatureAblation``."""

    _compat = FeatureAblation

    def __init__(self, forward_func, layer, device_ids=None) -> None:
        super().__init__(forward_func, layer, device_ids)
        self._multiply_by_inputs = True  # Captum's perturbation attributions say so

    def attribute(self, inputs, neuron_selector, baselines=None, additional_forward_args=None,
                  feature_mask=None, attribute_to_neuron_input: bool = False,
                  perturbations_per_eval: int = 1):
        return self._method(neuron_selector, attribute_to_neuron_input).attribute(
            inputs, baselines, None, additional_forward_args, feature_mask,
            perturbations_per_eval)


class NeuronGuidedBackprop(_Neuron):
    """Captum's ``NeuronGuidedBackprop``."""

    _compat = GuidedBackprop

    def __init__(self, model, layer, device_ids=None) -> None:
        super().__init__(model, layer, device_ids)

    def attribute(self, inputs, neuron_selector, additional_forward_args=None,
                  attribute_to_neuron_input: bool = False):
        return self._method(neuron_selector, attribute_to_neuron_input).attribute(
            inputs, None, additional_forward_args)


class NeuronDeconvolution(NeuronGuidedBackprop):
    """Captum's ``NeuronDeconvolution``."""

    _compat = Deconvolution


class NeuronGradient(_Neuron):
    """Captum's ``NeuronGradient``: the signed gradient of the neuron (Saliency without abs)."""

    _compat = Saliency

    def attribute(self, inputs, neuron_selector, additional_forward_args=None,
                  attribute_to_neuron_input: bool = False):
        return self._method(neuron_selector, attribute_to_neuron_input).attribute(
            inputs, None, False, additional_forward_args)


class NeuronDeepLift(_Neuron):
    """Captum's ``NeuronDeepLift``: DeepLIFT of the selected neuron."""

    _compat = DeepLift

    def __init__(self, model, layer, multiply_by_inputs: bool = True) -> None:
        super().__init__(model, layer, None, multiply_by_inputs=multiply_by_inputs)
        self.model = model

    def attribute(self, inputs, neuron_selector, baselines=None, additional_forward_args=None,
                  attribute_to_neuron_input: bool = False, custom_attribution_func=None):
        return self._method(neuron_selector, attribute_to_neuron_input).attribute(
            inputs, baselines, None, additional_forward_args, False, custom_attribution_func)


class NeuronDeepLiftShap(NeuronDeepLift):
    """Captum's ``NeuronDeepLiftShap``: DeepLiftShap of the selected neuron."""

    _compat = DeepLiftShap
