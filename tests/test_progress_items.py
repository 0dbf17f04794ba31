"""Progress per item and finished items kept (issue 46, item 5).

A unit of ``batch_size`` items used to be computed, stored and counted as one: a job of
six images showed 0/6 until all were done, and an interrupt kept none. Items whose
methods run many rows (here IG, 8 steps) are now computed one at a time: progress moves
after each, and each finished item is stored. Routes: the log lines counted against the
items; the maps of an interrupted and resumed job against those of an uninterrupted job
(bitwise: each item is computed alone in both) and against the methods called directly."""
from __future__ import annotations

import io
import re

import pytest
import torch
from torch import nn

from taylorattr.experiments import evaluate as E
from taylorattr.methods import IntegratedGradients
from taylorattr.runtime import progress


class Items(torch.utils.data.Dataset):
    """Five 1x6x6 images with their labels."""

    def __init__(self):
        g = torch.Generator().manual_seed(0)
        self.x = torch.rand(5, 1, 6, 6, generator=g)

    def __len__(self):
        return 5

    def __getitem__(self, i):
        return self.x[i], i % 3


def net():
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(1, 2, 3), nn.Softplus(), nn.Flatten(),
                         nn.Linear(32, 3)).eval()


IG = "IG"  # 32 steps: far more than ITEM_ROWS rows per item


def test_progress_moves_once_per_item_in_a_log(tmp_path, monkeypatch):
    monkeypatch.setattr(progress, "LOG_SECONDS", 0.0)
    log = io.StringIO()
    monkeypatch.setattr("sys.stderr", log)
    report = E.attribute_dataset(net(), Items(), IG, out=tmp_path / "o", batch_size=16,
                                 show_progress=True)
    assert report.computed == 5
    lines = log.getvalue().splitlines()
    done = [int(m.group(1)) for ln in lines
            if (m := re.search(r": IG: (\d)/5 items done in [0-9.]+ s$", ln))]
    assert done == [1, 2, 3, 4], lines  # the fifth is the "done" line
    assert lines[0].endswith("IG: started, 5 items") and "done, 5 items in" in lines[-1]


def test_an_interrupt_keeps_every_finished_item(tmp_path, monkeypatch):
    data = Items()
    whole = E.attribute_dataset(net(), data, IG, out=tmp_path / "whole", batch_size=16)
    assert whole.computed == 5
    saved = E.save_map
    calls = []

    def interrupted(*args, **kwargs):
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return saved(*args, **kwargs)

    monkeypatch.setattr(E, "save_map", interrupted)
    with pytest.raises(KeyboardInterrupt):
        E.attribute_dataset(net(), data, IG, out=tmp_path / "o", batch_size=16)
    monkeypatch.setattr(E, "save_map", saved)
    kept = {p.name: p.stat().st_mtime_ns for p in (tmp_path / "o").glob("*.pt")}
    assert sorted(kept) == ["000000.pt", "000001.pt"]
    again = E.attribute_dataset(net(), data, IG, out=tmp_path / "o", batch_size=16)
    assert (again.computed, again.reused, again.recomputed) == (3, 2, 0)
    for name, stamp in kept.items():  # the finished two were not computed again
        assert (tmp_path / "o" / name).stat().st_mtime_ns == stamp
    model = net()
    for i in range(5):
        got = torch.load(tmp_path / "o" / f"{i:06d}.pt", weights_only=True)["attribution"]
        ref = torch.load(tmp_path / "whole" / f"{i:06d}.pt", weights_only=True)["attribution"]
        assert torch.equal(got, ref)
        direct = IntegratedGradients(model).attribute(data.x[i:i + 1], 0.0, target=i % 3)
        torch.testing.assert_close(got, direct[0], rtol=1e-5, atol=1e-7)


def test_on_a_terminal_a_long_item_shows_its_model_rows(tmp_path, monkeypatch):
    """Each item computed alone gets a bar over its model rows (leave=False) beside the
    bar over the items; the maps are bitwise those of a run without bars."""
    import tqdm.auto
    from test_progress_units import Recorder

    Recorder.bars = []
    monkeypatch.setattr(tqdm.auto, "tqdm", Recorder)
    monkeypatch.setattr(progress, "interactive", lambda stream=None: True)
    E.attribute_dataset(net(), Items(), IG, out=tmp_path / "bars", batch_size=16,
                        show_progress=True)
    items = [b for b in Recorder.bars if b.unit == "item"]
    rows = [b for b in Recorder.bars if b.unit == "row"]
    assert len(items) == 1 and items[0].updates == [1] * 5
    # IG, 32 steps: 32 rows per item (and the call's own forward of the item)
    assert len(rows) == 5 and all(sum(b.updates) >= 32 and not b.leave_arg for b in rows)
    plain = E.attribute_dataset(net(), Items(), IG, out=tmp_path / "plain", batch_size=16)
    assert plain.computed == 5
    for i in range(5):
        a, b = (torch.load(tmp_path / d / f"{i:06d}.pt", weights_only=True)["attribution"]
                for d in ("bars", "plain"))
        assert torch.equal(a, b)
