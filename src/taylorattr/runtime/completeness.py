"""Self-verification of complete methods: every call checks ``sum(a) = f(x) - f(x~)``
(``ta.CompletenessWarning``, ``ta.CompletenessError``).

A method whose attributions are complete by construction declares it
(:attr:`~taylorattr.methods.AttributionMethod.complete`) and reports the explained
outputs at its references from the passes it ran anyway
(:meth:`Call.report <taylorattr.methods._call.Call.report>`): DeepLIFT's baseline
forward, DeepLiftShap's per-reference forwards, the Shapley coalition ``v(none)``. The base
class then measures, per sample and without another model call,

    miss = | sum_i a_i - (f(x) - mean_k f(x~_k)) |

and accepts it when ``miss <= tol``, with the tolerance derived from the dtype,

    tol = max(sqrt(eps) / 2 * max(1, |df|),  C * eps * max(1, |f(x)|, |f(x~)|)),
    df = f(x) - mean_k f(x~_k),   C = 1000,   eps = torch.finfo(dtype).eps

(float64: ``7.5e-9 max(1, |df|)``, half the digits, unless the outputs themselves are
so large that their rounding, ``2.2e-13 |f|``, is more; float32: ``1.7e-4 max(1, |df|)``
or ``1.2e-4 |f|``). Rounding of a sound computation stays far below it; a rule that is
not exact, or a wrong gradient, is far above it. The attributions' own size ``sum_i
|a_i|`` is not in the scale: attributions that cancel to ``df`` only to a few digits
(huge multipliers from a normaliser at a constant baseline) are reported, not excused.
A sample beyond the tolerance is recomputed once at batch 2 (the sample duplicated):
torch's reverse mode can give a wrong gradient at batch 1 on some models (timm
``levit_128s``, ``tests/test_upstream_bugs.py``) that it gets right at batch 2. What the repair does not mend is reported by a
:class:`CompletenessWarning` naming the size of the miss, the samples and the likely cause,
or, with ``strict=True``, raised as :class:`CompletenessError`.
"""
from __future__ import annotations

import warnings

import torch

__all__ = ["COMPLETENESS_FACTOR", "CompletenessError", "CompletenessWarning", "tolerance"]

#: ``C`` of the tolerance ``C * eps(dtype) * scale``.
COMPLETENESS_FACTOR = 1000.0


class CompletenessWarning(UserWarning):
    """A complete method's attributions miss ``f(x) - f(x~)`` beyond rounding."""


class CompletenessError(ValueError):
    """:class:`CompletenessWarning` raised instead (``strict=True``)."""


def tolerance(attr: torch.Tensor, fx: torch.Tensor, f_ref: torch.Tensor,
              sums: bool = False) -> torch.Tensor:
    """``max(sqrt(eps) / 2 * max(1, |df|), C * eps * max(1, |f(x)|, |f(x~)|))`` per sample
    (module docstring);
    ``sums``: ``sum_i |a_i|`` joins the scale (a check of how the shares of one pass add
    up, where their size is rounding, not the method's error)."""
    eps = torch.finfo(attr.dtype).eps
    parts = [torch.ones_like(fx), fx.abs(), f_ref.abs()]
    if sums:
        parts.append(attr.reshape(attr.shape[0], -1).abs().sum(1))
    rounding = COMPLETENESS_FACTOR * eps * torch.stack(parts).amax(0)
    digits = eps ** 0.5 / 2 * (fx - f_ref).abs().clamp(min=1.0)
    return torch.maximum(rounding, digits)


def misses(attr: torch.Tensor, fx: torch.Tensor, f_ref: torch.Tensor, sums: bool = False):
    """``(delta, failing, tol)``: ``delta = sum(a) - (f(x) - f(x~))`` per sample, the mask
    of samples whose ``|delta|`` exceeds the :func:`tolerance` ``tol`` (or is not finite)."""
    fx, f_ref = fx.to(attr.dtype), f_ref.to(attr.dtype)
    delta = attr.reshape(attr.shape[0], -1).sum(1) - (fx - f_ref)
    tol = tolerance(attr, fx, f_ref, sums)
    return delta, ~(delta.abs() <= tol), tol


#: The likely cause named when the attributions cancel (:func:`report`'s ``attr``).
CANCELLATION = (
    "cancellation: the attributions' absolute sum is {size:.3g} for a change of {df:.3g}, "
    "fewer than half the digits survive their sum; typical at a baseline where a LayerNorm "
    "or GroupNorm sees activations of (near) zero variance (e.g. a zero baseline and zero "
    "biases before it), so that rsqrt(var + eps) is huge; a baseline whose activations vary "
    "(a blurred or noisy input) avoids it")


def report(method: str, delta: torch.Tensor, fx: torch.Tensor, f_ref: torch.Tensor,
           bad: torch.Tensor, tol: torch.Tensor, tried_batch_2: bool, cause: str,
           strict: bool, explained: str = "f(x) - f(x~)", hint: bool = True,
           attr: torch.Tensor | None = None) -> None:
    """Warn (or raise, ``strict``) about the samples ``bad`` still misses. ``attr``: the
    attributions; where they cancel to fewer than half the digits,

        sum_i |a_i| * sqrt(eps) > |f(x) - f(x~)|,

    the likely cause named is that cancellation (:data:`CANCELLATION`) instead of ``cause``
    (the miss is then rounding of huge terms, not a wrong rule: ConvNeXt, PoolFormer,
    MLP-Mixer at a zero baseline, ``benchmarks/zoo_completeness.py``)."""
    idx = bad.nonzero().flatten().tolist()
    worst = int(idx[int(delta[bad].abs().argmax())])
    df = float(fx[worst] - f_ref[worst])
    if attr is not None:
        size = float(attr[worst].abs().sum())
        if size * torch.finfo(attr.dtype).eps ** 0.5 > abs(df):
            cause = CANCELLATION.format(size=size, df=df)
    shown = ", ".join(map(str, idx[:10])) + (", ..." if len(idx) > 10 else "")
    repair = " (recomputing them at batch 2 did not repair them)" if tried_batch_2 else ""
    msg = (f"{method}: attributions are incomplete for sample(s) {shown}{repair}: "
           f"sum(a) - ({explained}) = {float(delta[worst]):.3g} where {explained} = "
           f"{df:.3g} (tolerance {float(tol[worst]):.2g} for "
           f"{str(delta.dtype).replace('torch.', '')}); likely cause: {cause}."
           + (" Pass strict=True to raise instead of warning." if hint else ""))
    if strict:
        raise CompletenessError(msg)
    warnings.warn(msg, CompletenessWarning, stacklevel=4)


def check_total(attr: torch.Tensor, total: torch.Tensor, method: str, cause: str,
                strict: bool = False) -> None:
    """Warn (raise with ``strict``) where ``sum(a)`` misses ``total`` ``[B]``, the value the
    attributions are stated to sum to, beyond :func:`tolerance` (``total`` standing for
    ``f(x) - f(x~)``: e.g. Taylor attribution's ``g_K``, the change less its remainder)."""
    zero = torch.zeros_like(total)
    delta, bad, tol = misses(attr, total, zero, sums=True)
    if bool(bad.any()):
        report(method, delta, total.to(attr.dtype), zero.to(attr.dtype), bad, tol, False,
               cause, strict, "g_K", hint=False)
