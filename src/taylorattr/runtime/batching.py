r"""Rows per model call, chosen by measurement: the one batching helper.

Every chunked pass (the methods' path rows and occluded copies, the metrics' perturbed
copies) runs ``R`` rows through the model, ``c`` rows per call. Per call the pass needs

.. math::

    M(c) = M_0 + c \cdot m_{\mathrm{row}}, \qquad A(c) = A_0 + c \cdot a_{\mathrm{row}}

bytes of live tensors in all (``M``) and in its largest single tensor (``A``). Both are
measured once per (model, row shape, dtype, device, threads, pass kind) by running a probe
of 2 and of 4 copies of the first row and fitting the two lines: on CUDA from
``torch.cuda.max_memory_allocated``, elsewhere by accounting every tensor the pass
creates (a dispatch mode that holds a weak reference to each new storage, so the sum of the
live ones is exact at every operator boundary; workspaces inside one kernel are not
seen). They give the most rows the memory allows,

* ``c_max``: the largest ``c`` with ``M(c) + c * row_bytes <= max_memory`` (the hard budget;
  default a quarter of the machine's memory, at most 2 GiB, on CPU, and a quarter of the
  free memory on CUDA, where the rest may belong to other processes or a training job).

On the CPU the chunk is ``c_max`` from the start, so a pass within the budget is one call
(Captum's default; no timing: :func:`_pass_timer` says why), split the same way whatever
ran before it. On an accelerator the chunk is grown by
measured throughput, not pushed to ``c_max``: starting from
``c_max / 32`` rows (:data:`START_SHARE`: 64 MiB of a CPU's 2 GiB budget), the kept size
``c`` doubles while a pass over ``2c`` copies of the first row runs more than
:data:`GROWTH_GAIN` (5 %) more rows per second than a pass over ``c``, and never beyond
``c_max`` nor beyond the ``R`` rows of the pass at hand (the chunk loops, which know ``R``,
grow the plan before they split: :meth:`ChunkPlan.grow_to`; a later pass of more rows
continues the growth where it stopped short of the gain rule):

.. math::

    c \leftarrow c' = \min(2 c, c_{\max}) \quad\text{while}\quad
    \frac{c'}{t(c')} > 1.05\,\frac{c}{t(c)} .

With a pass time ``t(c) = a + b c`` (a cost per call, one per row) the growth stops at
``c ~ (2 - g) a / (2 (g - 1) b)`` rows for a gain ``g``, where the device runs at
``b c / (a + b c)`` of its peak rows per second: 82 % at ``g = 1.1``, 90 % at 1.05. The
first GPU measurement (H200, ResNet-50 and ViT-B/16 IG) took 10 %: 1.10x and 1.20x
Captum's time at ``internal_batch_size=128``, with 0.4x and 0.13x its memory; 5 % halves
the distance to the peak for about twice the memory.

Each size is timed twice after one warm-up pass and the faster counts (other work on the
machine only adds time); CUDA is synchronised around each pass; a pass under 2 ms is
per-call overhead and always kept (:func:`grow_rows`). A device's throughput saturates long
before its memory is full: ResNet-50 on an H200 took 66 GB with a memory-filling chunk, 6x
Captum's 10.6 GB at ``internal_batch_size=128``, for a 10 % gain; on the CPU the old rule
(chunks kept under glibc's mmap threshold) was 1.30x slower than one call. The probe's
passes are flagged (:func:`probing`): they are not part of any planned pass. They cost
about ``2 (c_0 + ... + 2c) < 8c`` rows once per (model, row shape, ...) key (none when
``c_0`` already holds the pass), cached with the memory probe. An automatic size used as
a plain ``int`` outside the chunk loops is the plan's current rows (``c_0`` until a loop
has grown it).

The chosen size is used as it is by default, so repeated calls in a process split the work
identically and give bitwise identical results (another process may time differently and
choose another size: results then differ in the last bits; fix ``internal_batch_size``
where bits must agree across processes). Within :func:`timed_chunks` the chunk loops
(``grid_blocks`` and ``chunk_ranges`` in ``taylorattr.methods._passes``) refine it further
on first use: they time whole chunks at up to four sizes (twice the grown size where the
budget allows, the grown size, half, a quarter), two per size after one warm-up chunk,
interleaved, and keep the size with the least time per row.

Overrides: ``internal_batch_size`` fixes the rows per call (nothing is measured);
``max_memory`` (bytes, or a string like ``"512MB"``/``"2GiB"``) replaces the budget, per
call or for a block of code with :func:`memory_budget`.

Why one module: the memory probe, the budget, the cache of probed sizes and the two
sizing rules (model rows, Taylor-mode series rows) share one cache and one budget.
"""
from __future__ import annotations

