"""taylorattr: exact Taylor decompositions and attribution methods for PyTorch.

Implements the Unified Taylor Framework (Deng et al., AAAI 2021). Names are loaded
lazily so that ``import taylorattr`` stays light and never needs torchvision.
"""
from __future__ import annotations

import importlib

__version__ = "0.1.0"

_EXPORTS = {
    "TaylorTerms": "taylorattr.taylor",
    "taylor_terms": "taylorattr.taylor",
    "register_taylor_rule": "taylorattr.taylor_mode",
    "supported_ops": "taylorattr.taylor_mode",
    "smooth": "taylorattr.smoothing",
    "SmoothedModel": "taylorattr.smoothing",
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
    "Interactions": "taylorattr.pair_interactions",
    "interactions": "taylorattr.pair_interactions",
    "integrated_hessians": "taylorattr.path_hessians",
    "shapley_attribution": "taylorattr.shapley_rule",
    "interaction_map": "taylorattr.interaction_plot",
    "tune_allocator": "taylorattr.allocator",
    "evaluate": "taylorattr.experiments.evaluate",
}
_SUBMODULES = {"baselines", "metrics", "models", "data", "methods", "experiments", "plotting",
               "principles", "reformulations", "registry", "series", "taylor", "taylor_mode"}

__all__ = sorted(_EXPORTS.keys() | _SUBMODULES)  # noqa: PLE0605 (from the lazy table)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    if name in _SUBMODULES:
        return importlib.import_module(f"taylorattr.{name}")
    raise AttributeError(f"module 'taylorattr' has no attribute {name!r}")


def __dir__():
    return __all__
