r"""Know the cost before paying it: rows counted from a plan, seconds from a timed probe.

Every long entry point runs rows through the model in three kinds of passes:

* **forward rows** (no gradient): occluded copies, coalitions, removed squares;
* **backward rows**: rows whose explained output is also differentiated (one reverse
  sweep per row; each such row is a forward row too);
* **Taylor-mode rows**: one series row per (sample, direction) of a Taylor-mode pass of
  order ``K`` (:func:`taylorattr.taylor.mode.propagate`), ``taylor_passes`` passes in all,
  and ``taylor_backward_rows`` of them swept backward (counted once per sweep).

The counts come from the method's own plan (its windows, steps, samples, references,
permutations, directions, squares) *before* anything runs, and equal the rows the model
then sees (``tests/test_cost.py`` checks this with :class:`RowCounter`). The automatic
chunk size's one-off memory probe (a few rows per model and row shape,
:mod:`taylorattr.runtime.batching`) is not counted. The estimate is

.. math::

    T = R_f\,t_f + R_b\,t_b + (R_T + 2 R_{Tb})\,t_T(K)

with ``t_f`` the seconds per forward row, ``t_b`` the extra seconds per backward row and
``t_T(K)`` the seconds per Taylor-mode row of order ``K``, each timed on a probe batch of
the actual model, row shape, dtype and device (:func:`measure_rates`), per row at the
stage's own call size (:func:`call_line` fits the per-call overhead once per model and
kind of pass), and
:func:`machine_load` says whether other work slowed the probes.

Why one module: counting rows, timing them and turning both into seconds against a
budget are one estimate; the counts (:class:`Cost`, :class:`RowCounter`) and the timings
(:class:`Rates`, :class:`Load`) meet only in :func:`estimate`.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field, replace

import torch
from torch import nn

from .._validation import (
    check_inputs,
    check_int,
    check_positive_int,
    check_real,
    cpu_generator,
    draw,
    model_output,
)
from ..inputs import follow_mode
from .batching import chunk_rows

__all__ = ["GPU_SCALE_ROWS", "Cost", "CostError", "Load", "Rates", "RowCounter",
           "call_line", "check_budget", "estimate", "format_seconds", "machine_load",
           "measure_rates", "per_row_seconds", "probe_budget", "stage_estimate", "summed"]

#: Rows per explained sample from which a cost is flagged as GPU-scale when it runs on a
#: CPU: pixel-level occlusion of a 224x224 image is 50,176 rows per image.
GPU_SCALE_ROWS = 20_000

#: :func:`call_line` times calls of at least this many rows (or the limit): the line through
#: two small sizes, read at a stage's call size of thousands of rows, carries their noise a
#: hundred-fold (on a busy machine, 8- and 32-row calls gave per-row seconds 3x those of
#: 512-row calls).
MIN_LINE_ROWS = 256

#: :func:`call_line` reads the machine's level from the mean of calls over at least this
#: many seconds: long enough to hold many scheduler slices of a busy machine, short enough
#: for dozens of models in one estimate.
LEVEL_SECONDS = 0.2

#: A reverse sweep through a Taylor-mode row costs about this many of its forward rows.
REVERSE_FACTOR = 2.0

#: What makes a run cheaper, named by :func:`check_budget`.
CHEAPER = ("a larger occlusion patch (e.g. patch=8 or 16 at 224x224)", "fewer samples (--samples)",
           "a GPU (--device cuda)", "several processes (torchrun)")


@dataclass(frozen=True)
class Cost:
    """The rows one call (or a stage of calls) runs, and their estimated seconds.

    ``samples``: the explained samples (images); ``order``: the Taylor order of the
    Taylor-mode rows (0 without them); ``seconds``/``device``: set by :func:`estimate`;
    ``call_rows``: the rows per model call where the run fixes them (a training batch;
    0: the automatic chunk size); ``out_of_reach``: why the call cannot finish on this
    machine whatever its rows cost (a method's own work beyond its model rows, e.g. a
    solve too large; "" when none): a budget refuses it. Costs add (``a + b``: rows and
    seconds summed, samples summed, the label kept when they agree, the smaller fixed call
    size, the reasons out of reach joined).
    """

    label: str = ""
    samples: int = 0
    forward_rows: int = 0
    backward_rows: int = 0
    taylor_passes: int = 0
    taylor_rows: int = 0
    taylor_backward_rows: int = 0
    order: int = 0
    seconds: float | None = None
    device: str = ""
    notes: tuple[str, ...] = field(default=())
    call_rows: int = 0  # rows per model call where the run fixes it (a training batch); 0: chunks
    out_of_reach: str = ""  # why no budget affords it ("" when none)

    def __post_init__(self):
        for name in ("samples", "forward_rows", "backward_rows", "taylor_passes",
                     "taylor_rows", "taylor_backward_rows", "order", "call_rows"):
            v = getattr(self, name)
            check_int(v, f"Cost.{name}", 0)

    def __add__(self, other: Cost) -> Cost:
        if not isinstance(other, Cost):
            return NotImplemented
        seconds = None if self.seconds is None or other.seconds is None \
            else self.seconds + other.seconds
        return Cost(label=self.label if self.label == other.label or not other.label
                    else (other.label if not self.label else f"{self.label} + {other.label}"),
                    samples=self.samples + other.samples,
                    forward_rows=self.forward_rows + other.forward_rows,
                    backward_rows=self.backward_rows + other.backward_rows,
                    taylor_passes=self.taylor_passes + other.taylor_passes,
                    taylor_rows=self.taylor_rows + other.taylor_rows,
                    taylor_backward_rows=self.taylor_backward_rows + other.taylor_backward_rows,
                    order=max(self.order, other.order), seconds=seconds,
                    device=self.device or other.device,
                    notes=tuple(dict.fromkeys(self.notes + other.notes)),
                    call_rows=min((c for c in (self.call_rows, other.call_rows) if c),
                                  default=0),
                    out_of_reach="; ".join(dict.fromkeys(
                        r for r in (self.out_of_reach, other.out_of_reach) if r)))

    def labelled(self, label: str, samples: int | None = None) -> Cost:
        return replace(self, label=label, samples=self.samples if samples is None else samples)

    @property
    def rows(self) -> int:
        """All rows: forward, backward (counted once more) and Taylor-mode."""
        return self.forward_rows + self.backward_rows + self.taylor_rows + \
            self.taylor_backward_rows

    @property
    def gpu_scale(self) -> bool:
        """More than :data:`GPU_SCALE_ROWS` rows per sample, on a CPU (or unknown device)."""
        per = self.rows / max(self.samples, 1)
        return per > GPU_SCALE_ROWS and not self.device.startswith("cuda")

    def describe(self) -> str:
        """One line: ``"Occlusion-1, 4 images, 200,704 forwards, about 80 min on cpu"``."""
        parts = [self.label] if self.label else []
        if self.samples:
            parts.append(f"{self.samples:,} image{'s' if self.samples != 1 else ''}")
        parts.append(f"{self.forward_rows:,} forwards")
        if self.backward_rows:
            parts.append(f"{self.backward_rows:,} backwards")
        if self.taylor_rows:
            parts.append(f"{self.taylor_rows:,} order-{self.order} Taylor rows in "
                         f"{self.taylor_passes:,} passes")
        if self.taylor_backward_rows:
            parts.append(f"{self.taylor_backward_rows:,} rows swept back through them")
        if self.seconds is not None:
            parts.append(f"about {format_seconds(self.seconds)} on {self.device or 'cpu'}")
        text = ", ".join(parts)
        if self.gpu_scale:
            text += " (GPU-scale: a CPU cannot afford this; use a GPU or a coarser setting)"
        if self.out_of_reach:
            text += f" (out of reach: {self.out_of_reach})"
        return text + "".join(f"; {n}" for n in self.notes)

    __str__ = describe


class CostError(ValueError):
    """A run estimated above its budget; the message is one line."""


def format_seconds(seconds: float) -> str:
    """``"40 s"``, ``"12 min"``, ``"3.5 h"``, ``"2.1 days"``."""
    if not math.isfinite(seconds) or seconds < 0:
        raise ValueError(f"seconds must be finite and >= 0, got {seconds!r}")
    if seconds < 90:
        return f"{max(seconds, 0.1):.2g} s" if seconds < 10 else f"{seconds:.0f} s"
    if seconds < 90 * 60:
        return f"{seconds / 60:.0f} min"
    if seconds < 48 * 3600:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} days"


# --------------------------------------------------------------------------- counting

class RowCounter(nn.Module):
    """Wraps a model and counts the rows it sees: every forward call adds its batch size to
    ``forward_rows``; a reverse sweep through an output adds that output's rows to
    ``backward_rows`` (a tensor hook on the output). Traced by torch.fx, it is transparent
    (a proxy is not counted: Taylor-mode passes run the traced graph, not this forward).

    Code that runs the model's traced graph itself (the layer-wise engine's passes through
    its plan) reports each such run with :meth:`observe`, counted like a forward call."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model
        follow_mode(self, model)
        self.reset()

    def reset(self) -> None:
        self.forward_rows = 0
        self.backward_rows = 0

    def forward(self, x):
        return self.observe(x, self.model(x))

    def observe(self, x, out):
        """Count one run of the model on ``x`` that returned ``out`` (its rows forward, and
        a hook on ``out`` for its reverse sweeps); returns ``out``. Proxies are not counted."""
        if isinstance(x, torch.fx.Proxy):
            return out
        self.forward_rows += int(x.shape[0])
        if isinstance(out, torch.Tensor) and out.requires_grad:
            out.register_hook(self._on_backward)
        return out

    def _on_backward(self, grad):
        self.backward_rows += int(grad.shape[0])


