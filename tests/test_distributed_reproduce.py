"""``reproduce`` under ``torchrun --nproc-per-node 2`` (CPU, gloo) writes the same tables as
one process: each rank computes its share of the validation and assessment units and rank 0
assembles them. Both runs are on this machine with one thread per process (torchrun's
``OMP_NUM_THREADS=1``; the session's one-process run, ``tiny_run`` of tests/conftest.py,
sets one thread), so every unit is computed by the same kernels in the same order: the
tables are compared bitwise, not within the golden file's cross-machine tolerance."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from test_distributed import _env, _free_port, _listening
from test_report import GOLDEN, _clean, golden_selection, moved

pytestmark = pytest.mark.slow  # minutes of subprocesses: `make test-quick` leaves it out

HERE = Path(__file__).resolve().parent


def test_reproduce_under_torchrun_equals_one_process(tmp_path, tiny_run):
    port = _free_port()
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node",
           "2", "--master-addr", "127.0.0.1", "--master-port", str(port),
           str(HERE / "_dist_reproduce.py"), str(tmp_path)]
    r = subprocess.run(cmd, check=False, env=_env(), capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    assert not _listening(port)
    golden = json.loads(GOLDEN.read_text())
    one = tiny_run.parent
    assert list(moved(golden_selection(tmp_path, golden), golden_selection(one, golden))) == []
    for table in ("validation/study.json", "assessment/assessment.json"):  # all, times aside
        now, single = (json.loads((d / table).read_text()) for d in (tmp_path, one))
        assert list(moved(_clean(now), _clean(single))) == [], table
    report = (tmp_path / "report.md").read_text()
    assert "2 processes under torchrun" in report

