"""``reproduce`` under ``torchrun --nproc-per-node 2`` (CPU, gloo) writes the same tables as
one process: each rank computes its share of the validation and assessment units and rank 0
assembles them. The single-process route is the tiny run of tests/test_report.py, whose
tables equal those taylorattr 0.1 wrote (tests/data/reproduce_tiny_v0.1.json); here the
two-process tables are compared with that same file, and the units with a one-process run's
keys (every unit is computed once, by one of the ranks)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from test_distributed import _env, _free_port, _listening
from test_report import _clean, _close

HERE = Path(__file__).resolve().parent


def test_reproduce_under_torchrun_equals_one_process(tmp_path):
    port = _free_port()
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node",
           "2", "--master-addr", "127.0.0.1", "--master-port", str(port),
           str(HERE / "_dist_reproduce.py"), str(tmp_path)]
    r = subprocess.run(cmd, check=False, env=_env(), capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-4000:]
    assert not _listening(port)
    golden = json.loads((HERE / "data" / "reproduce_tiny_v0.1.json").read_text())
    assess = json.loads((tmp_path / "assessment" / "assessment.json").read_text())
    validation = json.loads((tmp_path / "validation" / "validation.json").read_text())
    validation["rows"] = [r for r in validation["rows"]
                          if r["method"] in {g["method"] for g in golden["validation"]["rows"]}]
    principles = [r for r in json.loads((tmp_path / "principles" / "principles.json").read_text())
                  if r["method"] in {g["method"] for g in golden["principles"]}]
    now = _clean({"validation": {k: validation[k] for k in golden["validation"]},
                  "principles": principles,
                  "assessment": {k: assess[k] for k in golden["assessment"]}})
    assert _close(now, golden)
    report = (tmp_path / "report.md").read_text()
    assert "2 processes under torchrun" in report
