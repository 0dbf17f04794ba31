"""taylorattr: exact Taylor decompositions and attribution methods for PyTorch.

Implements the Unified Taylor Framework (Deng et al., AAAI 2021)::

    import taylorattr as ta
    attr = ta.IntegratedGradients(model).attribute(x, baselines=0.0, target=3, n_steps=50)

Every public class and function of the library is here: the attribution methods (one
class each, :mod:`taylorattr.methods`), Taylor decompositions and interactions
(:mod:`taylorattr.taylor`), the method registry (:mod:`taylorattr.registry`), baselines,
metrics and the run-time errors and warnings. Names are loaded lazily (on first access,
from the module named in ``_EXPORTS``) so that ``import taylorattr`` stays light and never
needs torchvision; the ``TYPE_CHECKING`` block names the same imports for editors and
type checkers (``tests/test_public_api.py`` keeps the two equal).

The paper's application (its experiments, principle audit, models, data and reports) is
not here: it is reached through its own modules, ``taylorattr.experiments.evaluate``,
``taylorattr.principles.audit``, ``taylorattr.reporting.interaction_plot``; importing it
registers the paper's variants on :data:`METHODS`, which no attribute of this package does.
"""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

_METHODS = (
    "AttributionMethod", "Deconvolution", "DeepLift", "DeepLiftShap", "EGDraws", "EpsilonLRP",
    "ExpectedGradients", "Explanation", "GSDraws", "GradCAM", "GradientInput", "GradientShap",
    "GuidedBackprop", "GuidedGradCam", "ImplicitBaselineMethod", "IntegratedGradients",
    "KernelShap", "LRP", "LayerConductance", "LayerRecord", "Lime", "NoiseTunnel", "Occlusion",
    "PredictionDifference", "Saliency", "ShapleyValues", "SmoothGrad",
    "SmoothIntegratedGradients", "TaylorAttribution", "UnsupportedModelError",
    "global_relevance", "local_relevance")

#: Public name -> the module it is imported from.
_EXPORTS = {name: "taylorattr.methods" for name in _METHODS} | {
    "network_integrated_hessians": "taylorattr.methods.integrated_hessians",
    "explain_generation": "taylorattr.methods.generation",
    "GenerationExplanation": "taylorattr.methods.generation",
    "shapley_interactions": "taylorattr.methods.shapley_interactions",
    "shapley_rule_error": "taylorattr.methods.truncation",
    "integrated_hessians_error": "taylorattr.methods.truncation",
    "TaylorTerms": "taylorattr.taylor",
    "taylor_terms": "taylorattr.taylor",
    "register_taylor_rule": "taylorattr.taylor",
    "supported_ops": "taylorattr.taylor",
    "smooth": "taylorattr.taylor",
    "SmoothedModel": "taylorattr.taylor",
    "Interactions": "taylorattr.taylor",
    "interactions": "taylorattr.taylor",
    "integrated_hessians": "taylorattr.taylor",
    "polynomial_integrated_hessians": "taylorattr.taylor",
    "shapley_attribution": "taylorattr.taylor",
    "UnsupportedOperation": "taylorattr.taylor.mode",
    "METHODS": "taylorattr.registry",
    "MethodSpec": "taylorattr.registry",
    "Variant": "taylorattr.registry",
    "register": "taylorattr.registry",
    "unregister": "taylorattr.registry",
    "resolve": "taylorattr.registry",
    "reformulate": "taylorattr.registry",
    "reformulate_orders": "taylorattr.registry",
    "Point": "taylorattr.baselines",
    "ReferenceSet": "taylorattr.baselines",
    "Noise": "taylorattr.baselines",
    "infidelity": "taylorattr.metrics",
    "max_sensitivity": "taylorattr.metrics",
    "tune_allocator": "taylorattr.runtime",
    "CompletenessWarning": "taylorattr.runtime.completeness",
    "CompletenessError": "taylorattr.runtime.completeness",
    "CaptureError": "taylorattr.capture",
}
#: The library's sub-packages by attribute name (``ta.taylor_mode`` is the short name of
#: ``taylorattr.taylor.mode``).
_SUBMODULES = {name: f"taylorattr.{name}" for name in (
    "baselines", "captum", "groups", "methods", "metrics", "registry", "runtime", "series",
    "taylor", "testing")} | {
    "taylor_mode": "taylorattr.taylor.mode", "reformulations": "taylorattr.methods.reformulations"}

#: The paper's application, no longer here: how to import each name now (an error says so).
_MOVED = {"evaluate": "from taylorattr.experiments.evaluate import evaluate",
          "audit": "from taylorattr.principles import audit",
          "AuditReport": "from taylorattr.principles import AuditReport",
          "interaction_map": "from taylorattr.reporting.interaction_plot import interaction_map",
          "plotting": "from taylorattr.reporting import plotting"} | {
    name: f"import taylorattr.{name}" for name in (
        "data", "experiments", "models", "paper_methods", "principles", "reporting")}

