"""The shared frame of a dataset job: lock, manifest, fingerprinted units, barrier, merge.

:func:`run_job` runs on every process of a job (one, or each rank under ``torchrun``):

1. rank 0 takes the output folder's :class:`~.lock.JobLock` and writes ``manifest.json``:
   the job's readable configuration, its fingerprint (:mod:`..fingerprints`: model,
   method, seed, version, job settings) and, after the merge, every unit's fingerprint.
   A failure (lock held, a refused strict resume) is broadcast and every rank stops with
   the same error;
2. every rank reads the items of its units (:func:`~.sharding.rank_units`) and
   fingerprints them: unit ``u``'s fingerprint is the job's plus ``inputs``, the digests
   of its items. A unit whose file holds the same fingerprint is reused; any other is
   computed and written atomically by :class:`~taylorattr.experiments._units.UnitStore`
   (a killed rank loses only the unit in progress). A unit computed from something else
   is recomputed and counted, with what changed, in :attr:`JobReport.changes`; with
   ``resume="strict"`` rank 0 first fingerprints every unit and refuses the run naming
   what changed, before any work;
3. after a barrier, rank 0 reads every unit and calls ``merge``; a last barrier lets the
   other ranks return once the merged files exist; rank 0 releases the lock.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from ... import _io
from ...runtime import distributed
from .._units import UnitStore
from ..fingerprints import changed, digest
from .lock import JobLock, LockHeld
from .sharding import rank_units, unit_ranges

__all__ = ["RESUME", "JobReport", "UnitInput", "describe_changes", "run_job"]

#: ``auto``: recompute exactly the units whose fingerprint changed (and say so);
#: ``strict``: refuse a run that would recompute a unit computed from something else.
RESUME = ("auto", "strict")


@dataclass(frozen=True)
class UnitInput:
    """What ``read`` returns for one unit: the data ``compute`` takes, and ``digests``,
    ``[index, digest]`` per item (a bad item's digest is that of its reason)."""

    data: object
    digests: list


@dataclass(frozen=True)
class JobReport:
    """What one process did: ``computed`` / ``reused`` units of its share, the
    ``world_size``, rank 0's merge result (None on other ranks) and ``changes``: what
    changed since the units were computed, ``{"model": 3, "inputs": 1, ...}`` (units per
    field) for the units recomputed because their fingerprint differed."""

    rank: int
    world_size: int
    n_units: int
    computed: int
    reused: int
    merged: object = None
    stale_lock: dict | None = None
    changes: dict = field(default_factory=dict)
    changed_items: tuple = ()  # the items whose input digest changed, named
    recomputed: int = 0  # units recomputed because what they were computed from changed


def _unit_key(u: int) -> str:
    return f"unit-{u:06d}"


def _unit_fingerprint(fields: Mapping, digests: list) -> dict:
    return {**fields, "inputs": digest([[int(i), str(d)] for i, d in digests])}


def _stored(store: UnitStore, key: str):
    """``(fingerprint, item digests)`` stored in a unit file, ``(None, [])`` when there is
    none (or it is unreadable: it is then recomputed)."""
    path = store.path(key)
    if not path.is_file():
        return None, []
    try:
        unit = _io.load_tensors(path)
    except ValueError:
        return {}, []
    return dict(unit.get("fingerprint", {})), list(unit.get("item_digests", []))


class _Changes:
    """Tally of the units found computed from something else: units per changed field,
    and the changed items, named."""

    def __init__(self, name_item: Callable[[int], str]):
        self.fields, self.items, self.name_item, self.units = {}, [], name_item, 0

    def add(self, old: dict, new: dict, old_items: list, new_items: list) -> None:
        self.units += 1
        for k in changed(old, new) or ["fingerprint"]:
            self.fields[k] = self.fields.get(k, 0) + 1
        before = {int(i): d for i, d in old_items}
        self.items += [self.name_item(int(i)) for i, d in new_items if before.get(int(i)) != d]


def _describe(changes: Mapping, items: list) -> str:
    text = ", ".join(f"{k} ({n} unit{'s' if n != 1 else ''})" for k, n in sorted(changes.items()))
    if items:
        shown = ", ".join(items[:5])
        text += f"; changed items: {shown}{' ...' if len(items) > 5 else ''}"
    return text


def _strict_check(store: UnitStore, ranges, fields, read, name_item) -> None:
    tally = _Changes(name_item)
    for u, r in enumerate(ranges):
        old, old_items = _stored(store, _unit_key(u))
        if old is None:
            continue
        new_items = read(r).digests
        new = _unit_fingerprint(fields, new_items)
        if old != new:
            tally.add(old, new, old_items, new_items)
    if tally.fields:
        raise ValueError(f"out: resume='strict' (--resume strict) refuses to recompute units "
                         f"computed from something else; changed: "
                         f"{_describe(tally.fields, tally.items)}; rerun without it to "
                         "recompute them, or choose another --out")


def run_job(out: Path, config: dict, fields: Mapping, n: int, batch_size: int,
            read: Callable[[range], UnitInput], compute: Callable[[range, object], dict],
            merge: Callable[[list[dict]], object], device=None, resume: str = "auto",
            name_item: Callable[[int], str] = str) -> JobReport:
    """Run a job of ``n`` samples in units of ``batch_size`` (see the module docstring).
    ``read(range_of_indices) -> UnitInput``; ``compute(range, unit_input.data) -> unit
    dict``; ``merge(all units in order)``; ``fields``: the job's fingerprint;
    ``name_item(index)``: how a changed item is named in messages."""
    if resume not in RESUME:
        raise ValueError(f"resume must be one of {RESUME}, got {resume!r}")
    out = Path(out)
    ranges = unit_ranges(n, batch_size)
    fields = {k: str(v) for k, v in fields.items()}
    with distributed.session(device) as ctx:
        lock = JobLock(out)
        error = None
        if ctx.is_main:
            try:
                lock.acquire()
                if resume == "strict":
                    _strict_check(UnitStore(out / "units"), ranges, fields, read, name_item)
                _io.save_json({"config": config, "fingerprint": fields, "n_units": len(ranges),
                               "units": [f"units/{_unit_key(u)}.pt" for u in range(len(ranges))]},
                              out / "manifest.json")
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
            tally = _Changes(name_item)
            for u in rank_units(len(ranges), ctx.rank, ctx.world_size):
                key = _unit_key(u)
                unit_input = read(ranges[u])
                new = _unit_fingerprint(fields, unit_input.digests)
                old, old_items = _stored(store, key)
                if old == new:
                    reused += 1
                    continue
                if old is not None:
                    tally.add(old, new, old_items, unit_input.digests)
                result = compute(ranges[u], unit_input.data)
                _io.save_tensors({**result, "fingerprint": new,
                                  "item_digests": [[int(i), str(d)]
                                                   for i, d in unit_input.digests]},
                                 store.path(key))
                computed += 1
            ctx.barrier()
            merged = None
            if ctx.is_main:
                units = [_io.load_tensors(store.path(_unit_key(u))) for u in range(len(ranges))]
                merged = merge(units)
                manifest = _io.load_json(out / "manifest.json")
                manifest["unit_fingerprints"] = [u["fingerprint"] for u in units]
                _io.save_json(manifest, out / "manifest.json")
            ctx.barrier()
            return JobReport(ctx.rank, ctx.world_size, len(ranges), computed, reused, merged,
                             lock.stale, tally.fields, tuple(tally.items), tally.units)
        finally:
            lock.release()


def describe_changes(report: JobReport) -> str:
    """One line: what changed since the recomputed units were computed ("" if nothing)."""
    if not report.changes:
        return ""
    return _describe(report.changes, list(report.changed_items))


class _OpenStore(UnitStore):
    """A unit store that leaves other writers' temporaries alone (ranks other than 0)."""

    def __init__(self, folder):
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
