"""Occlusion-1 and Occlusion-patch (Zeiler & Fergus 2014).

For a window (patch) ``p`` and a baseline ``b``,

    s_p = f(x) - f(x with x_p := b_p)          (the output drop of occluding p)

and every feature of ``p`` receives ``s_p``. ``patch=1`` is Occlusion-1 (Thm 2 of the
paper: ``T^a_i + T^gd_i``); a larger patch is Occlusion-patch (Thm 3: the whole Taylor
expansion of the drop restricted to ``p``).

Windows. ``patch`` is an int or a tuple of ints; a tuple of length ``d`` occludes the
last ``d`` dimensions of each sample and all the leading ones together; an int means
``d = 1`` for ``[B, n]`` and ``[B, C, L]`` inputs and ``d = 2`` for ``[B, C, H, W]``
(so all channels of a pixel are occluded together). Along each occluded dimension of
length ``L`` the windows start at ``0, s, 2s, ...`` (stride ``s``, default: the patch),
``ceil((L - p) / s) + 1`` of them, and a last window that runs past the edge is cut
there (Captum's layout). With ``stride == patch`` the windows tile the input and each
feature gets the drop of the one window holding it. With ``stride < patch`` windows
overlap and a feature gets the **average** of the drops of all windows covering it
(as Captum does). ``stride > patch`` would leave features unexplained and is refused.

Cost: one forward of every occluded copy (``B * number of windows`` rows), run in
chunks of ``perturbations_per_eval`` rows; copies are built chunk by chunk, so memory
stays at one chunk.
"""
from __future__ import annotations

import math

import torch

from .._validation import select_output
from ._base import (
    AttributionMethod,
    check_optional_positive_int,
    default_chunk_rows,
    grid_blocks,
)

__all__ = ["Occlusion"]


def _as_tuple(value, name: str, length: int) -> tuple[int, ...]:
    if isinstance(value, bool):
        raise TypeError(f"{name} must be an int or a tuple of ints, got bool")
    if isinstance(value, int):
        value = (value,) * length
    elif isinstance(value, (tuple, list)):
        if not value or not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
            raise TypeError(f"{name} must be an int or a non-empty tuple of ints, got {value!r}")
        value = tuple(value)
        if len(value) != length:
            raise ValueError(f"{name} must have {length} entries (one per occluded dimension), "
                             f"got {value!r}")
    else:
        raise TypeError(f"{name} must be an int or a tuple of ints, got {type(value).__name__}")
    if any(v < 1 for v in value):
        raise ValueError(f"{name} entries must be >= 1, got {value!r}")
    return value


def window_shape(patch, n_feature_dims: int) -> tuple[int, ...]:
    """``patch`` as one size per occluded dimension. An int occludes the last two
    dimensions of ``[C, H, W]`` samples (all channels of a pixel together) and the last
    one otherwise; a tuple names the last ``len(patch)`` dimensions."""
    d = len(patch) if isinstance(patch, (tuple, list)) else max(1, n_feature_dims - 1)
    if d > n_feature_dims:
        raise ValueError(f"patch {patch!r} has {d} entries but samples have only "
                         f"{n_feature_dims} feature dimensions")
    return _as_tuple(patch, "patch", d)


def window_masks(sizes, patch, stride) -> list[torch.Tensor]:
    """Per occluded dimension, a bool matrix ``[n_windows, L]``: row k marks window k."""
    masks = []
    for size, p, s in zip(sizes, patch, stride):
        n = math.ceil((size - p) / s) + 1
        starts = torch.arange(n) * s
        pos = torch.arange(size)
        masks.append((pos >= starts[:, None]) & (pos < (starts[:, None] + p)))
    return masks


class Occlusion(AttributionMethod):
    """Occlusion with windows of size ``patch``: each feature gets its window's output drop.

    Equals Captum's ``Occlusion`` with ``sliding_window_shapes=(C, *patch)`` and the same
    strides. ``patch=1`` on ``[C, H, W]`` inputs occludes all channels of a pixel together
    (Captum's ``Occlusion`` with window ``(C, 1, 1)``, not ``FeatureAblation``, which
    ablates every element alone). See the module docstring for the
    window layout and how overlapping windows combine (average).
    """

    name = "occlusion"

    def _attribute(self, x, base, t, fx, *, patch=1, stride=None,
                   perturbations_per_eval: int | None = None, show_progress: bool = False):
        """Options: ``patch`` window size, an int or a tuple (``(h, w)`` for images);
        ``stride`` window step, same form as ``patch`` (default ``patch``);
        ``perturbations_per_eval`` occluded copies per model call (rows across samples and
        windows; Captum counts windows per sample instead), default automatic."""
        chunk = check_optional_positive_int(perturbations_per_eval, "perturbations_per_eval")
        patch_t = window_shape(patch, x.dim() - 1)
        d = len(patch_t)
        stride_t = patch_t if stride is None else _as_tuple(stride, "stride", d)
        sizes = tuple(x.shape[x.dim() - d:])
        if any(p > n for p, n in zip(patch_t, sizes)):
            raise ValueError(f"patch {patch_t} exceeds the occluded dimensions {sizes} of inputs")
        if any(s > p for s, p in zip(stride_t, patch_t)):
            raise ValueError(f"stride {stride_t} must not exceed patch {patch_t} "
                             "(a larger stride leaves features never occluded)")

        masks = [m.to(x.device) for m in window_masks(sizes, patch_t, stride_t)]
        counts = [m.shape[0] for m in masks]
        n_windows = math.prod(counts)
        batch = x.shape[0]
        chunk = chunk or default_chunk_rows(x, backward=False, model=self.model)
        lead = x.shape[1:x.dim() - d]  # occluded together (e.g. channels)

        drops = torch.empty(n_windows, batch, dtype=fx.dtype, device=x.device)
        with torch.no_grad():
            for w0, w1, s0, s1 in grid_blocks(n_windows, batch, chunk, show_progress,
                                              "occlusion"):
                # rows (window w, sample s), window-major; mask [w, 1, (1,)*lead, *sizes]
                w_idx = torch.arange(w0, w1, device=x.device)
                mask = None
                for k in range(d - 1, -1, -1):  # unravel the window index, last dim fastest
                    m = masks[k][w_idx % counts[k]]
                    w_idx = w_idx // counts[k]
                    m = m.view((w1 - w0,) + (1,) * k + (sizes[k],) + (1,) * (d - 1 - k))
                    mask = m if mask is None else mask & m
                mask = mask.view((w1 - w0, 1) + (1,) * len(lead) + sizes)
                copies = torch.where(mask, base[None, s0:s1], x[None, s0:s1])
                copies = copies.reshape((-1,) + tuple(x.shape[1:]))
                tr = None if t is None else t[s0:s1].repeat(w1 - w0)
                out = select_output(self.model(copies), tr)
                drops[w0:w1, s0:s1] = fx[None, s0:s1] - out.view(w1 - w0, s1 - s0)

        # Spread the drops back: sum over the windows covering a feature, / their count.
        attr = drops.t().reshape((batch,) + tuple(counts))
        for m in masks:
            mf = m.to(attr.dtype)
            attr = torch.tensordot(attr, mf, dims=([1], [0]))  # window axis k -> feature axis k
            attr = attr / mf.sum(0)  # the new feature axis is appended last
        attr = attr.view((batch,) + (1,) * len(lead) + sizes).expand_as(x).to(x.dtype)
        return attr.contiguous(), base.unsqueeze(1)
