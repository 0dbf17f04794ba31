"""Resumable units of work: each finished unit is a file, written atomically.

``UnitStore(folder).get(key, compute)`` returns the stored result of ``key`` when its file
exists and otherwise computes it, writes it atomically (temporary file + rename) and
returns it. An interrupted run therefore loses at most the unit in progress, and a rerun
picks up where it stopped. Results are dicts of tensors and plain numbers.

A key names what the unit is computed from (the stage puts the model's weights, the
inputs, the method and its settings in it); every unit also records the library version
it was computed with (:func:`.fingerprints.library_version`: release, source hash, torch),
and a unit of another version is recomputed, never reused. Results are kept and returned
on the CPU, so a computed unit and a loaded one are alike (a run resumed after a crash, or
on another device, concatenates them) and every file loads on a machine without a GPU.
"""
from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from .. import _io
from .._io import fingerprint
from .fingerprints import library_version

__all__ = ["UnitStore", "fingerprint", "model_fingerprint"]

_SAFE = re.compile(r"[^A-Za-z0-9_.=-]+")
_VERSION = "_library_version"


def model_fingerprint(model) -> str:
    return fingerprint(sorted(model.state_dict().items()))


class UnitStore:
    """A folder of finished units, one ``.pt`` file per key."""

    def __init__(self, folder: str | Path):
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        _io.remove_stale_temporaries(self.folder)

    def path(self, key: str) -> Path:
        return self.folder / (_SAFE.sub("_", key) + ".pt")

    def get(self, key: str, compute: Callable[[], dict[str, Any]]) -> dict[str, Any]:
        path = self.path(key)
        if path.is_file():
            unit = _io.load_tensors(path)
            if isinstance(unit, dict) and unit.pop(_VERSION, None) == library_version():
                return unit
        result = _io.on_cpu(compute())  # as a loaded unit is
        _io.save_tensors({**result, _VERSION: library_version()}, path)
        return result