# --------------------------------------------------------------------------- timing

@dataclass(frozen=True)
class Rates:
    """Seconds per row measured on a probe batch: forward, extra for backward, and per
    Taylor-mode row of ``order`` (None when not measured)."""

    forward: float
    backward: float = 0.0
    taylor: float | None = None
    order: int = 0
    device: str = "cpu"
    probe_rows: int = 0


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def call_line(call, limit: int, device, probe_seconds: float, repeats: int = 3,
              level_seconds: float | None = None, row_budget: int | None = None
              ) -> tuple[float, float, int]:
    r"""``(a, b, n)``: the per-call seconds ``a`` and per-row seconds ``b`` of ``call(m)`` (a
    call on ``m`` rows), :math:`t(m) = f\,(a_0 + b_0\,m)` (``a``: dispatch, thread start-up;
    ``b``: the rows), and the largest size timed, ``n <= limit``.

    The shape, :math:`a_0 + b_0 m`: after a warm-up call the size grows from 8 rows,
    four-fold, to at least :data:`MIN_LINE_ROWS` rows, then on until the rows weigh (a call takes
    ``probe_seconds`` and twice the call before it) or a call takes ``20 * probe_seconds``
    or the size reaches ``limit``; the least of ``repeats`` interleaved timings is taken
    there (``n``) and at the size before, and the line goes through the two (``a_0 = 0``,
    ``b_0 = t(n) / n`` when only one size was timed, or when noise larger than the rows'
    cost makes the slope non-positive). The least of several timings is what the machine
    can do at its quietest, the same on every try.

    The level, :math:`f = \max(1, \bar t(n) / (a_0 + b_0 n))`: the mean of calls on ``n``
    rows over at least ``level_seconds`` (default :data:`LEVEL_SECONDS`; the repeats
    count; at most 1,000 calls) over the least one. A run pays the mean, not the least: on a quiet machine
    ``f`` is about 1, and on a busy one it is the slowdown the load causes while the
    probe runs (a descheduled moment only ever adds to a timing, and the least of a few
    short calls is a lucky draw that changes from try to try).

    ``row_budget``: the rows the probe may run in all (a stage of few rows is not timed
    with more work than it holds: an estimate that cost as much as the run): the sizes
    stop growing, and the repeats and the level stop, once the rows timed reach it (every
    size timed once at least)."""
    spent = [0]

    def timed(m):
        start = time.perf_counter()
        call(m)
        _sync(device)
        spent[0] += m
        return time.perf_counter() - start

    def affordable(m) -> bool:
        return row_budget is None or spent[0] + m <= row_budget

    n = min(limit, 8)
    call(n)  # warm-up (first-call allocations)
    _sync(device)
    seen = {n: [timed(n)]}
    last = 0.0
    while n < limit and (n < MIN_LINE_ROWS or seen[n][0] < max(probe_seconds, 2 * last)) \
            and seen[n][0] < 20 * probe_seconds and affordable(min(limit, 4 * n)):
        last, n = seen[n][0], min(limit, 4 * n)
        seen[n] = [timed(n)]
    for _ in range(repeats - 1):  # the last two sizes, `repeats` times, interleaved so
        for size in list(seen)[-2:]:  # that both see the same moments of a busy machine
            if affordable(size):
                seen[size].append(timed(size))
    while sum(seen[n]) < (LEVEL_SECONDS if level_seconds is None else level_seconds) \
            and len(seen[n]) < 1000 and affordable(n):  # microsecond calls: 1,000 do
        seen[n].append(timed(n))
    least = {size: min(times) for size, times in seen.items()}
    level = max(1.0, sum(seen[n]) / len(seen[n]) / least[n]) if least[n] > 0 else 1.0
    if len(least) < 2:
        return 0.0, level * least[n] / n, n
    n1 = list(least)[-2]
    b = (least[n] - least[n1]) / (n - n1)
    if b <= 0:
        return 0.0, level * least[n] / n, n
    return level * max(least[n1] - b * n1, 0.0), level * b, n


