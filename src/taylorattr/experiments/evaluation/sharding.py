"""Deterministic work split: fixed units of consecutive samples, dealt round-robin.

The samples ``0..n-1`` are cut into units of ``batch_size`` consecutive indices
(unit ``u`` holds ``[u * batch_size, min(n, (u + 1) * batch_size))``), whatever the
number of processes; rank ``r`` of ``W`` processes takes the units ``u`` with
``u mod W == r``. A unit is computed as one batch, so its numbers do not depend on
``W``; the random draws of sample ``i`` come from :func:`sample_seed` ``(seed, i)``,
which depends on neither ``W`` nor the batch. Rerunning with another ``W`` deals the
unfinished units anew.
"""
from __future__ import annotations

import hashlib

__all__ = ["rank_units", "sample_seed", "unit_ranges"]


def unit_ranges(n: int, batch_size: int) -> list[range]:
    """The sample indices of every unit: ``[range(0, b), range(b, 2b), ...]``."""
    if n < 0 or batch_size < 1:
        raise ValueError(f"need n >= 0 and batch_size >= 1, got n={n}, batch_size={batch_size}")
    return [range(s, min(n, s + batch_size)) for s in range(0, n, batch_size)]


def rank_units(n_units: int, rank: int, world_size: int) -> list[int]:
    """The units of rank ``rank`` in a world of ``world_size``: ``u mod world_size == rank``."""
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"rank must lie in [0, world_size), got rank={rank}, "
                         f"world_size={world_size}")
    return list(range(rank, n_units, world_size))


def sample_seed(seed: int, index: int) -> int:
    """The seed of sample ``index``: 63 bits of ``sha256(f"{seed}:{index}")``."""
    digest = hashlib.sha256(f"{int(seed)}:{int(index)}".encode()).digest()
    return int.from_bytes(digest[:8], "big") >> 1