import contextlib
import functools
import math
import os
import re
import time
import weakref
from dataclasses import dataclass, field

import torch
from torch import nn

from .._validation import check_positive_int
from .allocator import allocator_info

__all__ = ["GROWTH_GAIN", "ChunkPlan", "ChunkRows", "balanced_size", "chunk_rows", "clear_cache",
           "default_memory_budget", "grow_rows", "heuristic_rows", "memory_budget",
           "parse_memory", "row_memory", "series_rows", "timed_chunks"]

MAX_CHUNK_ROWS = 1 << 16
_PROBE_ROWS = (2, 4)
_SAMPLES = 2            # timed chunks per candidate size, after one warm-up chunk
_MIN_TIMED_S = 1e-4     # shorter gaps between chunks are not real work (e.g. list(blocks))
#: a doubled chunk is kept when it runs more than this factor more rows per second
GROWTH_GAIN = 1.05
_MIN_PASS_S = 2e-3      # a pass shorter than this is per-call overhead: the chunk doubles
_TIMED_PASSES = 2       # per probe size (the faster counts: disturbances only add time)
#: the growth starts at this share of the rows the memory allows (64 MiB of a CPU's 2 GiB)
START_SHARE = 1 / 32
#: the share of the free CUDA memory the default budget takes (the rest may be another
#: process's or a training job's)
CUDA_FREE_SHARE = 0.25
_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}
_budget_override: list[int] = []
_probing: list[bool] = []
_timed: list[bool] = []


# ----------------------------------------------------------------------------- budget

def parse_memory(value, name: str = "max_memory") -> int:
    """Bytes from an int (``>= 1``) or a string such as ``"800MB"`` or ``"2 GiB"``."""
    if isinstance(value, str):
        m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([KMGT]i?B|B)?\s*", value, re.IGNORECASE)
        if m is None:
            raise ValueError(f"{name} must be a number of bytes or a string like '512MB' or "
                             f"'2GiB', got {value!r}")
        value = int(float(m.group(1)) * _UNITS[(m.group(2) or "").lower()])
        if value < 1:
            raise ValueError(f"{name} must be at least 1 byte, got {value}")
        return value
    return check_positive_int(value, name)


def default_memory_budget(device: torch.device | str = "cpu") -> int:
    """The bytes a chunk may use when no ``max_memory`` is given: on CUDA a quarter
    (:data:`CUDA_FREE_SHARE`) of the free memory (``torch.cuda.mem_get_info``); elsewhere a
    quarter of the machine's memory, at most 2 GiB. Read once per device per process (so
    the cached chunk sizes do not follow every fluctuation). This is a ceiling: the chunk
    itself grows only while throughput does (:func:`grow_rows`)."""
    if _budget_override:
        return _budget_override[-1]
    return _measured_budget(str(torch.device(device)))


