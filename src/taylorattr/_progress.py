"""A per-chunk progress bar for any call that runs rows through a model.

:func:`model_rows_bar` counts the rows the model sees (a forward hook on the model: one
update per model call, i.e. per chunk of a chunked pass; for the layer-wise engines, per
run of its first leaf module) on a tqdm bar that does not stay
on screen (``leave=False``), labelled by the caller and totalled by the planned rows when
they are known (:mod:`taylorattr.cost`). The hook only reads the input's batch size, so
the results are bitwise those of an unobserved run.
"""
from __future__ import annotations

import contextlib

import torch
from torch import nn

__all__ = ["model_rows_bar"]


def _rows(args) -> int:
    first = args[0] if args else None
    return int(first.shape[0]) if isinstance(first, torch.Tensor) and first.dim() else 0


@contextlib.contextmanager
def model_rows_bar(model, desc: str, total: int | None = None):
    """Within the block, a tqdm bar (``leave=False``, unit ``row``) moves by each call's
    rows. Yields the bar, or None when ``model`` takes no forward hooks (then nothing is
    shown and the caller may fall back to its own bar).

    Rows are counted at the model's forward, and for engines that run the model's layers
    without calling its forward (the layer-wise rules run a traced plan of its modules) at
    the first leaf module such a run calls, outside any forward of the model itself."""
    if not isinstance(model, nn.Module) or isinstance(model, torch.jit.ScriptModule):
        yield None
        return
    from tqdm.auto import tqdm

    bar = tqdm(total=total, desc=desc, unit="row", leave=False, dynamic_ncols=True)
    state = {"inside": 0, "sentinel": None}

    def advance(rows: int) -> None:
        if rows:  # the memory probe's few rows are not planned: never run past the total
            bar.update(rows if bar.total is None else max(0, min(rows, bar.total - bar.n)))

    def enter(module, args):
        state["inside"] += 1

    def leave(module, args, output):
        state["inside"] -= 1
        advance(_rows(args))

    def leaf(module, args, output):
        if state["inside"]:
            return
        if state["sentinel"] is None:
            state["sentinel"] = module
        if module is state["sentinel"]:
            advance(_rows(args))

    handles = [model.register_forward_pre_hook(enter), model.register_forward_hook(leave)]
    handles += [m.register_forward_hook(leaf) for m in model.modules()
                if m is not model and not any(True for _ in m.children())]
    try:
        yield bar
    finally:
        for h in handles:
            h.remove()
        bar.close()
