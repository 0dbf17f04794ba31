r"""Keep PyTorch's CPU working set off glibc's mmap path: ``tune_allocator()``.

PyTorch's CPU tensors come from ``malloc``. glibc serves a request of at least
``M_MMAP_THRESHOLD`` bytes with a fresh ``mmap`` and gives it back with ``munmap`` when it is
freed; it also returns the free top of the heap to the system once it exceeds
``M_TRIM_THRESHOLD``. By default both thresholds are *dynamic*: the mmap threshold starts at
128 KiB and rises to the size of each freed mmapped block, up to
``DEFAULT_MMAP_THRESHOLD_MAX`` = 32 MiB on 64-bit systems, and the trim threshold follows at
twice that. A chunked attribution allocates and frees the same activations chunk after
chunk; every block that takes the mmap (or trim) path is faulted in and zeroed again by
the kernel on the next chunk, so page faults, not arithmetic, can dominate the run
(issue 16 measured 2.6-3.2x on the Taylor engine and the infidelity metric).

The cure PyTorch's CPU performance guides give is to raise both thresholds, so that freed
blocks stay in the process and are reused::

    import taylorattr as ta
    ta.tune_allocator()          # mallopt(M_MMAP_THRESHOLD, 2e9), mallopt(M_TRIM_THRESHOLD, 2^31-1)

or, equivalently and before Python starts, in the environment::

    MALLOC_MMAP_THRESHOLD_=2000000000 MALLOC_TRIM_THRESHOLD_=4000000000 python ...

The price is memory: freed blocks are kept for reuse instead of being returned to the
system, so the process's resident size stays at its high-water mark. Setting either
threshold also switches glibc's dynamic adjustment off for the life of the process; there
is no call that switches it back, so this is an opt-in, not a context manager.
:func:`allocator_info` reports the setting in force (ours, or the environment's). Where
the C library is not glibc (macOS, Windows, musl), :func:`tune_allocator` does nothing
and says so with a ``RuntimeWarning``.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os
import warnings
from dataclasses import dataclass

from .._validation import check_positive_int

__all__ = ["AllocatorInfo", "allocator_info", "tune_allocator"]

# glibc <malloc.h>
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
#: glibc's ceiling of the dynamic mmap threshold on 64-bit systems (4 * 1 MiB * sizeof(long)).
DYNAMIC_MMAP_THRESHOLD_MAX = 32 * 1024 * 1024
_INT_MAX = 2**31 - 1  # mallopt takes a C int
_ENV = {"mmap_threshold": "MALLOC_MMAP_THRESHOLD_", "trim_threshold": "MALLOC_TRIM_THRESHOLD_"}
_TUNABLES = {"mmap_threshold": "glibc.malloc.mmap_threshold",
             "trim_threshold": "glibc.malloc.trim_threshold"}

_set_by_us: dict[str, int] = {}


@dataclass(frozen=True)
class AllocatorInfo:
    """The C allocator's setting as far as this process can tell.

    ``mmap_threshold`` / ``trim_threshold`` are the fixed values in force in bytes, or
    None where glibc's dynamic default applies (or the library is not glibc). ``source``
    says where the values came from: ``"tune_allocator"``, ``"environment"``, ``"default"``
    or ``"not glibc"``.
    """

    glibc: str | None
    mmap_threshold: int | None
    trim_threshold: int | None
    source: str

    @property
    def tuned(self) -> bool:
        """True when large freed blocks stay in the process (mmap threshold >= 1 GiB)."""
        return self.mmap_threshold is not None and self.mmap_threshold >= 2**30

    @property
    def largest_heap_allocation(self) -> int | None:
        """The largest single allocation that stays on the heap: the fixed mmap threshold,
        glibc's dynamic ceiling (32 MiB) by default, None without glibc."""
        if self.glibc is None:
            return None
        return self.mmap_threshold or DYNAMIC_MMAP_THRESHOLD_MAX


