"""A tiny ImageNet-style folder for the tests: random JPEGs with Pascal-VOC XML boxes."""
from __future__ import annotations

import numpy as np

_XML = ("<annotation><size><width>{w}</width><height>{h}</height><depth>3</depth></size>"
        "<object><name>{wnid}</name><bndbox><xmin>{x0}</xmin><ymin>{y0}</ymin><xmax>{x1}</xmax>"
        "<ymax>{y1}</ymax></bndbox></object></annotation>")


def write_folder(folder, samples, width: int, height: int):
    """``samples``: ``(stem, wnid, (x0, y0, x1, y1))`` each; returns ``folder``."""
    from PIL import Image

    folder.mkdir()
    rng = np.random.default_rng(0)
    for stem, wnid, (x0, y0, x1, y1) in samples:
        Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8)).save(
            folder / f"{stem}.JPEG", quality=95)
        (folder / f"{stem}.xml").write_text(
            _XML.format(w=width, h=height, wnid=wnid, x0=x0, y0=y0, x1=x1, y1=y1))
    return folder
