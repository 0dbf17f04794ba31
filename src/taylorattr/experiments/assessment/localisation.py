"""Experiment 3: bounding-box accuracy of every method (paper Figure 4).

Held-out cluttered-MNIST canvases on the localisation models and, optionally, the
paper's ImageNet route (an ILSVRC-style folder with Pascal-VOC boxes and torchvision
models with weights the user supplies). Only images whose merged box mask covers at most
:data:`MAX_MASK_COVERAGE` of the image are used; the metric scores whatever it is given:

    accuracy = |top-n pixels by attribution inside the mask| / n,   n = mask pixels
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from ...baselines import Point
from ...metrics import bbox_accuracy
from ...statistics import mean_sem
from .. import paper
from .._units import fingerprint
from .stage import Stage, collect, timed

__all__ = ["IMAGENET_MODELS", "MAX_MASK_COVERAGE", "ImagenetRoute", "keep_by_coverage",
           "mask_coverage", "run_bbox", "run_imagenet"]

#: Images whose merged box mask covers more than this share of the image are excluded.
MAX_MASK_COVERAGE = 0.33
IMAGENET_MODELS = ("vgg16", "vgg19", "resnet18")


@dataclass(frozen=True)
class ImagenetRoute:
    """The paper's ImageNet boxes: ``root`` (images + VOC XML), ``weights``
    (``{"vgg16" | "vgg19" | "resnet18": state-dict path}``), ``(resize, crop)`` and the
    class order ``synsets`` (see :class:`taylorattr.data.ImageFolderWithBoxes`)."""

    root: Any
    weights: Mapping[str, Any]
    size: tuple[int, int] = (256, 224)
    synsets: Any = None

    def __post_init__(self):
        if not self.weights:
            raise ValueError("the ImageNet route needs weights={'vgg16'|'vgg19'|'resnet18': path} "
                             "(no weights are downloaded)")
        unknown = sorted(set(self.weights) - set(IMAGENET_MODELS))
        if unknown:
            raise ValueError(f"weights names must be among {IMAGENET_MODELS}, got {unknown}")


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
           target_mode: str) -> dict:
    keys, items = [], []
    for i0, i1 in stage.spans(x):
        xb = x[i0:i1].to(stage.dtype)
        mb = masks[i0:i1]
        if target_mode == "label":
            target = labels_true[i0:i1].to(torch.long)
        else:
            with torch.no_grad():
                target = model(xb).argmax(1)
        xfp = fingerprint([("x", xb), ("mask", mb), ("target", target)])
        for method in stage.methods:

            def compute(method=method, xb=xb, mb=mb, target=target):
                attr = stage.attribute(method, model, xb, target, baseline)
                if isinstance(attr, str):
                    return {"error": attr}
                return {"accuracy": bbox_accuracy(attr.to(torch.float64), mb)}
            keys.append((name, method.label, i0))
            items.append((f"bbox-{name}-{method.name}-{method.tag()}-seed{stage.ws.seed}-{mfp}-{xfp}",
                          lambda compute=compute: timed(compute)))
    return dict(zip(keys, stage.ws.run_units(stage.store, items, f"bbox {name}")))


def _rows(stage: Stage, name: str, units: dict, starts, counts, n_excluded: int, result):
    for method in stage.methods:
        v, seconds, note = collect(units, name, method.label, starts, "accuracy")
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
    from ... import data
    from ... import models as M

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
    x, masks, labels = torch.stack(xs), torch.stack(ms), torch.tensor(ys)
    mean = torch.tensor(data.IMAGENET_MEAN, dtype=stage.dtype).view(1, 3, 1, 1)
    std = torch.tensor(data.IMAGENET_STD, dtype=stage.dtype).view(1, 3, 1, 1)
    black = Point(-mean / std)
    starts = [i0 for i0, _ in stage.spans(x)]
    for name in IMAGENET_MODELS:
        if name not in route.weights:
            continue
        net = M.torchvision_model(name, route.weights[name]).to(stage.dtype).eval()
        model, mfp = stage.add_model(name, net, {
            "model": paper.model_label(name), "weights": str(route.weights[name]),
            "held_out_accuracy": None, "data": f"ImageNet-style folder {route.root}"})
        units = _units(stage, name, model, mfp, x, masks, labels, black, target_mode)
        _rows(stage, name, units, starts, counts, excluded, result)
