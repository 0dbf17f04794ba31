"""Your own model, as the command line names it (issue 28): a built-in name,
``package.module:callable`` or a ``torch.export`` program file (``.pt2``).

:func:`load_model` ``(spec, weights, model_args, cache)``:

* a paper model (``poly``, ``m_sg``, ..., :data:`taylorattr.models.MODELS`): ``weights``
  (a state dict) when given, else the weights ``reproduce`` trained, from its cache under
  ``cache/models`` (trained there now, with the same recipe and cache entry, when absent:
  :func:`taylorattr.models.get_trained`, seed 0, quick, the ``default`` recipe);
* a torchvision name (``vgg16``, ``vgg19``, ``resnet18``): built untrained, ``weights``
  loaded (required: nothing is downloaded); ``efficientnet-lite0``: its shipped weights;
* ``package.module:callable``: the module imported (the working directory is searched
  first, as ``python -m`` does), the callable called with ``model_args`` (a JSON object:
  keyword arguments; a list: positional ones; None: none), ``weights`` loaded strictly;
* a ``.pt2`` file: ``torch.export.load(path).module()`` (export it with a dynamic batch
  dimension: the methods run batches of rows), ``weights`` loaded when given.

The returned module is in eval mode and carries ``source_digest`` (the callable's source
file and arguments, the program file's bytes) for :func:`.fingerprints.model_digest`.

:func:`preprocessing` ``(model, size, resize, mean, std)``: input size and normalisation,
each given value winning over the model's own (a ``.pt2`` program's exported height and
width, read from its input placeholder and range constraints; timm's ``pretrained_cfg``:
``input_size``, ``crop_pct``, ``mean``, ``std``), then ImageNet's (224, 256,
:data:`IMAGENET_MEAN`, :data:`IMAGENET_STD`); a ``size`` the program cannot take is a
ValueError naming ``input_size``. :func:`image_classifier` wraps a module with it and class names.
"""
from __future__ import annotations

import importlib
import json
import os
import sys
from pathlib import Path

import torch

from .. import models
from ..data.imagenet import IMAGENET_MEAN, IMAGENET_STD
from ..models import ImageClassifier
from ..models.pretrained import TORCHVISION_MODELS
from ..models.pretrained import _load_user_state_dict as load_state_dict
from ..models.zoo import MODELS
from .fingerprints import digest, file_digest

__all__ = [
    "BUILTIN_IMAGENET",
    "image_classifier",
    "is_model_spec",
    "load_model",
    "preprocessing",
]

#: ImageNet classifiers known by name.
BUILTIN_IMAGENET = ("efficientnet-lite0", *TORCHVISION_MODELS)


def is_model_spec(text: str) -> str | None:
    """Why ``text`` cannot name a model (None when it can), without importing anything."""

    if text in BUILTIN_IMAGENET or text in MODELS:
        return None
    if text.endswith(".pt2"):
        return None if Path(text).is_file() else f"no such program file {text}"
    module, sep, attr = text.partition(":")
    if sep and module and attr and all(p.isidentifier() for p in module.split(".") + attr.split(".")):
        return None
    return (f"expected one of {', '.join(BUILTIN_IMAGENET + tuple(MODELS))}, "
            f"package.module:callable or a .pt2 file, got {text!r}")


def _load_weights(model: torch.nn.Module, path, spec: str) -> None:
    try:
        state = load_state_dict(path)
    except ValueError as exc:  # not a state dict, pickled objects, a corrupt file
        raise ValueError(f"weights: {exc}") from None
    mismatch = _mismatch(model.state_dict(), state)
    if mismatch:
        raise ValueError(f"weights: {path} does not fit --model {spec}: {mismatch}; give the "
                         "state_dict() saved from this network, or the --model-args it was "
                         "built with")
    try:
        model.load_state_dict(state)
    except RuntimeError as exc:  # a check of the module's own (e.g. a custom hook)
        text = " ".join(str(exc).split())
        raise ValueError(f"weights: {path} does not fit --model {spec}: {text[:300]} ...; "
                         "give the state_dict() saved from this network") from None


def _mismatch(own: dict, state: dict, shown: int = 3) -> str:
    """What differs between a module's state dict ``own`` and a file's ``state``: missing
    and unexpected keys and shape mismatches, each with its count and the first
    ``shown`` names ("" when they fit)."""
    def few(names) -> str:
        return ", ".join(names[:shown]) + (f" and {len(names) - shown} more"
                                           if len(names) > shown else "")
    missing = [k for k in own if k not in state]
    unexpected = [k for k in state if k not in own]
    shapes = [f"{k}: file {list(state[k].shape)}, model {list(own[k].shape)}"
              for k in own if k in state and tuple(state[k].shape) != tuple(own[k].shape)]
    parts = []
    if shapes:
        parts.append(f"{len(shapes)} tensor{'s' if len(shapes) != 1 else ''} of another shape "
                     f"({few(shapes)})")
    if missing:
        parts.append(f"{len(missing)} missing ({few(missing)})")
    if unexpected:
        parts.append(f"{len(unexpected)} unexpected ({few(unexpected)})")
    return "; ".join(parts)


