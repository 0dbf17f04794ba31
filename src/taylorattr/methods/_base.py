"""The one shared base of the attribution methods.

Every method follows one call contract (docs/design.md)::

    Method(model).attribute(inputs, [baselines,] target=None, ...,
                            return_convergence_delta=False)

* ``inputs`` is a batch-first float tensor ``[B, ...]``; attributions have its shape.
* ``target`` is None (the argmax of the model's output for each sample), an int, or a
  ``[B]`` integer tensor. The explained quantity is the model's output column
  ``target`` (a logit), or the output itself for models returning ``[B]``.
* With ``return_convergence_delta=True`` the call returns ``(attributions, delta)``,
  ``delta = sum(attributions) - (f(x) - f(baseline))`` per sample (Captum's sign).

This module holds what the methods share: argument checks, the chunked passes and the
delta. Nothing here repairs an input; every error names the offending argument.
"""
from __future__ import annotations

import inspect
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from .._validation import (
    broadcast_baselines,
    check_bool,
    check_inputs,
    check_model,
    check_positive_int,
    model_output,
    resolve_target,
    select_output,
)
from ..baselines import Baseline, Point
from ..batching import chunk_rows, count_blocks, heuristic_rows, planned_blocks

__all__ = [
    "AttributionMethod",
    "Explanation",
    "ImplicitBaselineMethod",
    "chunk_ranges",
    "default_chunk_rows",
    "grid_blocks",
    "target_gradient",
]

def default_chunk_rows(inputs: torch.Tensor, backward: bool, model=None) -> int:
    """Rows per model call for passes over rows shaped like ``inputs[0]``.

    With ``model``: measured once per (model, row shape, dtype, device, threads) against the
    memory budget and refined by timing (:func:`taylorattr.batching.chunk_rows`); without:
    a fixed heuristic from the features per row.
    """
    if model is None:
        return heuristic_rows(inputs, backward)
    return chunk_rows(model, inputs, backward)


def check_optional_positive_int(value, name: str) -> int | None:
    """None (automatic) or an int >= 1."""
    return None if value is None else check_positive_int(value, name)


def _progress(blocks, total: int, show_progress: bool, desc: str):
    if not show_progress:
        yield from blocks
        return
    from tqdm.auto import tqdm

    with tqdm(total=total, desc=desc, unit="chunk") as bar:
        for n, block in enumerate(blocks, 1):
            yield block
            bar.update(1)
        if bar.total != n:  # a size being timed changes the count: end at 100%
            bar.total = n
            bar.refresh()


def chunk_ranges(n_rows: int, size: int, show_progress: bool = False,
                 desc: str = "") -> Iterator[tuple[int, int]]:
    """``(start, stop)`` pairs covering ``range(n_rows)`` in chunks of at most ``size`` rows
    (an automatic :class:`~taylorattr.batching.ChunkRows` size is refined by timing)."""
    blocks = planned_blocks(1, n_rows, size)
    for _, _, start, stop in _progress(blocks, count_blocks(1, n_rows, size), show_progress,
                                       desc):
        yield start, stop


def grid_blocks(n_outer: int, n_inner: int, size: int, show_progress: bool = False,
                desc: str = "") -> Iterator[tuple[int, int, int, int]]:
    """Blocks ``(o0, o1, i0, i1)`` of the ``n_outer x n_inner`` grid of rows, each at most
    ``size`` rows: whole inner runs when ``size >= n_inner``, else pieces of one run.

    Chunked passes build each block with a few broadcast operations (no gathers), which
    keeps their overhead over the model's own cost small. An automatic
    :class:`~taylorattr.batching.ChunkRows` size may vary between blocks while it is timed.
    """
    yield from _progress(planned_blocks(n_outer, n_inner, size),
                         count_blocks(n_outer, n_inner, size), show_progress, desc)


