"""Experiment 3: bounding-box accuracy of every method (paper Figure 4).

Held-out cluttered-MNIST canvases on the localisation models and, optionally, the
paper's ImageNet route (an ILSVRC-style folder with Pascal-VOC boxes and torchvision
models with weights the user supplies). Only images whose merged box mask covers at most
:data:`MAX_MASK_COVERAGE` of the image are used; the metric scores whatever it is given:

    accuracy = |top-n pixels by attribution inside the mask| / n,   n = mask pixels

On the ImageNet route every method setting that lays out windows or players
(:data:`LAYOUT_SETTINGS`: ``patch``, ``stride``) is multiplied by the route's patch scale,
by default ``crop / 28`` (8 at 224x224) on a CPU and 1 on CUDA, so each occlusion- and
Shapley-type variant covers the same share of the image as on 28x28 MNIST (Occ-1 runs
8x8 windows, 785 forwards per image instead of 50,177). The rows keep the registry's
labels; the settings and the notes say which windows ran.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from types import MappingProxyType
from typing import Any

import torch

from ... import data
from ... import models as M
from ..._validation import check_positive_int
from ...baselines import Point
from ...metrics import bbox_accuracy
from ...metrics.statistics import mean_sem
from ...registry import LAYOUT_OPTIONS
from .. import paper
from .._units import fingerprint
from .stage import Stage, collect, timed

__all__ = ["IMAGENET_MODELS", "LAYOUT_SETTINGS", "MAX_MASK_COVERAGE", "ImagenetRoute",
           "keep_by_coverage", "mask_coverage", "run_bbox", "run_imagenet", "scale_patches"]

#: Images whose merged box mask covers more than this share of the image are excluded.
MAX_MASK_COVERAGE = 0.33
IMAGENET_MODELS = ("vgg16", "vgg19", "resnet18")
#: Method settings measured in pixels of the image (window and player sizes, strides):
#: the ImageNet route multiplies them by its patch scale.
LAYOUT_SETTINGS = tuple(sorted(LAYOUT_OPTIONS))
#: The side of the MNIST digits the registry's patch settings were chosen for.
MNIST_SIDE = 28


@dataclass(frozen=True)
class ImagenetRoute:
    """The paper's ImageNet boxes: ``root`` (images + VOC XML), ``weights``
    (``{"vgg16" | "vgg19" | "resnet18": state-dict path}``), ``(resize, crop)`` and the
    class order ``synsets`` (see :class:`taylorattr.data.ImageFolderWithBoxes`).

    ``patch_scale`` multiplies every window/player setting (:data:`LAYOUT_SETTINGS`) of the
    methods: 1 is the paper's pixel-level setting (Occ-1: one forward per pixel, 50,177 per
    224x224 image, GPU-scale); None (default) is automatic: 1 where the models run on
    CUDA, else ``crop / 28`` (8 at 224x224), the share of the image each window covers on
    MNIST (:meth:`resolved_patch_scale`)."""

    root: Any
    weights: Mapping[str, Any]
    size: tuple[int, int] = (256, 224)
    synsets: Any = None
    patch_scale: int | None = None

    def __post_init__(self):
        if not self.weights:
            raise ValueError("the ImageNet route needs weights={'vgg16'|'vgg19'|'resnet18': path} "
                             "(no weights are downloaded)")
        unknown = sorted(set(self.weights) - set(IMAGENET_MODELS))
        if unknown:
            raise ValueError(f"weights names must be among {IMAGENET_MODELS}, got {unknown}")
        s = self.patch_scale
        if s is not None and (isinstance(s, bool) or not isinstance(s, int) or s < 1):
            raise ValueError(f"patch_scale must be None (automatic) or an int >= 1, got {s!r}")

    def resolved_patch_scale(self, device: torch.device | str = "cpu") -> int:
        """``patch_scale``, or when None: 1 on CUDA, else ``max(1, round(crop / 28))``."""
        if self.patch_scale is not None:
            return self.patch_scale
        if torch.device(device).type == "cuda":
            return 1
        return max(1, round(self.size[1] / MNIST_SIDE))


def _times(value, scale: int):
    return tuple(v * scale for v in value) if isinstance(value, tuple) else value * scale


def scale_patches(methods, scale: int) -> list:
    """The bound methods with every window/player setting (:data:`LAYOUT_SETTINGS`, where
    set) multiplied by ``scale``; labels and the other settings are kept (a setting the
    registry pins, such as Occ-1's ``patch=1``, is scaled too)."""
    check_positive_int(scale, "scale")
    out = []
    for m in methods:
        own = {k: _times(m.settings[k], scale) for k in LAYOUT_SETTINGS
               if m.settings.get(k) is not None}
        out.append(replace(m, settings=MappingProxyType({**m.settings, **own}))
                   if own and scale != 1 else m)
    return out


def _scaled_methods(stage: Stage, route: ImagenetRoute, net, x, baseline, result) -> list:
    """The stage's methods at the route's patch scale; the scale, each method's rows per
    image and the GPU-scale ones go to ``result.settings["imagenet"]``."""

    device = M.model_device(net)
    scale = route.resolved_patch_scale(device)
    methods = scale_patches(stage.methods, scale)
    rows, gpu_scale = {}, []
    for m in methods:
        try:
            cost = replace(m.cost(net, x[:1], baseline), device=str(device))
        except (TypeError, ValueError, NotImplementedError):
            continue
        rows[m.label] = cost.rows
        if cost.gpu_scale:
            gpu_scale.append(m.label)
    result.settings["imagenet"] = {
        "patch_scale": scale,
        "patch_scale_source": "given" if route.patch_scale is not None
        else f"automatic ({device.type})",
        "device": str(device), "crop": route.size[1],
        "windows": {m.label: {k: m.settings[k] for k in LAYOUT_SETTINGS if k in m.settings}
                    for m in methods if any(k in m.settings for k in LAYOUT_SETTINGS)},
        "rows_per_image": rows, "gpu_scale": gpu_scale}
    return methods


def mask_coverage(masks: torch.Tensor) -> torch.Tensor:
    """Share of the image each mask covers, ``[B]`` float64 (masks ``[B, H, W]``)."""
    if masks.dim() == 4 and masks.shape[1] == 1:
        masks = masks[:, 0]
    if masks.dim() != 3:
        raise ValueError(f"masks must be [B, H, W] or [B, 1, H, W], got {tuple(masks.shape)}")
    m = masks.to(torch.bool).flatten(1)
    return m.sum(1).to(torch.float64) / m.shape[1]


def keep_by_coverage(masks: torch.Tensor, max_coverage: float = MAX_MASK_COVERAGE
                     ) -> torch.Tensor:
    """``[B]`` bool: the images the experiment keeps, those whose mask covers at most
    ``max_coverage`` of the image (and at least one pixel: bbox accuracy needs ``n >= 1``)."""
    cov = mask_coverage(masks)
    return (cov <= max_coverage) & (cov > 0)


def _units(stage: Stage, name: str, model, mfp: str, x, masks, labels_true, baseline,
           target_mode: str, methods=None) -> dict:
    keys, items = [], []
    dev = M.model_device(model)  # the canvases and photos are read on the CPU
    for i0, i1 in stage.spans(x):
        xb = x[i0:i1].to(dev, stage.dtype)
        mb = masks[i0:i1].to(dev)
        if target_mode == "label":
            target = labels_true[i0:i1].to(dev, torch.long)
        else:
            with torch.no_grad():
                target = model(xb).argmax(1)
        xfp = fingerprint([("x", xb), ("mask", mb), ("target", target)])
        for method in stage.methods if methods is None else methods:

            def compute(method=method, xb=xb, mb=mb, target=target):
                attr = stage.attribute(method, model, xb, target, baseline, stage.ws.progress,
                                       f"bbox {name}")
                if isinstance(attr, str):
                    return {"error": attr}
                return {"accuracy": bbox_accuracy(attr.to(torch.float64), mb)}
            keys.append((name, method.label, i0))
            items.append((f"bbox-{name}-{method.name}-{method.tag()}-seed{stage.ws.seed}-{mfp}-{xfp}",
                          lambda compute=compute: timed(compute)))
    return dict(zip(keys, stage.ws.run_units(stage.store, items, f"bbox {name}")))


def _rows(stage: Stage, name: str, units: dict, starts, counts, n_excluded: int, result,
          notes: Mapping[str, str] | None = None):
    for method in stage.methods:
        v, seconds, note = collect(units, name, method.label, starts, "accuracy")
        note = "; ".join(n for n in (note, (notes or {}).get(method.label, "")) if n)
        mean, sem = mean_sem(v) if v is not None else (None, None)
        result.bbox.append({
            "model": paper.model_label(name), "method": method.label,
            "principles": counts.get(method.label), "principles_paper": stage.paper_count(method),
            "bbox_accuracy": mean, "bbox_accuracy_sem": sem, "n": 0 if v is None else v.numel(),
            "n_excluded": n_excluded, "seconds": round(seconds, 3), "note": note})


def _select(masks: torch.Tensor, n: int) -> tuple[torch.Tensor, int]:
    """Indices of the first ``n`` kept images, and how many were excluded before the last."""
    keep = keep_by_coverage(masks)
    idx = torch.nonzero(keep).flatten()[:n]
    scanned = int(idx[-1]) + 1 if idx.numel() else masks.shape[0]
    return idx, scanned - idx.numel()


def run_bbox(stage: Stage, models, n: int, counts, result, target_mode: str) -> None:
    """Experiment 3 on the held-out canvases: rows in ``result.bbox``."""
    if not models:
        return
    canv = stage.ws.canvases()
    idx, n_excluded = _select(canv.masks, n)
    x, masks, labels = canv.images[idx], canv.masks[idx], canv.labels[idx]
    starts = [i0 for i0, _ in stage.spans(x)]
    for name in models:
        model, mfp = stage.model(name)
        units = _units(stage, name, model, mfp, x, masks, labels, Point(0.0), target_mode)
        _rows(stage, name, units, starts, counts, n_excluded, result)


def run_imagenet(stage: Stage, route: ImagenetRoute, n: int, counts, result,
                 target_mode: str) -> None:
    """Experiment 3 on the ImageNet route (baseline: the black image, ``-mean / std``)."""

    resize, crop = route.size
    ds = data.ImageFolderWithBoxes(route.root, size=crop, resize=resize, synsets=route.synsets)
    xs, ms, ys, excluded = [], [], [], 0
    for i in range(len(ds)):
        if len(xs) >= n:
            break
        img, mask, label, _ = ds[i]
        if bool(keep_by_coverage(mask[None])[0]):
            xs.append(img), ms.append(mask), ys.append(label)
        else:
            excluded += 1
    if not xs:
        raise ValueError(f"no image under {route.root} has a box mask covering at most "
                         f"{MAX_MASK_COVERAGE:.0%} of the cropped image")
    x, masks = torch.stack(xs), torch.stack(ms)
    labels = torch.tensor(ys, device=x.device)
    starts = [i0 for i0, _ in stage.spans(x)]
    for name in IMAGENET_MODELS:
        if name not in route.weights:
            continue
        net = M.torchvision_model(name, route.weights[name]).to(stage.dtype).eval()
        x = x.to(M.model_device(net))  # the photos are read on the CPU
        mean = torch.tensor(data.IMAGENET_MEAN, dtype=stage.dtype, device=x.device).view(1, 3, 1, 1)
        std = torch.tensor(data.IMAGENET_STD, dtype=stage.dtype, device=x.device).view(1, 3, 1, 1)
        black = Point(-mean / std)
        model, mfp = stage.add_model(name, net, {
            "model": paper.model_label(name), "weights": str(route.weights[name]),
            "held_out_accuracy": None, "data": f"ImageNet-style folder {route.root}"})
        methods = _scaled_methods(stage, route, net, x, black, result)
        units = _units(stage, name, model, mfp, x, masks, labels, black, target_mode, methods)
        _rows(stage, name, units, starts, counts, excluded, result,
              _window_notes(result.settings["imagenet"]))


def _window_notes(info: Mapping) -> dict[str, str]:
    """Per label: the windows that ran (when scaled) and a GPU-scale warning."""
    notes = {}
    for label, windows in info["windows"].items():
        if info["patch_scale"] != 1:
            notes[label] = (f"patch scale {info['patch_scale']}: "
                            + ", ".join(f"{k}={v}" for k, v in windows.items()))
    for label in info["gpu_scale"]:
        rows = info["rows_per_image"][label]
        notes[label] = "; ".join(n for n in (notes.get(label), (
            f"GPU-scale: {rows:,} rows per image on {info['device']} (a coarser "
            "--imagenet-patch-scale or a GPU)")) if n)
    return notes
