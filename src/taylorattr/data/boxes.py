"""Bounding boxes and the masks they cover.

Box convention used throughout: ``(x0, y0, x1, y1)`` in pixel-edge coordinates, half-open,
so that integer boxes select ``image[y0:y1, x0:x1]``. Pixel ``(r, c)`` lies in a box when its
centre ``(c + 0.5, r + 0.5)`` does: ``mask[r, c] = any_k x0_k <= c + 1/2 < x1_k and
y0_k <= r + 1/2 < y1_k``.
"""
from __future__ import annotations

import numpy as np
import torch

from .._validation import check_positive_int

__all__ = ["boxes_to_mask"]


def _as_box_tensor(boxes, name: str) -> torch.Tensor:
    b = torch.as_tensor(boxes, device=boxes.device if isinstance(boxes, torch.Tensor) else "cpu")
    if b.dtype == torch.bool or b.is_complex():
        raise TypeError(f"{name} must hold real numbers, got dtype {b.dtype}")
    b = b.to(torch.float64)
    if b.dim() == 1 and b.numel() == 0:
        b = b.reshape(0, 4)
    if b.shape[-1:] != (4,):
        raise ValueError(
            f"{name} must have a last dimension of 4 (x0, y0, x1, y1), got {tuple(b.shape)}"
        )
    if not torch.isfinite(b).all():
        raise ValueError(f"{name} must be finite")
    if (b[..., 2] < b[..., 0]).any() or (b[..., 3] < b[..., 1]).any():
        raise ValueError(f"{name} must satisfy x0 <= x1 and y0 <= y1")
    return b


def boxes_to_mask(boxes, height: int, width: int) -> torch.Tensor:
    """Merge the boxes of an image into one bool mask.

    ``boxes`` is ``[K, 4]`` (all boxes of one image; returns ``[height, width]``),
    ``[B, K, 4]`` or a list of ``B`` tensors ``[K_b, 4]`` (returns ``[B, height, width]``).
    Boxes are ``(x0, y0, x1, y1)`` half-open pixel-edge coordinates: pixel ``(r, c)`` is
    ``True`` when its centre ``(c + 0.5, r + 0.5)`` lies in ``[x0, x1) x [y0, y1)`` of at
    least one box, so an integer box sets ``mask[y0:y1, x0:x1]``. Boxes may extend past
    the image (clipped); ``K = 0`` gives an all-False mask. For one box per image of a
    batch, pass ``boxes[:, None]``.
    """
    for v, nm in ((height, "height"), (width, "width")):
        check_positive_int(v, nm)
    if isinstance(boxes, (list, tuple)) and boxes and all(
        isinstance(b, (torch.Tensor, np.ndarray)) for b in boxes
    ):
        return torch.stack([boxes_to_mask(b, height, width) for b in boxes])
    b = _as_box_tensor(boxes, "boxes")
    if b.dim() not in (2, 3):
        raise ValueError(
            f"boxes must be [K, 4], [B, K, 4] or a list of [K, 4], got {tuple(b.shape)}"
        )
    cols = torch.arange(width, dtype=torch.float64, device=b.device) + 0.5
    rows = torch.arange(height, dtype=torch.float64, device=b.device) + 0.5
    in_x = (cols >= b[..., 0:1]) & (cols < b[..., 2:3])  # [..., K, W]
    in_y = (rows >= b[..., 1:2]) & (rows < b[..., 3:4])  # [..., K, H]
    return (in_y.to(torch.float32).transpose(-1, -2) @ in_x.to(torch.float32)) > 0