def _call(spec: str, model_args):
    module_name, _, attr = spec.partition(":")
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.insert(0, os.getcwd())  # as python -m: the user's package beside them
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(f"model: cannot import {module_name} ({exc}); run from the folder "
                         "that holds the package or add it to PYTHONPATH") from None
    target = module
    for part in attr.split("."):
        target = getattr(target, part, None)
        if target is None:
            raise ValueError(f"model: {module_name} has no {attr}")
    if not callable(target):
        raise TypeError(f"model: {spec} is not callable")
    if model_args is None:
        model = target()
    elif isinstance(model_args, dict):
        model = target(**model_args)
    elif isinstance(model_args, list):
        model = target(*model_args)
    else:
        raise TypeError("model_args: expected a JSON object (keyword arguments) or a list "
                         f"(positional ones), got {json.dumps(model_args)}")
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model: {spec}() returned a {type(model).__name__}, not a "
                         "torch.nn.Module")
    source = getattr(module, "__file__", None)
    model.source_digest = digest([spec, model_args,
                                  file_digest(source) if source and Path(source).is_file() else ""])
    return model


class ExportedProgram(torch.nn.Module):
    """A ``torch.export`` program's module (``program``) as a module whose ``eval()`` and
    ``train()`` work: the program's own raise (its graph fixes the mode it was exported
    in), so they set only this wrapper's flag. ``input_shape``: the first input's shape
    as the program fixes it, one ``(low, high)`` range per axis (equal for a fixed axis;
    ``high`` None: unbounded), from the program's placeholder and range constraints."""

    def __init__(self, program: torch.nn.Module, input_shape: tuple = ()):
        super().__init__()
        self.program = program
        self.input_shape = tuple(input_shape)

    def forward(self, *args, **kwargs):
        return self.program(*args, **kwargs)

    def train(self, mode: bool = True):
        self.training = bool(mode)
        return self


def _input_ranges(program) -> tuple:
    """The first user input's axes as ``(low, high)`` ranges: a fixed axis ``(n, n)``, a
    dynamic one its range constraint (``high`` None when unbounded); ``()`` when the
    program has no tensor input."""
    names = list(program.graph_signature.user_inputs)
    node = next((n for n in program.graph.nodes if n.op == "placeholder" and names
                 and n.name == names[0]), None)
    val = None if node is None else node.meta.get("val")
    if not isinstance(val, torch.Tensor):
        return ()
    ranges = []
    for d in val.shape:
        if isinstance(d, int):
            ranges.append((d, d))
            continue
        vr = program.range_constraints.get(d.node.expr)
        low = int(vr.lower) if vr is not None and vr.lower.is_finite else 0
        high = int(vr.upper) if vr is not None and vr.upper.is_finite else None
        ranges.append((low, high))
    return tuple(ranges)


def _program(path: Path) -> torch.nn.Module:
    try:
        program = torch.export.load(str(path))
        model = program.module()
        shape = _input_ranges(program)
    except Exception as exc:  # noqa: BLE001 - any failure to read the program is the file's
        raise ValueError(f"model: cannot load the torch.export program {path} "
                         f"({type(exc).__name__}: {' '.join(str(exc).split())[:200]})") from None
    model = ExportedProgram(model, shape)
    model.source_digest = file_digest(path)
    return model


def load_model(spec: str, weights=None, model_args=None, cache="results") -> torch.nn.Module:
    """The module ``spec`` names (see the module docstring), in eval mode."""

    if spec in models.MODELS:
        if weights is None:
            model, _ = models.get_trained(spec, cache, seed=0, quick=True, training="default",
                                          show_progress=sys.stderr.isatty())
            return model.eval()
        model = models.MODELS[spec]()
        _load_weights(model, weights, spec)
        return models.fold_batchnorm(model.eval())
    if spec == "efficientnet-lite0":
        return models.efficientnet_lite0()
    if spec in BUILTIN_IMAGENET:
        if weights is None:
            raise ValueError(f"weights: --model {spec} needs --weights (no weights are "
                             "downloaded)")
        try:
            return models.torchvision_model(spec, weights)
        except ValueError as exc:  # the file, not the architecture
            raise ValueError(f"weights: {exc}") from None
    if spec.endswith(".pt2"):
        model = _program(Path(spec))
    else:
        model = _call(spec, model_args)
    if weights is not None:
        _load_weights(model, weights, spec)
    return model.eval()


