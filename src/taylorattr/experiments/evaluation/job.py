"""The shared frame of a dataset job: lock, manifest, fingerprinted items, barrier, merge.

:func:`run_job` runs on every process of a job (one, or each rank under ``torchrun``):

1. rank 0 takes the output folder's :class:`~.lock.JobLock` and writes ``manifest.json``:
   the job's readable configuration, its fingerprint (:mod:`..fingerprints`: model,
   method, seed, version, job settings) and, after the merge, every unit's fingerprint.
   A failure (lock held, a refused strict resume) is broadcast and every rank stops with
   the same error;
2. every rank reads the items of its units (:func:`~.sharding.rank_units`; a unit is
   ``batch_size`` consecutive items, computed as one batch for speed) and fingerprints
   each item: item ``i``'s fingerprint is the job's plus ``d_i``, the digest of its
   input as the method reads it. The result of item ``i`` is keyed by that fingerprint:
   it is reused when the unit's file holds it under the same fingerprint, and computed
   otherwise; a unit's missing or changed items are computed together, as one batch, and
   the unit's file is rewritten atomically with them
   (:class:`~taylorattr.experiments._units.UnitStore`'s folder; a killed rank loses only
   the unit in progress). An item computed from something else is recomputed and
   counted, with what changed, in :attr:`JobReport.changes`; with ``resume="strict"``
   rank 0 first fingerprints every item and refuses the run naming what changed, before
   any work;
3. after a barrier, rank 0 reads every unit and calls ``merge`` with the items' results
   in index order; a last barrier lets the other ranks return once the merged files
   exist; rank 0 releases the lock.

A fresh run computes every unit as one whole batch, so its numbers do not depend on the
world size (bitwise); an item recomputed alone (its input changed) runs in a smaller
batch, which may move its last float bits (a batched matrix product may sum in another
order), never its inputs, weights or settings.
"""
from __future__ import annotations

import contextlib
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
    """What one process did with the items of its share: ``computed`` and ``reused``
    items (``n_units``: the job's units, batches of ``batch_size`` items), the
    ``world_size``, rank 0's merge result (None on other ranks) and ``changes``: what
    changed since the recomputed items were computed, ``{"model": 3, "inputs": 1, ...}``
    (items per field); ``changed_items`` names the items whose input changed and
    ``recomputed`` counts the items recomputed because their fingerprint differed."""

    rank: int
    world_size: int
    n_units: int
    computed: int
    reused: int
    merged: object = None
    stale_lock: dict | None = None
    changes: dict = field(default_factory=dict)
    changed_items: tuple = ()  # the items whose input digest changed, named
    recomputed: int = 0  # items recomputed because what they were computed from changed


def _unit_key(u: int) -> str:
    return f"unit-{u:06d}"


def _unit_fingerprint(fields: Mapping, digests: list) -> dict:
    return {**fields, "inputs": digest([[int(i), str(d)] for i, d in digests])}


@dataclass
class _Stored:
    """A unit file's content: the job fields it was computed under, and per item its
    input digest and result (empty when there is no readable file)."""

    fields: dict | None = None
    digests: dict = field(default_factory=dict)
    results: dict = field(default_factory=dict)


def _stored(store: UnitStore, key: str) -> _Stored:
    """What the unit file ``key`` holds; an unreadable file holds nothing reusable (its
    items are then recomputed and counted as changed)."""
    path = store.path(key)
    if not path.is_file():
        return _Stored()
    try:
        unit = _io.load_tensors(path)
        fields = {k: v for k, v in dict(unit["fingerprint"]).items() if k != "inputs"}
        return _Stored(fields, {int(i): str(d) for i, d in unit["item_digests"]},
                       {int(i): r for i, r in unit["items"]})
    except (ValueError, KeyError, TypeError):
        return _Stored({}, {}, {})


def _plan(old: _Stored, fields: Mapping, digests: list, kept=None) -> tuple[list[int], dict]:
    """``(todo, why)``: the items of a unit that must be computed, and for those computed
    before from something else, the fields that changed (``inputs``: the item's digest).
    ``kept(result)``: whether a stored result's own files are still there (one whose
    files are gone is computed again, as a missing one)."""
    todo, why = [], {}
    for i, d in digests:
        i = int(i)
        same = old.fields == fields and old.digests.get(i) == str(d) and i in old.results
        if same and (kept is None or kept(old.results[i])):
            continue
        todo.append(i)
        if old.fields is not None and not same and (
                i in old.results or old.fields != fields or old.digests.get(i) != str(d)):
            # (an item of an interrupted unit, never computed, is missing, not changed)
            diff = changed(old.fields, fields) if old.fields else ["fingerprint"]
            if old.digests.get(i) != str(d):
                diff = [*diff, "inputs"]
            why[i] = diff or ["fingerprint"]  # e.g. a file of another layout
    return todo, why


