"""Is the estimate within 2x of the run, fixed costs included (issue 46, item 6)?

A user's small CNN (three Conv-ReLU-MaxPool blocks, ``AdaptiveAvgPool2d(4)``, a linear
classifier) and a 96x96 photo in a scratch folder; each command a fresh process, as a
user runs it: ``explain --dry-run`` (the estimate alone: its printed "in all" seconds and
its own wall time) and the same ``explain`` run (its wall time, estimate included).
Reported: estimate / run (goal: within [0.5, 2]), and the dry run's cost / the run's (the
estimate should cost a small part of the run). Every number is of this machine as it is,
with its load average printed beside; ``--json PATH`` writes the rows.
"""
from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _timing import dump_json, print_table

SRC = str(Path(__file__).resolve().parents[1] / "src")

NETS = '''
import torch
from torch import nn


def cnn():
    torch.manual_seed(0)
    blocks = []
    for c_in, c_out in ((3, 8), (8, 16), (16, 32)):
        blocks += [nn.Conv2d(c_in, c_out, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2)]
    return nn.Sequential(*blocks, nn.AdaptiveAvgPool2d(4), nn.Flatten(),
                         nn.Linear(512, 2)).eval()
'''

UNITS = {"s": 1.0, "min": 60.0, "h": 3600.0, "days": 86400.0}


def in_all(err: str) -> float:
    m = re.search(r"estimate: (?:in all|all stages): about ([0-9.]+) (s|min|h|days)", err)
    if m is None:
        raise SystemExit(f"no estimate in:\n{err}")
    return float(m.group(1)) * UNITS[m.group(2)]


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--methods", nargs="+", default=["gi", "dl", "ig", "taylor-1", "taylor-2"])
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    import numpy as np
    from PIL import Image

    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / "mypkg").mkdir()
        (root / "mypkg" / "__init__.py").write_text("")
        (root / "mypkg" / "nets.py").write_text(NETS)
        pixels = np.random.default_rng(0).integers(0, 255, (96, 96, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(root / "photo.png")
        env = {**os.environ, "PYTHONPATH": SRC, "OMP_NUM_THREADS": "1"}
        base = [sys.executable, "-m", "taylorattr", "explain", "photo.png", "--model",
                "mypkg.nets:cnn", "--methods", *args.methods]

        def timed(extra):
            start = time.perf_counter()
            proc = subprocess.run(base + extra, cwd=root, env=env, capture_output=True,
                                  text=True, check=False)
            if proc.returncode:
                raise SystemExit(proc.stderr)
            return time.perf_counter() - start, proc.stderr

        load = os.getloadavg()[0]
        dry_s, dry_err = timed(["--dry-run", "--out", "dry"])
        run_s, run_err = timed(["--out", "run"])
    said = in_all(run_err)
    rows = [("explain --dry-run (the estimate alone)", f"{dry_s:.1f}", f"{in_all(dry_err):.1f}"),
            ("explain (estimate and run)", f"{run_s:.1f}", f"{said:.1f}")]
    print_table(f"Estimate vs run, seconds (load average {load:.1f} on {os.cpu_count()} CPUs)",
                rows, ("command", "wall", "estimated in all"))
    ratio = said / run_s
    print(f"estimate / run = {ratio:.2f} ({'ok' if 0.5 <= ratio <= 2 else 'MISSED'}: "
          f"within 2x); dry run / run = {dry_s / run_s:.2f}")
    dump_json(args.json, {"dry_s": dry_s, "run_s": run_s, "estimated_s": said,
                          "ratio": ratio, "load": load})


if __name__ == "__main__":
    main()
