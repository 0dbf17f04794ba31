"""The batching helper: chunk sizes from measured row memory, grown by measured throughput,
cached, refined by timing.

Routes: a recording model sees the rows of every call, and its per-row memory has a
closed form (``sigmoid(x W) v``: two ``[c, h]`` float64 intermediates, an output and the
row copy), so the chunk a budget allows is known in advance; the blocks of the chunk loops
are checked by enumerating the grid cell by cell; results with automatic chunks against
the same method at a fixed size (another split of the same sums). The growth rule runs on
fake timers whose throughput has a closed form (so the size it stops at is known); the
memory tests use a timer of pure per-call overhead (the chunk grows to the memory cap).
"""
from __future__ import annotations

import itertools
import time

import pytest
import torch
from torch import nn

from taylorattr.methods import IntegratedGradients, Occlusion
from taylorattr.methods._passes import chunk_ranges, default_chunk_rows, grid_blocks
from taylorattr.runtime import batching as Bt
from taylorattr.runtime.allocator import AllocatorInfo

D, H = 64, 512  # features per row, hidden units


class Recorder(nn.Module):
    """``f(x) = sigmoid(x W) v`` in float64; records the rows of every call."""

    def __init__(self, d=D, h=H):
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.w = nn.Parameter(torch.randn(d, h, generator=g, dtype=torch.float64) / d**0.5,
                              requires_grad=False)
        self.v = nn.Parameter(torch.randn(h, 2, generator=g, dtype=torch.float64) / h**0.5,
                              requires_grad=False)
        self.rows: list[int] = []
        self.eval()

    def forward(self, x):
        self.rows.append(x.shape[0])
        return torch.sigmoid(x.flatten(1) @ self.w.to(x.dtype)) @ self.v.to(x.dtype)


def forward_row_bytes(d=D, h=H):
    """Closed form, one no-grad row at the peak (inside the sigmoid): x W and its sigmoid
    ([h] each; x W is freed before the [2] output is made) and the row itself, float64."""
    return 8 * (2 * h + d)


@pytest.fixture(autouse=True)
def _fresh_cache():
    Bt.clear_cache()
    yield
    Bt.clear_cache()


def _overhead_only(model, row, backward):
    """A fake pass timer: every pass costs the same 10 us, so rows per second double with
    every doubling and the chunk grows to the memory cap."""
    return lambda c: 1e-5


@pytest.fixture
def overhead_timer(monkeypatch):
    monkeypatch.setattr(Bt, "_pass_timer", _overhead_only)


def _info(tuned: bool) -> AllocatorInfo:
    return (AllocatorInfo("2.36", 2_000_000_000, 2**31 - 1, "tune_allocator") if tuned
            else AllocatorInfo("2.36", None, None, "default"))


def _budget_rows(*args, **kwargs) -> int:
    """The memory-based rows of an automatic chunk (its plan: the timed form carries it)."""
    with Bt.timed_chunks():
        return Bt.chunk_rows(*args, **kwargs).plan.budget_rows


