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

Feature groups. ``feature_mask`` (integer ids broadcastable to the input, first dimension
1 or ``B``; one mask per input for tuple inputs) replaces the windows by groups, as
Captum's ``FeatureAblation``: group ``g`` is occluded as a whole, ``s_g = f(x) - f(x with
x_g := b_g)``, and each feature receives the drop of its group. Ids are shared across the
inputs of a tuple (the same id in two inputs is one group).

Tuple inputs (:mod:`taylorattr.inputs`): windows never span two inputs; ``patch`` and
``stride`` are an int for every input or one entry per input (Captum's per-input
``sliding_window_shapes``); the windows of every input are occluded one at a time, the
others kept at ``x``.

Cost: one forward of every occluded copy (``B * number of windows`` rows), run in
chunks of ``perturbations_per_eval`` rows; copies are built chunk by chunk, so memory
stays at one chunk.
"""
from __future__ import annotations

import math

import torch

from .._validation import select_output
from ..inputs import Layout
from ._base import AttributionMethod
from ._passes import check_optional_positive_int, default_chunk_rows, grid_blocks

__all__ = ["Occlusion", "window_ids"]


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


def count_windows(shape: tuple[int, ...], patch, stride=None) -> int:
    """The windows of one sample of ``shape`` (without the batch), as :class:`Occlusion`
    lays them out: ``prod(ceil((L - p) / s) + 1)`` over the occluded dimensions."""
    patch_t, stride_t, sizes = _geometry(shape, patch, stride)
    return math.prod(math.ceil((n - p) / s) + 1 for n, p, s in zip(sizes, patch_t, stride_t))


def window_ids(sample_shape: tuple[int, ...], patch) -> torch.Tensor:
    """Window id of every feature when windows of ``patch`` tile a sample (stride = patch),
    shaped like one sample: the layout of :class:`Occlusion` (an int patch groups all
    channels of a pixel of ``[C, H, W]`` samples; windows past the edge are cut there)."""
    patch_t, _, sizes = _geometry(tuple(sample_shape), patch, None)
    ids = torch.zeros((), dtype=torch.long)
    for mask in window_masks(sizes, patch_t, patch_t):
        ids = ids.unsqueeze(-1) * mask.shape[0] + mask.long().argmax(0)
    return ids.expand(tuple(sample_shape)).contiguous()


def _geometry(shape: tuple[int, ...], patch, stride) -> tuple[tuple, tuple, tuple]:
    """``(patch, stride, sizes)`` per occluded dimension of samples of ``shape``, checked."""
    patch_t = window_shape(patch, len(shape))
    d = len(patch_t)
    stride_t = patch_t if stride is None else _as_tuple(stride, "stride", d)
    sizes = tuple(shape[len(shape) - d:])
    if any(p > n for p, n in zip(patch_t, sizes)):
        raise ValueError(f"patch {patch_t} exceeds the occluded dimensions {sizes} of inputs")
    if any(s > p for s, p in zip(stride_t, patch_t)):
        raise ValueError(f"stride {stride_t} must not exceed patch {patch_t} "
                         "(a larger stride leaves features never occluded)")
    return patch_t, stride_t, sizes


class Occlusion(AttributionMethod):
    """Occlusion with windows of size ``patch`` (or the groups of ``feature_mask``): each
    feature gets its window's (group's) output drop.

    Equals Captum's ``Occlusion`` with ``sliding_window_shapes=(C, *patch)`` and the same
    strides. ``patch=1`` on ``[C, H, W]`` inputs occludes all channels of a pixel together
    (Captum's ``Occlusion`` with window ``(C, 1, 1)``, not ``FeatureAblation``, which
    ablates every element alone). With ``feature_mask`` it equals Captum's
    ``FeatureAblation`` with the same mask. See the module docstring for the window layout
    and how overlapping windows combine (average).
    """

    name = "occlusion"

    def _attribute(self, x, base, t, fx, *, patch=1, stride=None, feature_mask=None,
                   perturbations_per_eval: int | None = None, show_progress: bool = False):
        """Options: ``patch`` window size, an int or a tuple (``(h, w)`` for images; one entry
        per input for tuple inputs); ``stride`` window step, same form as ``patch`` (default
        ``patch``); ``feature_mask`` integer group ids instead of windows (one mask per input
        for tuple inputs); ``perturbations_per_eval`` occluded copies per model call (rows
        across samples and windows; Captum counts windows per sample instead), default
        automatic."""
        chunk = check_optional_positive_int(perturbations_per_eval, "perturbations_per_eval")
        chunk = chunk or default_chunk_rows(x, backward=False, model=self.model)
        layout = self._layout or Layout.of((x,), False)
        if feature_mask is not None:
            if not (isinstance(patch, int) and patch == 1) or stride is not None:
                raise ValueError("give either feature_mask (groups) or patch/stride (windows), "
                                 "not both")
            ids = _group_ids(feature_mask, layout, x.shape[0], x.device)
            return self._ablate(x, base, t, fx, ids, chunk, show_progress), base.unsqueeze(1)
        if not layout.flat:
            return self._windows(x, base, t, fx, patch, stride, chunk, show_progress), \
                base.unsqueeze(1)
        patches = layout.per_input(patch, "patch", lambda v: isinstance(v, int))
        strides = layout.per_input(stride, "stride", lambda v: v is None or isinstance(v, int))
        parts = []
        for i, (o, n, shape) in enumerate(zip(layout.offsets, layout.sizes, layout.shapes)):
            parts.append(self._windows(x, base, t, fx, patches[i], strides[i], chunk,
                                       show_progress, (o, n, shape)).reshape(x.shape[0], n))
        return torch.cat(parts, 1), base.unsqueeze(1)

    def _cost(self, x, options):
        """One forward per (sample, window), or per (sample, group) with ``feature_mask``;
        one reference (the baseline)."""
        from ..cost import Cost

        patch, stride = options.get("patch", 1), options.get("stride")
        mask = options.get("feature_mask")
        if mask is not None:
            ids = _group_ids(mask, Layout.of((x,), False), x.shape[0], x.device)
            return Cost(forward_rows=x.shape[0] * torch.unique(ids).numel()), 1
        return Cost(forward_rows=x.shape[0] * count_windows(tuple(x.shape[1:]), patch,
                                                             stride)), 1

    def _windows(self, x, base, t, fx, patch, stride, chunk, show_progress, part=None):
        """Window drops of one input (``part = (offset, size, shape)`` inside the flat
        tensor of tuple inputs; None: ``x`` itself), spread back to its features."""
        shape = tuple(x.shape[1:]) if part is None else part[2]
        patch_t, stride_t, sizes = _geometry(shape, patch, stride)
        d = len(patch_t)

        masks = [m.to(x.device) for m in window_masks(sizes, patch_t, stride_t)]
        counts = [m.shape[0] for m in masks]
        n_windows = math.prod(counts)
        batch = x.shape[0]
        lead = shape[:len(shape) - d]  # occluded together (e.g. channels)

        def member(w0, w1):
            # the windows' masks [w, (1,)*lead, *sizes], unravelling w (last dim fastest)
            w_idx = torch.arange(w0, w1, device=x.device)
            mask = None
            for k in range(d - 1, -1, -1):
                m = masks[k][w_idx % counts[k]]
                w_idx = w_idx // counts[k]
                m = m.view((w1 - w0,) + (1,) * k + (sizes[k],) + (1,) * (d - 1 - k))
                mask = m if mask is None else mask & m
            mask = mask.view((w1 - w0,) + (1,) * len(lead) + sizes)
            if part is None:
                return mask.unsqueeze(1)  # [w, 1, (1,)*lead, *sizes] against x [s, ...]
            offset, n, _ = part
            inner = mask.expand((w1 - w0,) + shape).reshape(w1 - w0, n)
            full = torch.zeros(w1 - w0, 1, x.shape[1], dtype=torch.bool, device=x.device)
            full[:, 0, offset:offset + n] = inner
            return full

        drops = _drops(self.model, x, base, t, fx, n_windows, member, chunk, show_progress)
        # Spread the drops back: sum over the windows covering a feature, / their count.
        attr = drops.t().reshape((batch,) + tuple(counts))
        for m in masks:
            mf = m.to(attr.dtype)
            attr = torch.tensordot(attr, mf, dims=([1], [0]))  # window axis k -> feature axis k
            attr = attr / mf.sum(0)  # the new feature axis is appended last
        attr = attr.view((batch,) + (1,) * len(lead) + sizes).expand((batch,) + shape)
        return attr.to(x.dtype).contiguous()

    def _ablate(self, x, base, t, fx, ids, chunk, show_progress):
        """Group drops; each feature gets its group's drop (``ids``: ``[1 or B, N]``)."""
        values, inverse = torch.unique(ids, return_inverse=True)
        per_sample = ids.shape[0] > 1
        batch = x.shape[0]

        def member(g0, g1, s0=0, s1=1):
            rows = inverse[s0:s1] if per_sample else inverse
            g = torch.arange(g0, g1, device=x.device).view(-1, 1, 1)
            return (rows.unsqueeze(0) == g).view((g1 - g0, rows.shape[0]) + tuple(x.shape[1:]))

        drops = _drops(self.model, x, base, t, fx, values.numel(), member, chunk,
                       show_progress, per_sample)
        index = inverse.expand(batch, -1)
        return drops.t().gather(1, index).view_as(x).to(x.dtype).contiguous()


