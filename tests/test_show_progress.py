"""Every long public function of the library takes ``show_progress`` (issue 20).

Each call below runs with ``show_progress=True`` and without: the results are bitwise the
same, the bar (``leave=False``, off by default) ends at the number of Taylor-mode passes
(or chunks) computed here from the plan (moved features or groups, chunk size), and a
``show_progress`` that is not a bool is refused naming it. The ``explain`` command passes
``show_progress`` on to :func:`taylorattr.experiments.explain.explain`.
"""
from __future__ import annotations

import argparse
import math
from dataclasses import fields, is_dataclass

import pytest
import torch
from test_progress_units import Recorder
from torch import nn

import taylorattr.taylor.pair_interactions as PI
import taylorattr.taylor.path_hessians as PH
import taylorattr.taylor.shapley_rule as SR
import taylorattr.taylor.terms as T

B, SIDE = 2, 6
N = SIDE * SIDE
GROUPS = torch.arange(N).view(1, SIDE, SIDE) // 4  # 9 groups of 4 pixels


def _model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(1, 2, 3, padding=1), nn.Softplus(), nn.Flatten(),
                         nn.Linear(2 * N, 3)).double().eval()


def _inputs():
    x = torch.randn(B, 1, SIDE, SIDE, dtype=torch.float64,
                    generator=torch.Generator().manual_seed(1))
    base = x.clone()  # sample 0 moves 6 pixels (groups 0, 1), sample 1 moves 11 (groups 6-8)
    base[0, 0, :5] = 0.0
    base[1, 0, 4:] = 0.0
    return x, base


def _moved(x, base, groups=None) -> int:
    """The widest sample's moved features (or groups): the directions each sample expands."""
    delta = (x - base).reshape(B, -1) != 0
    if groups is None:
        return int(delta.sum(1).max())
    ids = groups.reshape(-1)
    return max(len(set(ids[row].tolist())) for row in delta)


def _cases():
    """``(name, call(model, x, base, **kw), passes)``: ``passes`` computed from the plan."""
    x, base = _inputs()
    ceil = math.ceil
    return [
        ("taylor_attribution", lambda m, **kw: T.taylor_attribution(m, x, base, order=3, **kw), 1),
        ("taylor_terms", lambda m, **kw: T.taylor_terms(m, x, base, order=2, chunk_size=4, **kw),
         ceil(_moved(x, base) / 4)),
        ("taylor_terms_groups", lambda m, **kw: T.taylor_terms(
            m, x, base, order=3, chunk_size=2, groups=GROUPS, **kw),
         ceil(_moved(x, base, GROUPS) / 2)),
        ("group_expansions", lambda m, **kw: T.group_expansions(
            m, x, base, order=2, groups=GROUPS, chunk_size=2, **kw),
         ceil(_moved(x, base, GROUPS) / 2)),
        ("interactions_gradient", lambda m, **kw: PI.interactions(
            m, x, base, groups=GROUPS, order=3, route="gradient", chunk_size=4, **kw), ceil(9 / 4)),
        ("interactions_pairs", lambda m, **kw: PI.interactions(
            m, x, base, groups=GROUPS, order=2, route="pairs", chunk_size=5, **kw),
         ceil(9 / 5) + ceil(36 / 5)),
        ("integrated_hessians", lambda m, **kw: PH.integrated_hessians(
            m, x, base, order=2, groups=GROUPS, chunk_size=4, **kw), ceil(9 / 4)),
        ("integrated_hessians_order1", lambda m, **kw: PH.integrated_hessians(
            m, x, base, order=1, chunk_size=4, **kw), 1),
        ("shapley_attribution", lambda m, **kw: SR.shapley_attribution(
            m, x, base, order=3, chunk_size=5, **kw), 1 + ceil(N / 5)),
        ("shapley_attribution_order2", lambda m, **kw: SR.shapley_attribution(
            m, x, base, order=2, groups=GROUPS, **kw), 1),
    ]


@pytest.fixture
def bars(monkeypatch):
    """Every bar the library's long functions open, recorded."""
    Recorder.bars = []
    for module in (T, PI, PH, SR):
        monkeypatch.setattr(module, "tqdm", Recorder)
    return Recorder.bars


def _same(a, b) -> bool:
    if is_dataclass(a):
        return all(_same(getattr(a, f.name), getattr(b, f.name)) for f in fields(a))
    if isinstance(a, torch.Tensor):
        return torch.equal(a, b)
    return a == b


CASES = _cases()


@pytest.mark.parametrize("call,passes", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bar_counts_the_passes_and_changes_nothing(bars, call, passes):
    model = _model()
    quiet = call(model)
    assert all(not bar.shown for bar in bars)  # off by default
    bars.clear()
    shown = call(model, show_progress=True)
    assert _same(quiet, shown)  # bitwise
    (bar,) = bars
    assert bar.shown and bar.leave_arg is False
    assert bar.n == bar.total == passes


@pytest.mark.parametrize("call", [c[1] for c in CASES], ids=[c[0] for c in CASES])
def test_show_progress_must_be_a_bool(call):
    with pytest.raises((TypeError, ValueError), match="show_progress"):
        call(_model(), show_progress="yes")


@pytest.mark.parametrize("terminal", [True, False])
def test_explain_command_passes_show_progress(monkeypatch, terminal):
    """The ``explain`` command shows the per-chunk bars when stderr is a terminal, and
    keeps them out of logs (stderr then holds the warnings alone)."""
    from taylorattr.cli.commands import explain as command
    from taylorattr.experiments import explain as E

    seen = {}

    class Stop(Exception):
        pass

    def explain(*args, **kwargs):
        seen.update(kwargs)
        raise Stop

    monkeypatch.setattr(E, "explain", explain)
    monkeypatch.setattr(command.sys.stderr, "isatty", lambda: terminal)
    args = argparse.Namespace(image="i.png", model="resnet18", weights=None, methods=None,
                              target=None, out="o", sign="all", overlay=False, save_maps=False,
                              beta=10.0, interactions=False, network=object(),
                              format=["pt"])  # network: built by the preflight
    with pytest.raises(Stop):
        command.run(args)
    assert seen["show_progress"] is terminal
