"""Shared timing helpers for the benchmark scripts (median wall time of repeats)."""
from __future__ import annotations

import statistics
import time


def median_time(fn, repeats: int = 3, warmup: int = 1) -> float:
    """Median wall-clock seconds of ``fn()`` over ``repeats`` runs after ``warmup`` runs."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def print_table(title: str, rows: list[tuple], header: tuple) -> None:
    """Print ``rows`` under ``header`` as a fixed-width table."""
    print(f"\n## {title}")
    widths = [max(len(str(r[i])) for r in rows + [header]) for i in range(len(header))]
    for row in [header] + rows:
        print("  ".join(str(v).ljust(w) for v, w in zip(row, widths)))
