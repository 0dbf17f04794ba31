"""Interaction map of an image: the G x G matrix ``J_K(A, B)`` beside the image, with the
strongest group pairs drawn as arcs between the centres of their patches.

Only draws a computed :class:`taylorattr.taylor.pair_interactions.Interactions`; computes nothing else.
Red is a positive interaction (moving A and B to the baseline together lowers the output by
more than the two moves apart), blue a negative one; arc width grows with ``|J_K|``.
"""
from __future__ import annotations

from pathlib import Path

import torch

from ..taylor.pair_interactions import Interactions
from .plotting import _new_figure, _save

__all__ = ["interaction_map", "strongest_pairs"]


def strongest_pairs(result: Interactions, sample: int = 0, order: int | None = None,
                    top: int = 5) -> list[tuple[int, int, float]]:
    """The ``top`` pairs ``(A, B, J_K(A, B))`` with ``A < B``, largest ``|J_K|`` first."""
    matrix = result.total(order)[sample]
    a, b = torch.triu_indices(matrix.shape[0], matrix.shape[1], offset=1, device="cpu")
    values = matrix[a, b]
    keep = values.abs().argsort(descending=True, stable=True)[:top]
    return [(int(a[i]), int(b[i]), float(values[i])) for i in keep]


def _centres(groups: torch.Tensor) -> torch.Tensor:
    """``[G, 2]`` (row, column) centre of every group of a ``[.., H, W]`` id map."""
    ids = groups.reshape(-1, *groups.shape[-2:])[0].cpu()
    rows, cols = torch.meshgrid(torch.arange(ids.shape[0], device="cpu"), torch.arange(ids.shape[1], device="cpu"),
                                indexing="ij")
    G = int(groups.max()) + 1
    count = torch.zeros(G, device="cpu").index_add_(0, ids.flatten(), torch.ones(ids.numel(), device="cpu"))
    centre = torch.stack([torch.zeros(G, device="cpu").index_add_(0, ids.flatten(), r.flatten().float())
                          for r in (rows, cols)], dim=1)
    return centre / count.clamp(min=1)[:, None]


def interaction_map(image: torch.Tensor, result: Interactions, sample: int = 0,
                    order: int | None = None, top: int = 5, path: str | Path | None = None,
                    title: str | None = None, dpi: int = 150):
    """Figure: ``image`` (``[H, W]``, ``[1, H, W]`` or ``[3, H, W]``) with arcs for the ``top``
    strongest pairs, and the heat map of ``J_K`` (``K = order``, default all computed).

    Returns the matplotlib Figure; with ``path`` also writes it as PNG atomically.
    """
    if not isinstance(result, Interactions):
        raise TypeError(f"result must be an Interactions (from taylorattr.taylor.pair_interactions), got "
                        f"{type(result).__name__}")
    if not isinstance(image, torch.Tensor) or image.dim() not in (2, 3):
        raise ValueError("image must be a [H, W], [1, H, W] or [3, H, W] tensor")
    img = image.detach().float().cpu()
    if img.dim() == 3:
        img = img[0] if img.shape[0] == 1 else img.permute(1, 2, 0)
    if tuple(img.shape[:2]) != tuple(result.groups.shape[-2:]):
        raise ValueError(f"image of size {tuple(img.shape[:2])} does not match the groups' "
                         f"{tuple(result.groups.shape[-2:])}")
    matrix = result.total(order)[sample].detach().cpu().float()
    pairs = strongest_pairs(result, sample, order, top)
    scale = float(matrix.abs().max()) or 1.0

    fig = _new_figure((8.0, 3.8))
    left, right = fig.subplots(1, 2)
    left.imshow(img.numpy(), cmap="gray" if img.dim() == 2 else None)
    centres = _centres(result.groups)
    from matplotlib.patches import FancyArrowPatch

    for a, b, value in pairs:
        (ya, xa), (yb, xb) = centres[a].tolist(), centres[b].tolist()
        left.add_patch(FancyArrowPatch((xa, ya), (xb, yb), arrowstyle="-",
                                       connectionstyle="arc3,rad=0.3",
                                       color="tab:red" if value > 0 else "tab:blue",
                                       linewidth=0.5 + 3.5 * abs(value) / scale, alpha=0.85))
    left.set_title(f"strongest {len(pairs)} pairs", fontsize=8)
    left.set_xticks([])
    left.set_yticks([])
    heat = right.imshow(matrix.numpy(), cmap="bwr", vmin=-scale, vmax=scale)
    right.set_title(f"J_{result._order(order)}(A, B), {matrix.shape[0]} groups", fontsize=8)
    right.set_xlabel("group B", fontsize=7)
    right.set_ylabel("group A", fontsize=7)
    fig.colorbar(heat, ax=right, shrink=0.8)
    if title:
        fig.suptitle(title, fontsize=9)
    if path is not None:
        _save(fig, path, dpi)
    return fig
