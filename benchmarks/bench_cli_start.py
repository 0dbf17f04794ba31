"""How fast the command line answers (issue 28): ``taylorattr --help`` and an argument
error, each a fresh process, against the peers measured in the same run: a bare
interpreter (``python -c pass``) and ``python -c "import torch"`` (what every command
paid before the parser stopped importing the registry).

Goal: ``taylorattr --help`` and an argument error under 1 s on this machine (median of
interleaved runs); ``explain --help``, which lists the registry's methods, is shown for
comparison (it imports torch). ``--json PATH`` writes the rows.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _timing import dump_json, interleaved_medians, print_table

SRC = str(Path(__file__).resolve().parents[1] / "src")
GOAL_S = 1.0


def process(*argv: str):
    env = {**os.environ, "PYTHONPATH": SRC, "OMP_NUM_THREADS": "1"}

    def call():
        subprocess.run([sys.executable, *argv], env=env, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL, check=False)
    return call


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="3 repeats instead of 7")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    runs = {
        "python -c pass (peer)": process("-c", "pass"),
        "python -c 'import torch' (peer)": process("-c", "import torch"),
        "taylorattr --help": process("-m", "taylorattr", "--help"),
        "taylorattr evaluate (missing arguments)": process("-m", "taylorattr", "evaluate"),
        "taylorattr explain --help (lists methods)": process("-m", "taylorattr", "explain",
                                                             "--help"),
    }
    seconds = interleaved_medians(runs, repeats=3 if args.quick else 7)
    torch_s = seconds["python -c 'import torch' (peer)"]
    rows = [(label, f"{s:.3f}", f"{s / torch_s:.2f}",
             ("ok" if s < GOAL_S else "MISSED") if label.startswith("taylorattr") and
             "explain" not in label else "")
            for label, s in seconds.items()]
    print_table("Start-up, median seconds of fresh processes", rows,
                ("command", "seconds", "/ import torch", f"< {GOAL_S:g} s"))
    dump_json(args.json, {"seconds": seconds, "goal_s": GOAL_S})


if __name__ == "__main__":
    main()
