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

:func:`preprocessing` ``(model, size, resize, mean, std, image_side)``: input size and
normalisation, each given value winning over the model's own (a ``.pt2`` program's exported
height and width, read from its input placeholder and range constraints; timm's
``pretrained_cfg``: ``input_size``, ``crop_pct``, ``mean``, ``std``); a model with no
preprocessing of its own gets the images as they are: their shorter side ``image_side``
(224 when unknown), the center square, pixels in [0, 1] with no normalisation (a user's
network is not assumed to be ImageNet's). A ``size`` the program cannot take is a
ValueError naming ``input_size``. :func:`describe_preprocessing` says what is applied, in
one sentence; :func:`image_classifier` wraps a module with it and class names.

Why one module: what the model is (a loaded callable, a program and its input ranges, a
gray network's RGB front) decides how the images are prepared for it (the program's size,
the channels, timm's settings); apart, the preprocessing would reach into each loader's
internals.
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
    "LUMA",
    "PLAIN_MEAN",
    "PLAIN_STD",
    "GrayInput",
    "describe_preprocessing",
    "image_classifier",
    "input_channels",
    "is_model_spec",
    "load_model",
    "preprocessing",
    "rgb_input",
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
    except SyntaxError as exc:  # the user's file: where, and what Python says
        raise ValueError(f"model: cannot import {module_name}: {type(exc).__name__} in "
                         f"{exc.filename}, line {exc.lineno}: {exc.msg}; fix that line") from None
    except Exception as exc:  # noqa: BLE001 - the module's own code failed on import
        raise ValueError(f"model: importing {module_name} raised {type(exc).__name__}: "
                         f"{' '.join(str(exc).split())[:200]}; fix the module") from None
    target = module
    for part in attr.split("."):
        target = getattr(target, part, None)
        if target is None:
            raise ValueError(f"model: {module_name} has no {attr}")
    if not callable(target):
        raise TypeError(f"model: {spec} is not callable")
    if model_args is not None and not isinstance(model_args, (dict, list)):
        raise TypeError("model_args: expected a JSON object (keyword arguments) or a list "
                        f"(positional ones), got {json.dumps(model_args)}")
    try:
        model = (target() if model_args is None else target(**model_args)
                 if isinstance(model_args, dict) else target(*model_args))
    except Exception as exc:  # noqa: BLE001 - the user's constructor failed
        raise ValueError(f"model: {spec}() raised {type(exc).__name__}: "
                         f"{' '.join(str(exc).split())[:200]}; check --model-args or the "
                         "constructor") from None
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
        low = _bound(None if vr is None else vr.lower)
        ranges.append((low or 0, _bound(None if vr is None else vr.upper)))
    return tuple(ranges)


def _bound(value) -> int | None:
    """A range constraint's bound as an int; None when it is unbounded. The bound of an
    unbounded ``Dim("batch")`` is torch's ``int_oo``, a sympy number that calls itself
    finite but has no integer value: only a sympy Integer is one."""
    return int(value) if getattr(value, "is_Integer", False) else None


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


#: The normalisation of a model with no preprocessing of its own: pixels in [0, 1].
PLAIN_MEAN, PLAIN_STD = (0.0, 0.0, 0.0), (1.0, 1.0, 1.0)


def _choices(model, size=None, resize=None, mean=None, std=None, image_side=None
             ) -> tuple[dict, dict]:
    """:func:`preprocessing`'s values and where each came from (``"given"``, ``"model"``,
    ``"program"``, ``"images"``, ``"plain"``, ``"imagenet"``)."""
    given = {"size": size, "resize": resize, "mean": mean, "std": std}
    if isinstance(model, ImageClassifier):  # a built-in classifier knows its own
        own = {"size": model.size, "resize": model.resize, "mean": model.mean, "std": model.std}
        values = {k: own[k] if v is None else (tuple(v) if k in ("mean", "std") else int(v))
                  for k, v in given.items()}
        return values, {k: "model" if v is None else "given" for k, v in given.items()}
    cfg = _timm_cfg(model)
    program = _program_size(model, size, image_side)
    origin = {k: "given" for k, v in given.items() if v is not None}
    if size is None:
        if program is not None:
            size, origin["size"] = program, "program"
        elif "input_size" in cfg:
            size, origin["size"] = int(cfg["input_size"][-1]), "model"
        elif image_side is not None:
            size, origin["size"] = int(image_side), "images"
        else:
            size, origin["size"] = 224, "imagenet"
    if resize is None:
        if cfg:  # the model's own crop margin (timm's default 0.875)
            resize, origin["resize"] = round(size / float(cfg.get("crop_pct") or 0.875)), "model"
        else:  # the whole image: its shorter side scaled to the size, no margin cropped
            resize, origin["resize"] = size, origin["size"]
    for key, value, imagenet, plain in (("mean", mean, IMAGENET_MEAN, PLAIN_MEAN),
                                        ("std", std, IMAGENET_STD, PLAIN_STD)):
        if value is not None:
            given[key] = tuple(value)
        elif cfg:  # timm's models state theirs; ImageNet's when one does not
            given[key], origin[key] = tuple(cfg.get(key, imagenet)), "model"
        else:
            given[key], origin[key] = plain, "plain"
    mean, std = given["mean"], given["std"]
    if len(mean) != 3 or len(std) != 3:
        raise ValueError(f"mean and std: expected 3 values each (RGB), got {mean} and {std}")
    return {"size": int(size), "resize": int(resize), "mean": mean, "std": std}, origin


def preprocessing(model, size=None, resize=None, mean=None, std=None, image_side=None
                  ) -> dict:
    """``{"size", "resize", "mean", "std"}`` of ``model``'s images: each given value, else
    the model's own (a built-in classifier's; a ``.pt2`` program's input size; timm's
    ``pretrained_cfg``: ``input_size``, ``crop_pct``, ``mean``, ``std``), else, for a model
    with no preprocessing of its own, the images as they are: ``size`` = ``image_side``
    (their shorter side; 224 when unknown), ``resize = size`` (the center square, nothing
    cropped off beyond it) and pixels in [0, 1] (:data:`PLAIN_MEAN`, :data:`PLAIN_STD`:
    no normalisation)."""
    return _choices(model, size, resize, mean, std, image_side)[0]


def describe_preprocessing(model, size=None, resize=None, mean=None, std=None,
                           image_side=None, image_sides=()) -> str:
    """What :func:`preprocessing` does to the images, in one sentence for the user: the
    size fed to the model and why, the resize (``image_sides``: the images' shorter sides,
    when known, to say whether any is rescaled) and the normalisation."""
    p, origin = _choices(model, size, resize, mean, std, image_side)
    why = {"given": "--input-size", "model": "the model's own", "program":
           "the size the .pt2 program takes", "images": "the images' own size",
           "imagenet": "the default; --input-size N to change it"}[origin["size"]]
    side, resize = p["size"], p["resize"]
    sides = set(image_sides)
    if sides and sides == {resize}:
        scaled = "not rescaled"
    elif sides:
        scaled = (f"rescaled (shorter side {'/'.join(str(s) for s in sorted(sides)[:3])}"
                  f"{'/...' if len(sides) > 3 else ''} -> {resize})")
    else:
        scaled = f"shorter side rescaled to {resize}"
    crop = "center square" if resize == side else f"center {side}x{side} of {resize}"
    if p["mean"] == PLAIN_MEAN and p["std"] == PLAIN_STD:
        norm = ("pixels in [0, 1], not normalised (--mean and --std normalise, e.g. "
                "ImageNet's 0.485 0.456 0.406 and 0.229 0.224 0.225)")
    else:
        where = {"given": "--mean/--std", "model": "the model's own"}.get(origin["mean"],
                                                                          "ImageNet's")
        norm = (f"normalised with {where} mean {_numbers(p['mean'])} and std "
                f"{_numbers(p['std'])}")
    gray = ("; converted to one gray channel, 0.299 R + 0.587 G + 0.114 B (the model "
            "takes 1 channel)" if isinstance(model, GrayInput) else "")
    return f"images fed at {side}x{side} ({why}): {scaled}, {crop}; {norm}{gray}"


def _numbers(values) -> str:
    return " ".join(f"{v:g}" for v in values)


#: ITU-R 601 luma weights (Pillow's ``convert("L")``): gray = 0.299 R + 0.587 G + 0.114 B.
LUMA = (0.299, 0.587, 0.114)


class GrayInput(torch.nn.Sequential):
    """A network that takes one gray channel, fed RGB images: ``net(g)`` with
    ``g = 0.299 R + 0.587 G + 0.114 B`` (:data:`LUMA`) computed by a fixed 1x1
    convolution in front, so that every method attributes to the RGB pixels (a linear
    layer each method's rules cover) and their maps sum over the three channels as for
    any model."""

    def __init__(self, net: torch.nn.Module):
        to_gray = torch.nn.Conv2d(3, 1, 1, bias=False)
        with torch.no_grad():
            to_gray.weight.copy_(torch.tensor(LUMA, device=to_gray.weight.device).view(1, 3, 1, 1))
        to_gray.weight.requires_grad_(False)
        super().__init__(to_gray, net)
        self.source_digest = digest(["gray", getattr(net, "source_digest", "")])


def input_channels(model: torch.nn.Module) -> int | None:
    """The channels ``model`` takes: a ``.pt2`` program's fixed channel axis, else the
    ``in_channels`` of the first convolution among its modules (None: not known)."""
    if isinstance(model, GrayInput):
        return 3
    if isinstance(model, ImageClassifier):
        return input_channels(model.net)
    if isinstance(model, ExportedProgram):
        shape = model.input_shape
        return shape[1][0] if len(shape) == 4 and shape[1][0] == shape[1][1] else None
    first = next((m for m in model.modules()
                  if isinstance(m, torch.nn.modules.conv._ConvNd)), None)
    return None if first is None else int(first.in_channels)


def rgb_input(model: torch.nn.Module, grayscale: bool = False) -> torch.nn.Module:
    """``model`` as it takes RGB images: wrapped in :class:`GrayInput` when it takes one
    channel (:func:`input_channels`) or ``grayscale`` asks for it; a ValueError naming
    ``model`` when it takes neither 1 nor 3 channels (or ``grayscale`` meets a 3-channel
    network)."""
    channels = input_channels(model)
    if channels in (1, None) and (grayscale or channels == 1):
        return GrayInput(model).eval()
    if grayscale and channels == 3:
        raise ValueError("grayscale: the model's first convolution takes 3 channels (RGB); "
                         "leave --grayscale out")
    if channels not in (3, None):
        raise ValueError(f"model: its first convolution takes {channels} input channels; "
                         "images give 3 (RGB) or, with --grayscale, 1; give a network for "
                         "RGB or gray images")
    return model


def _program_size(model, size, preferred=None) -> int | None:
    """The image side a ``.pt2`` program was exported for (None: not a program, or its
    height and width are dynamic and take ``preferred`` (default 224); else the side of
    their range nearest ``preferred``); a ValueError naming ``input_size`` when the program
    takes no ``[B, 3, H, W]`` images, its fixed sides are not square, or ``size``
    lies outside what it accepts."""
    gray = isinstance(model, GrayInput)
    model = model[1] if gray else model
    shape = getattr(model, "input_shape", None) if isinstance(model, ExportedProgram) else None
    if not shape:
        return None
    if len(shape) != 4 or shape[1] != ((1, 1) if gray else (3, 3)):
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
    preferred = 224 if preferred is None else int(preferred)
    return None if size is not None else min(max(preferred, low), high)


def _shape_text(shape) -> str:
    return "x".join(str(lo) if lo == hi else "B" if i == 0 else f"{lo}..{hi or 'inf'}"
                    for i, (lo, hi) in enumerate(shape))


def image_classifier(model, class_names=None, name: str = "", **options):
    """``model`` wrapped as a :class:`taylorattr.models.ImageClassifier` with
    :func:`preprocessing` ``(**options)`` and ``class_names`` (kept when ``model`` is one
    already and nothing is given)."""

    if isinstance(model, ImageClassifier) and class_names is None and not any(
            v is not None for k, v in options.items() if k != "image_side"):
        return model
    p = preprocessing(model, **options)
    net = model.net if isinstance(model, ImageClassifier) else model
    names = class_names if class_names is not None else getattr(model, "class_names", None)
    return ImageClassifier(net, p["mean"], p["std"], names, size=p["size"], resize=p["resize"],
                           name=name or getattr(model, "name", "")).eval()
