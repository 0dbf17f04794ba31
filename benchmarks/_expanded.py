"""Is the function Taylor mode expands the one the user's model computes? Shared by the zoo
sweeps (``zoo_completeness.py``, ``bench_taylor_zoo.py``), per model and batch:

* **value**: ``|g(x) - f(x)|``, with ``g`` the core graph Taylor mode captured (and, for a
  smoothed model, rewrote) and ``f`` the model's own forward;
* **first order**: the expansion's ``P_1 = D f(x)[x - x~]`` (Taylor-mode series, and the
  reverse sweep's ``sum_i first_i``) against the model's own derivative, decided
  independently of the library: forward mode (``torch.func.jvp``) at the batch as run and
  at batch 2 (the sample duplicated: torch's batch-1 derivative bugs), and where those two
  disagree, fourth-order central differences of the model;

each against ``BOUND * max(1, |reference|)``. A value beyond its bound without a
``ta.CompletenessWarning`` from the call is a **silent miss**.
"""
from __future__ import annotations

import warnings

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

#: ``miss <= BOUND * max(1, |reference|)``, else the call must have warned.
BOUND = 1e-8


def _jvp(f, x, d):
    with sdpa_kernel([SDPBackend.MATH]), torch.no_grad():
        return torch.func.jvp(f, (x,), (d,))[1]


def _differences(f, x, d, h=1e-3):
    with torch.no_grad():
        return (8 * (f(x + h * d) - f(x - h * d)) - (f(x + 2 * h * d) - f(x - 2 * h * d))) / (12 * h)


def reference_first_order(model, x, base, target) -> torch.Tensor:
    """``D f(x)[x - x~]`` ``[B]`` of the model's own forward (module docstring)."""
    def explained(t):
        return lambda z: model(z).gather(1, t[:, None])[:, 0]

    d = x - base
    one = _jvp(explained(target), x, d)
    refs = one.clone()
    for i in range(x.shape[0]):  # batch 2 per sample
        rows = slice(i, i + 1)
        two = _jvp(explained(target[rows].repeat(2)), x[rows].repeat_interleave(2, 0),
                   d[rows].repeat_interleave(2, 0))[0]
        if not abs(float(two - one[i])) <= BOUND * max(1.0, abs(float(two))):
            refs[i] = _differences(explained(target[rows]), x[rows], d[rows])[0]
    return refs


def expanded_function(model, x, base, target, smoothed=None) -> dict:
    """The module docstring's measures for ``ta.taylor_terms(m, x, base, target, order=1)``
    with ``m`` the model (or ``smoothed``, the model the user holds then): ``value_miss``,
    ``series_miss``, ``reverse_miss`` (``[B]`` each, over ``bound``), ``warned``,
    ``messages`` and, for a smoothed model, ``gap_miss`` (its reported ``output_gap``
    against ``|smoothed(x) - model(x)|`` measured here)."""
    import taylorattr as ta
    from taylorattr.taylor.mode import trace

    held = model if smoothed is None else smoothed
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        terms = ta.taylor_terms(held, x, base, target=target, order=1)
    messages = [str(w.message) for w in caught if issubclass(w.category, ta.CompletenessWarning)]
    with torch.no_grad():
        f = held(x).gather(1, target[:, None])[:, 0]
        g = trace(held).graph(x).run(x).gather(1, target[:, None])[:, 0]
    ref = reference_first_order(held, x, base, target)
    scale = ref.abs().clamp(min=1.0)
    out = {"value_miss": (g - f).abs() / f.abs().clamp(min=1.0) / BOUND,
           "series_miss": (terms.orders[:, 0] - ref).abs() / scale / BOUND,
           "reverse_miss": (terms.first.flatten(1).sum(1) - ref).abs() / scale / BOUND,
           "warned": bool(messages), "messages": messages, "gap_miss": torch.zeros(())}
    if smoothed is not None and smoothed.output_gap is not None:
        with torch.no_grad():
            gap = float((smoothed(x) - model(x)).abs().max())
        out["gap_miss"] = torch.tensor(abs(smoothed.output_gap - gap) / max(gap, 1e-300) / BOUND)
    return out


def worst(r: dict) -> float:
    """The largest miss over its bound (> 1: beyond it)."""
    return max(float(r[k].max()) for k in ("value_miss", "series_miss", "reverse_miss", "gap_miss"))


def silent(r: dict) -> bool:
    """Beyond a bound without a warning."""
    return worst(r) > 1.0 and not r["warned"]