def _timm_cfg(model) -> dict:
    cfg = getattr(model, "pretrained_cfg", None) or getattr(model, "default_cfg", None)
    return dict(cfg) if isinstance(cfg, dict) else {}


def preprocessing(model, size=None, resize=None, mean=None, std=None) -> dict:
    """``{"size", "resize", "mean", "std"}``: given values, else the model's
    (``pretrained_cfg``), else ImageNet's (see the module docstring)."""

    if isinstance(model, ImageClassifier):  # a built-in classifier knows its own
        own = {"size": model.size, "resize": model.resize, "mean": model.mean, "std": model.std}
        given = {"size": size, "resize": resize, "mean": mean, "std": std}
        return {k: own[k] if v is None else (tuple(v) if k in ("mean", "std") else int(v))
                for k, v in given.items()}
    cfg = _timm_cfg(model)
    program = _program_size(model, size)
    if size is None:
        size = program or (int(cfg["input_size"][-1]) if "input_size" in cfg else 224)
    if resize is None:
        crop = float(cfg.get("crop_pct") or 0.875)
        resize = round(size / crop)
    mean = tuple(cfg.get("mean", IMAGENET_MEAN)) if mean is None else tuple(mean)
    std = tuple(cfg.get("std", IMAGENET_STD)) if std is None else tuple(std)
    if len(mean) != 3 or len(std) != 3:
        raise ValueError(f"mean and std: expected 3 values each (RGB), got {mean} and {std}")
    return {"size": int(size), "resize": int(resize), "mean": mean, "std": std}


def _program_size(model, size) -> int | None:
    """The image side a ``.pt2`` program was exported for (None: not a program, or its
    height and width are dynamic and take the default 224; else the side of their range
    nearest 224); a ValueError naming ``input_size`` when the program
    takes no ``[B, 3, H, W]`` images, its fixed sides are not square, or ``size``
    lies outside what it accepts."""
    shape = getattr(model, "input_shape", None) if isinstance(model, ExportedProgram) else None
    if not shape:
        return None
    if len(shape) != 4 or shape[1] != (3, 3):
        raise ValueError(f"input_size: the program takes inputs of shape {_shape_text(shape)}, "
                         "not RGB images [batch, 3, H, W]; export it for images")
    if shape[0][0] == shape[0][1]:
        raise ValueError(f"model: the program was exported for a fixed batch of "
                         f"{shape[0][0]}; the methods run batches of rows, so export it with "
                         "a dynamic batch dimension (dynamic_shapes={0: torch.export.Dim("
                         "'batch')})")
    (hl, hh), (wl, wh) = shape[2], shape[3]
    fixed = hl == hh and wl == wh
    if fixed and hl != wl:
        raise ValueError(f"input_size: the program was exported for {hl}x{wl} inputs; the "
                         "images are center-cropped squares, so export it for a square size "
                         "(or with dynamic height and width)")
    if size is not None and not (max(hl, wl) <= size <= min(hh or size, wh or size)):
        wanted = f"{hl}" if fixed else f"between {max(hl, wl)} and {min(hh or 10**9, wh or 10**9)}"
        raise ValueError(f"input_size: the program was exported for {_shape_text(shape)} "
                         f"inputs, so --input-size {size} cannot run it; give --input-size "
                         f"{wanted} or leave it out")
    if fixed:
        return hl
    low, high = max(hl, wl), min(hh or 10**9, wh or 10**9)
    return None if size is not None or low <= 224 <= high else min(max(224, low), high)


def _shape_text(shape) -> str:
    return "x".join(str(lo) if lo == hi else "B" if i == 0 else f"{lo}..{hi or 'inf'}"
                    for i, (lo, hi) in enumerate(shape))


def image_classifier(model, class_names=None, name: str = "", **options):
    """``model`` wrapped as a :class:`taylorattr.models.ImageClassifier` with
    :func:`preprocessing` ``(**options)`` and ``class_names`` (kept when ``model`` is one
    already and nothing is given)."""

    if isinstance(model, ImageClassifier) and not any(v is not None for v in options.values()) \
            and class_names is None:
        return model
    p = preprocessing(model, **options)
    net = model.net if isinstance(model, ImageClassifier) else model
    names = class_names if class_names is not None else getattr(model, "class_names", None)
    return ImageClassifier(net, p["mean"], p["std"], names, size=p["size"], resize=p["resize"],
                           name=name or getattr(model, "name", "")).eval()
