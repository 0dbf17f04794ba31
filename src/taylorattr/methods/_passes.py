"""The chunked passes every method shares: rows per model call, the blocks of a grid of
rows, the gradient of the explained output of rows, and the cost of a gradient pass.

Rows are sized by :func:`taylorattr.runtime.batching.chunk_rows` (measured against a memory
budget); an explicit size is used as given.
"""
from __future__ import annotations

from collections.abc import Iterator

import torch

from .._validation import check_optional_positive_int, select_output
from ..runtime.batching import chunk_rows, count_blocks, heuristic_rows, planned_blocks
from ..runtime.cost import Cost
from ..runtime.progress import bar_label

__all__ = ["check_optional_positive_int", "chunk_ranges", "default_chunk_rows",
           "gradient_pass_cost", "grid_blocks", "input_gradient", "per_sample_sum",
           "target_gradient"]


def default_chunk_rows(inputs: torch.Tensor, backward: bool, model=None) -> int:
    """Rows per model call for passes over rows shaped like ``inputs[0]``.

    With ``model``: measured once per (model, row shape, dtype, device, threads) against the
    memory budget and refined by timing (:func:`taylorattr.runtime.batching.chunk_rows`); without:
    a fixed heuristic from the features per row.
    """
    if model is None:
        return heuristic_rows(inputs, backward)
    return chunk_rows(model, inputs, backward)


def _progress(blocks, total: int, show_progress: bool, desc: str):
    if not show_progress:
        yield from blocks
        return
    from tqdm.auto import tqdm

    with tqdm(total=total, desc=bar_label(desc), unit="chunk") as bar:
        for n, block in enumerate(blocks, 1):
            yield block
            bar.update(1)
        if bar.total != n:  # a size being timed changes the count: end at 100%
            bar.total = n
            bar.refresh()


def chunk_ranges(n_rows: int, size: int, show_progress: bool = False,
                 desc: str = "") -> Iterator[tuple[int, int]]:
    """``(start, stop)`` pairs covering ``range(n_rows)`` in chunks of at most ``size`` rows
    (an automatic :class:`~taylorattr.runtime.batching.ChunkRows` size is refined by timing)."""
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
    :class:`~taylorattr.runtime.batching.ChunkRows` size may vary between blocks while it is timed.
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


def gradient_pass_cost(rows: int):
    """The :class:`~taylorattr.runtime.cost.Cost` of ``rows`` rows run forward and swept backward
    (:func:`target_gradient` on them)."""

    return Cost(forward_rows=rows, backward_rows=rows)


def input_gradient(model, x: torch.Tensor, target, fx: torch.Tensor) -> torch.Tensor:
    """``d f / d x`` at the inputs: from the graph of the base class's forward when it kept
    one (``x`` a leaf requiring grad, ``fx`` its output), else by a forward+backward pass."""
    if x.requires_grad and fx.requires_grad:
        (grad,) = torch.autograd.grad(fx.sum(), x)
        return grad
    return target_gradient(model, x.detach().clone(), target)[0]


def per_sample_sum(t: torch.Tensor) -> torch.Tensor:
    return t.reshape(t.shape[0], -1).sum(1)
