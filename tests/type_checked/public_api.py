"""What a user's type checker sees of the public API: checked by mypy (``make lint``,
``tests/test_public_api.py``), never run. Each line is a use a user writes; an annotation
the API does not satisfy, or a name the top level lacks, is a type error."""
from __future__ import annotations

import torch
from torch import nn

import taylorattr as ta


def explain(model: nn.Module, x: torch.Tensor) -> list[ta.AttributionMethod]:
    methods: list[ta.AttributionMethod] = [
        ta.IntegratedGradients(model), ta.Saliency(model), ta.GuidedBackprop(model),
        ta.Deconvolution(model), ta.KernelShap(model), ta.Lime(model), ta.LRP(model),
        ta.ShapleyValues(model), ta.DeepLift(model), ta.GradientInput(model),
        ta.NoiseTunnel(ta.IntegratedGradients(model)), ta.NoiseTunnel(model, "saliency"),
    ]
    return methods


def attribute(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    ta.IntegratedGradients(model).attribute(x, baselines=0.0, target=1, n_steps=16)
    _, delta = ta.IntegratedGradients(model).attribute(x, 0.0, target=1,
                                                       return_convergence_delta=True)
    d: torch.Tensor = delta
    return d


def decompose(model: nn.Module, x: torch.Tensor) -> tuple[ta.TaylorTerms, ta.Interactions]:
    terms: ta.TaylorTerms = ta.taylor_terms(model, x, 0.0, target=0, order=2)
    pairs: ta.Interactions = ta.interactions(model, x, order=2)
    smoothed: ta.SmoothedModel = ta.smooth(model, 10.0)
    score: torch.Tensor = ta.infidelity(smoothed, x, terms.first, target=0)
    del score
    return terms, pairs


def registry() -> list[str]:
    spec: ta.MethodSpec = ta.METHODS["saliency"]
    ops: dict[str, list[str]] = ta.supported_ops()
    errors: tuple[type[Exception], ...] = (ta.CompletenessError, ta.UnsupportedModelError,
                                           ta.UnsupportedOperation, ta.CaptureError)
    del errors
    return [spec.name, *ops]
