"""Exact Taylor expansions of a model's output change, and what is built on them.

* :mod:`.mode`: Taylor-mode propagation of a univariate series through a model
  (``propagate``, ``register_taylor_rule``), on the truncated series of :mod:`taylorattr.series`;
* :mod:`.smoothing`: smooth surrogates of piecewise-linear operations (``smooth``);
* :mod:`.terms`: the terms of ``df = f(x) - f(x~) = sum_k P_k(delta)`` per feature or
  group (``taylor_terms``, ``taylor_attribution``, ``group_expansions``);
* :mod:`.first_order_check`: their first order held to the model's own forward-mode
  derivative on every call (``check=``, ``strict=``);
* :mod:`.pair_interactions`: ``J_K(A, B) = g_K(delta_A + delta_B) - g_K(delta_A) - g_K(delta_B)``;
* :mod:`.shapley_rule`: the Shapley value of the order-K polynomial;
* :mod:`.path_hessians`: Integrated Hessians of the order-K polynomial.
"""
from __future__ import annotations

from .mode import register_taylor_rule, supported_ops
from .pair_interactions import Interactions, interactions
from .path_hessians import integrated_hessians, polynomial_integrated_hessians
from .shapley_rule import shapley_attribution
from .smoothing import SmoothedModel, smooth
from .terms import (
    TaylorTerms,
    group_expansions,
    group_expansions_cost,
    taylor_attribution,
    taylor_attribution_cost,
    taylor_terms,
    taylor_terms_cost,
)

__all__ = ["Interactions", "SmoothedModel", "TaylorTerms", "group_expansions",
           "group_expansions_cost", "integrated_hessians", "interactions",
           "polynomial_integrated_hessians", "register_taylor_rule", "shapley_attribution", "smooth", "supported_ops", "taylor_attribution",
           "taylor_attribution_cost", "taylor_terms", "taylor_terms_cost"]
