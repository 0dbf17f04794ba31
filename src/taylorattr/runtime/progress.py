"""Progress of long work: a bar on a terminal, one line per stage in a log.

For a command (the CLI's ``reproduce``, ``attribute``, ``evaluate``, ...):

* :func:`interactive` says whether bars are drawn at all: only when the stream (stderr)
  is a terminal. A command passes ``show_progress=interactive()`` to the library calls it
  makes, so that no bar redraws into a log file.
* :func:`stage` is one stage of the command: on a terminal a tqdm bar over its ``total``
  items (``advance(n)`` moves it); otherwise one line when it starts and one when it ends,
  with the items done and the seconds taken (``taylorattr attribute: IG: done, 6 items in
  12.3 s``), and between them the items done so far, at most every :data:`LOG_SECONDS`
  (``taylorattr attribute: IG: 3/6 items done in 11.0 s``). ``enabled=False`` shows nothing. Use::

      with progress.stage("attribute", "IG", total=len(items), unit="item") as advance:
          for item in items:
              ...
              advance()

For a library call that runs rows through a model,
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
import sys
import time

import torch
import tqdm.auto
from torch import nn

from .batching import probing

__all__ = ["LOG_SECONDS", "bar_label", "interactive", "labelled", "model_rows_bar", "report_rows", "stage"]


def interactive(stream=None) -> bool:
    """Whether progress bars are drawn on ``stream`` (default ``sys.stderr``): only on a
    terminal; a log file or a pipe gets :func:`stage`'s lines instead of redraws."""
    stream = sys.stderr if stream is None else stream
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        return False


def _count(n: int, unit: str) -> str:
    return f"{n:,} {unit}{'' if n == 1 else 's'}"


@contextlib.contextmanager
def stage(command: str, label: str, total: int | None = None, unit: str = "item", *,
          enabled: bool = True, stream=None):
    """One stage of ``command``: yields ``advance(n=1)``, which counts ``n`` more items done.

    On a terminal (:func:`interactive`) a tqdm bar labelled ``label`` over ``total`` items
    (``leave=False``); otherwise two lines on ``stream`` (default stderr),
    ``taylorattr {command}: {label}: started[, {total} {unit}s]`` and, when the block ends
    without an exception, ``taylorattr {command}: {label}: done, {n} {unit}s in {t} s`` (the
    items counted by ``advance``; without any, ``done in {t} s``). A failing block adds no
    line: the error says why. ``enabled=False``: nothing is shown."""
    stream = sys.stderr if stream is None else stream
    if not enabled:
        yield lambda n=1: None
        return
    if interactive(stream):
        bar = tqdm.auto.tqdm(total=total, desc=label, unit=unit, leave=False,
                             dynamic_ncols=True, file=stream)
        try:
            yield bar.update
        finally:
            bar.close()
        return
    done = [0]
    start = time.perf_counter()
    said = [start]

    def advance(n: int = 1) -> None:
        done[0] += n
        now = time.perf_counter()
        if n and now - said[0] >= LOG_SECONDS and (total is None or done[0] < total):
            said[0] = now
            of = "" if total is None else f"/{total:,}"
            print(f"taylorattr {command}: {label}: {done[0]:,}{of} {unit}s done in "
                  f"{now - start:.1f} s", file=stream, flush=True)

    planned = "" if total is None else f", {_count(total, unit)}"
    print(f"taylorattr {command}: {label}: started{planned}", file=stream, flush=True)
    yield advance
    counted = f", {_count(done[0], unit)} in" if done[0] else " in"
    print(f"taylorattr {command}: {label}: done{counted} {time.perf_counter() - start:.1f} s",
          file=stream, flush=True)

#: In a log, :func:`stage` says how many items are done at most once per this many
#: seconds (and never for the last: its "done" line says it).
LOG_SECONDS = 10.0

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
    """The batch size of a call's first argument; 0 for a symbolic one (a graph capture
    runs forward on fake tensors: ``int()`` of their batch size would fix it in the
    captured program)."""
    first = args[0] if args else None
    if not isinstance(first, torch.Tensor) or not first.dim():
        return 0
    rows = first.shape[0]
    return rows if isinstance(rows, int) else 0


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
        # fake tensors once per model: ``_rows`` reads 0 there) are not planned work
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