__all__ = sorted(_EXPORTS.keys() | _SUBMODULES.keys())  # noqa: PLE0605 (from the lazy table)

if TYPE_CHECKING:  # the same names, for editors and type checkers (no import at run time)
    from . import baselines as baselines
    from . import captum as captum
    from . import groups as groups
    from . import methods as methods
    from . import metrics as metrics
    from . import registry as registry
    from . import runtime as runtime
    from . import series as series
    from . import taylor as taylor
    from . import testing as testing
    from .baselines import Noise as Noise
    from .baselines import Point as Point
    from .baselines import ReferenceSet as ReferenceSet
    from .capture import CaptureError as CaptureError
    from .methods import LRP as LRP
    from .methods import AttributionMethod as AttributionMethod
    from .methods import Deconvolution as Deconvolution
    from .methods import DeepLift as DeepLift
    from .methods import DeepLiftShap as DeepLiftShap
    from .methods import EGDraws as EGDraws
    from .methods import EpsilonLRP as EpsilonLRP
    from .methods import ExpectedGradients as ExpectedGradients
    from .methods import Explanation as Explanation
    from .methods import GradCAM as GradCAM
    from .methods import GradientInput as GradientInput
    from .methods import GradientShap as GradientShap
    from .methods import GSDraws as GSDraws
    from .methods import GuidedBackprop as GuidedBackprop
    from .methods import GuidedGradCam as GuidedGradCam
    from .methods import ImplicitBaselineMethod as ImplicitBaselineMethod
    from .methods import IntegratedGradients as IntegratedGradients
    from .methods import KernelShap as KernelShap
    from .methods import LayerConductance as LayerConductance
    from .methods import LayerRecord as LayerRecord
    from .methods import Lime as Lime
    from .methods import NoiseTunnel as NoiseTunnel
    from .methods import Occlusion as Occlusion
    from .methods import PredictionDifference as PredictionDifference
    from .methods import Saliency as Saliency
    from .methods import ShapleyValues as ShapleyValues
    from .methods import SmoothGrad as SmoothGrad
    from .methods import SmoothIntegratedGradients as SmoothIntegratedGradients
    from .methods import TaylorAttribution as TaylorAttribution
    from .methods import UnsupportedModelError as UnsupportedModelError
    from .methods import global_relevance as global_relevance
    from .methods import local_relevance as local_relevance
    from .methods import reformulations as reformulations
    from .methods.generation import GenerationExplanation as GenerationExplanation
    from .methods.generation import explain_generation as explain_generation
    from .methods.integrated_hessians import (
        network_integrated_hessians as network_integrated_hessians,
    )
    from .methods.shapley_interactions import shapley_interactions as shapley_interactions
    from .methods.truncation import integrated_hessians_error as integrated_hessians_error
    from .methods.truncation import shapley_rule_error as shapley_rule_error
    from .metrics import infidelity as infidelity
    from .metrics import max_sensitivity as max_sensitivity
    from .registry import METHODS as METHODS
    from .registry import MethodSpec as MethodSpec
    from .registry import Variant as Variant
    from .registry import reformulate as reformulate
    from .registry import reformulate_orders as reformulate_orders
    from .registry import register as register
    from .registry import resolve as resolve
    from .registry import unregister as unregister
    from .runtime import tune_allocator as tune_allocator
    from .runtime.completeness import CompletenessError as CompletenessError
    from .runtime.completeness import CompletenessWarning as CompletenessWarning
    from .taylor import Interactions as Interactions
    from .taylor import SmoothedModel as SmoothedModel
    from .taylor import TaylorTerms as TaylorTerms
    from .taylor import integrated_hessians as integrated_hessians
    from .taylor import interactions as interactions
    from .taylor import mode as taylor_mode  # noqa: F401 (its short name, in __all__)
    from .taylor import polynomial_integrated_hessians as polynomial_integrated_hessians
    from .taylor import register_taylor_rule as register_taylor_rule
    from .taylor import shapley_attribution as shapley_attribution
    from .taylor import smooth as smooth
    from .taylor import supported_ops as supported_ops
    from .taylor import taylor_terms as taylor_terms
    from .taylor.mode import UnsupportedOperation as UnsupportedOperation


if not TYPE_CHECKING:  # hidden from type checkers: a misspelt ``ta.X`` is their error
    def __getattr__(name: str) -> Any:
        if name in _EXPORTS:
            return getattr(importlib.import_module(_EXPORTS[name]), name)
        if name in _SUBMODULES:
            return importlib.import_module(_SUBMODULES[name])
        if name in _MOVED:
            raise AttributeError(f"taylorattr.{name} is part of the paper's application, not the "
                                 f"library's top level: {_MOVED[name]}")
        raise AttributeError(f"module 'taylorattr' has no attribute {name!r}")

    def __dir__() -> list[str]:
        return __all__
