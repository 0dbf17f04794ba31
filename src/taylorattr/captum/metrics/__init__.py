"""``captum.metrics``' names over taylorattr's metrics: ``infidelity`` is
:func:`taylorattr.metrics.perturbation.infidelity` with Captum's arguments.

Captum calls ``perturb_func`` on the inputs repeated ``n_perturb_samples`` times per sample
(sample-major), drawing from the global generators; so does this function, once, and it
hands the native metric draw ``k`` of every sample as its ``k``-th perturbation. Captum's
``normalize`` default (False: ``beta = 1``) is kept. ``sensitivity_max`` is
:func:`taylorattr.metrics.max_sensitivity` with Captum's ``perturb_func`` called on the
repeated inputs of each batch of perturbations, as Captum calls it.
"""
from __future__ import annotations

import inspect

import torch

from ...inputs import as_tuple, point_baselines
from ...metrics.perturbation import infidelity as _infidelity
from ...metrics.sensitivity import max_sensitivity

__all__ = ["default_perturb_func", "infidelity", "infidelity_perturb_func_decorator",
           "sensitivity_max"]


def infidelity(forward_func, perturb_func, inputs, attributions, baselines=None,
               additional_forward_args=None, target=None, n_perturb_samples: int = 10,
               max_examples_per_batch=None, normalize: bool = False):
    """Captum's ``infidelity``: one score per sample."""
    parts, is_tuple = as_tuple(inputs)
    n = n_perturb_samples
    expanded = tuple(p.repeat_interleave(n, 0) for p in parts)
    args = expanded if is_tuple else expanded[0]
    if baselines is None:
        drawn = perturb_func(args)
    else:
        base, _ = as_tuple(baselines) if not isinstance(baselines, (int, float)) else \
            ((baselines,) * len(parts), None)
        base = tuple(b.repeat_interleave(n, 0) if hasattr(b, "repeat_interleave") and b.dim()
                     and b.shape[0] == parts[0].shape[0] else b for b in base)
        drawn = perturb_func(args, base if is_tuple else base[0])
    perturbations, perturbed = drawn
    perturbations, _ = as_tuple(perturbations, "perturbations")
    perturbed, _ = as_tuple(perturbed, "perturbed inputs")
    batch = parts[0].shape[0]

    def draw(k):
        def pick(ts):
            out = tuple(t.view((batch, n) + tuple(t.shape[1:]))[:, k] for t in ts)
            return out if is_tuple else out[0]
        return pick(perturbations), pick(perturbed)

    calls = iter(range(n))

    def perturbation(_inputs, _generator):
        return draw(next(calls))

    return _infidelity(forward_func, inputs, attributions, target, perturbation,
                       normalize=normalize, n_perturb_samples=n,
                       additional_forward_args=additional_forward_args)


def infidelity_perturb_func_decorator(multiply_by_inputs: bool = True):
    """Captum's decorator for a ``perturb_func`` that returns only the perturbed inputs
    ``x'``: the decorated function returns ``(I, x')`` with the perturbation

        I = (x - x') / (x - x~)   (``multiply_by_inputs``; ``x~`` the baselines, 0 if none;
                                   a zero denominator reads as 1)
        I = x - x'                (otherwise)
    """
    def decorate(perturb_func):
        def perturbations(inputs, baselines=None):
            perturbed = perturb_func(inputs) if baselines is None else \
                perturb_func(inputs, baselines)
            parts, _ = as_tuple(inputs)
            moved, _ = as_tuple(perturbed, "perturbed inputs")
            base = (0.0,) * len(parts) if baselines is None else point_baselines(baselines, parts)
            out = []
            for x, xp, b in zip(parts, moved, base):
                change = x - xp
                if multiply_by_inputs:
                    denominator = x - b
                    change = change / torch.where(denominator != 0, denominator, 1.0)
                out.append(change)
            return tuple(out), moved
        return perturbations
    return decorate


def default_perturb_func(inputs, perturb_radius: float = 0.02):
    """Captum's default perturbation: ``U(-r, r)`` noise (float32, the global generator)
    added to every input; a tuple."""
    parts, _ = as_tuple(inputs)
    return tuple(p + torch.empty(p.size(), dtype=torch.float32, device="cpu").uniform_(
        -perturb_radius, perturb_radius).to(p.device) for p in parts)


def sensitivity_max(explanation_func, inputs, perturb_func=default_perturb_func,
                    perturb_radius: float = 0.02, n_perturb_samples: int = 10,
                    norm_ord="fro", max_examples_per_batch=None, **kwargs):
    """Captum's ``sensitivity_max``: one score per sample."""
    takes_radius = len(inspect.signature(perturb_func).parameters) > 1

    def perturbation(rows, _generator, _k):
        return perturb_func(rows, perturb_radius) if takes_radius else perturb_func(rows)

    return max_sensitivity(explanation_func, inputs, n_perturb_samples=n_perturb_samples,
                           perturbation=perturbation, norm=norm_ord,
                           batch_size=max_examples_per_batch, **kwargs)
