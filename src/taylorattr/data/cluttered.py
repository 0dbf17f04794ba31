"""Cluttered-MNIST localisation canvases: one whole digit, its box, and digit fragments
outside the box, so that ``mask = boxes_to_mask(box)`` holds exactly the digit's pixels.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch

from .._validation import check_int, cpu_generator
from .boxes import boxes_to_mask

__all__ = ["ClutteredMnist", "cluttered_mnist"]


class ClutteredMnist(NamedTuple):
    """Localisation canvases (a plain tuple of four tensors)."""

    images: torch.Tensor  # [n, 1, canvas, canvas] float32 in [0, 1]
    labels: torch.Tensor  # [n] int64
    boxes: torch.Tensor   # [n, 4] int64 (x0, y0, x1, y1), half-open, the digit's extent
    masks: torch.Tensor   # [n, canvas, canvas] bool, boxes_to_mask of the box


def cluttered_mnist(images: torch.Tensor, labels: torch.Tensor, n: int, canvas: int = 64,
                    seed: int = 0, n_clutter: int = 6, fragment: int = 8) -> ClutteredMnist:
    """Deterministic cluttered-MNIST localisation set.

    Each canvas holds one whole digit, drawn from ``images`` (``[N, 1, S, S]`` in
    [0, 1]; blank images are never drawn), pasted at a uniformly random position, and
    ``n_clutter`` fragments: ``fragment x fragment`` crops taken near the centre of other
    random digits, pasted (pixel-wise max) at uniformly random positions that do not
    overlap the digit's box, so everything inside the box belongs to the digit. The box
    is the digit's extent on the canvas: the smallest box holding all its nonzero pixels.
    With 28x28 digits on a 64x64 canvas a box covers at most 19% of the canvas.

    The digit placement and the clutter come from two generators seeded from ``seed``,
    so the same seed gives the same digits at the same places whatever ``n_clutter`` is.
    Returns ``ClutteredMnist(images, labels, boxes, masks)`` on the device of ``images``
    (the canvases are composed on the CPU, from CPU draws: the same on every device).
    """
    if not isinstance(images, torch.Tensor) or images.dim() not in (3, 4):
        raise ValueError("images must be a tensor [N, 1, S, S] or [N, S, S]")
    src = images[:, 0] if images.dim() == 4 else images
    if images.dim() == 4 and images.shape[1] != 1:
        raise ValueError(f"images must have one channel, got shape {tuple(images.shape)}")
    if labels.shape[:1] != src.shape[:1]:
        raise ValueError("images and labels must have the same length")
    for v, nm in ((n, "n"), (canvas, "canvas"), (fragment, "fragment")):
        check_int(v, nm, 1)
    check_int(n_clutter, "n_clutter", 0)
    s_h, s_w = src.shape[1], src.shape[2]
    if canvas < max(s_h, s_w):
        raise ValueError(f"canvas ({canvas}) must be at least the digit size {s_h}x{s_w}")
    if fragment > min(s_h, s_w) or fragment > canvas:
        raise ValueError(f"fragment ({fragment}) must fit in a digit and the canvas")
    digits = src.detach().to(torch.float32).cpu().numpy()
    nonblank = np.flatnonzero(digits.reshape(len(digits), -1).max(axis=1) > 0)
    if nonblank.size == 0:
        raise ValueError("images holds no nonblank digit")

    g_digit = cpu_generator(int(seed))
    g_clutter = cpu_generator((int(seed) * 1_000_003 + 7919) % (2**63))
    pick = torch.from_numpy(nonblank)[torch.randint(len(nonblank), (n,), generator=g_digit, device="cpu")]
    ys = torch.randint(canvas - s_h + 1, (n,), generator=g_digit, device="cpu")
    xs = torch.randint(canvas - s_w + 1, (n,), generator=g_digit, device="cpu")
    m_h = min(4, (s_h - fragment) // 2)
    m_w = min(4, (s_w - fragment) // 2)
    c_src = torch.from_numpy(nonblank)[
        torch.randint(len(nonblank), (n, n_clutter), generator=g_clutter, device="cpu")]
    c_y = torch.randint(m_h, s_h - fragment - m_h + 1, (n, n_clutter), generator=g_clutter, device="cpu")
    c_x = torch.randint(m_w, s_w - fragment - m_w + 1, (n, n_clutter), generator=g_clutter, device="cpu")
    c_u = torch.rand((n, n_clutter), generator=g_clutter, dtype=torch.float64, device="cpu")

    pick_np, ys_np, xs_np = pick.numpy(), ys.numpy(), xs.numpy()
    c_src_np, c_y_np, c_x_np, c_u_np = c_src.numpy(), c_y.numpy(), c_x.numpy(), c_u.numpy()
    # each digit's extent: first and last nonzero row and column
    ink_r = digits.max(axis=2) > 0  # [N, S_h]
    ink_c = digits.max(axis=1) > 0  # [N, S_w]
    r_first, r_last = ink_r.argmax(1), s_h - 1 - ink_r[:, ::-1].argmax(1)
    c_first, c_last = ink_c.argmax(1), s_w - 1 - ink_c[:, ::-1].argmax(1)
    boxes = np.stack([xs_np + c_first[pick_np], ys_np + r_first[pick_np],
                      xs_np + c_last[pick_np] + 1, ys_np + r_last[pick_np] + 1], 1).astype(np.int64)

    out = np.zeros((n, canvas, canvas), dtype=np.float32)
    n_pos = canvas - fragment + 1
    starts = np.arange(n_pos)
    for i in range(n):
        x0, y0, x1, y1 = boxes[i]
        if n_clutter:
            # top-left corners whose fragment overlaps the box in both directions are invalid
            over_x = (starts < x1) & (starts + fragment > x0)
            over_y = (starts < y1) & (starts + fragment > y0)
            valid = np.flatnonzero(~(over_y[:, None] & over_x[None, :]).ravel())
            if valid.size == 0:
                raise ValueError(
                    f"no room for a {fragment}x{fragment} fragment outside the digit box on a "
                    f"{canvas}x{canvas} canvas; use a larger canvas or n_clutter=0"
                )
            where = valid[np.minimum((c_u_np[i] * valid.size).astype(np.int64), valid.size - 1)]
            for k in range(n_clutter):
                py, px = divmod(int(where[k]), n_pos)
                cy, cx = c_y_np[i, k], c_x_np[i, k]
                frag = digits[c_src_np[i, k], cy:cy + fragment, cx:cx + fragment]
                region = out[i, py:py + fragment, px:px + fragment]
                np.maximum(region, frag, out=region)
        y, x = ys_np[i], xs_np[i]
        region = out[i, y:y + s_h, x:x + s_w]
        np.maximum(region, digits[pick_np[i]], out=region)
    boxes_t = torch.from_numpy(boxes)
    masks = boxes_to_mask(boxes_t[:, None], canvas, canvas)
    dev = images.device
    return ClutteredMnist(torch.from_numpy(out).unsqueeze(1).to(dev),
                          labels[pick.to(labels.device)].to(dev, torch.int64).clone(),
                          boxes_t.to(dev), masks.to(dev))
