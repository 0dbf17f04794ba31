"""Localisation metrics: bounding-box (relevance rank) accuracy and box masks."""
from __future__ import annotations

from numbers import Real

import torch

from .._validation import check_bool, check_positive_int

__all__ = ["bbox_accuracy", "boxes_to_mask"]

_TIES = ("expected", "index")


def _check_masks(masks, batch: int, spatial: tuple[int, int]) -> torch.Tensor:
    if not isinstance(masks, torch.Tensor):
        raise TypeError(f"masks must be a torch.Tensor, got {type(masks).__name__}")
    if masks.is_complex():
        raise TypeError(f"masks must be a bool, integer or float tensor, got {masks.dtype}")
    if masks.dim() == 4 and masks.shape[1] == 1:
        masks = masks[:, 0]
    if masks.dim() != 3 or masks.shape[0] != batch or tuple(masks.shape[1:]) != spatial:
        raise ValueError(
            f"masks must have shape [B, H, W] or [B, 1, H, W] = [{batch}, {spatial[0]}, "
            f"{spatial[1]}] to match the attributions, got {tuple(masks.shape)}"
        )
    if masks.dtype != torch.bool:
        if not ((masks == 0) | (masks == 1)).all():
            raise ValueError("masks must hold only 0 and 1 (or be a bool tensor)")
        masks = masks != 0
    return masks


def bbox_accuracy(
    attributions: torch.Tensor,
    masks: torch.Tensor,
    absolute: bool = False,
    ties: str = "expected",
) -> torch.Tensor:
    r"""Bounding-box accuracy (Schulz et al. 2020; Quantus's ``RelevanceRankAccuracy``).

    Per sample, with ``M`` the (merged) box mask and ``n = |M|``:

    .. math::

        \mathrm{acc} = \frac{|\mathrm{top}_n(r) \cap M|}{n}, \qquad
        r_{hw} = \sum_c a_{chw}

    i.e. pixels are ranked by their channel-summed *signed* relevance, descending (what
    Quantus does with its defaults ``abs=False``, its normalisation being monotone), and
    the score is the share of the ``n`` best pixels that lie in the mask. With
    ``absolute=True`` pixels are ranked by ``|r|`` (channels summed first).

    Images whose mask covers more than a third of the image are *not* excluded here; the
    experiment selects images, the metric scores whatever it is given.

    Ties at the cut (several pixels sharing the n-th largest value, common for methods
    that give exactly 0 to a black background) are resolved by ``ties``:

    * ``"expected"`` (default): the expected score under a uniformly random order of the
      tied pixels, ``(|above ∩ M| + r * |tied ∩ M| / |tied|) / n`` with ``r`` the free
      places left after the strictly larger pixels. Invariant to the pixel order, so a
      box position is never rewarded for lying early in the raster.
    * ``"index"``: a stable descending sort, so among equal values the lower row-major
      pixel index ranks first. Equals Quantus on tie-free maps (Quantus's ``np.argsort``
      leaves the order of ties unspecified).

    Args:
        attributions: ``[B, C, H, W]`` or ``[B, H, W]`` float tensor.
        masks: ``[B, H, W]`` or ``[B, 1, H, W]``; bool, or numbers that are all 0 or 1.
        absolute: rank by the absolute channel-summed relevance.
        ties: ``"expected"`` or ``"index"``.

    Returns:
        ``[B]`` tensor in ``[0, 1]``, dtype of ``attributions``.

    Raises:
        TypeError, ValueError: bad types or shapes, non-finite attributions, values other
        than 0/1 in ``masks``, or an empty mask (ValueError naming the samples).
    """
    if not isinstance(attributions, torch.Tensor):
        raise TypeError(f"attributions must be a torch.Tensor, got {type(attributions).__name__}")
    if attributions.dtype not in (torch.float32, torch.float64):
        raise TypeError(f"attributions must have dtype float32 or float64, got {attributions.dtype}")
    if attributions.dim() not in (3, 4) or attributions.shape[0] == 0 or attributions.numel() == 0:
        raise ValueError(
            "attributions must have shape [B, C, H, W] or [B, H, W] with B >= 1, got "
            f"{tuple(attributions.shape)}"
        )
    if not torch.isfinite(attributions).all():
        raise ValueError("attributions must be finite; they contain NaN or inf")
    check_bool(absolute, "absolute")
    if ties not in _TIES:
        raise ValueError(f"ties must be one of {_TIES}, got {ties!r}")

    rel = attributions.detach()
    if rel.dim() == 4:
        rel = rel.sum(1)
    if absolute:
        rel = rel.abs()
    b = rel.shape[0]
    m = _check_masks(masks, b, tuple(rel.shape[1:])).to(rel.device).flatten(1)
    rel = rel.flatten(1)
    n = m.sum(1)
    if (n == 0).any():
        idx = torch.nonzero(n == 0).flatten().tolist()
        raise ValueError(f"masks are empty for samples {idx}; bbox accuracy needs n >= 1 pixels")

    acc = torch.float32 if rel.device.type == "mps" else torch.float64
    order = torch.sort(rel, dim=1, descending=True, stable=True)
    if ties == "index":
        in_mask_sorted = m.gather(1, order.indices)
        places = torch.arange(rel.shape[1], device=rel.device)[None]
        hits = (in_mask_sorted & (places < n[:, None])).sum(1).to(acc)
    else:
        cut = order.values.gather(1, (n - 1)[:, None])          # the n-th largest value
        above = rel > cut
        tied = rel == cut
        free = (n - above.sum(1)).to(acc)                        # places left for ties
        hits = ((above & m).sum(1).to(acc)
                + free * (tied & m).sum(1).to(acc) / tied.sum(1).to(acc))
    return (hits / n.to(acc)).to(attributions.dtype)