@functools.cache
def _measured_budget(device: str) -> int:
    device = torch.device(device)
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return max(1, int(free * CUDA_FREE_SHARE))
    available = None
    with contextlib.suppress(OSError, ValueError), open("/proc/meminfo") as fh:
        for line in fh:
            if line.startswith("MemTotal:"):
                available = int(line.split()[1]) * 1024
    if available is None:
        with contextlib.suppress(ValueError, OSError, AttributeError):
            available = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    return min(2**31, (available or 2**33) // 4)


@contextlib.contextmanager
def memory_budget(max_memory):
    """Within the block, automatic chunk sizes keep each chunk under ``max_memory`` bytes
    (an int or a string like ``"1GB"``), for every method and metric."""
    _budget_override.append(parse_memory(max_memory))
    try:
        yield _budget_override[-1]
    finally:
        _budget_override.pop()


@contextlib.contextmanager
def timed_chunks():
    """Within the block, automatic chunk sizes are refined by timing a few sizes on the
    real work (the fastest is cached); results may then differ in the last bits from an
    untimed run, which splits the work by the memory-based size alone."""
    _timed.append(True)
    try:
        yield
    finally:
        _timed.pop()


# ---------------------------------------------------------------------- measurement

def _tensors(values) -> list:
    """The tensors among ``values`` (an operator's arguments or results), also inside
    tuples, lists and dicts."""
    out, todo = [], [values]
    while todo:
        v = todo.pop()
        if isinstance(v, torch.Tensor):
            out.append(v)
        elif isinstance(v, (tuple, list)):
            todo.extend(v)
        elif isinstance(v, dict):
            todo.extend(v.values())
    return out


class _TensorBytes(torch.utils._python_dispatch.TorchDispatchMode):
    """Accounts the bytes of every storage created under it: live sum, peak, largest.

    ``total`` is the sum over the storages recorded and not yet seen freed, an upper bound
    of the live bytes; the freed ones are dropped only when ``total`` would raise the
    peak, so the peak is exact (the live bytes after every operator, wherever they could
    exceed it) without a scan of every live storage after every operator."""

    def __init__(self):
        super().__init__()
        self.live: list = []  # (weak reference, nbytes)
        self.total = 0
        self.peak = 0
        self.largest = 0

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        return False  # nothing here is compiled; True would import torch._dynamo (~1 s)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        from torch.multiprocessing.reductions import StorageWeakRef

        kwargs = kwargs or {}
        seen = {t.untyped_storage().data_ptr() for t in _tensors((args, kwargs))}
        out = func(*args, **kwargs)
        for t in _tensors(out):
            st = t.untyped_storage()
            n = st.nbytes()
            if n and st.data_ptr() not in seen:  # new storage (not a view, not in-place)
                seen.add(st.data_ptr())
                self.live.append((StorageWeakRef(st), n))
                self.total += n
                self.largest = max(self.largest, n)
        if self.total > self.peak:  # the live bytes may exceed the peak: count them
            self.live = [(r, n) for r, n in self.live if not r.expired()]
            self.total = sum(n for _, n in self.live)
            self.peak = max(self.peak, self.total)
        return out


def _run_probe(model, rows: torch.Tensor, backward: bool) -> None:
    if backward:
        rows = rows.detach().requires_grad_(True)
        with torch.enable_grad():
            torch.autograd.grad(model(rows).sum(), rows)
    else:
        with torch.no_grad():
            model(rows)


def _probe_bytes(model, rows: torch.Tensor, backward: bool) -> tuple[int, int]:
    """(peak live bytes, largest single allocation) of one pass over ``rows``."""
    if rows.device.type == "cuda":
        torch.cuda.synchronize(rows.device)
        before = torch.cuda.memory_allocated(rows.device)
        torch.cuda.reset_peak_memory_stats(rows.device)
        _run_probe(model, rows, backward)
        peak = torch.cuda.max_memory_allocated(rows.device) - before
        return peak, 0  # no mmap path on CUDA's caching allocator
    with _TensorBytes() as acct:
        _run_probe(model, rows, backward)
    return acct.peak, acct.largest


def _stateful(model) -> bool:
    """A module in train mode with buffers (batch norm statistics) would be changed by a probe."""
    return isinstance(model, nn.Module) and any(
        m.training and any(True for _ in m.buffers(recurse=False)) for m in model.modules())


def row_memory(model, row: torch.Tensor, backward: bool) -> tuple[float, float, float, float]:
    """``(M_0, m_row, A_0, a_row)`` in bytes: the lines ``M(c) = M_0 + c m_row`` (peak live
    tensor bytes of a pass over ``c`` rows) and ``A(c) = A_0 + c a_row`` (its largest single
    tensor), fitted through probes of 2 and 4 copies of ``row`` (shape ``[1, ...]``).
    The probe leaves the random number generators as they were."""
    r1, r2 = _PROBE_ROWS
    devices = [row.device] if row.device.type == "cuda" else []
    _probing.append(True)
    try:
        with torch.random.fork_rng(devices=devices):
            (m1, a1), (m2, a2) = (_probe_bytes(model, row.expand(r, *row.shape[1:]).clone(),
                                               backward) for r in (r1, r2))
    finally:
        _probing.pop()
    m_row, a_row = max(0.0, (m2 - m1) / (r2 - r1)), max(0.0, (a2 - a1) / (r2 - r1))
    return max(0.0, m1 - r1 * m_row), m_row, max(0.0, a1 - r1 * a_row), a_row


def grow_rows(seconds, cap: int, start: int = 1, gain: float = GROWTH_GAIN,
              min_pass_s: float = _MIN_PASS_S) -> tuple[int, dict]:
    """The chunk by measured throughput: ``(rows, {size: seconds})``.

    ``seconds(c)`` is the time of one pass over ``c`` rows (any source: the probe's timer,
    or a fake one in tests). Starting at ``start`` rows, the kept size ``c`` doubles (to at
    most ``cap``) while the doubled pass runs more than ``gain`` times the rows per second
    of the kept one, ``c' / t(c') > gain * c / t(c)``; a pass shorter than ``min_pass_s``
    counts as per-call overhead and is always kept. Nothing is timed when ``start``
    reaches ``cap``. Returns ``c`` and every time measured."""
    cap = max(1, int(cap))
    c = max(1, min(int(start), cap))
    times: dict = {}
    if c == cap:
        return c, times  # nothing to grow into
    times[c] = float(seconds(c))
    while c < cap:
        n = min(2 * c, cap)
        times[n] = float(seconds(n))
        if not (n * times[c] > gain * c * times[n] or times[n] < min_pass_s):
            break  # not faster by more than the gain: keep c
        c = n
    return c, times


def _pass_timer(model, row: torch.Tensor, backward: bool):
    """``seconds(c)``: the faster of two passes over ``c`` copies of ``row`` (one warm-up
    pass before the first size), synchronised on CUDA; the random generators are left as
    they were. Holds the model weakly where it can (the plan cache is keyed by it).

    None on the CPU: there the chunk takes the whole pass up to the budget, untimed
    (:meth:`ChunkPlan.grow_to`). Measured (ResNet-50, 64x64, batch 2, IG 20 steps, one
    thread): the throughput rule stopped at 18 rows and took 2.0x Captum's one call, plus
    6.5 s of probes on the first call; with the whole pass in one call both take 0.9 s.
    Per-call costs on a CPU (a new batch shape's kernels and weight layouts) are not seen
    by timing copies of one row, and a CPU's memory budget is the process's own."""
    if row.device.type == "cpu":
        return None
    cuda = row.device.type == "cuda"
    row = row.detach().clone()
    try:
        ref = weakref.ref(model)
    except TypeError:  # bound methods and the like: held as they are
        def ref():
            return model
    warm: list[bool] = []

    def once(rows):
        if cuda:
            torch.cuda.synchronize(row.device)
        start = time.perf_counter()
        _run_probe(ref(), rows, backward)
        if cuda:
            torch.cuda.synchronize(row.device)
        return time.perf_counter() - start

    def seconds(c: int) -> float:
        rows = row.expand(c, *row.shape[1:]).clone()
        with torch.random.fork_rng(devices=[row.device] if cuda else []):
            if not warm:
                once(rows)
                warm.append(True)
            return min(once(rows) for _ in range(_TIMED_PASSES))

    return seconds


def probing() -> bool:
    """Whether a memory probe (:func:`row_memory`) is running: its rows are not part of any
    planned pass (progress bars leave them out)."""
    return bool(_probing)


# ----------------------------------------------------------------------------- plans

class ChunkRows(int):
    """An automatic chunk size: an ``int`` (the plan's rows per call when it was made) that
    carries its :class:`ChunkPlan`, so the chunk loops, which know how many rows the pass
    runs, grow it by throughput up to them (:meth:`ChunkPlan.grow_to`), or refine it by
    timing within :func:`timed_chunks`. An explicit ``int`` (``internal_batch_size``) is
    used as given."""

    plan: ChunkPlan
    timed: bool

    def __new__(cls, plan: ChunkPlan, timed: bool = False):
        obj = super().__new__(cls, plan.rows)
        obj.plan = plan
        obj.timed = timed
        return obj


@dataclass
class ChunkPlan:
    """Measured memory and timing state for one (model, row shape, dtype, device, threads,
    pass kind, budget, allocator) key."""

    rows: int                      # current choice (the memory guess until settled)
    budget_rows: int               # most rows under the hard budget
    bytes_per_row: float
    fixed_bytes: float
    candidates: tuple[int, ...]
    largest_per_row: float = 0.0   # growth of the largest single tensor per row (a_row)
    growth: dict = field(default_factory=dict)  # size -> seconds of one probe pass
    saturated: bool = False        # growth ended (throughput or the budget): rows are final
    timer: object = field(default=None, repr=False)  # size -> seconds (the probe's timer)
    times: dict = field(default_factory=dict)  # size -> list of seconds per row
    warm: bool = False
    settled: bool = False

    def grow_to(self, needed: int) -> int:
        """Grow ``rows`` by throughput (:func:`grow_rows`) towards the ``needed`` rows of a
        pass (never beyond them: a chunk that holds them all is one call) and the budget;
        probe passes already timed are reused. Returns the rows per call."""
        cap = max(1, min(self.budget_rows, int(needed)))
        if self.saturated or self.rows >= cap or self.timer is None:
            return self.rows
        known = self.growth

        def seconds(c):
            if c not in known:
                known[c] = self.timer(c)
            return known[c]

        _probing.append(True)
        try:
            rows, _ = grow_rows(seconds, cap, self.rows)
        finally:
            _probing.pop()
        # stopped short of the cap by the gain rule, or at the budget: no further growth
        self.saturated = rows < cap or cap == self.budget_rows
        self.rows = rows
        return rows

    def next_size(self) -> int:
        """The size of the next chunk: a candidate still short of samples, else the best."""
        if self.settled or not self.warm:
            return self.rows
        short = [c for c in self.candidates if len(self.times.get(c, ())) < _SAMPLES]
        if not short:
            return self.rows
        return min(short, key=lambda c: (len(self.times.get(c, ())), -c))

    def record(self, size: int, rows: int, seconds: float) -> None:
        """One chunk of ``rows`` rows, asked for at ``size``, took ``seconds``."""
        if self.settled or seconds < _MIN_TIMED_S or rows < max(1, size // 2):
            return  # a short last chunk says little about its size
        if not self.warm:
            self.warm = True  # the first chunk pays one-off costs
            return
        self.times.setdefault(size, []).append(seconds / rows)
        if all(len(self.times.get(c, ())) >= _SAMPLES for c in self.candidates):
            self.rows = min(self.candidates, key=lambda c: min(self.times[c]))
            self.settled = True


_plans: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def clear_cache() -> None:
    """Forget every measured chunk size."""
    _plans.clear()


def _describe(v):
    """A hashable stand-in for an attribute a model's memory may depend on: a tensor's
    shape, dtype and device; a flag, string, dtype or a value that compares by value
    (frozen dataclasses, tuples of them) itself; a plain number nothing (a token index, a
    counter of calls: state that changes from call to call, as a plain model's attributes
    never entered its key either); anything else its identity (never shared)."""
    if isinstance(v, torch.Tensor):
        return ("tensor", tuple(v.shape), v.dtype, str(v.device))
    if isinstance(v, (tuple, list)):
        return (type(v).__name__,) + tuple(_describe(e) for e in v)
    if v is None or isinstance(v, (bool, str, torch.dtype, torch.device)):
        return v
    if isinstance(v, (int, float)):
        return "number"
    if type(v).__eq__ is not object.__eq__:
        try:
            hash(v)
            return v
        except TypeError:
            pass
    return ("object", type(v), id(v))


def _view_key(model):
    """``(owner, key)``: the cache a model's plans live in. A module that wraps others (a
    method's view of the user's model, made anew for each call: the model on one tensor,
    the log-probability of one token) is described by its type, its submodules (by
    identity), its own tensors' shapes and its other attributes (:func:`_describe`), and
    its plans are held by its first submodule, so that the next call's view of the same
    model finds them. Any other model holds its own plans (key None)."""
    if not isinstance(model, nn.Module) or not model._modules:
        return model, None
    children = tuple((name, id(m)) for name, m in model._modules.items())
    own = tuple((name, _describe(v)) for name, v in sorted(vars(model).items())
                if not name.startswith("_"))
    tensors = tuple((name, _describe(t)) for table in (model._parameters, model._buffers)
                    for name, t in table.items())
    owner = next(m for m in model._modules.values() if m is not None)
    return owner, ("view", type(model), children, own, tensors)


def _table(model) -> dict:
    """The plans of ``model``, held weakly: a bound method's plans live with its object
    (keyed by the function), a wrapping module's with the module it wraps
    (:func:`_view_key`), and a model that cannot be weakly referenced gets no cache
    at all, never one keyed by ``id()`` (a new object can reuse a dead one's id)."""
    owner, key = getattr(model, "__self__", None), getattr(model, "__func__", None)
    if owner is not None and key is not None:
        try:
            return _plans.setdefault(owner, {}).setdefault(("bound", key), {})
        except TypeError:
            return {}
    owner, key = _view_key(model)
    try:
        table = _plans.setdefault(owner, {})
    except TypeError:
        return {}
    return table if key is None else table.setdefault(key, {})


def _plan(model, row: torch.Tensor, backward: bool, budget: int) -> ChunkPlan:
    m0, m_row, _, a_row = row_memory(model, row, backward)
    row_bytes = row.element_size() * row.numel() * (2 if backward else 1)  # rows (+ grads)
    per_row = m_row + row_bytes
    budget_rows = int(max(1, min(MAX_CHUNK_ROWS, (budget - m0) // max(per_row, 1))))
    timer = _pass_timer(model, row, backward)
    # untimed (the CPU): the budget's rows from the start, whatever passes came before, so
    # a pass splits the same way in every process (torchrun = one process, bitwise)
    start = budget_rows if timer is None else max(1, int(budget_rows * START_SHARE))
    cands = sorted({max(1, c) for c in (min(budget_rows, 2 * start), start, start // 2,
                                        start // 4)}, reverse=True)
    return ChunkPlan(rows=start, budget_rows=budget_rows, bytes_per_row=per_row,
                     fixed_bytes=m0, candidates=tuple(cands), largest_per_row=a_row,
                     timer=timer)


def heuristic_rows(inputs: torch.Tensor, backward: bool) -> int:
    """Rows per call without a model to measure: ``threads * elements per thread // features
    per row`` (measured once for the C-sg CNN on 1x28x28, 2 CPU cores: one thread is fastest
    at ~128 rows per forward+backward and ~192 rows per forward)."""
    per_thread = (128 if backward else 192) * 784
    budget = per_thread * max(1, torch.get_num_threads())
    return int(min(MAX_CHUNK_ROWS, max(1, budget // max(1, inputs[0].numel()))))


def chunk_rows(model, inputs: torch.Tensor, backward: bool, *, max_memory=None,
               internal_batch_size: int | None = None) -> int:
    """Rows per model call for passes over rows shaped like ``inputs[0]``.

    Args:
        model: the callable the rows go through.
        inputs: ``[B, ...]``; only its row shape, dtype and device matter.
        backward: True for forward+backward passes (gradient w.r.t. the rows), False for
            forward passes without gradients.
        max_memory: bytes (or ``"512MB"``-style string) a chunk may use; default
            :func:`default_memory_budget` (or the enclosing :func:`memory_budget`).
        internal_batch_size: fixed rows per call; returned as is, nothing is measured.

    Returns:
        ``internal_batch_size`` when given, else a :class:`ChunkRows` (an ``int``) from the
        cached or freshly measured plan.
    """
    if internal_batch_size is not None:
        if max_memory is not None:
            raise ValueError("give internal_batch_size (rows per call) or max_memory (bytes "
                             "per call), not both")
        return check_positive_int(internal_batch_size, "internal_batch_size")
    if not isinstance(inputs, torch.Tensor) or inputs.dim() < 1 or inputs.shape[0] < 1:
        raise ValueError("inputs must be a batch-first tensor [B, ...] with B >= 1 to size "
                         "chunks from")
    budget = (parse_memory(max_memory) if max_memory is not None
              else default_memory_budget(inputs.device))
    plan = _measured_plan(model, inputs, backward, budget)
    if plan is None:  # a probe would move batch-norm statistics: no measurement
        return heuristic_rows(inputs, backward)
    return ChunkRows(plan, timed=bool(_timed))


def _measured_plan(model, inputs: torch.Tensor, backward: bool, budget: int) -> ChunkPlan | None:
    """The cached plan of (model, row shape, dtype, device, threads, pass, budget,
    allocator), measured on first use; None for a model with batch statistics in train
    mode (a probe would change them)."""
    info = allocator_info()
    key = (tuple(inputs.shape[1:]), inputs.dtype, str(inputs.device), torch.get_num_threads(),
           bool(backward), budget, info.mmap_threshold, info.trim_threshold)
    table = _table(model)
    if key not in table:
        if _stateful(model):
            return None
        table[key] = _plan(model, inputs[:1].detach(), backward, budget)
    return table[key]


def balanced_size(n_outer: int, n_inner: int, size: int) -> int:
    """The largest-first split evened out: the same number of blocks as ``size`` gives,
    each as nearly equal as whole inner runs (or equal pieces of one run) allow, so no
    block is a small remainder and the allocator reuses the previous block's memory.

    ``ceil(n / ceil(n / s))`` of the unit that is split (outer runs, or inner rows)."""
    size = int(size)
    if size >= n_inner:
        per = size // n_inner
        return n_inner * math.ceil(n_outer / math.ceil(n_outer / per))
    return math.ceil(n_inner / math.ceil(n_inner / size))


def series_rows(model, inputs: torch.Tensor, order: int) -> int | None:
    """Series rows (sample x direction) per Taylor-mode pass of ``order`` whose largest
    block stays on glibc's heap: ``order * rows * a_row <= heap / 2``, with ``a_row`` the
    growth per row of the largest tensor of a forward pass (measured as for
    :func:`chunk_rows`, and cached with it). A pass's coefficients are stacked as
    ``[K, B, m, ...]``, so its largest block is about ``K`` times a forward's; above the
    mmap threshold every pass faults its blocks in anew (3x the time measured on the
    C-sg CNN). None where there is no such limit: CUDA, a raised threshold
    (:func:`taylorattr.runtime.allocator.tune_allocator`), not glibc, a model in train mode
    with batch statistics (not probed), or one that cannot run on copies of one row (its
    forward tied to the batch, e.g. per-sample attention masks)."""
    heap = allocator_info().largest_heap_allocation
    if inputs.device.type != "cpu" or heap is None or heap >= 2**30:
        return None
    try:
        plan = _measured_plan(model, inputs, False, default_memory_budget(inputs.device))
    except Exception:  # noqa: BLE001 - a model tied to its batch (e.g. per-sample masks)
        return None    # cannot run on probe rows: no cap, the pass sizes stay as they were
    if plan is None or plan.largest_per_row <= 0:
        return None
    return max(1, int(heap // 2 // (order * plan.largest_per_row)))


def _fixed_size(n_outer: int, n_inner: int, size: int) -> int:
    """The rows per block of a pass over the ``n_outer x n_inner`` grid: an automatic size
    first grown by throughput up to the grid's rows (:meth:`ChunkPlan.grow_to`)."""
    plan = getattr(size, "plan", None)
    if plan is not None and not size.timed:
        size = plan.grow_to(n_outer * n_inner)
    return int(size)


def planned_blocks(n_outer: int, n_inner: int, size: int):
    """``(o0, o1, i0, i1)`` blocks of the ``n_outer x n_inner`` grid, at most ``size`` rows
    each: whole inner runs when the size allows, else pieces of one run; a fixed size (an
    automatic one grown first) is evened out (:func:`balanced_size`). A :class:`ChunkRows`
    size made within :func:`timed_chunks` may change from block to block while timed."""
    plan = getattr(size, "plan", None) if getattr(size, "timed", False) else None
    fixed = None if plan is not None else balanced_size(n_outer, n_inner,
                                                        _fixed_size(n_outer, n_inner, size))
    o = i = 0
    while o < n_outer:
        s = plan.next_size() if plan is not None else fixed
        if i == 0 and s >= n_inner:
            o1 = min(o + s // n_inner, n_outer)
            block, rows, o = (o, o1, 0, n_inner), (o1 - o) * n_inner, o1
        else:
            i1 = min(i + s, n_inner)
            block, rows = (o, o + 1, i, i1), i1 - i
            o, i = (o + 1, 0) if i1 == n_inner else (o, i1)
        start = time.perf_counter()
        yield block
        if plan is not None:
            plan.record(s, rows, time.perf_counter() - start)


def count_blocks(n_outer: int, n_inner: int, size: int) -> int:
    """How many blocks :func:`planned_blocks` gives for a fixed ``size`` (or an automatic
    one, grown first)."""
    size = balanced_size(n_outer, n_inner, _fixed_size(n_outer, n_inner, size))
    if size >= n_inner:
        return math.ceil(n_outer / (size // n_inner))
    return n_outer * math.ceil(n_inner / size)
