"""Self-verification of complete methods: every call checks ``sum(a) = f(x) - f(x~)``
(``ta.CompletenessWarning``, ``ta.CompletenessError``).

A method whose attributions are complete by construction declares it
(:class:`Traits.complete <taylorattr.methods._call.Traits>`) and returns the explained
outputs at its references from the passes it ran anyway
(:attr:`Attributed.reference_outputs <taylorattr.methods._call.Attributed>`): DeepLIFT's
baseline forward, DeepLiftShap's per-reference forwards, the Shapley coalition ``v(none)``.
The pipeline then measures, per sample and without another model call,

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

**A model that computes in lower precision than its inputs.** Where the captured graph
(:mod:`taylorattr.capture`) casts an input-dependent floating value to a dtype of larger
``eps`` than the inputs' (``.float()``, ``.to(torch.bfloat16)``, an autocast region under
float64 inputs: :func:`downcasts`), the call is still held to the inputs' dtype's
tolerance (a float64 call promises float64's completeness, and a miss the user did not
ask for is never silent), and a miss beyond it names the first cast (the dtypes, the
operation and where it sits) before the other likely cause (:data:`DOWNCAST`), with
that dtype's ``eps`` in the cancellation test. timm ``efficientvit_b0`` casts its linear
attention to float32 (``LiteMLA._attn``): with float64 inputs at 64x64, DeepLIFT misses
by 3.7e-7 and 1.9e-5 (``|df|`` 0.34, 0.37; at most 4e-14 with the casts removed), beyond
float64's 7.5e-9 and within float32's 1.7e-4: it warns, naming the cast; at 32x32 by
3.5e-4 for ``|df|`` 0.57 (``sum_i |a_i|`` 1.3e4; without the casts 1.1e-4, the
attention's normaliser near zero at the zero baseline: ``sum_i |a_i|`` 2.2e12,
cancellation at float64). The engines that run the captured graph (the layer-wise
DeepLIFT and DeepLiftShap, Taylor attribution) report their casts; the model-agnostic
methods see none. (Taylor attribution's share check, :func:`check_total`, of how the
shares of one pass add up, is held to the lowest dtype's rounding: the shares are computed
at that precision.)

**Completeness up to a discretisation.** A method complete only up to an error it
controls (Integrated Gradients' quadrature: ``sum_i a_i = sum_k w_k d/dalpha f(x~ + alpha_k
(x - x~))``, the rule's value of ``int_0^1 d/dalpha f = f(x) - f(x~)``) states that
error's scale ``r`` (:attr:`~taylorattr.methods.AttributionMethod.complete_within`); its
tolerance is

    tol_r = max(tol, r * max(|df|, sum_i |a_i|)).

Sound in one direction: the per-feature errors ``e_i`` of the attributions sum to the
miss, so ``miss > r sum_i |a_i|`` means some attribution is off by more than ``r`` of its
own size (to first order in the errors); a miss below it proves nothing either way. Such a
method is not recomputed at batch 2 (its miss is its own discretisation, not a gradient).
"""
from __future__ import annotations

import warnings
import weakref
from dataclasses import dataclass

import torch

from ..capture import CoreGraph, op_name, where

__all__ = ["COMPLETENESS_FACTOR", "CompletenessError", "CompletenessWarning", "Downcast",
           "downcasts", "lowest_dtype", "tolerance"]

#: ``C`` of the tolerance ``C * eps(dtype) * scale``.
COMPLETENESS_FACTOR = 1000.0


class CompletenessWarning(UserWarning):
    """A complete method's attributions miss ``f(x) - f(x~)`` beyond rounding."""


class CompletenessError(ValueError):
    """:class:`CompletenessWarning` raised instead (``strict=True``)."""


@dataclass(frozen=True)
class Downcast:
    """An input-dependent operation of a captured graph whose floating output has a larger
    ``eps`` than its input-dependent floating arguments: ``source`` -> ``dtype`` by ``op``
    (``aten._to_copy.default``, ``prims.convert_element_type.default``, ...) at ``at``
    (:func:`taylorattr.capture.where`: the module and the source line)."""

    op: str
    source: torch.dtype
    dtype: torch.dtype
    at: str

    def __str__(self) -> str:
        return f"{_short(self.source)} to {_short(self.dtype)} at {self.at} ({self.op})"


