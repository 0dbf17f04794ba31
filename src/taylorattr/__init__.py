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
    "GradientInput": "taylorattr.methods",
    "Occlusion": "taylorattr.methods",
    "DeepLift": "taylorattr.methods",
    "EpsilonLRP": "taylorattr.methods",
    "IntegratedGradients": "taylorattr.methods",
    "ExpectedGradients": "taylorattr.methods",
    "METHODS": "taylorattr.methods",
    "reformulate": "taylorattr.reformulations",
    "reformulate_orders": "taylorattr.reformulations",
    "audit": "taylorattr.principles",
    "AuditReport": "taylorattr.principles",
    "tune_allocator": "taylorattr.allocator",
}
_SUBMODULES = {"metrics", "models", "data", "methods", "experiments", "plotting", "principles",
               "reformulations", "taylor"}

__all__ = sorted(_EXPORTS.keys() | _SUBMODULES)  # noqa: PLE0605 (from the lazy table)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    if name in _SUBMODULES:
        return importlib.import_module(f"taylorattr.{name}")
    raise AttributeError(f"module 'taylorattr' has no attribute {name!r}")


def __dir__():
    return __all__