def _drops(model, x, base, t, fx, n_windows, member, chunk, show_progress,
           per_sample=False) -> torch.Tensor:
    """``f(x) - f(x with window w occluded)``, ``[n_windows, B]``; ``member(w0, w1[, s0, s1])``
    gives the windows' masks, broadcastable against ``[w, s, *x.shape[1:]]``."""
    batch = x.shape[0]
    drops = torch.empty(n_windows, batch, dtype=fx.dtype, device=x.device)
    with torch.no_grad():
        for w0, w1, s0, s1 in grid_blocks(n_windows, batch, chunk, show_progress, "occlusion"):
            # rows (window w, sample s), window-major
            mask = member(w0, w1, s0, s1) if per_sample else member(w0, w1)
            copies = torch.where(mask, base[None, s0:s1], x[None, s0:s1])
            copies = copies.reshape((-1,) + tuple(x.shape[1:]))
            tr = None if t is None else t[s0:s1].repeat(w1 - w0)
            out = select_output(model(copies), tr)
            drops[w0:w1, s0:s1] = fx[None, s0:s1] - out.view(w1 - w0, s1 - s0)
    return drops


def _group_ids(feature_mask, layout: Layout, batch: int, device) -> torch.Tensor:
    """The masks of every input broadcast to ``[1 or B, *shape_i]``, joined: ``[1 or B, N]``."""
    masks = layout.per_input(feature_mask, "feature_mask", lambda v: isinstance(v, torch.Tensor))
    out, rows = [], 1
    for i, (m, shape) in enumerate(zip(masks, layout.shapes)):
        name = "feature_mask" if len(masks) == 1 else f"feature_mask[{i}]"
        if not isinstance(m, torch.Tensor):
            raise TypeError(f"{name} must be an integer tensor, got {type(m).__name__}")
        if m.dtype.is_floating_point or m.is_complex() or m.dtype == torch.bool:
            raise TypeError(f"{name} must hold integer group ids, got dtype {m.dtype}")
        if m.dim() != len(shape) + 1 or m.shape[0] not in (1, batch):
            raise ValueError(f"{name} must have the input's {len(shape) + 1} dimensions with a "
                             f"first dimension of 1 or {batch} (the batch), broadcastable to "
                             f"[{batch}, {', '.join(map(str, shape))}]; got {tuple(m.shape)}")
        try:
            full = torch.broadcast_to(m, (m.shape[0],) + shape)
        except RuntimeError:
            raise ValueError(f"{name} of shape {tuple(m.shape)} does not broadcast to the input "
                             f"[{batch}, {', '.join(map(str, shape))}]") from None
        out.append(full.reshape(m.shape[0], -1).to(device, torch.long))
        rows = max(rows, m.shape[0])
    return torch.cat([o.expand(rows, -1) for o in out], 1)
