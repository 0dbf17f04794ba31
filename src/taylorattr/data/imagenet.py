"""The ImageNet route: torchvision-style preprocessing and image folders with boxes.

``x = (CenterCrop(size)(Resize(resize)(image)) / 255 - mean) / std``, the same geometry
(:func:`resize_crop_geometry`) applied to box masks (:func:`transform_mask`), and
:class:`ImageFolderWithBoxes`, an ILSVRC-style folder with VOC XML annotations.
"""
from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from .boxes import boxes_to_mask
from .photos import _open_image
from .voc import VocAnnotation, parse_voc_xml

__all__ = ["IMAGENET_MEAN", "IMAGENET_STD", "ImageFolderWithBoxes", "image_files",
           "imagenet_transform", "resize_crop_geometry", "transform_mask"]

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


def resize_crop_geometry(width: int, height: int, resize: int = 256, size: int = 224
                         ) -> tuple[int, int, int, int]:
    """The geometry of torchvision's ``Resize(resize)`` then ``CenterCrop(size)``.

    Returns ``(new_width, new_height, left, top)``: the shorter side becomes ``resize``
    and the longer ``int(resize * long / short)``; the crop starts at
    ``int(round((new - size) / 2))`` in each direction.
    """
    if resize < size:
        raise ValueError(f"resize ({resize}) must be >= size ({size})")
    if width <= height:
        new_w, new_h = resize, int(resize * height / width)
    else:
        new_w, new_h = int(resize * width / height), resize
    left = round((new_w - size) / 2.0)
    top = round((new_h - size) / 2.0)
    return new_w, new_h, left, top


def _to_pil(image):
    from PIL import Image

    if isinstance(image, Image.Image):
        return image.convert("RGB")
    arr = np.asarray(image)
    if arr.dtype != np.uint8:
        raise TypeError(f"image must be a PIL image or a uint8 array, got dtype {arr.dtype}")
    if arr.ndim == 2:
        arr = np.repeat(arr[:, :, None], 3, axis=2)
    if arr.ndim != 3 or arr.shape[2] not in (3, 4):
        raise ValueError(f"image must be HxW, HxWx3 or HxWx4, got shape {arr.shape}")
    return Image.fromarray(np.ascontiguousarray(arr[:, :, :3]), "RGB")


def imagenet_transform(image, resize: int = 256, size: int = 224,
                       mean: Sequence[float] = IMAGENET_MEAN,
                       std: Sequence[float] = IMAGENET_STD) -> torch.Tensor:
    """Resize(resize) (bilinear, as PIL does it), CenterCrop(size), scale to [0, 1],
    normalise per channel: ``(x - mean) / std``. ``image`` is a PIL image or an
    HxW / HxWx3 uint8 array. Returns float32 ``[3, size, size]``; the same numbers as
    torchvision's ``Resize, CenterCrop, ToTensor, Normalize`` on a PIL image.
    """
    from PIL import Image

    img = _to_pil(image)
    new_w, new_h, left, top = resize_crop_geometry(img.width, img.height, resize, size)
    img = img.resize((new_w, new_h), Image.BILINEAR).crop((left, top, left + size, top + size))
    x = torch.from_numpy(np.array(img, dtype=np.float32) / 255.0).permute(2, 0, 1)
    m = torch.tensor(mean, dtype=torch.float32, device="cpu").view(3, 1, 1)
    s = torch.tensor(std, dtype=torch.float32, device="cpu").view(3, 1, 1)
    return ((x - m) / s).contiguous()


def transform_mask(mask: torch.Tensor, resize: int = 256, size: int = 224) -> torch.Tensor:
    """Apply the geometry of :func:`imagenet_transform` to a bool mask ``[H, W]``.

    Nearest-neighbour sampling by pixel centres, in exact integer arithmetic: output pixel
    ``(r, c)`` takes source pixel ``(floor((r + top + 1/2) * H / new_h),
    floor((c + left + 1/2) * W / new_w))``. For a box mask this is the mask of the box
    scaled by ``new / old`` and shifted by the crop. (PIL's NEAREST uses fixed-point
    coordinates and can differ by a pixel where a centre falls exactly on an edge.)
    """
    if not isinstance(mask, torch.Tensor) or mask.dim() != 2:
        raise ValueError("mask must be a 2-D tensor [H, W]")
    h, w = mask.shape
    new_w, new_h, left, top = resize_crop_geometry(w, h, resize, size)
    out_idx = torch.arange(size, dtype=torch.int64, device=mask.device)
    rows = ((2 * (out_idx + top) + 1) * h) // (2 * new_h)
    cols = ((2 * (out_idx + left) + 1) * w) // (2 * new_w)
    return mask.to(torch.bool)[rows][:, cols]


