"""``taylorattr explain IMAGE``: saliency maps and the top classes (up to 5) of one image, on any
model."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ...reporting.signs import SIGNS
from ..arguments import (
    MAP_FORMATS,
    CliError,
    _beta,
    _cost_flags,
    _existing_file,
    _model_flags,
    _nonnegative_int,
    _one_line,
    _output_dir,
    library,
    require_package,
)
from ..jobs import explain_network
from ..preflight import check_writable

CHEAPER = "fewer --methods, no --interactions"


def _explain():
    """The application module this command runs."""
    from ...experiments import explain  # torch: after parsing, not for --help

    return explain


def _method(text: str) -> str:
    """An explain method: its grid name (:func:`~taylorattr.experiments.explain.canonical_method`)."""
    try:
        return _explain().canonical_method(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix("methods: ")) from None


def arguments(p, method_help: bool) -> None:
    p.add_argument("image", type=_existing_file, help="a photo (any format Pillow reads)")
    _model_flags(p, default="efficientnet-lite0")
    # the method list reads the registry (torch): only for --help
    names = f"any of {', '.join(_explain().explain_methods())}" if method_help else "see --help"
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


def check(args) -> None:
    """The model (built, so that a bad --model, --weights or --labels is named before the
    image), the image, and --target within the model's outputs; a writable --out."""
    import torch  # torch: after parsing, not for --help

    require_package("PIL", "IMAGE", "reading images", "paper")
    net = explain_network(args)
    try:
        image = library().data.load_image(args.image)
    except (ValueError, OSError) as exc:
        raise CliError("IMAGE", f"{_one_line(exc)}; give an image file Pillow reads (PNG, JPEG, "
                                "WebP, TIFF, BMP, ...)") from None
    if args.target is not None:
        with torch.no_grad():
            classes = int(net(net.preprocess(image)).shape[-1])
        if args.target >= classes:
            raise CliError("--target", f"{args.target} is not a class index of --model "
                                       f"{args.model}; give one in [0, {classes})")
    check_writable(args.out)


def stages(args) -> list:
    net = explain_network(args)
    x = net.preprocess(library().data.load_image(args.image))
    stage = _explain().ExplainStage(None if args.methods is None else tuple(args.methods),
                                    interactions=args.interactions)
    return stage.cost(net, x, args.model)


def run(args) -> str:
    result = _explain().explain(
        args.image, model=explain_network(args), methods=args.methods, target=args.target,
        out_dir=args.out, sign=args.sign, overlay=args.overlay, save_maps=args.save_maps,
        beta=None if args.beta == 0 else args.beta, interactions=args.interactions,
        map_formats=tuple(args.format),
        show_progress=sys.stderr.isatty())  # bars on a terminal, not in logs
    for line in result.warnings:
        print(f"taylorattr explain: warning: {_one_line(line)}", file=sys.stderr)
    n = len(result.top5)
    lines = [f"top-{n} class{'es' if n != 1 else ''}:" if n < 5 else "top-5 classes:"] + [
        f"  {p:6.2%}  {i:4d}" + ("" if label == str(i) else f" {label}")
        + ("  <- explained" if i == result.target else "")
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