def per_row_seconds(call, cap: int, device, probe_seconds: float, repeats: int = 3
                    ) -> tuple[float, int]:
    r"""Seconds per row of ``call(n)`` (a call on ``n`` rows) when it runs ``cap`` rows per
    call, and the largest size timed: :func:`call_line` up to ``cap`` rows, then
    :math:`t(\mathrm{cap}) / \mathrm{cap} = a/\mathrm{cap} + b` (measured directly when the
    probe reached ``cap``). Timing tiny calls and dividing would charge every row the
    per-call overhead, which on a busy machine (a thread waiting for its descheduled
    sibling) is milliseconds or more: estimates ten times too high."""
    a, b, n = call_line(call, cap, device, probe_seconds, repeats)
    return a / cap + b, n


def _model_key(model):
    """What the speed of ``model`` depends on (its type and layers, not its weights): untrained
    copies of one architecture share their timings."""
    if isinstance(model, nn.Module):
        return type(model).__module__, type(model).__qualname__, repr(model)
    return id(model)


def measure_rates(model, x: torch.Tensor, *, backward: bool = True, taylor_order: int = 0,
                  probe_rows: int | None = None, taylor_directions: int = 4,
                  max_rows: int | None = None, probe_seconds: float = 0.5,
                  taylor_pass=None, cache: dict | None = None,
                  row_budget: int | None = None) -> Rates:
    """Time the model on copies of the first row of ``x``: forward without gradient and,
    with ``backward``, forward + reverse sweep, per row at the rows per call the stage's
    chunked passes use (the automatic chunk size, at most ``max_rows``; ``probe_rows``
    fixes it), since the seconds per row depend on the call size (per-call overheads, and
    on CPU whether a chunk's blocks take glibc's mmap path): one :func:`call_line` per
    kind of pass (timed up to the memory's chunk size, with calls of about
    ``probe_seconds`` at most), read at that call size. With ``taylor_order``, Taylor-mode
    passes of up to ``taylor_directions`` directions (the stage's rows per pass), run by
    ``taylor_pass(x1, directions, order)`` (the Taylor layer's
    :func:`taylorattr.taylor.mode.timing_pass`: this layer knows no Taylor mode), per
    direction the same way. :func:`probe_sizes` picks sizes like a stage's own.
    ``cache``: a dict that keeps the timings of (architecture, row shape, dtype, device,
    threads, sizes) for later calls (an estimate of many stages on copies of few models).
    ``row_budget``: the rows each kind of pass may time (:func:`call_line`).
    """
    x = check_inputs(x).detach()
    if max_rows is not None:
        check_positive_int(max_rows, "max_rows")
    check_real(probe_seconds, "probe_seconds", 0.0, strict=True)
    if probe_rows is not None:
        check_positive_int(probe_rows, "probe_rows")

    def rows(n):
        return x[:1].expand((n,) + tuple(x.shape[1:])).contiguous()

    def fwd(n):
        with torch.no_grad():
            model_output(model, rows(n))

    def fwd_bwd(n):
        r = rows(n).requires_grad_(True)
        with torch.enable_grad():
            out = model_output(model, r)
            torch.autograd.grad(out.sum(), r)

    base = (_model_key(model), tuple(x.shape[1:]), x.dtype, str(x.device),
            torch.get_num_threads(), probe_seconds)

    def cached(key, compute):
        if cache is None:
            return compute()
        if key not in cache:
            cache[key] = compute()
        return cache[key]

    def timed(kind, call, limit, cap):
        """Seconds per row at ``cap`` rows per call, from the kind's one line (timed up to
        ``limit`` rows; every stage of one model shares it, whatever its call size)."""
        a, b, n = cached(base + (kind, limit),
                         lambda: call_line(call, limit, x.device, probe_seconds,
                                           row_budget=row_budget))
        return a / cap + b, min(n, cap)

    def chunk_limit(is_backward):
        if probe_rows is not None:
            return probe_rows
        return max(1, cached(base + ("chunk", is_backward),
                             lambda: int(chunk_rows(model, x[:1], is_backward))))

    def at(is_backward):  # (limit, cap): the memory's chunk, the stage's rows per call
        limit = chunk_limit(is_backward)
        return limit, max(1, min(limit, max_rows or limit))

    t_f, n_f = timed("forward", fwd, *at(False))
    t_b = 0.0
    if backward:
        t_fb, _ = timed("backward", fwd_bwd, *at(True))
        t_b = max(t_fb - t_f, 0.0)
    t_T = None
    if taylor_order:
        if not callable(taylor_pass):
            raise ValueError("taylor_order needs taylor_pass, a callable (x, directions, order) "
                             "that runs one Taylor-mode pass: taylorattr.taylor.mode.timing_pass"
                             "(model)")
        m = check_positive_int(taylor_directions, "taylor_directions")
        dirs = draw(torch.randn, (1, m) + tuple(x.shape[1:]), generator=cpu_generator(0),
                    device=x.device, dtype=torch.float64).to(x.dtype)
        t_T, _ = timed(("taylor", taylor_order, m),
                       lambda k: taylor_pass(x[:1], dirs[:, :k], taylor_order), m, m)
    return Rates(t_f, t_b, t_T, taylor_order, str(x.device), n_f)


