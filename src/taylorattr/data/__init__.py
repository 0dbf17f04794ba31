"""Where inputs come from: MNIST, cluttered-MNIST localisation canvases, ImageNet-style
folders with bounding boxes, and photos for demos.

Everything here works offline. Readers of untrusted files (IDX, JPEG/PNG, Pascal-VOC XML)
reject malformed input with a ``ValueError`` that names the file; XML is parsed with
``defusedxml``. Boxes are ``(x0, y0, x1, y1)`` half-open pixel-edge coordinates
(:mod:`~taylorattr.data.boxes`).

One module per source; every name is re-exported here:

* :mod:`~taylorattr.data.idx`: ``read_idx``;
* :mod:`~taylorattr.data.mnist`: ``load_mnist``, ``mnist_split``/``MnistSplit``,
  ``held_out_digits``;
* :mod:`~taylorattr.data.boxes`: ``boxes_to_mask``;
* :mod:`~taylorattr.data.cluttered`: ``cluttered_mnist``/``ClutteredMnist``;
* :mod:`~taylorattr.data.voc`: ``parse_voc_xml``/``VocAnnotation``;
* :mod:`~taylorattr.data.imagenet`: ``IMAGENET_MEAN``/``IMAGENET_STD``,
  ``imagenet_transform``, ``resize_crop_geometry``, ``transform_mask``,
  ``ImageFolderWithBoxes``;
* :mod:`~taylorattr.data.photos`: ``load_image``, ``sample_photos``.

Monkeypatch a name in the module that looks it up (e.g.
``taylorattr.data.mnist._bundled_mnist``), not here.
"""
from __future__ import annotations

from .boxes import boxes_to_mask
from .cluttered import ClutteredMnist, cluttered_mnist
from .idx import read_idx
from .imagenet import (
    IMAGENET_MEAN,
    IMAGENET_STD,
    ImageFolderWithBoxes,
    imagenet_transform,
    resize_crop_geometry,
    transform_mask,
)
from .mnist import MnistSplit, held_out_digits, load_mnist, mnist_split
from .photos import load_image, sample_photos
from .references import TrainingDigits
from .voc import VocAnnotation, parse_voc_xml

__all__ = [
    "IMAGENET_MEAN",
    "IMAGENET_STD",
    "ClutteredMnist",
    "ImageFolderWithBoxes",
    "MnistSplit",
    "TrainingDigits",
    "VocAnnotation",
    "boxes_to_mask",
    "cluttered_mnist",
    "held_out_digits",
    "imagenet_transform",
    "load_image",
    "load_mnist",
    "mnist_split",
    "parse_voc_xml",
    "read_idx",
    "resize_crop_geometry",
    "sample_photos",
    "transform_mask",
]
