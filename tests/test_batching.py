"""The batching helper: chunk sizes from measured row memory, cached, refined by timing.

Routes: a recording model sees the rows of every call, and its per-row memory has a
closed form (``sigmoid(x W) v``: two ``[c, h]`` float64 intermediates, an output and the
row copy), so the chunk a budget allows is known in advance; the blocks of the chunk loops
are checked by enumerating the grid cell by cell; results with automatic chunks against
the same method at a fixed size (another split of the same sums).
"""
from __future__ import annotations

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


def _info(tuned: bool) -> AllocatorInfo:
    return (AllocatorInfo("2.36", 2_000_000_000, 2**31 - 1, "tune_allocator") if tuned
            else AllocatorInfo("2.36", None, None, "default"))


def _budget_rows(*args, **kwargs) -> int:
    """The memory-based rows of an automatic chunk (its plan: the timed form carries it)."""
    with Bt.timed_chunks():
        return Bt.chunk_rows(*args, **kwargs).plan.budget_rows


@pytest.mark.parametrize("rows_allowed", [10, 100, 1000])
def test_the_chunk_a_budget_allows_matches_the_closed_form(rows_allowed, monkeypatch):
    monkeypatch.setattr(Bt, "allocator_info", lambda: _info(True))
    model = Recorder()
    x = torch.rand(3, D, dtype=torch.float64)
    budget = rows_allowed * forward_row_bytes()
    got = Bt.chunk_rows(model, x, backward=False, max_memory=budget)
    assert int(got) == rows_allowed  # the measured line equals the closed form
    # and the model really sees chunks of at most that many rows
    model.rows.clear()
    with Bt.memory_budget(budget):
        Occlusion(model).attribute(torch.rand(rows_allowed // 10 + 1, D, dtype=torch.float64),
                                   0.0, target=0, patch=1)
    chunks = model.rows[1:]  # after the one call on the inputs
    assert sum(chunks) == D * (rows_allowed // 10 + 1)
    assert rows_allowed // 2 < max(chunks) <= rows_allowed


def test_backward_rows_cost_more_and_stay_under_the_budget(monkeypatch):
    monkeypatch.setattr(Bt, "allocator_info", lambda: _info(True))
    model = Recorder()
    x = torch.rand(4, D, dtype=torch.float64)
    budget = 200 * forward_row_bytes()
    fwd = Bt.chunk_rows(model, x, backward=False, max_memory=budget)
    bwd = Bt.chunk_rows(model, x, backward=True, max_memory=budget)
    assert 1 <= int(bwd) < int(fwd) == 200
    # forward+backward keeps x W, its sigmoid (saved), the grad of both and the row's grad
    assert int(bwd) * 8 * (2 * H + 2 + D) <= budget
    model.rows.clear()
    with Bt.memory_budget(budget):
        IntegratedGradients(model).attribute(x, 0.0, target=1, n_steps=300)
    assert max(model.rows[:-1]) <= _budget_rows(model, x, True, max_memory=budget)


def test_single_allocations_stay_under_the_mmap_threshold_by_default(monkeypatch):
    """Default glibc: no tensor of a chunk reaches half the 32 MiB dynamic threshold, and
    the chunk stays under the trim threshold; after tune_allocator only the budget binds."""
    wide = 1 << 15  # one row's hidden layer: 256 KiB in float64
    model = Recorder(h=wide)
    x = torch.rand(2, D, dtype=torch.float64)
    monkeypatch.setattr(Bt, "allocator_info", lambda: _info(False))
    default = int(Bt.chunk_rows(model, x, backward=False, max_memory=2**34))
    assert default * 8 * wide <= 16 * 2**20 < (default + 1) * 8 * wide
    Bt.clear_cache()
    monkeypatch.setattr(Bt, "allocator_info", lambda: _info(True))
    tuned = int(Bt.chunk_rows(model, x, backward=False, max_memory=2**30))
    assert tuned == 2**30 // forward_row_bytes(h=wide)


def test_cache_key_distinguishes_shape_dtype_threads_and_pass():
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
    assert model.rows[1:] == [6] * 10  # 7 rows fit two whole steps of 3 samples
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
        for o0, o1, i0, i1 in grid_blocks(n_outer, n_inner, Bt.ChunkRows(plan)):
            assert (o1 - o0) * (i1 - i0) <= plan.budget_rows
            assert o1 - o0 == 1 or (i0, i1) == (0, n_inner)
            seen[o0:o1, i0:i1] += 1
            time.sleep(2e-4)
        assert torch.equal(seen, torch.ones_like(seen))
    spans = list(chunk_ranges(n_inner, Bt.ChunkRows(plan)))
    assert [a for a, _ in spans] == [0] + [b for _, b in spans[:-1]] and spans[-1][1] == n_inner


def test_timing_settles_on_the_fastest_size():
    """Each chunk costs a fixed 3 ms whatever its size, so the largest candidate wins."""
    plan = Bt.ChunkPlan(rows=8, budget_rows=16, bytes_per_row=1.0, fixed_bytes=0.0,
                        candidates=(16, 8, 4, 2))
    while not plan.settled:
        for _ in grid_blocks(20, 16, Bt.ChunkRows(plan)):
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
    model = Recorder(d=16, h=wide)
    x = torch.rand(3, 16, dtype=torch.float64)
    monkeypatch.setattr(Bt, "allocator_info", lambda: _info(False))
    cap = Bt.series_rows(model, x, order)
    assert cap == 16 * 2**20 // (order * 8 * wide) == 32
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
