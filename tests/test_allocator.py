"""tune_allocator and allocator_info, checked against glibc's own statistics.

Route: in a fresh process a 100 MB tensor is allocated and ``mallinfo2().hblkhd`` (bytes
glibc holds in mmapped blocks) says whether it took the mmap path: it must without tuning
and must not after ``tune_allocator()`` or with the environment variables set.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from taylorattr.runtime import allocator as A

SRC = str(Path(__file__).resolve().parents[1] / "src")

_CHILD = r"""
import ctypes, json, sys
import torch
import taylorattr as ta
from taylorattr.runtime.allocator import allocator_info

class MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in
                "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost".split()]

libc = ctypes.CDLL("libc.so.6")
libc.mallinfo2.restype = MallInfo2
if sys.argv[1] == "tune":
    ta.tune_allocator()
before = libc.mallinfo2().hblkhd
t = torch.empty(100_000_000, dtype=torch.uint8)
info = allocator_info()
print(json.dumps({"mmapped": libc.mallinfo2().hblkhd - before, "source": info.source,
                  "mmap_threshold": info.mmap_threshold, "tuned": info.tuned}))
"""


def _child(mode: str, env_extra: dict) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MALLOC_", "GLIBC_TUN"))}
    env.update(env_extra, PYTHONPATH=SRC, OMP_NUM_THREADS="1")
    out = subprocess.run([sys.executable, "-c", _CHILD, mode], env=env, capture_output=True,
                         text=True, timeout=120, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def _glibc() -> bool:
    return A._libc() is not None


def test_tuning_keeps_a_large_block_off_the_mmap_path():
    if not _glibc():  # elsewhere the only promise is a warning and no change
        with pytest.warns(RuntimeWarning, match="not glibc"):
            assert A.tune_allocator().source == "not glibc"
        return
    plain = _child("plain", {})
    assert plain["source"] == "default" and not plain["tuned"]
    assert plain["mmapped"] >= 100_000_000  # glibc mmaps a 100 MB block by default
    tuned = _child("tune", {})
    assert tuned == {"mmapped": 0, "source": "tune_allocator", "mmap_threshold": 2_000_000_000,
                     "tuned": True}
    env = _child("plain", {"MALLOC_MMAP_THRESHOLD_": "2000000000",
                           "MALLOC_TRIM_THRESHOLD_": "4000000000"})
    assert env == {"mmapped": 0, "source": "environment", "mmap_threshold": 2_000_000_000,
                   "tuned": True}


def test_without_glibc_it_warns_and_changes_nothing(monkeypatch):
    monkeypatch.setattr(A, "_libc", lambda: None)
    with pytest.warns(RuntimeWarning, match="not glibc"):
        info = A.tune_allocator()
    assert info == A.AllocatorInfo(None, None, None, "not glibc")
    assert info.largest_heap_allocation is None and not info.tuned


def test_environment_and_tunables_are_read(monkeypatch):
    if not _glibc():
        assert A.allocator_info().source == "not glibc"
        return
    monkeypatch.setattr(A, "_set_by_us", {})
    for var in ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "GLIBC_TUNABLES"):
        monkeypatch.delenv(var, raising=False)
    assert A.allocator_info().largest_heap_allocation == A.DYNAMIC_MMAP_THRESHOLD_MAX
    monkeypatch.setenv("GLIBC_TUNABLES", "glibc.malloc.arena_max=2:glibc.malloc.mmap_threshold=0x100000")
    info = A.allocator_info()
    assert (info.source, info.mmap_threshold, info.trim_threshold) == ("environment", 2**20, None)
    assert info.largest_heap_allocation == 2**20 and not info.tuned


@pytest.mark.parametrize("kwargs, name, error", [
    ({"mmap_threshold": 0}, "mmap_threshold", ValueError),
    ({"mmap_threshold": 2**31}, "mmap_threshold", ValueError),
    ({"trim_threshold": -5}, "trim_threshold", ValueError),
    ({"trim_threshold": "big"}, "trim_threshold", TypeError),
    ({"mmap_threshold": True}, "mmap_threshold", TypeError),
])
def test_bad_thresholds_raise_named_errors(kwargs, name, error):
    with pytest.raises(error, match=name):
        A.tune_allocator(**kwargs)
