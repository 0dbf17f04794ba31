"""Taylor mode checks itself: the expansion's first order against the model's own
forward-mode derivative (``taylor_terms`` / ``taylor_attribution``, ``check=True``).

With ``delta = x - x~`` the expansion's first order is ``P_1 = D f(x)[delta]``, computed
twice by the expansion itself: by the Taylor-mode series (``orders[:, 0]``) and by the
reverse sweep that gives the per-feature ``first`` (``sum_i first_i``). Both are held to
one forward-mode directional derivative of the model the user gave, at ``x`` along
``delta`` (``torch.func.jvp``: about one forward pass, ``B`` forward rows),

    miss = | P_1 - jvp |  <=  tol = sqrt(eps) / 2 * max(1, |jvp|) + C eps max(1, |f(x)|, |P_1|)

(``eps`` of the inputs' dtype, ``C`` = :data:`~taylorattr.runtime.completeness.COMPLETENESS_FACTOR`:
float64 keeps half its digits, as the completeness checks). Where a value misses, fourth-
order central differences of the model along ``delta``,

    (8 (f(x + h d) - f(x - h d)) - (f(x + 2h d) - f(x - 2h d))) / (12 h),   h = eps^(1/5),

decide (four more forwards, only then) which value is right; a wrong one is named with its
likely cause:

* the series misses and the expanded graph's ``f(x)`` is not the model's own: the function
  expanded is not the model (a smooth surrogate or a capture that computes another
  function);
* the series misses and ``f(x)`` agrees: an operation's Taylor rule;
* the reverse sweep misses and the series is right: torch's reverse-mode derivative at this
  batch size (as on timm LeViT and XCiT at batch 1; the caller recomputes such samples at
  batch 2 first, :func:`reverse_misses`);
* the model computes below the inputs' precision (:func:`~taylorattr.runtime.completeness.downcasts`):
  the cast is named first, as DeepLIFT names it.

Where only torch's own ``jvp`` disagrees with differences, the expansion is right and
nothing is said. A model ``torch.func.jvp`` cannot run (an op without a forward-mode
formula) is not checked. ``strict=True`` raises :class:`~taylorattr.runtime.completeness.CompletenessError`
instead of warning (:class:`~taylorattr.runtime.completeness.CompletenessWarning`).
Cost: :func:`check_cost` (``B`` forward rows; ``4 B`` more only on a disagreement).
"""
from __future__ import annotations

import contextlib
import functools
import math
import warnings
from dataclasses import dataclass

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from .. import _validation as V
from ..runtime.completeness import (
    COMPLETENESS_FACTOR,
    CompletenessError,
    CompletenessWarning,
    downcast_cause,
)
from ..runtime.cost import Cost

__all__ = ["FirstOrder", "check_cost", "first_order", "reverse_misses", "verify"]


@dataclass
class FirstOrder:
    """The model's own first order at ``x`` along ``delta`` and what it says of the
    expansion's two values: ``jvp`` ``[B]`` (None: torch.func.jvp could not run the model),
    ``f_model`` ``[B]`` the model's own ``f(x)``, ``tol`` ``[B]``, the masks ``series_bad``
    and ``reverse_bad`` (samples whose value is wrong, after central differences decided),
    ``differences`` ``[B]`` (NaN where not computed)."""

    jvp: torch.Tensor | None
    f_model: torch.Tensor | None
    tol: torch.Tensor | None
    series_bad: torch.Tensor
    reverse_bad: torch.Tensor
    differences: torch.Tensor


def check_cost(inputs: torch.Tensor) -> Cost:
    """The rows the check runs: one forward-mode pass of the batch (``B`` forward rows); the
    central differences (``4 B`` rows) run only where a value disagrees."""
    return Cost(forward_rows=V.check_inputs(inputs).shape[0])


def _explained(fn, target, active):
    def f(z):
        with active():
            return V.select_output(fn(z), target)
    return f


def _tolerance(ref, f_x, value):
    eps = torch.finfo(ref.dtype).eps
    one = torch.ones_like(ref)
    scale = torch.stack([one, f_x.abs().to(ref.dtype), value.abs().to(ref.dtype)]).amax(0)
    return eps ** 0.5 / 2 * torch.maximum(one, ref.abs()) + COMPLETENESS_FACTOR * eps * scale


