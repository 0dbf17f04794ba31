"""The runtime: how work is cut, counted, spread and shown, independent of what it computes.

* :mod:`.batching`: chunk sizes from a memory probe (``chunk_rows``, ``series_rows``);
* :mod:`.allocator`: glibc's allocator settings for chunked CPU work (``tune_allocator``);
* :mod:`.cost`: rows counted from a plan and seconds from a timed probe (``Cost``);
* :mod:`.distributed`: torchrun sessions, deterministic sharding by sample;
* :mod:`.determinism`: cuDNN's deterministic algorithms (bitwise repeats on CUDA);
* :mod:`.progress`: progress bars that count model rows.

Nothing here knows a method, a Taylor expansion or an experiment: those layers sit above.
"""
from __future__ import annotations

from .allocator import allocator_info, tune_allocator
from .batching import chunk_rows, series_rows
from .cost import Cost, CostError, RowCounter, check_budget, estimate, summed

__all__ = ["Cost", "CostError", "RowCounter", "allocator_info", "check_budget", "chunk_rows",
           "estimate", "series_rows", "summed", "tune_allocator"]