@dataclass(frozen=True)
class Load:
    """How busy the machine is: ``average`` runnable threads (the 1-minute load average,
    read before this process times anything) on ``cpus`` CPUs."""

    average: float
    cpus: int

    @property
    def busy(self) -> bool:
        """Other work holds half the CPUs or more: timings then run several times slower
        than on the quiet machine, and more so with several threads per process (a thread
        waits for its descheduled sibling at every parallel op: measured on 2 CPUs at load
        14, a C-sg forward and backward of 256 rows took 2.1 s on 2 threads, 0.9 s on one,
        0.08 s of CPU time)."""
        return self.average >= self.cpus / 2


def machine_load() -> Load | None:
    """The machine's :class:`Load` now (None where the OS gives no load average). Read it
    before timing anything: the average then holds little of this process's own work."""
    import os

    try:
        average = os.getloadavg()[0]
    except (AttributeError, OSError):
        return None
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:
        cpus = os.cpu_count() or 1
    return Load(average, cpus)


#: The probe of a stage times at most this fraction of the stage's own rows per kind of
#: pass (at least :data:`MIN_PROBE_ROWS`): an estimate costs a small part of the run.
PROBE_FRACTION = 0.25
MIN_PROBE_ROWS = 64


def probe_budget(cost: Cost) -> int:
    """The rows :func:`estimate`'s probe may time per kind of pass for ``cost``."""
    return max(MIN_PROBE_ROWS, int(PROBE_FRACTION * cost.rows))