def _short(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def _eps(dtype: torch.dtype) -> float:
    return torch.finfo(dtype).eps


def _floating(value) -> list:
    """The floating tensors of a node's ``meta["val"]`` (one tensor or a tuple of them)."""
    values = value if isinstance(value, (tuple, list)) else (value,)
    return [v for v in values if isinstance(v, torch.Tensor) and v.is_floating_point()]


#: CoreGraph -> (its node list when analysed, every precision-losing node): a graph is
#: walked once (:meth:`CoreGraph.refresh` replaces the list when a rewrite edits it).
_CASTS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def downcasts(graph: CoreGraph, dtype: torch.dtype) -> tuple[Downcast, ...]:
    """The casts below ``dtype`` in ``graph``, in graph order: every input-dependent node
    whose floating output's ``eps`` exceeds that of its input-dependent floating arguments
    and that of ``dtype`` (the inputs' dtype). Casts back up are not listed; a float32
    constant meeting float64 values is promoted, not a cast. Reads the shapes and dtypes
    the capture recorded (``node.meta["val"]``): no model call."""
    nodes = graph.nodes
    cached = _CASTS.get(graph)
    if cached is None or cached[0] is not nodes:
        found = []
        for node in nodes:
            if not graph.depends_on_input(node):
                continue
            outs = _floating(node.meta.get("val"))
            ins = [t for a in node.all_input_nodes if graph.depends_on_input(a)
                   for t in _floating(a.meta.get("val"))]
            if not outs or not ins:
                continue
            out = max((t.dtype for t in outs), key=_eps)
            source = min((t.dtype for t in ins), key=_eps)
            if _eps(out) > _eps(source):
                found.append(Downcast(op_name(node.target), source, out, where(node)))
        cached = _CASTS[graph] = (nodes, tuple(found))
    return tuple(c for c in cached[1] if _eps(c.dtype) > _eps(dtype))


def lowest_dtype(dtype: torch.dtype, casts=()) -> torch.dtype:
    """The floating dtype of largest ``eps`` among ``dtype`` and the targets of ``casts``
    (:func:`downcasts`): the precision the computation passes through."""
    return max([dtype, *(c.dtype for c in casts)], key=_eps)


def tolerance(attr: torch.Tensor, fx: torch.Tensor, f_ref: torch.Tensor,
              sums: bool = False, dtype: torch.dtype | None = None,
              rtol: float = 0.0) -> torch.Tensor:
    """``max(sqrt(eps) / 2 * max(1, |df|), C * eps * max(1, |f(x)|, |f(x~)|))`` per sample
    (module docstring);
    ``sums``: ``sum_i |a_i|`` joins the scale (a check of how the shares of one pass add
    up, where their size is rounding, not the method's error); ``dtype``: the lowest
    precision the computation passes through (:func:`lowest_dtype`; ``eps`` is the larger
    of its and the attributions' dtype's); ``rtol``: a method complete up to a
    discretisation, ``max(tol, rtol * max(|df|, sum_i |a_i|))``."""
    eps = _eps(attr.dtype) if dtype is None else max(_eps(attr.dtype), _eps(dtype))
    size = attr.reshape(attr.shape[0], -1).abs().sum(1)
    parts = [torch.ones_like(fx), fx.abs(), f_ref.abs()]
    if sums:
        parts.append(size)
    rounding = COMPLETENESS_FACTOR * eps * torch.stack(parts).amax(0)
    digits = eps ** 0.5 / 2 * (fx - f_ref).abs().clamp(min=1.0)
    tol = torch.maximum(rounding, digits)
    if rtol:
        tol = torch.maximum(tol, rtol * torch.maximum((fx - f_ref).abs(), size))
    return tol


def misses(attr: torch.Tensor, fx: torch.Tensor, f_ref: torch.Tensor, sums: bool = False,
           dtype: torch.dtype | None = None, rtol: float = 0.0):
    """``(delta, failing, tol)``: ``delta = sum(a) - (f(x) - f(x~))`` per sample, the mask
    of samples whose ``|delta|`` exceeds the :func:`tolerance` ``tol`` (or is not finite);
    ``dtype``, ``rtol``: :func:`tolerance`'s."""
    fx, f_ref = fx.to(attr.dtype), f_ref.to(attr.dtype)
    delta = attr.reshape(attr.shape[0], -1).sum(1) - (fx - f_ref)
    tol = tolerance(attr, fx, f_ref, sums, dtype, rtol)
    return delta, ~(delta.abs() <= tol), tol


#: The likely cause named when the attributions cancel (:func:`report`'s ``attr``).
CANCELLATION = (
    "cancellation: the attributions' absolute sum is {size:.3g} for a change of {df:.3g}, "
    "fewer than half the digits survive their sum; typical at a baseline where a LayerNorm "
    "or GroupNorm sees activations of (near) zero variance (e.g. a zero baseline and zero "
    "biases before it), so that rsqrt(var + eps) is huge; a baseline whose activations vary "
    "(a blurred or noisy input) avoids it")


#: The likely cause named when the captured graph casts below the inputs' dtype.
DOWNCAST = ("the model computes in {low}, not in {dtype}: it casts {first}{more}, so part "
            "of the computation (and f(x) itself) carries {low} rounding, which the "
            "method's rules can amplify; to check at {dtype}, remove the cast(s) from the "
            "model")


def downcast_cause(casts, dtype: torch.dtype) -> str:
    """The :data:`DOWNCAST` cause for ``casts`` (:func:`downcasts`, not empty)."""
    low = lowest_dtype(dtype, casts)
    first = next(c for c in casts if c.dtype == low)
    more = f" ({len(casts) - 1} more cast(s) below {_short(dtype)})" if len(casts) > 1 else ""
    return DOWNCAST.format(low=_short(low), dtype=_short(dtype), first=first, more=more)


def report(method: str, delta: torch.Tensor, fx: torch.Tensor, f_ref: torch.Tensor,
           bad: torch.Tensor, tol: torch.Tensor, tried_batch_2: bool, cause: str,
           strict: bool, explained: str = "f(x) - f(x~)", hint: bool = True,
           attr: torch.Tensor | None = None, casts=(), held_to: torch.dtype | None = None
           ) -> None:
    """Warn (or raise, ``strict``) about the samples ``bad`` still misses. ``attr``: the
    attributions; where they cancel to fewer than half the digits,

        sum_i |a_i| * sqrt(eps) > |f(x) - f(x~)|,

    the likely cause named is that cancellation (:data:`CANCELLATION`) instead of ``cause``
    (the miss is then rounding of huge terms, not a wrong rule: ConvNeXt, PoolFormer,
    MLP-Mixer at a zero baseline, ``benchmarks/zoo_completeness.py``). ``casts``: the
    graph's casts below the attributions' dtype (:func:`downcasts`): named first
    (:data:`DOWNCAST`), and ``eps`` above is the lowest dtype's (the digits the model's own
    computation keeps); ``tol``: the tolerance the samples were held to, that of
    ``held_to`` (default: the attributions' dtype)."""
    idx = bad.nonzero().flatten().tolist()
    worst = int(idx[int(delta[bad].abs().argmax())])
    df = float(fx[worst] - f_ref[worst])
    low = lowest_dtype(delta.dtype, casts)
    cancels = False
    if attr is not None:
        size = float(attr[worst].abs().sum())
        if size * _eps(low) ** 0.5 > abs(df):
            cause, cancels = CANCELLATION.format(size=size, df=df), True
    if casts:  # the cast first; with cancellation both act (the sum loses the low digits)
        cause = downcast_cause(casts, delta.dtype) + ("; and " if cancels else
                                                      "; otherwise: ") + cause
    shown = ", ".join(map(str, idx[:10])) + (", ..." if len(idx) > 10 else "")
    repair = " (recomputing them at batch 2 did not repair them)" if tried_batch_2 else ""
    if held_to is not None and held_to != delta.dtype:
        precision = (f"{_short(held_to)}, the lowest precision of the model's "
                     f"{_short(delta.dtype)} computation")
    else:
        precision = _short(delta.dtype) + (f"; the model computes in {_short(low)} in part"
                                           if casts else "")
    msg = (f"{method}: attributions are incomplete for sample(s) {shown}{repair}: "
           f"sum(a) - ({explained}) = {float(delta[worst]):.3g} where {explained} = "
           f"{df:.3g} (tolerance {float(tol[worst]):.2g} for {precision}); likely cause: "
           f"{cause}."
           + (" Pass strict=True to raise instead of warning." if hint else ""))
    if strict:
        raise CompletenessError(msg)
    warnings.warn(msg, CompletenessWarning, stacklevel=4)


def check_total(attr: torch.Tensor, total: torch.Tensor, method: str, cause: str,
                strict: bool = False, casts=()) -> None:
    """Warn (raise with ``strict``) where ``sum(a)`` misses ``total`` ``[B]``, the value the
    attributions are stated to sum to, beyond :func:`tolerance` (``total`` standing for
    ``f(x) - f(x~)``: e.g. Taylor attribution's ``g_K``, the change less its remainder);
    ``casts``: the graph's casts below the attributions' dtype (:func:`downcasts`)."""
    zero = torch.zeros_like(total)
    low = lowest_dtype(attr.dtype, casts)
    delta, bad, tol = misses(attr, total, zero, sums=True, dtype=low)
    if bool(bad.any()):
        report(method, delta, total.to(attr.dtype), zero.to(attr.dtype), bad, tol, False,
               cause, strict, "g_K", hint=False, casts=casts, held_to=low)