@functools.cache
def _libc():
    """glibc as a ctypes library with ``mallopt``, or None (another C library). Looked up
    once per process: ``find_library`` runs ``ldconfig`` in a subprocess (about 3 ms,
    which every chunked call would otherwise pay)."""
    name = ctypes.util.find_library("c")
    try:
        lib = ctypes.CDLL(name) if name else ctypes.CDLL(None)
        version = lib.gnu_get_libc_version
        lib.mallopt  # noqa: B018 (AttributeError where absent)
    except (OSError, AttributeError):
        return None
    version.restype = ctypes.c_char_p
    lib.mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    lib.mallopt.restype = ctypes.c_int
    return lib


def _from_environment(field: str) -> int | None:
    raw = os.environ.get(_ENV[field])
    if raw is None:  # GLIBC_TUNABLES=glibc.malloc.mmap_threshold=...:...
        for item in os.environ.get("GLIBC_TUNABLES", "").split(":"):
            key, _, value = item.partition("=")
            if key == _TUNABLES[field]:
                raw = value
    try:
        return None if raw is None else int(raw, 0)
    except ValueError:
        return None  # glibc ignores a value it cannot parse, so do we


def allocator_info() -> AllocatorInfo:
    """Report the allocator setting in force: set by :func:`tune_allocator` in this
    process, else from the environment (``MALLOC_*_THRESHOLD_`` or ``GLIBC_TUNABLES``,
    read by glibc at start-up), else glibc's dynamic default."""
    lib = _libc()
    if lib is None:
        return AllocatorInfo(None, None, None, "not glibc")
    version = lib.gnu_get_libc_version().decode()
    if _set_by_us:
        return AllocatorInfo(version, _set_by_us.get("mmap_threshold"),
                             _set_by_us.get("trim_threshold"), "tune_allocator")
    env = {f: _from_environment(f) for f in _ENV}
    if any(v is not None for v in env.values()):
        return AllocatorInfo(version, env["mmap_threshold"], env["trim_threshold"], "environment")
    return AllocatorInfo(version, None, None, "default")


def tune_allocator(mmap_threshold: int = 2_000_000_000,
                   trim_threshold: int = _INT_MAX) -> AllocatorInfo:
    """Raise glibc's mmap and trim thresholds (``mallopt``) so freed tensors stay reusable.

    Call it once, early (before the first large allocation helps most). Blocks smaller
    than ``mmap_threshold`` bytes come from the heap and are reused after ``free``; the
    heap's free top is returned to the system only beyond ``trim_threshold`` bytes.

    Args:
        mmap_threshold: bytes, 1 .. 2^31-1 (``mallopt`` takes a C int); default 2e9.
        trim_threshold: bytes, 1 .. 2^31-1; default 2^31-1.

    Returns:
        :func:`allocator_info` after the change.

    Raises:
        TypeError, ValueError: a threshold that is not an int in ``1 .. 2^31-1``.
        RuntimeError: glibc refused a value (``mallopt`` returned 0).

    Without glibc this does nothing and warns (``RuntimeWarning``).
    """
    values = {"mmap_threshold": mmap_threshold, "trim_threshold": trim_threshold}
    for name, value in values.items():
        check_positive_int(value, name)
        if value > _INT_MAX:
            raise ValueError(f"{name} must be at most 2^31-1 = {_INT_MAX} bytes (mallopt takes "
                             f"a C int), got {value}; use the environment variable "
                             f"{_ENV[name]} for larger values")
    lib = _libc()
    if lib is None:
        warnings.warn("tune_allocator: the C library is not glibc, so there is no mallopt; the "
                      "allocator is left as it is", RuntimeWarning, stacklevel=2)
        return allocator_info()
    for name, param in (("mmap_threshold", M_MMAP_THRESHOLD), ("trim_threshold", M_TRIM_THRESHOLD)):
        if lib.mallopt(param, values[name]) != 1:
            raise RuntimeError(f"glibc refused mallopt({name}={values[name]}); the allocator "
                               "keeps its previous setting for it")
        _set_by_us[name] = values[name]
    return allocator_info()