def target_gradient(model, rows: torch.Tensor, target_rows: torch.Tensor | None):
    """Gradient of the explained output of each row w.r.t. that row, and the output.

    ``rows`` must be a leaf tensor (it is made to require grad here). Parameter
    gradients are not computed: ``torch.autograd.grad`` asks only for ``rows``.
    """
    rows.requires_grad_(True)
    with torch.enable_grad():
        out = select_output(model(rows), target_rows)
        (grad,) = torch.autograd.grad(out.sum(), rows)
    return grad, out.detach()


def per_sample_sum(t: torch.Tensor) -> torch.Tensor:
    return t.reshape(t.shape[0], -1).sum(1)


class AttributionMethod:
    """Base class: holds the model and does the work every method shares.

    ``attribute`` checks the flags and the inputs, runs the model once to resolve the
    target and the explained output ``f(x)``, turns ``baselines`` into what the method's
    :attr:`baseline_kind` needs, calls the subclass's ``_attribute`` and, on request,
    computes the convergence delta from the reference points ``_attribute`` reports::

        _attribute(x, baselines, target, f_x, *, show_progress, **options)
            -> (attributions shaped like x, references [B, n, ...] or None)

    ``references`` are the points the attribution explains the change against
    (``delta = sum(a) - (f(x) - mean_k f(references_k))``); None means the method explains
    ``f(x)`` itself (epsilon-LRP). The method's own options are the keyword-only
    parameters of its ``_attribute``; anything else is refused with a TypeError naming it.
    Subclasses implement ``_attribute`` only; they are final (not meant to be subclassed).
    """

    #: The registry name (``taylorattr.registry.METHODS``) of the method.
    name: str = ""
    #: ``"point"`` (``baselines`` is a scalar or tensor: one reference per sample),
    #: ``"distribution"`` (a reference set or noise: :mod:`taylorattr.baselines`) or
    #: ``"none"`` (an implicit zero reference; ``attribute`` takes no ``baselines``).
    baseline_kind: str = "point"

    def __init__(self, model) -> None:
        check_model(model)
        self.model = model

    def __repr__(self) -> str:
        return f"{type(self).__name__}({type(self.model).__name__})"

    def attribute(self, inputs: torch.Tensor, baselines=0.0, target=None, *,
                  return_convergence_delta: bool = False, show_progress: bool = False,
                  **options):
        """Attributions ``[B, ...]`` shaped like ``inputs``.

        Args:
            inputs: ``[B, ...]`` float32/float64 batch.
            baselines: the reference (see :attr:`baseline_kind` and
                :mod:`taylorattr.baselines`): a scalar, a tensor broadcastable to ``inputs``
                or one baseline per sample, for point methods.
            target: None (argmax class), an int, or a ``[B]`` integer tensor.
            return_convergence_delta: also return ``sum(a) - (f(x) - f(baselines))`` per
                sample (Captum's sign), averaged over the references a method draws.
            show_progress: a tqdm bar over the method's chunks.
            **options: the method's own options (the keyword-only parameters of its
                ``_attribute``, e.g. ``n_steps`` for Integrated Gradients).
        """
        return self._run(inputs, baselines, target, options, show_progress,
                         return_convergence_delta).result()

    @classmethod
    def options(cls) -> dict[str, inspect.Parameter]:
        """The method's own options: keyword-only parameters of ``_attribute``."""
        params = inspect.signature(cls._attribute).parameters
        return {k: p for k, p in params.items()
                if p.kind is inspect.Parameter.KEYWORD_ONLY and k != "show_progress"}

    # ---- the shared work ----------------------------------------------------------
    def _run(self, inputs, baselines, target, options: dict, show_progress,
             return_convergence_delta) -> Explanation:
        """Everything ``attribute`` does, with the references kept (the audit needs them)."""
        check_bool(return_convergence_delta, "return_convergence_delta")
        check_bool(show_progress, "show_progress")
        unknown = sorted(set(options) - set(self.options()))
        if unknown:
            accepted = ", ".join(sorted(self.options())) or "none"
            raise TypeError(f"{type(self).__name__}.attribute got unexpected keyword argument(s) "
                            f"{', '.join(map(repr, unknown))} (method options: {accepted})")
        x, t, fx = self._inputs_and_target(inputs, target)
        base = self._baselines(baselines, x)
        attr, refs = self._attribute(x, base, t, fx, show_progress=show_progress, **options)
        self._finite(attr)
        delta = self._delta(attr, fx, refs, t) if return_convergence_delta else None
        return Explanation(attr, refs, fx, t, delta)

    def _baselines(self, baselines, x: torch.Tensor):
        if self.baseline_kind == "point":
            if isinstance(baselines, Point):
                baselines = baselines.value
            elif isinstance(baselines, Baseline):
                raise TypeError(f"baselines: {type(self).__name__} takes a point baseline (a "
                                f"scalar or tensor), got a {type(baselines).__name__}")
            return broadcast_baselines(baselines, x)
        return baselines

    def _inputs_and_target(self, inputs, target):
        """Check ``inputs``, run the model once on them and resolve ``target``.

        Returns ``(x, target_index, f_x)`` with ``x`` detached and ``f_x`` the explained
        output per sample ``[B]``.
        """
        x = check_inputs(inputs).detach()
        with torch.no_grad():
            out = model_output(self.model, x)
        t = resolve_target(target, out)
        return x, t, select_output(out, t)

    def _explained(self, rows: torch.Tensor, target: torch.Tensor | None,
                   chunk: int | None = None) -> torch.Tensor:
        """The explained output of ``rows`` (no grad), in chunks of ``chunk`` rows."""
        n = rows.shape[0]
        chunk = chunk or default_chunk_rows(rows, backward=False, model=self.model)
        outs = []
        with torch.no_grad():
            for a, b in chunk_ranges(n, chunk):
                outs.append(select_output(self.model(rows[a:b]),
                                          None if target is None else target[a:b]))
        return torch.cat(outs)

    def _delta(self, attr, fx, refs, t) -> torch.Tensor:
        """``sum(a) - (f(x) - mean_k f(refs_k))`` per sample; ``sum(a) - f(x)`` without refs."""
        if refs is None:
            explained = fx
        else:
            batch, n = refs.shape[:2]
            rows = refs.reshape((batch * n,) + tuple(refs.shape[2:]))
            f_ref = self._explained(rows, None if t is None else t.repeat_interleave(n))
            explained = fx - f_ref.view(batch, n).mean(1)
        return per_sample_sum(attr) - explained.to(attr.dtype)

    @staticmethod
    def _finite(attributions: torch.Tensor) -> torch.Tensor:
        """Refuse non-finite attributions: the model was finite at the inputs, so NaN or inf
        here means it overflowed at an occluded copy, a path point or a baseline."""
        if not torch.isfinite(attributions).all():
            raise ValueError("model returned NaN or inf away from the inputs (at occluded copies, "
                             "integration-path points or baselines); the attributions are not finite")
        return attributions

    def _attribute(self, x, baselines, target, fx, *, show_progress=False):  # pragma: no cover
        raise NotImplementedError


class ImplicitBaselineMethod(AttributionMethod):
    """A method with a fixed reference (the zero input): ``attribute`` takes no baselines."""

    baseline_kind = "none"

    def attribute(self, inputs: torch.Tensor, target=None, *,
                  return_convergence_delta: bool = False, show_progress: bool = False,
                  **options):
        """Attributions ``[B, ...]`` shaped like ``inputs`` (see :meth:`AttributionMethod.attribute`;
        the reference is fixed by the method)."""
        return self._run(inputs, None, target, options, show_progress,
                         return_convergence_delta).result()


@dataclass(frozen=True)
class Explanation:
    """What one ``attribute`` call computed: the attributions, the references they explain
    the change against (``[B, n, ...]``, None: ``f(x)`` itself), ``f(x)``, the resolved
    target and the convergence delta (None unless asked)."""

    attributions: torch.Tensor
    references: torch.Tensor | None
    output: torch.Tensor
    target: torch.Tensor | None
    delta: torch.Tensor | None = None

    def result(self):
        """``attributions``, or ``(attributions, delta)`` when the delta was asked for."""
        return self.attributions if self.delta is None else (self.attributions, self.delta)
