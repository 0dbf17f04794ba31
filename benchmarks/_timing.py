"""Shared timing helpers for the benchmark scripts.

* :func:`interleaved_medians`: median seconds of several callables timed round-robin, so a
  change of machine load hits all of them alike.
* :func:`floor_sweep`: the real floor of a chunked pass, the best of a *fine* sweep of chunk
  sizes: every size on a 2^1 grid from 16 rows once, then a 2^(1/8) grid (2^(1/4) with ``quick``)
  around the best, each timed ``repeats`` times interleaved; returns the best sizes' callables
  for the final interleaved comparison with the method and its peers.
"""
from __future__ import annotations

import json
import math
import os
import statistics
import time

CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}


def run_times(fn, repeats: int = 3, warmup: int = 1) -> list[float]:
    """Wall-clock seconds of ``fn()`` in each of ``repeats`` runs after ``warmup`` runs."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return times


def timed(fn, *args, **kwargs):
    """``(fn(*args, **kwargs), seconds)`` of one call (a run too slow to repeat)."""
    start = time.perf_counter()
    out = fn(*args, **kwargs)
    return out, time.perf_counter() - start


def median_time(fn, repeats: int = 3, warmup: int = 1) -> float:
    """Median wall-clock seconds of ``fn()`` over ``repeats`` runs after ``warmup`` runs."""
    return statistics.median(run_times(fn, repeats, warmup))


def best_time(fn, repeats: int = 3, warmup: int = 1) -> float:
    """Least wall-clock seconds of ``fn()`` over ``repeats`` runs after ``warmup`` runs."""
    return min(run_times(fn, repeats, warmup))


def interleaved_medians(fns: dict, repeats: int, clock: str = "wall", warmup: int = 1) -> dict:
    """Median seconds per callable, timed round-robin after ``warmup`` calls each."""
    now = CLOCKS[clock]
    for _ in range(warmup):
        for fn in fns.values():
            fn()
    times = {label: [] for label in fns}
    for _ in range(repeats):
        for label, fn in fns.items():
            t0 = now()
            fn()
            times[label].append(now() - t0)
    return {label: statistics.median(ts) for label, ts in times.items()}


def size_grid(lo: float, hi: float, per_octave: int) -> list[int]:
    """Distinct integer sizes ``lo * 2^(k/per_octave)`` within ``[lo, hi]``."""
    lo, hi = max(1.0, lo), max(1.0, hi)
    n = math.floor(math.log2(hi / lo) * per_octave + 1e-9)
    return sorted({max(1, round(lo * 2 ** (k / per_octave))) for k in range(n + 1)} | {int(hi)})


def floor_sweep(make_fn, max_rows: int, repeats: int, clock: str, quick: bool,
                keep: int = 2, lo: int = 16) -> tuple[dict, dict]:
    """Sweep chunk sizes of ``make_fn(size)`` (a callable running the whole pass).

    Returns ``(finalists, sweep)``: the ``keep`` best sizes as ``{"floor: chunk c": fn}``
    for the final interleaved run, and ``{size: median seconds}`` of the fine stage.
    """
    coarse = size_grid(lo, max_rows, 1)
    first = interleaved_medians({c: make_fn(c) for c in coarse}, 1, clock)
    best = min(first, key=first.get)
    fine = size_grid(best / 2**0.5, min(max_rows, best * 2**0.5), 4 if quick else 8)
    sweep = interleaved_medians({c: make_fn(c) for c in fine}, repeats, clock, warmup=0)
    top = sorted(sweep, key=sweep.get)[:keep]
    return {f"floor: chunk {c}": make_fn(c) for c in top}, sweep


def print_table(title: str, rows: list[tuple], header: tuple) -> None:
    """Print ``rows`` under ``header`` as a fixed-width table."""
    print(f"\n## {title}")
    widths = [max(len(str(r[i])) for r in rows + [header]) for i in range(len(header))]
    for row in [header] + rows:
        print("  ".join(str(v).ljust(w) for v, w in zip(row, widths)))


def allocator_label() -> str:
    """``tuned`` when the environment raises glibc's mmap threshold, else ``default``."""
    return "tuned" if os.environ.get("MALLOC_MMAP_THRESHOLD_") else "default"


def dump_json(path: str | None, payload: dict) -> None:
    if path:
        with open(path, "w") as fh:
            json.dump(payload, fh, indent=1)
