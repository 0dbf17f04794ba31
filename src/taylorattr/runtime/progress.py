"""A per-chunk progress bar for any call that runs rows through a model.

:func:`model_rows_bar` counts the rows the model sees (a forward hook on the model: one
update per model call, i.e. per chunk of a chunked pass; for the layer-wise engines, per
run of their plan) on a tqdm bar that does not stay
on screen (``leave=False``), labelled by the caller and totalled by the planned rows when
they are known (:mod:`taylorattr.runtime.cost`). The hook only reads the input's batch size, so
the results are bitwise those of an unobserved run.
"""
from __future__ import annotations

import contextlib
import contextvars

import torch
import tqdm.auto
from torch import nn

from .batching import probing

__all__ = ["bar_label", "labelled", "model_rows_bar", "report_rows"]

#: The label every bar opened in a :func:`labelled` block shows instead of its own.
_LABEL: contextvars.ContextVar[str | None] = contextvars.ContextVar("bar_label", default=None)


@contextlib.contextmanager
def labelled(label: str):
    """Within the block every progress bar is labelled ``label`` (a caller's name for the
    whole call, e.g. Captum's ``"Occlusion attribution"``) instead of its own ``desc``; in
    nested blocks the outermost label stands (the call the user made)."""
    token = _LABEL.set(_LABEL.get() or label)
    try:
        yield
    finally:
        _LABEL.reset(token)


def bar_label(desc: str) -> str:
    """The label of a bar whose own description is ``desc`` (:func:`labelled`)."""
    return _LABEL.get() or desc

#: Called as ``observe(model, x)`` by :func:`report_rows`.
_ROW_OBSERVERS: list = []


def report_rows(model, x) -> None:
    """Say that ``model``'s rows ``x`` ran without its forward (the layer-wise engines run
    a traced plan of its modules, which forward hooks do not see): the open bars count them."""
    for observe in _ROW_OBSERVERS:
        observe(model, x)


def _rows(args) -> int:
    first = args[0] if args else None
    return int(first.shape[0]) if isinstance(first, torch.Tensor) and first.dim() else 0


@contextlib.contextmanager
def model_rows_bar(model, desc: str, total: int | None = None):
    """Within the block, a tqdm bar (``leave=False``, unit ``row``) moves by each call's
    rows. Yields the bar, or None when ``model`` takes no forward hooks (then nothing is
    shown and the caller may fall back to its own bar).

    Rows are counted at the model's forward and, for the layer-wise engines (which run a
    traced plan of the model's modules, never its forward), at each run of the plan
    (:func:`report_rows`)."""
    if not isinstance(model, nn.Module) or isinstance(model, torch.jit.ScriptModule):
        yield None
        return
    bar = tqdm.auto.tqdm(total=total, desc=bar_label(desc), unit="row", leave=False, dynamic_ncols=True)

    def advance(rows: int) -> None:
        # the chunk sizes' memory probe and a graph capture (torch.export runs forward on
        # fake tensors once per model) are not planned work
        if rows and not probing() and not torch.compiler.is_compiling():
            bar.update(rows)

    def on_forward(module, args, output):
        advance(_rows(args))

    def on_plan_run(module, x):
        advance(_rows((x,)))

    handle = model.register_forward_hook(on_forward)
    _ROW_OBSERVERS.append(on_plan_run)
    try:
        yield bar
    finally:
        handle.remove()
        _ROW_OBSERVERS.remove(on_plan_run)
        bar.close()
