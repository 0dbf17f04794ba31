"""The attribution methods, one file each, one call contract (docs/design.md)::

    from taylorattr.methods import DeepLift
    attr = DeepLift(model).attribute(inputs, baselines=0.0, target=None)

The registry of methods (labels, baseline kinds, paper facts, Taylor reformulations)
is :mod:`taylorattr.registry`; this package holds only the methods themselves.

DeepLIFT and epsilon-LRP also give their per-layer terms (paper Thm 4 and supplement)::

    records = DeepLift(model).layer_records(inputs, baselines, target)  # one per Linear/Conv
    a = local_relevance(records[0])    # [B, out, in] (conv: [B, C_out, L, K]) local a_ij^(l)

See :mod:`taylorattr.methods.layerwise` for what the layer-wise rules support.
"""
from __future__ import annotations

from ._base import AttributionMethod, Call, Explanation, ImplicitBaselineMethod
from .deconvolution import Deconvolution
from .deeplift import DeepLift
from .deeplift_shap import DeepLiftShap
from .expected_gradients import EGDraws, ExpectedGradients
from .grad_cam import GradCAM
from .gradient_input import GradientInput
from .gradient_shap import GradientShap, GSDraws
from .guided_backprop import GuidedBackprop
from .guided_grad_cam import GuidedGradCam
from .integrated_gradients import IntegratedGradients
from .kernel_shap import KernelShap
from .layer_conductance import LayerConductance
from .layerwise import LayerRecord, UnsupportedModelError, global_relevance, local_relevance
from .lime import Lime
from .lrp import EpsilonLRP
from .lrp_rules import LRP
from .noise_tunnel import NoiseTunnel, SmoothGrad, SmoothIntegratedGradients
from .occlusion import Occlusion
from .prediction_difference import PredictionDifference
from .saliency import Saliency
from .shapley_values import ShapleyValues
from .taylor_attribution import TaylorAttribution

__all__ = [
    "AttributionMethod",
    "Call",
    "DeepLift",
    "DeepLiftShap",
    "EGDraws",
    "EpsilonLRP",
    "ExpectedGradients",
    "Explanation",
    "GSDraws",
    "GradCAM",
    "GradientInput",
    "GradientShap",
    "GuidedBackprop",
    "ImplicitBaselineMethod",
    "IntegratedGradients",
    "LayerRecord",
    "NoiseTunnel",
    "Occlusion",
    "Saliency",
    "SmoothGrad",
    "SmoothIntegratedGradients",
    "TaylorAttribution",
    "UnsupportedModelError",
    "global_relevance",
    "local_relevance",
]
__all__ += ["LRP", "KernelShap", "PredictionDifference", "ShapleyValues"]
__all__ += ["Deconvolution", "GuidedGradCam", "LayerConductance", "Lime"]