class _Changes:
    """Tally of the items found computed from something else: items per changed field,
    and the items whose input changed, named."""

    def __init__(self, name_item: Callable[[int], str]):
        self.fields, self.items, self.name_item, self.count = {}, [], name_item, 0

    def add(self, why: Mapping[int, list]) -> None:
        for i, diff in why.items():
            self.count += 1
            for k in diff:
                self.fields[k] = self.fields.get(k, 0) + 1
            if "inputs" in diff:
                self.items.append(self.name_item(int(i)))


def _describe(changes: Mapping, items: list) -> str:
    text = ", ".join(f"{k} ({n} item{'s' if n != 1 else ''})" for k, n in sorted(changes.items()))
    if items:
        shown = ", ".join(items[:5])
        text += (f"; changed item{'s' if len(items) != 1 else ''}: {shown}"
                 f"{' ...' if len(items) > 5 else ''}")
    return text


def _strict_check(store: UnitStore, ranges, fields, read, name_item) -> None:
    tally = _Changes(name_item)
    for u, r in enumerate(ranges):
        old = _stored(store, _unit_key(u))
        if old.fields is not None:
            tally.add(_plan(old, fields, read(r).digests)[1])
    if tally.fields:
        raise ValueError(f"out: resume='strict' (--resume strict) refuses to recompute items "
                         f"computed from something else; changed: "
                         f"{_describe(tally.fields, tally.items)}; rerun without it to "
                         "recompute them, or choose another --out")


def run_job(out: Path, config: dict, fields: Mapping, n: int, batch_size: int,
            read: Callable[[range], UnitInput],
            compute: Callable[[list[int], object], Mapping[int, dict]],
            merge: Callable[[list[dict]], object], device=None, resume: str = "auto",
            name_item: Callable[[int], str] = str, progress=None, kept=None,
            items_per_call: int | None = None) -> JobReport:
    """Run a job of ``n`` samples in units of ``batch_size`` (see the module docstring).
    ``read(range_of_indices) -> UnitInput``; ``compute(indices, unit_input.data) ->
    {index: result}`` for the listed indices of the unit (computed as one batch);
    ``merge(every item's result, in index order)``; ``fields``: the job's fingerprint;
    ``name_item(index)``: how a changed item is named in messages; ``progress(total)``:
    a context manager over this rank's ``total`` items yielding ``advance(n)``, called
    after each unit (:func:`taylorattr.runtime.progress.stage`); ``kept(result)``: whether a stored result's files (e.g. its map) are still
    there (a result whose files are gone is computed again); ``items_per_call``: a unit's
    items to compute are computed this many at a time (default: all at once), and the unit
    file is rewritten and progress advanced after each call, so that an interrupt keeps
    every finished call's items."""
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
            mine = rank_units(len(ranges), ctx.rank, ctx.world_size)
            total = sum(len(ranges[u]) for u in mine)
            shown = contextlib.nullcontext(lambda n=1: None) if progress is None \
                else progress(total)
            with shown as advance:
                for u in mine:
                    key = _unit_key(u)
                    unit_input = read(ranges[u])
                    old = _stored(store, key)
                    todo, why = _plan(old, fields, unit_input.digests, kept)
                    kept_here = len(unit_input.digests) - len(todo)
                    reused += kept_here
                    if kept_here:
                        advance(kept_here)
                    if todo:
                        tally.add(why)
                    # a stale result never stays beside its item's new digest
                    results = {i: r for i, r in old.results.items() if i not in todo}
                    step = items_per_call or len(todo) or 1
                    for start in range(0, len(todo), step):
                        piece = todo[start:start + step]
                        results.update(compute(piece, unit_input.data))
                        _io.save_tensors({
                            "items": [[int(i), results[int(i)]] for i, _ in unit_input.digests
                                      if int(i) in results],
                            "fingerprint": _unit_fingerprint(fields, unit_input.digests),
                            "item_digests": [[int(i), str(d)] for i, d in unit_input.digests]},
                            store.path(key))
                        computed += len(piece)
                        advance(len(piece))
            ctx.barrier()
            merged = None
            if ctx.is_main:
                units = [_io.load_tensors(store.path(_unit_key(u))) for u in range(len(ranges))]
                merged = merge([r for unit in units for _, r in unit["items"]])
                manifest = _io.load_json(out / "manifest.json")
                manifest["unit_fingerprints"] = [unit["fingerprint"] for unit in units]
                _io.save_json(manifest, out / "manifest.json")
            ctx.barrier()
            return JobReport(ctx.rank, ctx.world_size, len(ranges), computed, reused, merged,
                             lock.stale, tally.fields, tuple(tally.items), tally.count)
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
