"""Two real processes under torchrun (CPU, gloo): the merged table equals the
single-process one byte for byte; a SIGKILLed rank loses only unfinished units and a
world-size-1 rerun finishes without recomputing any finished unit; a second job on the
same folder is refused naming the holder; nothing is left listening."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from taylorattr import _io, cli
from taylorattr.experiments.evaluation.lock import LOCK_NAME

pytestmark = pytest.mark.slow  # torchrun jobs in subprocesses

HERE = Path(__file__).resolve().parent
SRC = str(HERE.parent / "src")
JOB = str(HERE / "_dist_job.py")


def _env():
    env = dict(os.environ, PYTHONPATH=SRC + os.pathsep + os.environ.get("PYTHONPATH", ""),
               OMP_NUM_THREADS="1", CUDA_VISIBLE_DEVICES="")
    env.pop("RANK", None)
    env.pop("WORLD_SIZE", None)
    return env


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


def _torchrun(port, *args, check=True):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1",
           "--nproc-per-node", "2", "--master-addr", "127.0.0.1", "--master-port", str(port),
           *args]
    r = subprocess.run(cmd, check=False, env=_env(), capture_output=True, text=True, timeout=110)
    if check:
        assert r.returncode == 0, r.stdout + r.stderr
    return r


def _python(*args):
    r = subprocess.run([sys.executable, *args], check=False, env=_env(), capture_output=True, text=True,
                       timeout=110)
    assert r.returncode == 0, r.stdout + r.stderr
    return r


def _counts(stdout: str) -> tuple[int, int]:
    comp = reused = 0
    for line in stdout.splitlines():
        if line.startswith("computed="):
            parts = dict(p.split("=") for p in line.split())
            comp += int(parts["computed"])
            reused += int(parts["reused"])
    return comp, reused


def _units(folder: Path) -> dict[str, tuple[int, int]]:
    return {p.name: (p.stat().st_ino, p.stat().st_mtime_ns)
            for p in (folder / "units").glob("unit-*.pt")}


def test_cli_two_ranks_equal_one_rank_bytewise(tmp_path):
    from taylorattr.models import poly

    torch.manual_seed(0)
    weights = tmp_path / "poly.pt"
    torch.save(poly().state_dict(), weights)
    common = ["evaluate", "--data", "mnist", "--model", "poly", "--weights", str(weights),
              "--methods", "GI", "integrated_gradients", "EG", "--samples", "10",
              "--batch-size", "2", "--max-side", "3", "--device", "cpu"]
    port = _free_port()
    two = _torchrun(port, "-m", "taylorattr", *common, "--out", str(tmp_path / "two"))
    one = _python("-m", "taylorattr", *common, "--out", str(tmp_path / "one"))
    assert not _listening(port)
    for name in ("scores.csv", "summary.csv", "summary.json"):
        assert (tmp_path / "one" / name).read_bytes() == (tmp_path / "two" / name).read_bytes()
    # both ranks worked: 5 units of 2 items dealt 3 + 2, all computed once; the rank is
    # named under torchrun only
    assert "rank 0/2: 6 items computed, 0 reused" in two.stdout
    assert "rank 1/2: 4 items computed, 0 reused" in two.stdout
    assert "10 items computed, 0 reused" in one.stdout and "rank 0/1" not in one.stdout
    rows = _io.load_csv(tmp_path / "two" / "scores.csv")
    assert len(rows) == 10 * 3 and not (tmp_path / "two" / LOCK_NAME).exists()


def test_sigkill_one_rank_then_rerun_on_one_process(tmp_path):
    ref, out, marker = tmp_path / "ref", tmp_path / "out", tmp_path / "kill"
    _python(JOB, str(ref))                              # the uninterrupted run, world size 1
    marker.touch()
    port = _free_port()
    killed = _torchrun(port, JOB, str(out), str(marker), check=False)
    assert killed.returncode != 0 and not marker.exists()  # rank 1 died at item 18
    assert not _listening(port)
    finished = _units(out)
    n_units = 12
    assert 4 <= len(finished) < n_units                 # rank 1 finished units 1,3,5,7 first
    assert "unit-000009.pt" not in finished            # the unit it died in is not there
    for p in (out / "units").iterdir():                 # no partial file is visible
        assert p.name.startswith(".") or len(_io.load_tensors(p)["items"]) == 2
    assert not (out / "summary.csv").exists()

    rerun = _python(JOB, str(out))                      # world size 1 finishes the rest
    computed, reused = _counts(rerun.stdout)
    assert (computed, reused) == (2 * (n_units - len(finished)), 2 * len(finished))  # items
    after = _units(out)
    assert all(after[name] == stamp for name, stamp in finished.items())  # none rewritten
    for name in ("scores.csv", "summary.csv", "summary.json"):
        assert (ref / name).read_bytes() == (out / name).read_bytes()
    assert not (out / LOCK_NAME).exists()


def test_second_job_is_refused_naming_the_holder(tmp_path, capsys):
    out = tmp_path / "out"
    holder = subprocess.Popen(
        [sys.executable, "-c",
         ("import sys; from taylorattr.experiments.evaluation.lock import JobLock; "
          f"JobLock({str(out)!r}).acquire(); print('held', flush=True); sys.stdin.read()")],
        env=_env(), stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        from taylorattr.models import poly

        weights = tmp_path / "w.pt"
        torch.manual_seed(0)
        torch.save(poly().state_dict(), weights)
        with pytest.raises(SystemExit) as exc:
            cli.main(["evaluate", "--data", "mnist", "--model", "poly", "--weights",
                      str(weights), "--methods", "GI", "--samples", "2", "--out", str(out),
                      "--budget", "none"])
        assert exc.value.code == 2
    finally:
        holder.stdin.close()
        holder.wait(timeout=30)
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert f"pid {holder.pid} on {socket.gethostname()}" in err and "--out" in err, err
    # the holder is gone now: its lock is stale and the next job takes it over
    _python(JOB, str(out))
    assert not (out / LOCK_NAME).exists()
    assert (out / "summary.csv").is_file()
