"""``python tests/regenerate_golden.py [OUT]``: rewrite tests/data/reproduce_tiny_v0.1.json
from the tiny reproduce run (tests/_dist_reproduce.py's settings) with the installed
packages, after ``make lock`` (docs/getting_started.md, "What is bitwise, what holds
within a tolerance").
Prints every number that moved against the file it replaces, to be said in the commit.
Only the keys the file already holds are rewritten (rows of methods registered since 0.1
stay out of it)."""
from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
GOLDEN = HERE / "data" / "reproduce_tiny_v0.1.json"


def main(out: Path) -> None:
    sys.path.insert(0, str(HERE))
    import torch
    from _dist_reproduce import TINY
    from test_report import golden_selection, moved

    from taylorattr.experiments.reproduce import reproduce

    torch.set_num_threads(1)  # as the golden test's run (tests/test_report.py, tiny_run)
    reproduce(out, show_progress=False, settings=TINY)
    old = json.loads(GOLDEN.read_text())
    new = golden_selection(out, old)
    for path, was, now in moved(new, old):
        print(f"{path}: {was!r} -> {now!r}")
    GOLDEN.write_text(json.dumps(new, indent=1, sort_keys=True))
    print(f"wrote {GOLDEN}")


if __name__ == "__main__":
    if len(sys.argv) > 1:
        main(Path(sys.argv[1]))
    else:
        with tempfile.TemporaryDirectory() as tmp:
            main(Path(tmp))
