"""Saved attribution maps: one file per map in the format a user asks for.

:func:`save_map` writes ``pt`` (``torch.save`` of the map, or of a dict with the map under
``attribution`` and a record of where it came from), ``npy`` (the array) or ``png``
(:func:`save_picture`: the channel-summed map ``m(h, w) = sum_c a[c, h, w]``, red positive,
blue negative, on the symmetric scale ``[-max|m|, max|m|]``), each written atomically. A map
computed on a GPU is saved as a CPU tensor (:func:`taylorattr._io.save_tensors`), so every
file loads on a machine without one.
"""
from __future__ import annotations

from pathlib import Path

import torch

from .. import _io

__all__ = ["MAP_FORMATS", "save_map", "save_picture"]

#: The formats of :func:`save_map`.
MAP_FORMATS = ("pt", "npy", "png")


def save_picture(attribution: torch.Tensor, path: Path) -> Path:
    """The channel-summed map as a PNG (see the module docstring)."""
    import matplotlib  # plotting only when a picture is asked for

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    m = attribution.detach().cpu().to(torch.float64)
    m = m.sum(0) if m.dim() == 3 else m.reshape(m.shape[-2:]) if m.dim() >= 2 else m[None]
    scale = float(m.abs().max()) or 1.0
    with _io.atomic_path(path) as tmp:
        plt.imsave(tmp, m.numpy(), cmap="bwr", vmin=-scale, vmax=scale, format="png")
    return Path(path)


def save_map(attribution: torch.Tensor, path, fmt: str, record: dict | None = None) -> Path:
    """Write ``attribution`` to ``path`` as ``fmt`` (:data:`MAP_FORMATS`); ``record``
    (``pt`` only) is saved beside it in one dict."""
    if fmt not in MAP_FORMATS:
        raise ValueError(f"format must be one of {MAP_FORMATS}, got {fmt!r}")
    if fmt == "npy":
        return _io.save_npy(attribution, path)
    if fmt == "png":
        return save_picture(attribution, path)
    obj = attribution if record is None else {"attribution": attribution.clone(), **record}
    return _io.save_tensors(obj, path)
