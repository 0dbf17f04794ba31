"""``captum.metrics``' names over taylorattr's metrics: ``infidelity`` is
:func:`taylorattr.metrics.perturbation.infidelity` with Captum's arguments.

Captum calls ``perturb_func`` on the inputs repeated ``n_perturb_samples`` times per sample
(sample-major), drawing from the global generators; so does this function, once, and it
hands the native metric draw ``k`` of every sample as its ``k``-th perturbation. Captum's
``normalize`` default (False: ``beta = 1``) is kept. ``sensitivity_max`` is not offered
(no native metric).
"""
from __future__ import annotations

from ...inputs import as_tuple
from ...metrics.perturbation import infidelity as _infidelity
from .._mapping import not_offered

__all__ = ["infidelity", "sensitivity_max"]


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


def sensitivity_max(explanation_func, inputs, *args, **kwargs):
    """Not offered (README, "Coming from Captum")."""
    raise not_offered("sensitivity_max", "taylorattr has no sensitivity metric yet")
