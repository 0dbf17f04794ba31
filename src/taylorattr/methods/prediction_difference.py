"""Prediction Difference (Robnik-Sikonja & Kononenko 2008; Zintgraf et al. 2017).

Each feature or window ``p`` is *marginalised* over a reference distribution instead of
being set to one baseline value:

    a_p = f(x) - E_{r ~ p_ref} [ f(x with x_p := r_p) ]
        ~ f(x) - 1/n sum_k f(x with x_p := r_{k,p})

and every feature of ``p`` receives ``a_p`` (windows as :class:`~.occlusion.Occlusion`:
``patch``, ``stride``; overlapping windows average). It is Occlusion averaged over the
references: ``mean_k Occlusion(x, baseline=r_k)``. The explained output is the logit (the
library's convention), not Zintgraf's log-odds of a probability, and references are
drawn from the whole distribution, not conditioned on the window's neighbourhood.

References: every row of a :class:`~taylorattr.baselines.ReferenceSet` (or reference
tensor ``[N, ...]``) when ``n_samples`` is None; otherwise ``n_samples`` draws per sample,
made exactly as Expected Gradients draws its baselines (:func:`.expected_gradients.draw`
with the same ``seed``: rows with replacement, or :class:`~taylorattr.baselines.Noise`,
``noise_std`` as its shorthand). Cost: ``n * windows`` forward rows per sample.

Taylor view: per reference it is Occlusion's reformulation (Thm 2/3: the expansion of the
drop restricted to ``p``), averaged over the references; no reformulation is registered.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Any, Literal, overload

import torch

from ..baselines import ReferenceSet
from ..groups import count_windows
from ..runtime.cost import Cost
from ._base import Attributed, AttributionMethod
from ._call import CONSTRUCTED, Attributions, Baselines, Inputs, Target, given
from .expected_gradients import _reference_rows, draw
from .occlusion import Occlusion

__all__ = ["PredictionDifference"]


class PredictionDifference(AttributionMethod):
    """Prediction Difference: the occlusion drop of each window averaged over references."""

    name = "prediction_difference"
    traits = replace(AttributionMethod.traits, baseline_kind="distribution")

    @overload
    def attribute(self, inputs: Inputs, baselines: Baselines = ..., target: Target = ..., *,
                  patch: Any = ..., stride: Any = ..., n_samples: int | None = ...,
                  noise_std: Any = ..., seed: int = ...,
                  perturbations_per_eval: int | None = ...,
                  return_convergence_delta: Literal[False] = ..., show_progress: bool = ...,
                  strict: bool = ..., additional_forward_args: Any = ..., layer: Any = ...,
                  attribute_to_layer_input: Any = ..., layer_baselines: Any = ...,
                  layer_delta: str = ...) -> Attributions: ...

    @overload
    def attribute(self, inputs: Inputs, baselines: Baselines = ..., target: Target = ..., *,
                  patch: Any = ..., stride: Any = ..., n_samples: int | None = ...,
                  noise_std: Any = ..., seed: int = ...,
                  perturbations_per_eval: int | None = ...,
                  return_convergence_delta: Literal[True], show_progress: bool = ...,
                  strict: bool = ..., additional_forward_args: Any = ..., layer: Any = ...,
                  attribute_to_layer_input: Any = ..., layer_baselines: Any = ...,
                  layer_delta: str = ...) -> tuple[Attributions, torch.Tensor]: ...

    def attribute(self, inputs: Inputs, baselines: Baselines = None, target: Target = None, *,
                  patch: Any = 1, stride: Any = None, n_samples: int | None = None,
                  noise_std: Any = None, seed: int = 0,
                  perturbations_per_eval: int | None = None,
                  return_convergence_delta: bool = False, show_progress: bool = False,
                  strict: bool = False, additional_forward_args: Any = None,
                  layer: Any = CONSTRUCTED, attribute_to_layer_input: Any = CONSTRUCTED,
                  layer_baselines: Any = None,
                  layer_delta: str = "layer") -> Attributions | tuple[Attributions, torch.Tensor]:
        """PredictionDifference: attributions shaped like ``inputs`` (with
        ``return_convergence_delta=True`` and the delta ``[B]``); its options are
        ``_attribute``'s, the shared arguments :data:`~taylorattr.methods._call.SHARED_DOC`."""
        return self.explain(**given(locals())).result()

    def _attribute(self, call, x, baselines, t, fx, *, patch=1, stride=None,
                   n_samples: int | None = None, noise_std=None, seed: int = 0,
                   perturbations_per_eval: int | None = None, show_progress: bool = False):
        """Attributions ``[B, ...]``; ``baselines`` is the reference distribution (a
        ``ReferenceSet``, a reference tensor ``[N, ...]``, a ``Noise``) or None with
        ``noise_std``. Options: ``patch``, ``stride``, ``n_samples`` (None: every
        reference row), ``noise_std``, ``seed``, ``perturbations_per_eval`` (module
        docstring)."""
        refs = self.references(x, baselines, n_samples, noise_std, seed)
        occlusion = Occlusion(call.model)
        total = torch.zeros_like(x)
        for k in range(refs.shape[1]):
            total += occlusion._attribute(call, x, refs[:, k], t, fx, patch=patch, stride=stride,
                                          perturbations_per_eval=perturbations_per_eval,
                                          show_progress=show_progress).attributions
        return Attributed(total / refs.shape[1], refs)

    def _cost(self, x, options):
        """Occlusion's windows once per reference; the references themselves."""

        refs = self.references(x, options.get("baselines"), options.get("n_samples"),
                               options.get("noise_std"), options.get("seed", 0))
        n = refs.shape[1]
        windows = count_windows(tuple(x.shape[1:]), options.get("patch", 1), options.get("stride"))
        return Cost(forward_rows=x.shape[0] * n * windows), n

    @staticmethod
    def references(x, baselines=None, n_samples=None, noise_std=None, seed=0) -> torch.Tensor:
        """The references ``[B, n, ...]`` each sample is marginalised over."""
        if n_samples is None:
            if isinstance(baselines, (ReferenceSet, torch.Tensor)):
                rows = baselines.samples if isinstance(baselines, ReferenceSet) else baselines
                rows = _reference_rows(rows, x)
                return rows.unsqueeze(0).expand((x.shape[0],) + tuple(rows.shape)).to(x.device)
            raise ValueError("n_samples must be given for a Noise distribution or noise_std "
                             "(n_samples=None uses every row of a reference set)")
        return draw(x, baselines, n_samples, noise_std, seed).baselines.to(x.device, x.dtype)
