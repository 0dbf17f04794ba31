"""``captum.attr``'s names over taylorattr's methods: ``from taylorattr.captum.attr import
IntegratedGradients`` in place of ``from captum.attr import IntegratedGradients``.

Every class takes Captum's constructor and ``attribute`` arguments, with Captum's defaults,
return structures and delta shapes; the numbers come from :mod:`taylorattr.methods`.
Options taylorattr does not offer raise ``NotImplementedError`` naming them (docs/captum.md,
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
from . import visualization
from ._cam import Deconvolution, GuidedGradCam, LayerGradCam
from ._embedding import (
    InterpretableEmbeddingBase,
    ProductBaselines,
    TokenReferenceBase,
    configure_interpretable_embedding_layer,
    remove_interpretable_embedding_layer,
)
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
from ._layer import InternalInfluence, LayerActivation, NeuronConductance
from ._llm import (
    InterpretableInput,
    LLMAttribution,
    LLMAttributionResult,
    LLMGradientAttribution,
    TextTemplateInput,
    TextTokenInput,
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
    FeaturePermutation,
    KernelShap,
    LayerFeatureAblation,
    LayerFeaturePermutation,
    Lime,
    Occlusion,
    ShapleyValues,
    ShapleyValueSampling,
)
from ._refused import (
    DataLoaderAttribution,
    ImageMaskInput,
    LimeBase,
    RemoteLLMAttribution,
    RemoteLLMProvider,
    VLLMProvider,
)
from ._summarizer import (
    MSE,
    ClassSummarizer,
    CommonStats,
    Count,
    Max,
    Mean,
    Min,
    StatValue,
    StdDev,
    Sum,
    Summarizer,
    SummarizerSingleTensor,
    Var,
)

__all__ = [
    "LRP", "MSE", "Alpha1_Beta0_Rule", "Attribution", "ClassSummarizer", "CommonStats", "Count",
    "DataLoaderAttribution", "Deconvolution", "DeepLift", "DeepLiftShap", "EpsilonRule",
    "FeatureAblation", "FeaturePermutation", "GammaRule", "GradientAttribution",
    "GradientShap", "GuidedBackprop", "GuidedGradCam", "IdentityRule", "ImageMaskInput",
    "InputXGradient", "IntegratedGradients", "InternalInfluence", "InterpretableEmbeddingBase",
    "InterpretableInput", "KernelShap", "LLMAttribution", "LLMAttributionResult",
    "LLMGradientAttribution", "LayerActivation", "LayerAttribution", "LayerConductance",
    "LayerDeepLift", "LayerDeepLiftShap", "LayerFeatureAblation", "LayerFeaturePermutation",
    "LayerGradCam", "LayerGradientShap", "LayerGradientXActivation",
    "LayerIntegratedGradients", "LayerLRP", "Lime", "LimeBase", "Max", "Mean", "Min",
    "NeuronAttribution", "NeuronConductance", "NeuronDeconvolution", "NeuronDeepLift",
    "NeuronDeepLiftShap", "NeuronFeatureAblation", "NeuronGradient", "NeuronGradientShap",
    "NeuronGuidedBackprop", "NeuronIntegratedGradients", "NoiseTunnel", "Occlusion",
    "PerturbationAttribution", "ProductBaselines", "PropagationRule", "RemoteLLMAttribution",
    "RemoteLLMProvider", "Saliency", "ShapleyValueSampling", "ShapleyValues", "StatValue",
    "StdDev", "Sum", "Summarizer", "SummarizerSingleTensor", "TextTemplateInput",
    "TextTokenInput", "TokenReferenceBase", "VLLMProvider", "Var",
    "configure_interpretable_embedding_layer", "remove_interpretable_embedding_layer",
    "visualization",
]
