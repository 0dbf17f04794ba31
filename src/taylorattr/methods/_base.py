"""The one shared base of the attribution methods.

Every method follows one call contract (DESIGN.md section 5)::

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

from collections.abc import Iterator

import torch

from .._validation import (
    check_inputs,
    check_model,
    check_positive_int,
    model_output,
    resolve_target,
    select_output,
)
from ..batching import chunk_rows, count_blocks, heuristic_rows, planned_blocks

__all__ = [
    "AttributionMethod",
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
    """Base class: holds the model and implements the checks every method needs.

    Subclasses implement ``attribute``; they are final (not meant to be subclassed).
    """

    #: The registry name (``taylorattr.methods.METHODS``) of the method.
    name: str = ""

    def __init__(self, model) -> None:
        check_model(model)
        self.model = model

    def __repr__(self) -> str:
        return f"{type(self).__name__}({type(self.model).__name__})"

    # ---- shared steps -------------------------------------------------------------
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
        chunk = chunk or default_chunk_rows(rows, backward=False)
        outs = []
        with torch.no_grad():
            for a, b in chunk_ranges(n, chunk):
                outs.append(select_output(self.model(rows[a:b]),
                                          None if target is None else target[a:b]))
        return torch.cat(outs)

    @staticmethod
    def _finite(attributions: torch.Tensor) -> torch.Tensor:
        """Refuse non-finite attributions: the model was finite at the inputs, so NaN or inf
        here means it overflowed at an occluded copy, a path point or a baseline."""
        if not torch.isfinite(attributions).all():
            raise ValueError("model returned NaN or inf away from the inputs (at occluded copies, "
                             "integration-path points or baselines); the attributions are not finite")
        return attributions

    @classmethod
    def _with_delta(cls, attributions: torch.Tensor, output_change: torch.Tensor,
                    return_convergence_delta: bool):
        """``attributions`` or ``(attributions, sum(attributions) - output_change)``."""
        cls._finite(attributions)
        if not return_convergence_delta:
            return attributions
        delta = per_sample_sum(attributions) - output_change.to(attributions.dtype)
        return attributions, delta