def boxes_to_mask(boxes, height: int, width: int) -> torch.Tensor:
    """Merge bounding boxes into one ``[height, width]`` bool mask.

    ``boxes`` is a ``[K, 4]`` tensor or a sequence of ``(x_min, y_min, x_max, y_max)`` in
    pixel coordinates, half-open, 0-based (torchvision's convention; a Pascal VOC box
    ``xmin..xmax`` 1-based inclusive is ``(xmin - 1, ymin - 1, xmax, ymax)``). Pixel
    ``(row, col)`` is inside a box when its centre ``(col + 0.5, row + 0.5)`` is, which for
    integer coordinates means ``x_min <= col < x_max`` and ``y_min <= row < y_max``; float
    coordinates (boxes after a resize) are allowed. Parts outside the image are clipped.
    ``K = 0`` gives an all-False mask. The mask is on the device of a ``boxes`` tensor
    (the CPU for a sequence of numbers).
    """
    for name, v in (("height", height), ("width", width)):
        check_positive_int(v, name)
    if isinstance(boxes, torch.Tensor):
        t = boxes.detach().to(torch.float64)
    else:
        try:
            rows = [list(bx) for bx in boxes]
        except TypeError:
            raise TypeError(
                f"boxes must be a [K, 4] tensor or a sequence of 4-sequences, got "
                f"{type(boxes).__name__}"
            ) from None
        if any(len(r) != 4 or not all(isinstance(v, Real) and not isinstance(v, bool)
                                      for v in r) for r in rows):
            raise ValueError("boxes must be a sequence of (x_min, y_min, x_max, y_max) numbers")
        t = torch.tensor(rows, dtype=torch.float64, device="cpu").reshape(-1, 4)
    if t.dim() != 2 or t.shape[1] != 4:
        raise ValueError(f"boxes must have shape [K, 4], got {tuple(t.shape)}")
    if not torch.isfinite(t).all():
        raise ValueError("boxes must be finite")
    if ((t[:, 2] <= t[:, 0]) | (t[:, 3] <= t[:, 1])).any():
        raise ValueError("boxes must have x_max > x_min and y_max > y_min")
    cx = torch.arange(width, dtype=torch.float64, device=t.device) + 0.5
    cy = torch.arange(height, dtype=torch.float64, device=t.device) + 0.5
    in_x = (cx[None] >= t[:, 0:1]) & (cx[None] < t[:, 2:3])     # [K, W]
    in_y = (cy[None] >= t[:, 1:2]) & (cy[None] < t[:, 3:4])     # [K, H]
    return (in_y[:, :, None] & in_x[:, None, :]).any(0) if len(t) else torch.zeros(
        height, width, dtype=torch.bool, device=t.device)