@functools.cache
def _load_forward_mode() -> None:
    """torch loads its forward-mode decompositions on the first ``jvp`` through
    ``torch.jit.script``, which warns that it is deprecated (torch's own use, not the
    user's): loaded once here with that warning silenced."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*torch.jit.script.*", category=FutureWarning)
        warnings.filterwarnings("ignore", message=".*TorchScript.*", category=DeprecationWarning)
        from torch._decomp import decompositions_for_jvp  # noqa: F401


def _differences(f, x, delta):
    """Fourth-order central differences of ``f`` along ``delta`` at ``x``, ``[B]`` (four
    calls of the whole batch: a model's batch size stays the one it was given)."""
    h = torch.finfo(x.dtype).eps ** 0.2
    with torch.no_grad():
        at = [f(x + s * h * delta) for s in (1.0, -1.0, 2.0, -2.0)]
    return (8 * (at[0] - at[1]) - (at[2] - at[3])) / (12 * h)


def first_order(fn, inputs, delta, target, series, reverse, f_pass, *,
                active=contextlib.nullcontext, smooth_only: bool = False) -> FirstOrder:
    """Check ``series`` and ``reverse`` (``[B]``: the expansion's ``P_1`` by the Taylor-mode
    series and by the reverse sweep; ``f_pass`` its ``f(x)``) against ``fn`` (the model as
    the user gave it, one tensor in; ``active``: the context it runs in, a layer swap) at
    ``inputs`` along ``delta`` (module docstring). ``smooth_only``: the model has
    piecewise-linear operations, where central differences cross kinks: they then decide
    nothing (a disagreement is reported as it stands)."""
    f = _explained(fn, target, active)
    x, d = inputs.detach(), delta.detach()
    nothing = torch.zeros_like(series, dtype=torch.bool)
    nan = torch.full_like(series, float("nan"))
    _load_forward_mode()
    try:
        with sdpa_kernel([SDPBackend.MATH]), torch.no_grad():
            f_model, jvp = torch.func.jvp(f, (x,), (d,))
    except (RuntimeError, NotImplementedError, TypeError):  # no forward-mode formula
        return FirstOrder(None, None, None, nothing, nothing, nan)
    f_model, jvp = f_model.detach(), jvp.detach()
    tol = _tolerance(jvp, f_model, series)
    series_off = ~((series - jvp).abs() <= tol)
    reverse_off = ~((reverse - jvp).abs() <= tol)
    if not bool((series_off | reverse_off).any()):
        return FirstOrder(jvp, f_model, tol, nothing, nothing, nan)
    if smooth_only:
        return FirstOrder(jvp, f_model, tol, series_off, reverse_off, nan)
    cd = _differences(f, x, d)
    cd_tol = _tolerance(cd, f_model, series)

    def wrong(value, off):  # off the jvp and off the differences: wrong
        return off & ~((value - cd).abs() <= cd_tol)
    return FirstOrder(jvp, f_model, tol, wrong(series, series_off), wrong(reverse, reverse_off),
                      cd)


def reverse_misses(check: FirstOrder) -> list[int]:
    """The samples whose reverse sweep alone is wrong (the series right): recompute them at
    batch 2, where torch's reverse mode is right on the models where it is wrong at 1."""
    return (check.reverse_bad & ~check.series_bad).nonzero().flatten().tolist()


def verify(check: FirstOrder, series, reverse, f_pass, method: str, strict: bool = False,
           casts=(), batch: int = 1) -> None:
    """Warn (raise with ``strict``) about the samples whose expansion's first order is
    wrong (:func:`first_order`), naming the likely cause (module docstring)."""
    bad = check.series_bad | check.reverse_bad
    if not bool(bad.any()):
        return
    idx = bad.nonzero().flatten().tolist()
    i = idx[0]
    off = check.series_bad[i]
    value = float((series if off else reverse)[i])
    other_mismatch = (f_pass - check.f_model).abs() > _tolerance(check.f_model, f_pass,
                                                                   check.f_model)
    if off and bool(other_mismatch[i]):
        cause = (f"the function expanded is not the model: its f(x) is {float(f_pass[i]):.10g} "
                 f"where the model gives {float(check.f_model[i]):.10g} (a smooth surrogate "
                 "acting only in the captured graph, or a capture that computes another "
                 "function than the model's forward)")
    elif off:
        cause = ("an operation's Taylor rule that is not its derivative (a user rule "
                 "registered with register_taylor_rule, or a built-in one: please report "
                 "the model)")
    else:
        cause = (f"torch's reverse-mode derivative at batch size {batch} (a known torch bug "
                 "on some models, e.g. timm LeViT and XCiT at batch 1; recomputing at batch "
                 "2 did not repair it)")
    if casts:
        cause = downcast_cause(casts, series.dtype) + "; otherwise: " + cause
    cd = float(check.differences[i])
    decided = f"; central differences give {cd:.10g}" if not math.isnan(cd) else \
        " (central differences cross the model's kinks and decide nothing)"
    which = "Taylor-mode series" if off else "reverse sweep (first)"
    msg = (f"{method}: the first order D f(x)[x - x~] of sample(s) {idx[:10]} is wrong: the "
           f"{which} gives {value:.10g} where the model's forward-mode derivative gives "
           f"{float(check.jvp[i]):.10g}{decided} (tolerance {float(check.tol[i]):.2g} for "
           f"{str(series.dtype).replace('torch.', '')}); likely cause: {cause}. Pass "
           "strict=True to raise, check=False to skip this check.")
    if strict:
        raise CompletenessError(msg)
    warnings.warn(msg, CompletenessWarning, stacklevel=3)
