"""taylorattr: exact Taylor decompositions and attribution methods for PyTorch.

Implements the Unified Taylor Framework (Deng et al., AAAI 2021). Names are loaded
lazily so that ``import taylorattr`` stays light and never needs torchvision.
"""
from __future__ import annotations

import importlib

__version__ = "0.1.0"

_EXPORTS = {
    "TaylorTerms": "taylorattr.taylor.terms",
    "taylor_terms": "taylorattr.taylor.terms",
    "register_taylor_rule": "taylorattr.taylor.mode",
    "supported_ops": "taylorattr.taylor.mode",
    "smooth": "taylorattr.taylor.smoothing",
    "SmoothedModel": "taylorattr.taylor.smoothing",
    "GradientInput": "taylorattr.methods",
    "Occlusion": "taylorattr.methods",
    "DeepLift": "taylorattr.methods",
    "EpsilonLRP": "taylorattr.methods",
    "IntegratedGradients": "taylorattr.methods",
    "ExpectedGradients": "taylorattr.methods",
    "TaylorAttribution": "taylorattr.methods",
    "METHODS": "taylorattr.registry",
    "MethodSpec": "taylorattr.registry",
    "register": "taylorattr.registry",
    "reformulate": "taylorattr.registry",
    "reformulate_orders": "taylorattr.registry",
    "Point": "taylorattr.baselines",
    "ReferenceSet": "taylorattr.baselines",
    "Noise": "taylorattr.baselines",
    "audit": "taylorattr.principles",
    "AuditReport": "taylorattr.principles",
    "Interactions": "taylorattr.taylor.pair_interactions",
    "interactions": "taylorattr.taylor.pair_interactions",
    "integrated_hessians": "taylorattr.taylor.path_hessians",
    "polynomial_integrated_hessians": "taylorattr.taylor.path_hessians",
    "network_integrated_hessians": "taylorattr.methods.integrated_hessians",
    "shapley_interactions": "taylorattr.methods.shapley_interactions",
    "shapley_rule_error": "taylorattr.methods.truncation",
    "integrated_hessians_error": "taylorattr.methods.truncation",
    "shapley_attribution": "taylorattr.taylor.shapley_rule",
    "interaction_map": "taylorattr.reporting.interaction_plot",
    "tune_allocator": "taylorattr.runtime.allocator",
    "CompletenessWarning": "taylorattr.runtime.completeness",
    "CompletenessError": "taylorattr.runtime.completeness",
    "evaluate": "taylorattr.experiments.evaluate",
}
#: Sub-packages by attribute name (``ta.taylor_mode`` and ``ta.plotting`` are their homes'
#: short names: ``taylorattr.taylor.mode`` and ``taylorattr.reporting.plotting``).
_SUBMODULES = {name: f"taylorattr.{name}" for name in (
    "baselines", "data", "experiments", "groups", "metrics", "methods", "models", "paper_methods",
    "principles",
    "registry", "reporting", "runtime", "series", "taylor")} | {
    "taylor_mode": "taylorattr.taylor.mode", "plotting": "taylorattr.reporting.plotting",
    "reformulations": "taylorattr.methods.reformulations"}

__all__ = sorted(_EXPORTS.keys() | _SUBMODULES.keys())  # noqa: PLE0605 (from the lazy table)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    if name in _SUBMODULES:
        return importlib.import_module(_SUBMODULES[name])
    raise AttributeError(f"module 'taylorattr' has no attribute {name!r}")


def __dir__():
    return __all__
