"""Pascal-VOC / ILSVRC XML bounding-box annotations, parsed with ``defusedxml``.

VOC stores inclusive 1-based pixel indices ``[xmin, xmax]``; they become the half-open
0-based boxes used here, ``[xmin - 1, xmax)`` (see :mod:`taylorattr.data.boxes`).
"""
from __future__ import annotations

import math
import os
from pathlib import Path
from typing import NamedTuple

import torch

__all__ = ["VocAnnotation", "parse_voc_xml"]


class VocAnnotation(NamedTuple):
    """A parsed Pascal-VOC annotation."""

    names: list[str]         # object names (ILSVRC: synset ids such as "n01440764")
    boxes: torch.Tensor      # [K, 4] float64, half-open 0-based (x0, y0, x1, y1)
    size: tuple[int, int] | None  # (width, height) from <size>, when present


def parse_voc_xml(path: str | os.PathLike, one_based: bool = True) -> VocAnnotation:
    """Parse a Pascal-VOC / ILSVRC XML annotation with ``defusedxml``.

    Every ``<object>`` needs a ``<name>`` and a ``<bndbox>`` with numeric ``xmin, ymin,
    xmax, ymax`` where min <= max. VOC stores inclusive pixel indices, 1-based; they are
    turned into the half-open 0-based boxes used here: ``(xmin - 1, ymin - 1, xmax, ymax)``
    (with ``one_based=False``: ``(xmin, ymin, xmax + 1, ymax + 1)``). Raises ``ValueError``
    naming the file for malformed XML, forbidden constructs (entities, DTDs, external
    references) or missing/invalid fields.
    """
    try:
        import defusedxml.ElementTree as DET
        from defusedxml import DefusedXmlException
    except ImportError:  # pragma: no cover
        raise ImportError(
            "reading XML annotations needs defusedxml (pip install defusedxml)"
        ) from None
    from xml.etree.ElementTree import ParseError

    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"annotation file not found: {p}")
    try:
        root = DET.parse(str(p), forbid_dtd=True).getroot()
    except (ParseError, DefusedXmlException, UnicodeDecodeError) as exc:
        raise ValueError(f"{p}: malformed or unsafe XML annotation: {exc}") from None

    def number(node, tag: str) -> float:
        el = node.find(tag)
        if el is None or el.text is None:
            raise ValueError(f"{p}: <{tag}> missing in <{node.tag}>")
        try:
            v = float(el.text.strip())
        except ValueError:
            raise ValueError(f"{p}: <{tag}> is not a number: {el.text!r}") from None
        if not math.isfinite(v):
            raise ValueError(f"{p}: <{tag}> is not finite: {el.text!r}")
        return v

    size = None
    size_el = root.find("size")
    if size_el is not None:
        w, h = number(size_el, "width"), number(size_el, "height")
        if w < 1 or h < 1 or w != int(w) or h != int(h):
            raise ValueError(f"{p}: <size> must hold positive integer width and height")
        size = (int(w), int(h))
    names, boxes = [], []
    for obj in root.findall("object"):
        name_el = obj.find("name")
        if name_el is None or not (name_el.text or "").strip():
            raise ValueError(f"{p}: an <object> has no <name>")
        bb = obj.find("bndbox")
        if bb is None:
            raise ValueError(f"{p}: object {name_el.text.strip()!r} has no <bndbox>")
        x0, y0, x1, y1 = (number(bb, t) for t in ("xmin", "ymin", "xmax", "ymax"))
        if x1 < x0 or y1 < y0:
            raise ValueError(f"{p}: box ({x0}, {y0}, {x1}, {y1}) has max < min")
        if one_based:
            boxes.append((x0 - 1, y0 - 1, x1, y1))
        else:
            boxes.append((x0, y0, x1 + 1, y1 + 1))
        names.append(name_el.text.strip())
    if not boxes:
        raise ValueError(f"{p}: no <object> with a bounding box")
    return VocAnnotation(names, torch.tensor(boxes, dtype=torch.float64, device="cpu"), size)
