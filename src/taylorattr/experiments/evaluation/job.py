"""The shared frame of a dataset job: lock, manifest, sharded units, barrier, merge.

:func:`run_job` runs on every process of a job (one, or each rank under ``torchrun``):

1. rank 0 takes the output folder's :class:`~.lock.JobLock` and writes (or, on a rerun,
   checks) ``manifest.json``: the job's configuration, its number of units and their
   keys; a rerun with another configuration is refused instead of mixing results. The
   other ranks learn the outcome by broadcast and stop with the same error;
2. every rank computes its units (:func:`~.sharding.rank_units`) that have no file yet,
   each written atomically by :class:`~taylorattr.experiments._units.UnitStore`, so a
   killed rank loses only the unit in progress;
3. after a barrier, rank 0 reads every unit and calls ``merge``; a last barrier lets the
   other ranks return once the merged files exist; rank 0 releases the lock.
"""
from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ... import _io
from ...runtime import distributed
from .._units import UnitStore
from .lock import JobLock, LockHeld
from .sharding import rank_units, unit_ranges

__all__ = ["JobReport", "run_job"]


@dataclass(frozen=True)
class JobReport:
    """What one process did: ``computed`` / ``reused`` units of its share, the
    ``world_size``, and rank 0's merge result (None on other ranks)."""

    rank: int
    world_size: int
    n_units: int
    computed: int
    reused: int
    merged: object = None
    stale_lock: dict | None = None


def _unit_key(u: int) -> str:
    return f"unit-{u:06d}"


def _check_manifest(out: Path, config: dict, n_units: int) -> None:
    path = out / "manifest.json"
    manifest = {"config": config, "n_units": n_units,
                "units": [f"units/{_unit_key(u)}.pt" for u in range(n_units)]}
    if path.is_file():
        old = _io.load_json(path)
        if old.get("config") != json.loads(json.dumps(config)):
            diff = sorted(k for k in set(config) | set(old.get("config", {}))
                          if old.get("config", {}).get(k) != json.loads(json.dumps(config)).get(k))
            raise ValueError(f"out: {out} holds a different job (its manifest differs in "
                             f"{', '.join(diff)}); choose another --out or delete it")
        return
    _io.save_json(manifest, path)


def run_job(out: Path, config: dict, n: int, batch_size: int,
            compute: Callable[[range], dict], merge: Callable[[list[dict]], object],
            device=None) -> JobReport:
    """Run a job of ``n`` samples in units of ``batch_size`` (see the module docstring).
    ``compute(range_of_indices) -> unit dict``; ``merge(all units in order)``."""
    out = Path(out)
    ranges = unit_ranges(n, batch_size)
    with distributed.session(device) as ctx:
        lock = JobLock(out)
        error = None
        if ctx.is_main:
            try:
                lock.acquire()
                _check_manifest(out, config, len(ranges))
            except (LockHeld, ValueError, OSError) as exc:
                lock.release()
                error = f"{type(exc).__name__}:{exc}"
        error = distributed.broadcast_object(ctx, error)
        if error is not None:
            kind, _, text = error.partition(":")
            raise (LockHeld if kind == "LockHeld" else ValueError)(text)
        try:
            store = UnitStore(out / "units") if ctx.is_main else None
            ctx.barrier()  # stale temporaries are gone before anyone writes
            store = store or _OpenStore(out / "units")
            computed = reused = 0
            for u in rank_units(len(ranges), ctx.rank, ctx.world_size):
                key = _unit_key(u)
                if store.path(key).is_file():
                    reused += 1
                    continue
                store.get(key, lambda u=u: compute(ranges[u]))
                computed += 1
            ctx.barrier()
            merged = None
            if ctx.is_main:
                units = [_io.load_tensors(store.path(_unit_key(u))) for u in range(len(ranges))]
                merged = merge(units)
            ctx.barrier()
            return JobReport(ctx.rank, ctx.world_size, len(ranges), computed, reused, merged,
                             lock.stale)
        finally:
            lock.release()


class _OpenStore(UnitStore):
    """A unit store that leaves other writers' temporaries alone (ranks other than 0)."""

    def __init__(self, folder):
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