def probe_sizes(cost: Cost) -> dict:
    """Probe sizes close to the stage's own: at most the stage's forward rows per call, and
    Taylor-mode passes of its average rows per pass (at most 256, as directions of one
    sample: the primal is shared, so the rows of a pass set its cost), so per-call
    overheads amortise as in the run."""
    per_pass = cost.taylor_rows // max(cost.taylor_passes, 1)
    return {"max_rows": cost.call_rows or max(2, cost.forward_rows),
            "taylor_directions": max(1, min(256, per_pass))}


def estimate(cost: Cost, model=None, x: torch.Tensor | None = None, *,
             rates: Rates | None = None, probe_seconds: float = 0.5, taylor_pass=None,
             cache: dict | None = None) -> Cost:
    """``cost`` with ``seconds`` and ``device`` filled in from ``rates`` (measured here on
    ``model`` and ``x`` when not given, at the stage's own sizes (:func:`probe_sizes`) and
    at most about ``probe_seconds`` per probe call; ``taylor_pass`` times its Taylor-mode
    rows and ``cache`` keeps timings for later calls, see :func:`measure_rates`)."""
    if not isinstance(cost, Cost):
        raise TypeError(f"cost must be a Cost, got {type(cost).__name__}")
    if rates is None:
        if model is None or x is None:
            raise ValueError("estimate needs rates, or model and x to measure them on")
        rates = measure_rates(model, x, backward=cost.backward_rows > 0,
                              taylor_order=cost.order if cost.taylor_rows else 0,
                              probe_seconds=probe_seconds, taylor_pass=taylor_pass,
                              cache=cache, row_budget=probe_budget(cost), **probe_sizes(cost))
    if (cost.taylor_rows or cost.taylor_backward_rows) and (rates.taylor is None or rates.order != cost.order):
        raise ValueError(f"rates were measured without order-{cost.order} Taylor-mode rows; "
                         f"measure_rates(..., taylor_order={cost.order})")
    taylor = cost.taylor_rows + REVERSE_FACTOR * cost.taylor_backward_rows
    seconds = (cost.forward_rows * rates.forward + cost.backward_rows * rates.backward
               + (taylor * rates.taylor if taylor else 0.0))
    return replace(cost, seconds=seconds, device=rates.device)


