"""Argument types, shared constants and the one-line error of the command line.

Everything here is light: the parser and ``--help`` import no torch. What the types need
from the package (the seed check, the training presets, the registry) comes through
:func:`library`, loaded the first time such a value is parsed.
"""
from __future__ import annotations

import argparse
import importlib
import json
import re
import sys
from pathlib import Path
from types import SimpleNamespace

# models.pretrained.TORCHVISION_MODELS, written here so that --help imports no torch
IMAGENET_MODELS = ("vgg16", "vgg19", "resnet18")
EXPLAIN_MODELS = ("efficientnet-lite0", *IMAGENET_MODELS)
ASSESS_EXPERIMENTS = ("infidelity", "taylor_order", "bbox")
MAP_FORMATS = ("pt", "npy", "png")  # as taylorattr.experiments.evaluate.MAP_FORMATS


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


_ESCAPES = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def _one_line(text) -> str:
    """``text`` on one line, without terminal escape codes unless stderr is a terminal."""
    text = " ".join(str(text).split())
    return text if sys.stderr.isatty() else _ESCAPES.sub("", text)


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


def library() -> SimpleNamespace:
    """The package modules the command line reads around its commands: ``validation``
    (argument checks), ``data``, ``models`` and ``registry`` (with the paper's rows,
    :mod:`taylorattr.paper_methods`, registered)."""
    from .. import _validation, data, models, paper_methods, registry  # torch: not for --help

    del paper_methods  # imported for its registrations
    return SimpleNamespace(validation=_validation, data=data, models=models, registry=registry)


def _seed(text: str) -> int:
    value = _nonnegative_int(text)
    try:
        return library().validation.check_seed(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _preset(text: str) -> str:
    PRESETS = library().models.training.PRESETS
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


def _beta(text: str) -> float | str:
    """``--beta``: ``auto`` or a number >= 0 (0: the network itself)."""
    return "auto" if text == "auto" else _nonnegative_float(text)


def _nonnegative_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {text!r}") from None
    if not (value >= 0 and value < float("inf")):
        raise argparse.ArgumentTypeError(f"expected a finite number >= 0, got {text!r}")
    return value


def _positive_float(text: str) -> float:
    try:
        value = _nonnegative_float(text)
    except argparse.ArgumentTypeError:
        value = 0.0
    if value == 0:
        raise argparse.ArgumentTypeError(f"expected a finite number > 0, got {text!r}")
    return value


def _budget(text: str) -> float:
    """Seconds > 0, or ``none`` (no budget, also on a terminal: infinity)."""
    if text.strip().lower() == "none":
        return float("inf")
    return _positive_float(text)


def _cost_flags(p) -> None:
    """``--estimate`` and ``--budget`` of every long command (:mod:`.estimates`)."""
    p.add_argument("--budget", type=_budget, default=None, metavar="SECONDS",
                   help="refuse, with one line and exit status 2 before any work (no "
                        "training, no files), a run estimated above SECONDS; the estimate "
                        "counts every stage's rows from the methods' plans and times a probe "
                        "batch; every stage's estimate is printed on stderr (default: 4 h, "
                        "in batch mode too; 'none' lifts it and skips the estimate)")
    p.add_argument("--estimate", action="store_true",
                   help="print the estimates even with --budget none")
    p.add_argument("--dry-run", action="store_true",
                   help="print the estimates (with the fixed costs: start-up, model loading, "
                        "graph captures) and exit 0 without running or writing anything")


def _json_args(text: str):
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"expected JSON, e.g. '{{\"num_classes\": 10}}': "
                                         f"{exc.msg} in {text!r}") from None
    if not isinstance(value, (dict, list)):
        raise argparse.ArgumentTypeError("expected a JSON object (keyword arguments) or list "
                                         f"(positional ones), got {text!r}")
    return value


