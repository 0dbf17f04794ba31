"""Captum's ``DataLoaderAttribution``: feature ablation of a metric over a whole data
loader.

The features are groups of the inputs' elements (``feature_mask``, shared by every batch;
every element alone by default, numbered across the inputs that need attribution). With
``m(S)`` the metric of the data set when the features in ``S`` are replaced by their
baselines in every batch,

    m(S) = to_metric(reduce(... reduce(None, f(batch_1(S)), batch_1(S)) ..., f(batch_N(S))))

(``reduce`` concatenating the outputs and ``to_metric`` the identity by default), feature
``g`` gets ``m({}) - m({g})`` for every entry of the metric: ``[*metric_shape, G]``, spread
back to the inputs' shapes (``return_input_shape``). ``perturbations_per_pass`` features
are ablated in each traversal of the loader (one traversal for ``m({})`` and one to read
the inputs' layout besides), as Captum traverses it.
"""
from __future__ import annotations

import math

import torch

from .._mapping import Attribution
from ._perturbation import FeatureAblation

__all__ = ["DataLoaderAttribution", "InputRole"]


class InputRole:
    """What each element a batch holds is: attributed and passed to the forward
    (``need_attr``), passed only (``need_forward``), or neither (``no_forward``, e.g.
    labels, which ``reduce`` still sees)."""

    need_attr = 0
    need_forward = 1
    no_forward = 2


def _concat(accum, output, _inputs):
    return output if accum is None else torch.cat([accum, output])


def _as_tuple(batch) -> tuple[tuple, bool]:
    if isinstance(batch, (tuple, list)):
        return tuple(batch), True
    return (batch,), False


class DataLoaderAttribution(Attribution):
    """Captum's ``DataLoaderAttribution`` over a ``FeatureAblation`` (module docstring)."""

    def __init__(self, attr_method) -> None:
        if type(attr_method) is not FeatureAblation:
            raise TypeError(f"DataLoaderAttribution takes a FeatureAblation (Captum's only "
                            f"supported method), got {type(attr_method).__name__}")
        super().__init__(attr_method.forward_func)
        self.attr_method = attr_method

    def _masks(self, attr_inputs: tuple, feature_mask) -> tuple:
        if feature_mask is None:
            masks, offset = [], 0
            for x in attr_inputs:
                n = math.prod(x.shape[1:])
                masks.append((offset + torch.arange(n, device=x.device)).reshape(
                    (1,) + tuple(x.shape[1:])))
                offset += n
            return tuple(masks)
        masks = feature_mask if isinstance(feature_mask, tuple) else (feature_mask,)
        if len(masks) != len(attr_inputs):
            raise ValueError(f"feature_mask must give one mask per attributed input "
                             f"({len(attr_inputs)}), got {len(masks)}")
        return masks

    def _metric(self, loader, roles, bases, masks, off: list, reduce, to_metric):
        """The metric of the data set with each feature set of ``off`` ablated, stacked
        (one traversal of ``loader`` for all of them)."""
        states = [None] * len(off)
        for batch in loader:
            batch, _ = _as_tuple(batch)
            for k, features in enumerate(off):
                perturbed, j = [], 0
                for x, role in zip(batch, roles):
                    if role != InputRole.need_attr:
                        perturbed.append(x)
                        continue
                    mask, base = masks[j], bases[j]
                    j += 1
                    if not features:
                        perturbed.append(x)
                        continue
                    keep = (~torch.isin(mask, torch.tensor(features, device=mask.device)))
                    keep = keep.to(x.dtype) if x.is_floating_point() else keep.long()
                    perturbed.append(x * keep + base * (1 - keep))
                perturbed = tuple(perturbed)
                forward = [p for p, r in zip(perturbed, roles) if r != InputRole.no_forward]
                with torch.no_grad():
                    out = self.forward_func(*forward)
                states[k] = reduce(states[k], out, perturbed)
        results = [to_metric(s) if to_metric else s for s in states]
        for r in results:
            if type(r) is not torch.Tensor:
                raise AssertionError(f"Accumulated metrics for attribution must be a Tensor, "
                                     f"received: {type(r).__name__}")
        return results

    def attribute(self, dataloader, input_roles=None, baselines=None, feature_mask=None,
                  reduce=None, to_metric=None, perturbations_per_pass: int = 1,
                  show_progress: bool = False, return_input_shape: bool = True):
        """Attributions of the data set's metric (module docstring): per attributed input
        ``[*metric_shape, *input.shape[1:]]`` (a tensor for one, a tuple for several), or
        ``[*metric_shape, G]`` with ``return_input_shape=False``."""
        first, was_tuple = _as_tuple(next(iter(dataloader)))
        roles = tuple(input_roles) if input_roles else (InputRole.need_attr,) * len(first)
        if len(roles) != len(first):
            raise AssertionError(f"input_roles must have the same size as the return of the "
                                 f"dataloader ({len(first)}), got {len(roles)}")
        if InputRole.need_attr not in roles:
            raise AssertionError("input_roles must contain at least one element that needs "
                                 f"attribution ({InputRole.need_attr}), got {roles}")
        if isinstance(perturbations_per_pass, bool) or not isinstance(perturbations_per_pass,
                                                                      int) \
                or perturbations_per_pass < 1:
            raise ValueError(f"perturbations_per_pass must be an int >= 1, got "
                             f"{perturbations_per_pass!r}")
        attr_inputs = tuple(x for x, r in zip(first, roles) if r == InputRole.need_attr)
        masks = self._masks(attr_inputs, feature_mask)
        bases = baselines if isinstance(baselines, tuple) else \
            (0 if baselines is None else baselines,) * len(attr_inputs)
        n = max(int(m.max()) for m in masks if m.numel()) + 1
        reduce = reduce or _concat
        base = self._metric(dataloader, roles, bases, masks, [[]], reduce, to_metric)[0]
        drops = []
        for start in range(0, n, perturbations_per_pass):
            group = [[g] for g in range(start, min(n, start + perturbations_per_pass))]
            for m in self._metric(dataloader, roles, bases, masks, group, reduce, to_metric):
                drops.append((base - m).reshape(-1))  # the metric flattened, as Captum
        unique = torch.stack(drops, -1)
        if not return_input_shape:
            return unique
        out = []
        lead = unique.shape[:-1]
        for x, mask in zip(attr_inputs, masks):
            index = mask.long().reshape((1,) * len(lead) + tuple(mask.shape[1:]))
            index = index.expand(*lead, *x.shape[1:])
            values = unique.reshape(*lead, *(1,) * (x.dim() - 1), n).expand(
                *lead, *x.shape[1:], n)
            out.append(values.gather(-1, index.unsqueeze(-1)).squeeze(-1))
        return tuple(out) if was_tuple else out[0]

    def attribute_future(self, *args, **kwargs):
        raise NotImplementedError("attribute_future is not implemented for "
                                  "DataLoaderAttribution")