def summed(costs) -> Cost | None:
    """The sum of an iterable of costs (rows, samples and seconds added as
    :meth:`Cost.__add__` does), or None when it is empty."""
    total = None
    for c in costs:
        total = c if total is None else total + c
    return total


def stage_estimate(label: str, costs, model, x: torch.Tensor, *,
                   rates: Rates | None = None, taylor_pass=None) -> Cost:
    """The summed, timed cost of one stage (e.g. ``"bbox on resnet18"``): ``costs`` is a
    Cost or an iterable of them (one per unit); the label is prefixed to the units' own."""
    total = summed([costs] if isinstance(costs, Cost) else costs)
    if total is None:
        raise ValueError("costs must hold at least one Cost")
    total = estimate(total, model, x, rates=rates, taylor_pass=taylor_pass)
    return replace(total, label=f"{label}: {total.label}" if total.label else label)


def check_budget(cost: Cost, budget: float | None) -> Cost:
    """Return ``cost`` when it fits ``budget`` seconds (None: no budget); otherwise raise
    :class:`CostError` with one line naming the estimate and the cheaper options."""
    if budget is None:
        return cost
    check_real(budget, "budget", 0.0, strict=True)  # seconds
    if cost.seconds is None:
        raise ValueError("cost has no estimated seconds; pass it through estimate() first")
    if cost.seconds <= budget and not cost.out_of_reach:
        return cost
    raise CostError(f"{cost.describe()} exceeds the budget of {format_seconds(budget)}; "
                    f"cheaper: {', '.join(CHEAPER)}, or raise --budget")
