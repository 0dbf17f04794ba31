"""Evaluation metrics: pure functions over batched tensors, one value per sample.

``METRICS`` maps each metric's name to its function; every registered metric passes the
common invariance test in ``tests/test_metrics.py`` (batch-order equivariance, per-sample
independence, float32/float64 agreement, errors on mismatched shapes).
"""
from __future__ import annotations

from .fidelity import approximation_error, percentage_change
from .localisation import bbox_accuracy, boxes_to_mask
from .perturbation import gaussian_perturbation, infidelity, infidelity_cost, square_removal
from .sensitivity import max_sensitivity

METRICS = {
    "percentage_change": percentage_change,
    "approximation_error": approximation_error,
    "infidelity": infidelity,
    "max_sensitivity": max_sensitivity,
    "bbox_accuracy": bbox_accuracy,
}

__all__ = [
    "METRICS",
    "approximation_error",
    "bbox_accuracy",
    "boxes_to_mask",
    "gaussian_perturbation",
    "infidelity",
    "infidelity_cost",
    "max_sensitivity",
    "percentage_change",
    "square_removal",
]
