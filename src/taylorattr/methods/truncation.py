r"""Truncation error of the order-K Taylor routes, where the exact value is affordable.

The Shapley rule (:func:`taylorattr.taylor.shapley_rule.shapley_attribution`) is the exact
Shapley value of the order-K *polynomial*'s removal game, and
:func:`taylorattr.taylor.path_hessians.polynomial_integrated_hessians` the exact Integrated
Hessians of that polynomial; both approximate the network's own values, with an error the
order does not bound in advance (on a wine MLP the Shapley rule was 13.1%, 12.4%, 6.7%, 3.1%
from exact Shapley at K = 1..4). These reports compute the network's value by an exact route
and the difference:

* :func:`shapley_rule_error`: against exact Shapley values by enumeration of all ``2^G``
  coalitions (:class:`~taylorattr.methods.ShapleyValues`, ``G <= 16`` players);
* :func:`integrated_hessians_error`: against the network's Integrated Hessians by
  Gauss-Legendre quadrature (:func:`.integrated_hessians.network_integrated_hessians`).

Each returns a :class:`TruncationReport`: ``approximation``, ``exact``, ``error =
approximation - exact`` and ``relative = ||error|| / ||exact||`` per sample.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..taylor.path_hessians import polynomial_integrated_hessians
from ..taylor.shapley_rule import shapley_attribution
from .integrated_hessians import network_integrated_hessians
from .shapley_values import ShapleyValues

__all__ = ["TruncationReport", "integrated_hessians_error", "shapley_rule_error"]


@dataclass(frozen=True)
class TruncationReport:
    """An order-K approximation beside the exact value: ``error = approximation - exact``,
    ``relative [B] = ||error|| / ||exact||`` per sample (norms over everything but the batch)."""

    approximation: torch.Tensor
    exact: torch.Tensor
    error: torch.Tensor
    relative: torch.Tensor

    @classmethod
    def of(cls, approximation: torch.Tensor, exact: torch.Tensor) -> TruncationReport:
        error = approximation - exact
        relative = error.flatten(1).norm(dim=1) / exact.flatten(1).norm(dim=1)
        return cls(approximation, exact, error, relative)


def shapley_rule_error(model, inputs: torch.Tensor, baselines=0.0, target=None,
                       order: int = 2, groups=None) -> TruncationReport:
    """The order-K Shapley rule against the network's exact Shapley values (``G <= 16``
    players: features, or the groups of ``groups``, ids broadcastable to one sample)."""
    exact_method = ShapleyValues(model)
    if groups is not None and not isinstance(groups, torch.Tensor):
        raise TypeError(f"groups must be an integer tensor of ids, got {type(groups).__name__}")
    exact = exact_method.attribute(inputs, baselines, target, method="exact",
                                   feature_mask=groups)
    rule = shapley_attribution(model, inputs, baselines, target, order, groups=groups)
    return TruncationReport.of(rule, exact)


def integrated_hessians_error(model, inputs: torch.Tensor, baselines=0.0, target=None,
                              order: int = 2, groups=None, *, n_steps: int = 16
                              ) -> TruncationReport:
    """The order-K polynomial's Integrated Hessians against the network's (quadrature with
    ``n_steps`` Gauss-Legendre nodes per path parameter; raise it if its own error estimate,
    ``network_integrated_hessians(..., return_error=True)``, is not small)."""
    exact = network_integrated_hessians(model, inputs, baselines, target, groups,
                                        n_steps=n_steps)
    poly = polynomial_integrated_hessians(model, inputs, baselines, target, order, groups)
    return TruncationReport.of(poly, exact)
