"""Run every benchmark script in this folder (``make bench``)."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import torch


def main() -> None:
    here = Path(__file__).parent
    sys.path.insert(0, str(here))
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    for script in sorted(here.glob("bench_*.py")):
        spec = importlib.util.spec_from_file_location(script.stem, script)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        print(f"\n# {script.stem}")
        module.main()


if __name__ == "__main__":
    main()
