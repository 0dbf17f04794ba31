"""The interactions stage of the report: its split of each order is exact.

Independent facts: a monomial of degree k touches at most k patches, so nothing of orders 1
and 2 spans three or more patches and nothing of order 1 joins two; ``df`` equals plain model
calls; and each order's total equals ``taylor_terms``' per-order terms of the whole delta.
"""
from __future__ import annotations

import json

import pytest
import torch

from taylorattr.experiments.interactions import format_interactions, run_interactions
from taylorattr.experiments.workspace import Workspace
from taylorattr.taylor.terms import taylor_terms


def test_orders_split_exactly_and_sum_to_the_output_change(tmp_path):
    ws = Workspace(tmp_path, epochs=0, progress=False)
    r = run_interactions(ws, models=("c_sg",), n_samples=2, order=3, plots=False)
    rows = {row["order"]: row for row in r.rows}
    assert rows[1]["pairs"] == pytest.approx(0.0, abs=1e-12)
    for k in (1, 2):
        assert rows[k]["rest"] == pytest.approx(0.0, abs=1e-10)
    # sum_k P_k + eps = df per digit, with df from two model calls
    model, _ = ws.trained("c_sg", torch.float64)
    x = ws.held_out_digits(2).double()
    with torch.no_grad():
        t = model(x).argmax(1)
        df = model(x).gather(1, t[:, None])[:, 0] - model(torch.zeros_like(x)).gather(
            1, t[:, None])[:, 0]
    unit = next((tmp_path / "interactions" / "units").glob("*.pt"))
    torch.testing.assert_close(torch.load(unit)["df"], df.cpu())  # units are stored on the CPU
    # each order's P_k by another route: taylor_terms' single expansion along the whole delta
    orders = taylor_terms(model, x, 0.0, t, 3).orders  # [B, K]
    for k in (1, 2, 3):
        expected = float((orders[:, k - 1] / df.abs()).mean())
        assert rows[k]["total"] == pytest.approx(expected, rel=1e-9, abs=1e-12)
    saved = json.loads((tmp_path / "interactions" / "interactions.json").read_text())
    assert saved["rows"] == r.rows
    assert "between two patches" in format_interactions(r)
