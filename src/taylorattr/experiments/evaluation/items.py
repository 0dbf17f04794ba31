"""Dataset items for evaluation: reading, checking, and the built-in datasets.

An evaluation dataset is any map-style dataset (``len`` and ``dataset[i]``) whose item is
``(input, target)`` or ``(input, target, box_mask)``: ``input`` a float tensor of the
model's input shape without the batch axis, ``target`` an int class index (or a 0-d
integer tensor; :data:`PREDICTED` = -1: explain the model's predicted class), ``box_mask`` a ``[H, W]`` (or ``[1, H, W]``) bool / 0-1 tensor over
the input's last two axes, needed by the ``bbox`` metric.

:func:`read_item` turns ``dataset[i]`` into an :class:`Item` or raises :class:`BadItem`
naming the index and what is wrong: the item could not be read (an unreadable image, an
exception in ``__getitem__``), it has the wrong structure, the wrong input shape (all
inputs must have the shape of the first readable item, or the given one), a non-finite
input, a target that is not a class index, or no (or an empty) box mask where ``bbox``
needs one. The caller then refuses the run or skips the item and records it
(``on_bad_item``), never drops it silently.

Built in: :class:`TensorItems` (tensors in memory, e.g. the bundled MNIST digits and
cluttered canvases, see :func:`builtin_dataset`) and :class:`ImageFolderItems` (a
folder of images, read lazily so that one unreadable file is one bad item; class folders
are output indices only through ``labels``, :func:`match_labels`).
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import torch

from ... import data, models
from ...data import (
    IMAGENET_MEAN,
    IMAGENET_STD,
    boxes_to_mask,
    imagenet_transform,
    parse_voc_xml,
    transform_mask,
)
from ...data.photos import _open_image, image_files_pillow_reads

__all__ = ["PREDICTED", "BadItem", "ImageFolderItems", "Item", "TensorItems",
           "builtin_dataset", "item_source", "match_labels", "read_item", "read_labels",
           "reference_shape"]


class BadItem(ValueError):
    """A malformed dataset item: ``index`` and ``reason``."""

    def __init__(self, index: int, reason: str):
        super().__init__(f"dataset item {index}: {reason}")
        self.index, self.reason = index, reason


@dataclass(frozen=True)
class Item:
    index: int
    input: torch.Tensor
    target: int
    mask: torch.Tensor | None


def _fetch(dataset, index: int):
    try:
        return dataset[index]
    except (ValueError, OSError) as exc:  # the readers' own: they name the file and why
        raise BadItem(index, f"cannot be read: {exc}") from None
    except Exception as exc:  # noqa: BLE001 - any failure of a user's dataset is reported
        raise BadItem(index, f"cannot be read: {type(exc).__name__}: {exc}") from None


def read_item(dataset, index: int, shape: tuple[int, ...] | None, need_mask: bool) -> Item:
    """``dataset[index]`` checked (see the module docstring); :class:`BadItem` otherwise."""
    raw = _fetch(dataset, index)
    if not isinstance(raw, (tuple, list)) or len(raw) not in (2, 3):
        raise BadItem(index, "must be a tuple (input, target) or (input, target, box_mask), "
                             f"got {type(raw).__name__}"
                             + (f" of length {len(raw)}" if isinstance(raw, (tuple, list)) else ""))
    x, target = raw[0], raw[1]
    mask = raw[2] if len(raw) == 3 else None
    if not isinstance(x, torch.Tensor) or not x.is_floating_point():
        raise BadItem(index, "input must be a floating-point tensor, got "
                             f"{getattr(x, 'dtype', type(x).__name__)}")
    if shape is not None and tuple(x.shape) != tuple(shape):
        raise BadItem(index, f"input has shape {tuple(x.shape)}, expected {tuple(shape)}")
    if not torch.isfinite(x).all():
        raise BadItem(index, "input contains NaN or inf")
    if isinstance(target, torch.Tensor):
        if target.numel() != 1 or target.is_floating_point() or target.dtype == torch.bool:
            raise BadItem(index, f"target must be an integer class index, got a tensor "
                                 f"{tuple(target.shape)} {target.dtype}")
        target = int(target.item())
    if isinstance(target, bool) or not isinstance(target, int) or target < PREDICTED:
        raise BadItem(index, f"target must be a non-negative int class index (or -1: the "
                             f"predicted class), got {target!r}")
    if mask is not None:
        if not isinstance(mask, torch.Tensor):
            raise BadItem(index, f"box mask must be a tensor, got {type(mask).__name__}")
        if mask.dim() == 3 and mask.shape[0] == 1:
            mask = mask[0]
        if x.dim() < 2 or tuple(mask.shape) != tuple(x.shape[-2:]):
            raise BadItem(index, f"box mask has shape {tuple(mask.shape)}, expected the input's "
                                 f"last two axes {tuple(x.shape[-2:])}")
        if mask.dtype != torch.bool:
            if not ((mask == 0) | (mask == 1)).all():
                raise BadItem(index, "box mask must hold only 0 and 1")
            mask = mask != 0
        if not mask.any():
            raise BadItem(index, "box mask is empty (no box)")
    elif need_mask:
        raise BadItem(index, "has no box mask, which the bbox metric needs")
    return Item(index, x.detach(), target, mask)


def reference_shape(dataset, n: int) -> tuple[int, ...]:
    """The input shape of the first item that can be read (scanned in index order, so
    every rank finds the same one); ValueError when none can."""
    reasons = []
    for i in range(n):
        try:
            return tuple(read_item(dataset, i, None, False).input.shape)
        except BadItem as exc:
            reasons.append(str(exc))
    raise ValueError(f"dataset: no item can be read ({'; '.join(reasons[:3]) or 'it is empty'})")


class TensorItems(torch.utils.data.Dataset):
    """Items from tensors: ``inputs [N, ...]``, ``targets [N]``, optional ``masks [N, H, W]``."""

    def __init__(self, inputs: torch.Tensor, targets: torch.Tensor,
                 masks: torch.Tensor | None = None):
        if len(inputs) != len(targets) or (masks is not None and len(masks) != len(inputs)):
            raise ValueError(f"inputs, targets and masks must have the same length, got "
                             f"{len(inputs)}, {len(targets)}, "
                             f"{None if masks is None else len(masks)}")
        self.inputs, self.targets, self.masks = inputs, targets, masks

    def __len__(self) -> int:
        return len(self.inputs)

    def __getitem__(self, i: int):
        item = (self.inputs[i], int(self.targets[i]))
        return item if self.masks is None else (*item, self.masks[i])


def builtin_dataset(name: str, mnist_dir=None) -> TensorItems:
    """``"mnist"``: the held-out MNIST digits (2,500 of the bundled ones);
    ``"cluttered"``: the held-out cluttered-MNIST canvases with their box masks."""

    if name == "mnist":
        images, labels = data.held_out_digits(mnist_dir)
        return TensorItems(images, labels)
    if name == "cluttered":
        c = models.held_out_canvases(mnist_dir)
        return TensorItems(c.images, c.labels, c.masks)
    raise ValueError(f"data must be 'mnist', 'cluttered' or a folder, got {name!r}")


def read_labels(path) -> list[str]:
    """The class names of ``--labels FILE``: one per line in the model's output order
    (blank lines skipped); ValueError naming the file when it holds none or repeats one."""
    path = Path(path)
    names = [ln.strip() for ln in path.read_text(encoding="utf-8").splitlines() if ln.strip()]
    if not names:
        raise ValueError(f"labels: {path} holds no class names (one per line)")
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise ValueError(f"labels: {path} repeats {', '.join(repeated[:5])}")
    return names


def match_labels(folders, labels: list[str]) -> dict[str, int]:
    """Folder (class) name -> output index: a folder matches the label line equal to it or
    whose first word it is (``n01440764 tench`` matches ``n01440764``). ValueError listing
    the folders no line matches, and some labels, when any is left over."""
    index = {}
    for i, line in enumerate(labels):
        index.setdefault(line, i)
        index.setdefault(line.split()[0], i)
    missing = sorted(f for f in set(folders) if f not in index)
    if missing:
        raise ValueError(
            f"labels: the class folder(s) {', '.join(missing[:8])}"
            f"{' ...' if len(missing) > 8 else ''} match no line of the labels (which start "
            f"{', '.join(labels[:8])}{' ...' if len(labels) > 8 else ''}); rename the folders "
            "or fix the labels file")
    return {f: index[f] for f in set(folders)}


class ImageFolderItems(torch.utils.data.Dataset):
    """A folder of images, read lazily: every image (any format Pillow reads, any depth;
    ``skipped_files``: the other files) is an item ``(image [3, size, size] normalised, target[, box mask])``.

    Class names: the synset of a Pascal-VOC ``<stem>.xml`` beside the image when there is
    one (its boxes give the mask), else the image's parent folder name. ``labels`` (the
    model's class names in output order, or a file of them, :func:`read_labels`) gives
    each class name its output index (:func:`match_labels`: a name no label matches is
    refused at construction, listing the names). Without ``labels`` the folder names are
    not output indices: ``target`` is :data:`PREDICTED` (-1), and the job explains the
    model's predicted class. ``mean``/``std``/``size``/``resize``: the preprocessing
    (:func:`taylorattr.data.imagenet_transform`; default ImageNet's). Each image and XML
    is read when its item is, so an unreadable file is one bad item. ``source(i)``: the
    image's path relative to ``root``.
    """

    def __init__(self, root: str | os.PathLike, size: int = 224, resize: int = 256,
                 labels=None, mean=None, std=None):
        self.root = Path(root)
        if not self.root.is_dir():
            raise FileNotFoundError(f"data folder not found: {self.root}")
        self.files, self.skipped_files = image_files_pillow_reads(self.root)
        if isinstance(labels, (str, os.PathLike)):
            labels = read_labels(labels)
        self.labels = None if labels is None else [str(s) for s in labels]
        self.class_to_idx = None if self.labels is None else match_labels(
            {self._class_name(p) for p in self.files}, self.labels)
        self.size, self.resize = int(size), int(resize)
        self.mean = IMAGENET_MEAN if mean is None else tuple(float(v) for v in mean)
        self.std = IMAGENET_STD if std is None else tuple(float(v) for v in std)

    @staticmethod
    def _class_name(path: Path) -> str:
        xml = path.with_suffix(".xml")
        if xml.is_file():
            try:
                return parse_voc_xml(xml).names[0]
            except (ValueError, IndexError, OSError):  # a bad XML is that item's problem
                pass
        return path.parent.name

    def __len__(self) -> int:
        return len(self.files)

    def source(self, i: int) -> str:
        """Image ``i``'s path relative to the root (POSIX separators)."""
        return self.files[i].relative_to(self.root).as_posix()

    def __getitem__(self, i: int):
        path = self.files[i]
        img = _open_image(path)
        xml = path.with_suffix(".xml")
        ann = parse_voc_xml(xml) if xml.is_file() else None
        name = ann.names[0] if ann is not None else path.parent.name
        if self.class_to_idx is not None and name not in self.class_to_idx:
            raise ValueError(f"{path}: class {name!r} is not one of the labels")
        target = PREDICTED if self.class_to_idx is None else self.class_to_idx[name]
        x = imagenet_transform(img, self.resize, self.size, self.mean, self.std)
        if ann is None:
            return x, target
        mask = transform_mask(boxes_to_mask(ann.boxes, img.height, img.width),
                              self.resize, self.size)
        return x, target, mask


#: The target of an item whose class the dataset cannot map to an output index: the job
#: explains the model's predicted class.
PREDICTED = -1


def item_source(dataset, index: int) -> str | None:
    """Where item ``index`` comes from (``dataset.source(i)``, through ``Subset``), or
    None."""
    while isinstance(dataset, torch.utils.data.Subset):
        dataset, index = dataset.dataset, dataset.indices[index]
    source = getattr(dataset, "source", None)
    return source(index) if callable(source) else None
