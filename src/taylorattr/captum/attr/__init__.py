"""``captum.attr``'s names over taylorattr's methods: ``from taylorattr.captum.attr import
IntegratedGradients`` in place of ``from captum.attr import IntegratedGradients``.

Every class takes Captum's constructor and ``attribute`` arguments, with Captum's defaults,
return structures and delta shapes; the numbers come from :mod:`taylorattr.methods`.
Options taylorattr does not offer raise ``NotImplementedError`` naming them (README,
"Coming from Captum").
"""
from __future__ import annotations

from .._mapping import (
    Attribution,
    GradientAttribution,
    LayerAttribution,
    NeuronAttribution,
    PerturbationAttribution,
)
from ._cam import Deconvolution, GuidedGradCam, LayerGradCam
from ._gradient import (
    DeepLift,
    DeepLiftShap,
    GradientShap,
    GuidedBackprop,
    InputXGradient,
    IntegratedGradients,
    LayerConductance,
    LayerDeepLift,
    LayerDeepLiftShap,
    LayerGradientShap,
    LayerGradientXActivation,
    LayerIntegratedGradients,
    Saliency,
)
from ._lrp import (
    LRP,
    Alpha1_Beta0_Rule,
    EpsilonRule,
    GammaRule,
    IdentityRule,
    LayerLRP,
    PropagationRule,
)
from ._neuron import (
    NeuronDeconvolution,
    NeuronDeepLift,
    NeuronDeepLiftShap,
    NeuronFeatureAblation,
    NeuronGradient,
    NeuronGradientShap,
    NeuronGuidedBackprop,
    NeuronIntegratedGradients,
)
from ._noise_tunnel import NoiseTunnel
from ._perturbation import (
    FeatureAblation,
    KernelShap,
    LayerFeatureAblation,
    Lime,
    Occlusion,
    ShapleyValues,
    ShapleyValueSampling,
)

__all__ = [
    "LRP", "Alpha1_Beta0_Rule", "Attribution", "Deconvolution", "DeepLift", "DeepLiftShap",
    "EpsilonRule", "FeatureAblation", "GammaRule", "GradientAttribution", "GradientShap",
    "GuidedBackprop", "GuidedGradCam", "IdentityRule", "InputXGradient",
    "IntegratedGradients", "KernelShap", "LayerAttribution", "LayerConductance", "LayerDeepLift",
    "LayerDeepLiftShap", "LayerFeatureAblation", "LayerGradCam", "LayerGradientShap",
    "LayerGradientXActivation", "LayerIntegratedGradients", "LayerLRP", "Lime", "NeuronAttribution",
    "NeuronDeconvolution", "NeuronDeepLift", "NeuronDeepLiftShap", "NeuronFeatureAblation", "NeuronGradient", "NeuronGradientShap",
    "NeuronGuidedBackprop", "NeuronIntegratedGradients", "NoiseTunnel",
    "Occlusion", "PerturbationAttribution", "PropagationRule", "Saliency", "ShapleyValueSampling",
    "ShapleyValues",
]