def _rgb(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None


def _model_flags(p, default: str | None) -> None:
    """``--model`` (a name, ``package.module:callable`` or a ``.pt2`` file) with its
    weights, arguments, labels and input preprocessing."""
    builtin = "efficientnet-lite0, vgg16, vgg19, resnet18, the paper models poly, m_sg, ..."
    p.add_argument("--model", required=default is None, default=default, metavar="MODEL",
                   help=f"a built-in name ({builtin}), package.module:callable (your own "
                        "network, imported from the working directory or PYTHONPATH) or a "
                        "torch.export program file .pt2 (exported with a dynamic batch "
                        "dimension)")
    p.add_argument("--model-args", type=_json_args, default=None, metavar="JSON",
                   help="arguments of a package.module:callable --model: a JSON object "
                        "(keywords) or list (positional)")
    p.add_argument("--weights", type=_existing_file, default=None,
                   help="state dict of --model (required for vgg16/vgg19/resnet18; the paper "
                        "models default to the weights reproduce trained under --models-dir; "
                        "no weights are downloaded)")
    p.add_argument("--models-dir", type=_output_dir, default=Path("results"),
                   help="where reproduce caches its trained paper models (trained there now "
                        "when absent)")
    p.add_argument("--labels", type=_existing_file, default=None, metavar="FILE",
                   help="class names, one per line in the model's output order; class "
                        "folders of --data must match them (without it the predicted class "
                        "is explained)")
    p.add_argument("--input-size", type=_positive_int, default=None, metavar="N",
                   help="side of the square fed to the model (default: the model's own: a "
                        "built-in's, a .pt2 program's input shape, timm's pretrained_cfg; "
                        "else the images' own shorter side)")
    p.add_argument("--resize", type=_positive_int, default=None, metavar="N",
                   help="shorter side before the center crop (default: the model's own, "
                        "else --input-size: the whole center square)")
    p.add_argument("--mean", type=_rgb, nargs=3, default=None, metavar=("R", "G", "B"),
                   help="normalisation mean (default: the model's own, else none: pixels "
                        "in [0, 1]; ImageNet's is 0.485 0.456 0.406)")
    p.add_argument("--std", type=_rgb, nargs=3, default=None, metavar=("R", "G", "B"),
                   help="normalisation std (default: the model's own, else none; ImageNet's "
                        "is 0.229 0.224 0.225)")
    p.add_argument("--grayscale", action="store_true",
                   help="feed one gray channel (0.299 R + 0.587 G + 0.114 B); automatic when "
                        "the model's first convolution takes 1 channel")


def _dataset_flags(p) -> None:
    """The flags of a dataset job (``evaluate``, ``attribute``): its data, model, samples,
    batches, seeds, bad items, device, resume and cost."""
    p.add_argument("--data", required=True,
                   help="mnist (the held-out digits), cluttered (held-out canvases with box "
                        "masks) or a folder of images (any depth; class folders and VOC XML "
                        "boxes optional)")
    _model_flags(p, default=None)
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
    _dataset_job_flags(p)
    _cost_flags(p)


def _dataset_job_flags(p) -> None:
    """``--resume``: how a rerun into the same ``--out`` treats finished units."""
    p.add_argument("--resume", choices=("auto", "strict"), default="auto",
                   help="auto: recompute exactly the units whose model, inputs, method, "
                        "seed or library version changed, and say so; strict: refuse such a "
                        "rerun naming what changed")


def _any_method(text: str) -> str:
    """A registry name or label of ``evaluate``/``attribute``, checked (an unknown one
    with the closest names, :func:`taylorattr.registry.resolve`) and kept as given."""
    try:
        library().registry.resolve(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix("methods: ")) from None
    return text


def method_names(method_help: bool) -> str:
    """The registry's method names for a ``--methods`` help text (they read the registry,
    a torch import: only for ``--help``)."""
    if not method_help:
        return "see --help for the names"
    return "one of " + ", ".join(library().registry.METHODS)


def _named_weights(text: str) -> tuple[str, Path]:
    """``NAME=PATH`` with NAME one of the torchvision localisation models."""
    name, sep, path = text.partition("=")
    if not sep or name not in IMAGENET_MODELS:
        raise argparse.ArgumentTypeError(
            f"expected NAME=PATH with NAME one of {', '.join(IMAGENET_MODELS)}, got {text!r}")
    return name, _existing_file(path)


def require_package(module: str, argument: str, what: str, extra: str) -> None:
    """Import ``module`` or fail with the install command of the extra that brings it."""
    try:
        importlib.import_module(module)
    except ImportError:
        raise CliError(argument, f"{what} needs the optional package {module.split('.')[0]}; "
                                 f"install it with pip install 'taylorattr[{extra}]'") from None