@pytest.mark.parametrize("rows_allowed", [10, 100, 1000])
def test_the_chunk_a_budget_allows_matches_the_closed_form(rows_allowed, monkeypatch,
                                                           overhead_timer):
    monkeypatch.setattr(Bt, "allocator_info", lambda: _info(True))
    model = Recorder()
    x = torch.rand(3, D, dtype=torch.float64)
    budget = rows_allowed * forward_row_bytes()
    assert _budget_rows(model, x, False, max_memory=budget) == rows_allowed  # closed form
    # and the model really sees chunks of at most that many rows
    model.rows.clear()
    with Bt.memory_budget(budget):
        Occlusion(model).attribute(torch.rand(rows_allowed // 10 + 1, D, dtype=torch.float64),
                                   0.0, target=0, patch=1)
    chunks = model.rows[1:]  # after the one call on the inputs
    assert sum(chunks) == D * (rows_allowed // 10 + 1)
    assert rows_allowed // 2 < max(chunks) <= rows_allowed


def test_backward_rows_cost_more_and_stay_under_the_budget(monkeypatch, overhead_timer):
    monkeypatch.setattr(Bt, "allocator_info", lambda: _info(True))
    model = Recorder()
    x = torch.rand(4, D, dtype=torch.float64)
    budget = 200 * forward_row_bytes()
    fwd = _budget_rows(model, x, False, max_memory=budget)
    bwd = _budget_rows(model, x, True, max_memory=budget)
    assert 1 <= bwd < fwd == 200
    # forward+backward keeps x W, its sigmoid (saved), the grad of both and the row's grad
    assert int(bwd) * 8 * (2 * H + 2 + D) <= budget
    model.rows.clear()
    with Bt.memory_budget(budget):
        IntegratedGradients(model).attribute(x, 0.0, target=1, n_steps=300)
    assert max(model.rows[:-1]) <= _budget_rows(model, x, True, max_memory=budget)


def test_the_glibc_thresholds_no_longer_cap_the_chunk_timing_does(monkeypatch):
    """A chunk whose largest tensor passes glibc's mmap threshold (16 MiB here) is faulted in
    again on every call: a fake timer that charges that (per-row time x3 beyond it) stops the
    growth there; without the charge the chunk grows to the budget, tuned or not."""
    wide = 1 << 15  # one row's hidden layer: 256 KiB in float64
    model = Recorder(h=wide)
    x = torch.rand(2, D, dtype=torch.float64)
    over = (16 * 2**20) // (8 * wide)  # rows whose hidden layer reaches 16 MiB: 64

    def faulting(_model, _row, _backward):
        return lambda c: 1e-3 * c * (3 if c > over else 1) + 5e-2

    monkeypatch.setattr(Bt, "allocator_info", lambda: _info(False))
    monkeypatch.setattr(Bt, "_pass_timer", faulting)
    budget = 1000 * forward_row_bytes(h=wide)  # growth from 31 rows: 31, 62, 124
    rows = Bt.chunk_rows(model, x, backward=False, max_memory=budget).plan.grow_to(10**9)
    assert rows <= over < 2 * rows  # the last doubling that stays under the threshold
    Bt.clear_cache()
    monkeypatch.setattr(Bt, "_pass_timer", _overhead_only)
    budget = 2**30
    rows = _budget_rows(model, x, False, max_memory=budget)
    assert Bt.chunk_rows(model, x, backward=False, max_memory=budget).plan.grow_to(10**9) == rows
    assert rows == budget // forward_row_bytes(h=wide)


def test_cache_key_distinguishes_shape_dtype_threads_and_pass(overhead_timer):
    model = Recorder(d=D)
    x = torch.rand(2, D, dtype=torch.float64)
    Bt.chunk_rows(model, x, backward=False, max_memory=10**7)
    probes = len(model.rows)
    assert probes == 2  # two probe sizes
    Bt.chunk_rows(model, torch.rand(7, D, dtype=torch.float64), backward=False, max_memory=10**7)
    assert len(model.rows) == probes  # same row shape and dtype: cached (batch size is not key)

    def probed(fn):
        before = len(model.rows)
        fn()
        return len(model.rows) - before

    other = Recorder(d=2 * D)
    assert probed(lambda: Bt.chunk_rows(model, x.float(), False, max_memory=10**7)) == 2
    assert probed(lambda: Bt.chunk_rows(model, x, True, max_memory=10**7)) == 2
    assert probed(lambda: Bt.chunk_rows(model, x, False, max_memory=10**6)) == 2
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(threads + 1)
        assert probed(lambda: Bt.chunk_rows(model, x, False, max_memory=10**7)) == 2
    finally:
        torch.set_num_threads(threads)
    assert probed(lambda: Bt.chunk_rows(other, torch.rand(2, 2 * D, dtype=torch.float64), False,
                                        max_memory=10**7)) == 0  # other model: own counter
    assert len(other.rows) == 2
    # float32 rows take half the bytes of float64 ones: the budget allows more of them
    f32 = _budget_rows(model, x.float(), False, max_memory=10**7)
    f64 = _budget_rows(model, x, False, max_memory=10**7)
    assert f32 > f64


def test_probe_leaves_the_random_generator_alone():
    model = nn.Sequential(nn.Linear(D, 8), nn.Dropout(0.5))
    model.train()
    row = torch.rand(1, D)
    state = torch.get_rng_state()
    Bt.row_memory(model, row, backward=False)
    assert torch.equal(state, torch.get_rng_state())


def test_a_module_with_batch_statistics_in_train_mode_is_not_probed():
    model = nn.Sequential(nn.Linear(D, 8), nn.BatchNorm1d(8)).train()
    before = model[1].running_mean.clone()
    rows = Bt.chunk_rows(model, torch.rand(3, D), backward=False)
    assert torch.equal(model[1].running_mean, before)
    assert rows == Bt.heuristic_rows(torch.rand(3, D), backward=False)


def test_explicit_sizes_are_honoured_exactly():
    model = Recorder()
    x = torch.rand(3, D, dtype=torch.float64)
    IntegratedGradients(model).attribute(x, 0.0, target=0, n_steps=20, internal_batch_size=7)
    # 7 rows fit two whole steps of 3 samples; then the self-check's f(x~) of the 3 baselines
    assert model.rows[1:] == [6] * 10 + [3]
    model.rows.clear()
    Occlusion(model).attribute(x, 0.0, target=0, patch=1, perturbations_per_eval=5)
    assert set(model.rows[1:]) == {3}  # fewer rows than samples: pieces of one window run
    assert Bt.chunk_rows(model, x, True, internal_batch_size=11) == 11
    assert default_chunk_rows(x, backward=True) == Bt.heuristic_rows(x, True)  # no model


@pytest.mark.parametrize("kwargs, name", [
    ({"max_memory": 0}, "max_memory"), ({"max_memory": -3}, "max_memory"),
    ({"max_memory": "lots"}, "max_memory"), ({"max_memory": 1.5}, "max_memory"),
    ({"max_memory": "0.1B"}, "max_memory"), ({"internal_batch_size": 0}, "internal_batch_size"),
    ({"internal_batch_size": True}, "internal_batch_size"),
    ({"internal_batch_size": 4, "max_memory": 10**6}, "max_memory"),
])
def test_bad_overrides_raise_named_errors(kwargs, name):
    with pytest.raises((TypeError, ValueError), match=name):
        Bt.chunk_rows(Recorder(), torch.rand(2, D, dtype=torch.float64), False, **kwargs)


def test_memory_strings():
    assert Bt.parse_memory("512MB") == 512 * 10**6
    assert Bt.parse_memory("2 GiB") == 2 * 2**30
    assert Bt.parse_memory("1.5kib") == 1536
    assert Bt.parse_memory(4096) == 4096
    with pytest.raises(ValueError, match="max_memory"), Bt.memory_budget("-1GB"):
        pass


@pytest.mark.parametrize("n_outer, n_inner", [(7, 5), (3, 40), (1, 33)])
def test_timed_blocks_cover_the_grid_exactly_once(n_outer, n_inner):
    plan = Bt.ChunkPlan(rows=12, budget_rows=24, bytes_per_row=1.0, fixed_bytes=0.0,
                        candidates=(24, 12, 6, 3))
    seen = torch.zeros(n_outer, n_inner, dtype=torch.long)
    for _ in range(4):  # several passes while the plan is timed and after it settled
        seen.zero_()
        for o0, o1, i0, i1 in grid_blocks(n_outer, n_inner, Bt.ChunkRows(plan, timed=True)):
            assert (o1 - o0) * (i1 - i0) <= plan.budget_rows
            assert o1 - o0 == 1 or (i0, i1) == (0, n_inner)
            seen[o0:o1, i0:i1] += 1
            time.sleep(2e-4)
        assert torch.equal(seen, torch.ones_like(seen))
    spans = list(chunk_ranges(n_inner, Bt.ChunkRows(plan, timed=True)))
    assert [a for a, _ in spans] == [0] + [b for _, b in spans[:-1]] and spans[-1][1] == n_inner


def test_timing_settles_on_the_fastest_size():
    """Each chunk costs a fixed 3 ms whatever its size, so the largest candidate wins."""
    plan = Bt.ChunkPlan(rows=8, budget_rows=16, bytes_per_row=1.0, fixed_bytes=0.0,
                        candidates=(16, 8, 4, 2))
    while not plan.settled:
        for _ in grid_blocks(20, 16, Bt.ChunkRows(plan, timed=True)):
            time.sleep(3e-3)
    assert plan.rows == 16
    assert all(len(plan.times[c]) == 2 for c in plan.candidates)


def test_automatic_chunks_give_the_fixed_chunk_result():
    model = Recorder()
    x = torch.rand(5, D, dtype=torch.float64)
    ig = IntegratedGradients(model)
    fixed = ig.attribute(x, 0.0, target=1, n_steps=64, internal_batch_size=320)
    with Bt.memory_budget(37 * forward_row_bytes()):
        for _ in range(6):  # while timing varies the split, and after
            auto = ig.attribute(x, 0.0, target=1, n_steps=64)
            torch.testing.assert_close(auto, fixed, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("n_outer, n_inner, size", [
    (50, 32, 455), (392, 1, 227), (49, 8, 227), (7, 5, 12), (5, 1, 4), (1, 33, 10),
    (3, 40, 7), (20, 3, 7)])
def test_fixed_sizes_are_evened_out(n_outer, n_inner, size):
    """A fixed size splits the grid into no more blocks than greedy largest-first chunks
    (counted by a plain loop), never above ``size`` rows, covering the grid once; all
    blocks of a split but its last are equal, the last short by less than one unit (an
    inner run, or a row) per block of the split (greedy: up to the whole size short);
    count_blocks agrees."""
    greedy, o, i = 0, 0, 0
    while o < n_outer:  # the old greedy split, written out
        greedy += 1
        if i == 0 and size >= n_inner:
            o += size // n_inner
        else:
            i = min(i + size, n_inner)
            o, i = (o + 1, 0) if i == n_inner else (o, i)
    blocks = list(grid_blocks(n_outer, n_inner, size))
    seen = torch.zeros(n_outer, n_inner, dtype=torch.long)
    for o0, o1, i0, i1 in blocks:
        seen[o0:o1, i0:i1] += 1
    assert torch.equal(seen, torch.ones_like(seen))
    rows = [(o1 - o0) * (i1 - i0) for o0, o1, i0, i1 in blocks]
    unit, per_split = (n_inner, len(blocks)) if size >= n_inner else (1, len(blocks) // n_outer)
    assert max(rows) <= size and max(rows) - min(rows) < max(per_split, 1) * unit
    assert len(set(rows)) <= 2
    assert len(blocks) <= greedy and len(blocks) == Bt.count_blocks(n_outer, n_inner, size)


def test_taylor_mode_passes_stay_under_the_mmap_threshold_by_default(monkeypatch):
    """Default glibc: an order-K pass stacks K coefficient blocks of its rows, so its rows
    are capped at half the 32 MiB threshold over K times the widest activation of a row
    (a [h] float64 hidden layer here: closed form); taylor_terms runs passes of that many
    rows, and taylor_terms_cost(model=) counts those passes (counted by wrapping
    propagate). After tune_allocator, and on models that cannot run on probe rows, no cap."""
    import taylorattr.taylor.terms as T

    wide, order = 1 << 15, 2  # one row's hidden layer: 256 KiB in float64
    with torch.device("cpu"):  # glibc's threshold is the CPU's, whatever the default device
        model = Recorder(d=16, h=wide)
        x = torch.rand(3, 16, dtype=torch.float64)
    monkeypatch.setattr(Bt, "allocator_info", lambda: _info(False))
    cap = Bt.series_rows(model, x, order)
    assert cap == 16 * 2**20 // (order * 8 * wide) == 32
    dev = torch.get_default_device()
    if dev.type != "cpu":  # CUDA's caching allocator has no mmap threshold: no cap there
        assert Bt.series_rows(Recorder(d=16, h=wide).to(dev), x.to(dev), order) is None
    seen = []
    real = T.propagate

    def counting(gm, inputs, directions, k):
        seen.append(directions.shape[0] * directions.shape[1])
        return real(gm, inputs, directions, k)

    monkeypatch.setattr(T, "propagate", counting)
    T.taylor_terms(model, x, 0.0, target=0, order=order)
    expansions = seen[1:]  # after the one pass along -delta
    assert max(expansions) <= cap and sum(expansions) == 3 * 16
    assert len(expansions) == -(-16 // (cap // 3)) == 2  # 10 + 6 directions of 3 samples
    cost = T.taylor_terms_cost(x, 0.0, order, model=model)
    assert cost.taylor_passes == len(seen)
    Bt.clear_cache()
    monkeypatch.setattr(Bt, "allocator_info", lambda: _info(True))
    assert Bt.series_rows(model, x, order) is None

    class BatchTied(nn.Module):
        def forward(self, z):
            return z * torch.ones(3, 16, dtype=z.dtype)  # only a batch of 3 broadcasts

    monkeypatch.setattr(Bt, "allocator_info", lambda: _info(False))
    assert Bt.series_rows(BatchTied(), x, order) is None


def _saturating(a, b, calls=None):
    """``t(c) = a + b c``: a fixed cost per call and a cost per row. A doubling from ``c``
    is more than ``g - 1`` faster per row exactly when ``2 (a + b c) > g (a + 2 b c)``, i.e.
    ``c < (2 - g) a / (2 (g - 1) b)`` (:func:`_stop`)."""
    def seconds(c):
        if calls is not None:
            calls.append(c)
        return a + b * c
    return seconds


def _stop(a, b, g=Bt.GROWTH_GAIN):
    """The rows below which a doubling gains more than ``g`` (:func:`_saturating`)."""
    return (2 - g) * a / (2 * (g - 1) * b)


@pytest.mark.parametrize("a, b, start, cap", [(1.0, 0.01, 1, 10**6), (0.3, 0.01, 5, 10**6),
                                              (1.0, 1.0, 1, 10**6), (1.0, 0.001, 3, 700),
                                              (1.0, 0.01, 9, 9)])
def test_growth_stops_where_a_doubling_gains_the_growth_gain_or_less(a, b, start, cap):
    calls = []
    rows, times = Bt.grow_rows(_saturating(a, b, calls), cap, start, min_pass_s=0.0)
    # by hand: double from start while the doubling gains more than GROWTH_GAIN, at most cap
    want = min(start, cap)
    while want < cap and want < _stop(a, b):
        want = min(2 * want, cap)
    assert rows == want
    assert rows <= cap and set(times) == set(calls)
    if start >= cap:
        assert calls == []  # nothing to grow into: nothing timed
    else:
        assert calls[0] == start
        assert all(n == min(2 * c, cap) for c, n in itertools.pairwise(calls))


def test_short_passes_always_grow_and_the_gain_is_a_parameter():
    # 1 us per row and nothing per call: a doubling never gains, but passes under 2 ms
    # count as overhead and grow: 1024 rows take 1.02 ms, 2048 take 2.05 ms
    assert Bt.grow_rows(_saturating(0.0, 1e-6), 10**6, 1)[0] == 1024
    assert Bt.grow_rows(_saturating(0.0, 1e-6), 10**6, 1, min_pass_s=0.0)[0] == 1
    # a demanded gain of 50 %: 2 (a + b c) > 1.5 (a + 2 b c) iff c < a / (2 b)
    assert Bt.grow_rows(_saturating(1.0, 0.01), 10**6, 1, gain=1.5, min_pass_s=0.0)[0] == 64


def test_the_default_grows_from_a_32nd_of_the_budget_and_max_memory_caps_it(monkeypatch):
    """chunk_rows with a fake memory line (1 MiB per row, nothing fixed) and a fake timer:
    the growth starts at budget_rows / 32 and stops where the timer says."""
    monkeypatch.setattr(Bt, "row_memory", lambda model, row, backward: (0.0, 2.0**20, 0.0, 0.0))
    seen = []

    def timer(_model, row, _backward):
        return _saturating(1.0, _stop(1.0, 1.0) / 72, seen)  # grows while c < 72

    monkeypatch.setattr(Bt, "_pass_timer", timer)
    model = Recorder()
    x = torch.rand(2, D, dtype=torch.float64)
    per_row = 2**20 + 8 * D  # the fake line plus the row itself
    budget = 1000 * per_row
    size = Bt.chunk_rows(model, x, False, max_memory=budget)
    assert int(size) == 31 and seen == []  # the start, nothing timed before a pass needs it
    assert size.plan.grow_to(50) == 50 and seen == [31, 50]  # never past the 50 rows needed
    # a pass of more rows continues: 50 -> 100 (50 < 72 gains), 100 -> 200 does not
    assert size.plan.grow_to(10**6) == 100 and seen == [31, 50, 100, 200]
    assert size.plan.saturated and size.plan.grow_to(10**6) == 100 and len(seen) == 4
    # the chunk loops grow the plan to their grid: 20 x 10 rows in blocks of 100
    blocks = list(grid_blocks(20, 10, Bt.chunk_rows(model, x, False, max_memory=budget)))
    assert [o1 - o0 for o0, o1, _, _ in blocks] == [10, 10]
    # 100 rows allowed: 3, 6, ..., 96; the last step, to the cap of 100, gains too little
    small = Bt.chunk_rows(model, x, False, max_memory=100 * per_row)
    assert small.plan.grow_to(10**6) == 96
    assert Bt.chunk_rows(model, x, False, internal_batch_size=500) == 500


def test_the_cuda_budget_is_a_quarter_of_the_free_memory(monkeypatch):
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (40 * 2**30, 80 * 2**30))
    assert Bt._measured_budget.__wrapped__("cuda:0") == 10 * 2**30
    assert Bt.CUDA_FREE_SHARE == 0.25


def test_plans_of_a_bound_method_live_with_its_object_and_die_with_it():
    """The plan cache holds models weakly: every bound method of one object shares the
    object's plans, another object of the same class never sees them (not even when it is
    created after the first one died and Python hands it the same ``id()``), and a callable
    that cannot be weakly referenced gets no cache rather than one keyed by ``id()``."""
    import gc

    class Scorer:
        def score(self, x):
            return x.sum(-1, keepdim=True)

    first = Scorer()
    plans = Bt._table(first.score)
    plans["key"] = "first's plan"
    assert Bt._table(first.score) is plans  # a new bound-method object, the same plans
    assert "key" not in Bt._table(Scorer().score)
    del first, plans
    gc.collect()
    for _ in range(50):  # new objects, some of them at the dead one's address
        assert "key" not in Bt._table(Scorer().score)
    import operator
    getter = operator.itemgetter(0)  # a callable that cannot be weakly referenced
    assert Bt._table(getter) is not Bt._table(getter)


class _View(nn.Module):
    """A method's per-call view of a model (as the LLM front's log-probability of one
    token): made anew for every call, wrapping the same model."""

    def __init__(self, model, token: int, context: torch.Tensor | None = None):
        super().__init__()
        self.model, self.token = model, token
        if context is not None:
            self.register_buffer("context", context, persistent=False)
        self.eval()

    def forward(self, x):
        return self.model(x)[:, self.token:self.token + 1]


def test_a_new_view_of_the_same_model_reuses_its_probes(overhead_timer):
    """Probes are keyed by what the memory depends on: a fresh view of the same model (of
    any token: plain numbers are state, not structure) probes nothing and gets the plan a
    new probe would measure; another model or another context shape is probed anew."""
    model, other = Recorder(), Recorder()
    x = torch.rand(2, D, dtype=torch.float64)

    def probed(view):
        before = len(model.rows) + len(other.rows)
        rows = _budget_rows(view, x, False, max_memory=10**7)
        return len(model.rows) + len(other.rows) - before, rows

    n, rows = probed(_View(model, 0))
    assert n == 2
    assert probed(_View(model, 0)) == (0, rows)  # the plan of the first view
    Bt.clear_cache()
    assert probed(_View(model, 0)) == (2, rows)  # measured anew: the same plan
    assert probed(_View(model, 1))[0] == 0       # another token: the same memory
    assert probed(_View(other, 0))[0] == 2       # another model
    ctx = torch.zeros(1, 3)
    assert probed(_View(model, 0, ctx))[0] == 2  # a context tensor: its shape is part of it
    assert probed(_View(model, 0, torch.ones(1, 3)))[0] == 0
    assert probed(_View(model, 0, torch.zeros(1, 4)))[0] == 2


def test_layer_integrated_gradients_through_the_llm_front_probes_once():
    """LayerIntegratedGradients through the LLM front (one view of the model per target
    token): the first call probes, a repeated call with the same prompt probes nothing and
    gives bitwise the same attributions."""
    import warnings

    from test_captum_llm import PROMPT, TARGET, WORDS, _build
    from tokenizers import Tokenizer, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    import taylorattr.captum.attr as T

    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.post_processor = processors.TemplateProcessing(single="<s> $A",
                                                       special_tokens=[("<s>", 1)])
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>",
                                        unk_token="<unk>", pad_token="<pad>")
    llama = _build("llama")
    probes = []
    real = Bt._probe_bytes

    def counted(*args, **kwargs):
        probes.append(args[1].shape)
        return real(*args, **kwargs)

    def run():
        inp = T.TextTokenInput(PROMPT, tokenizer, skip_tokens=["<s>"], baselines="a")
        method = T.LayerIntegratedGradients(llama, llama.get_input_embeddings())
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # transformers' own deprecation notes
            return T.LLMGradientAttribution(method, tokenizer).attribute(
                inp, target=TARGET, n_steps=5)

    Bt._probe_bytes = counted
    try:
        first = run()
        n_first = len(probes)
        second = run()
    finally:
        Bt._probe_bytes = real
    assert n_first == 2 * len(first.output_tokens)  # two probe sizes per target token
    assert len(probes) == n_first                   # the repeated call: none
    assert torch.equal(first.token_attr, second.token_attr)
