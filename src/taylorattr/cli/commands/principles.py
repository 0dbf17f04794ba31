"""``taylorattr principles``: the paper's Table 2, measured (the principle audit)."""
from __future__ import annotations

from ..arguments import _seed


def arguments(p, method_help: bool) -> None:
    p.add_argument("--seed", type=_seed, default=0, help="seed of the probe networks")


def run(args) -> str:
    from ... import principles  # torch: after parsing, not for --help

    return principles.format_table(principles.principles_table(seed=args.seed))