_IMAGE_SUFFIXES = (".jpeg", ".jpg", ".png")


def image_files(root: str | os.PathLike) -> list[Path]:
    """Every image (``.JPEG``, ``.jpg``, ``.jpeg``, ``.png``, any case) at any depth under
    ``root``, sorted; ValueError when there is none."""
    root = Path(root)
    files = sorted(p for p in root.rglob("*")
                   if p.is_file() and p.suffix.lower() in _IMAGE_SUFFIXES)
    if not files:
        raise ValueError(f"data: no images ({', '.join(_IMAGE_SUFFIXES)}) under {root}")
    return files


class ImageFolderWithBoxes(torch.utils.data.Dataset):
    """An ILSVRC-style folder of images with Pascal-VOC XML bounding boxes.

    Every image (``.JPEG``, ``.jpg``, ``.jpeg``, ``.png``; any depth under ``root``)
    needs an annotation with the same stem: ``<stem>.xml`` beside it or in
    ``annotations`` when that folder is given. Item ``i`` is
    ``(image float32 [3, size, size] normalised, mask bool [size, size], label int,
    synset str)``; Resize(``resize``) and CenterCrop(``size``) are applied to the image
    (bilinear, :func:`imagenet_transform`) and to the mask of the merged boxes (nearest,
    :func:`transform_mask`) alike.

    The synset is the first object's ``<name>`` (ILSVRC names objects by synset id).
    ``synsets`` fixes the class indices: a sequence of ids in model-output order, or a
    text file with one id first on each line (ILSVRC's ``LOC_synset_mapping.txt``). For
    the 1,000 ImageNet classes torchvision's models use the sorted synset ids. Without
    it, the sorted ids found in the folder are used, which match ImageNet indices only
    if all 1,000 are present. Missing annotations and malformed files raise
    ``ValueError`` naming the file (annotations are checked when the folder is indexed,
    images when read).
    """

    def __init__(self, root: str | os.PathLike, size: int = 224, resize: int = 256,
                 annotations: str | os.PathLike | None = None,
                 synsets: Sequence[str] | str | os.PathLike | None = None,
                 mean: Sequence[float] = IMAGENET_MEAN, std: Sequence[float] = IMAGENET_STD,
                 one_based: bool = True):
        self.root = Path(root)
        if not self.root.is_dir():
            raise FileNotFoundError(f"image folder not found: {self.root}")
        resize_crop_geometry(size, size, resize, size)  # validates resize >= size
        self.size, self.resize = int(size), int(resize)
        self.mean, self.std = tuple(mean), tuple(std)
        ann_dir = Path(annotations) if annotations is not None else None
        files = image_files(self.root)
        self.samples: list[tuple[Path, VocAnnotation]] = []
        for f in files:
            xml = (ann_dir / f"{f.stem}.xml") if ann_dir is not None else f.with_suffix(".xml")
            if not xml.is_file():
                raise ValueError(f"{f}: no annotation file {xml}")
            self.samples.append((f, parse_voc_xml(xml, one_based=one_based)))
        if synsets is None:
            self.synsets = sorted({ann.names[0] for _, ann in self.samples})
        elif isinstance(synsets, (str, os.PathLike)):
            lines = Path(synsets).read_text(encoding="utf-8").splitlines()
            self.synsets = [ln.split()[0] for ln in lines if ln.strip()]
        else:
            self.synsets = [str(s) for s in synsets]
        self.class_to_idx = {s: i for i, s in enumerate(self.synsets)}
        for f, ann in self.samples:
            if ann.names[0] not in self.class_to_idx:
                raise ValueError(f"{f}: synset {ann.names[0]!r} is not in the given synsets")

    def __len__(self) -> int:
        return len(self.samples)

    def boxes(self, index: int) -> torch.Tensor:
        """The image's boxes ``[K, 4]`` in original pixel coordinates."""
        return self.samples[index][1].boxes

    def __getitem__(self, index: int):
        path, ann = self.samples[index]
        img = _open_image(path)
        if ann.size is not None and ann.size != (img.width, img.height):
            raise ValueError(
                f"{path}: image is {img.width}x{img.height} but its annotation says "
                f"{ann.size[0]}x{ann.size[1]}"
            )
        x = imagenet_transform(img, self.resize, self.size, self.mean, self.std)
        mask = transform_mask(boxes_to_mask(ann.boxes, img.height, img.width),
                              self.resize, self.size)
        synset = ann.names[0]
        return x, mask, self.class_to_idx[synset], synset
