r"""Feature groups: the one home of window, patch, mask and player ids.

A *grouping* of a sample of shape ``S`` is an integer tensor ``ids`` shaped like ``S`` (or
broadcastable to it) with values ``0..G-1``: feature ``j`` belongs to group ``ids[j]``.
Every method that moves features together (Occlusion's windows, Captum's ``feature_mask``,
the players of the Shapley family, the groups of ``taylor_terms`` and ``interactions``)
builds its ids here:

* :func:`window_ids`: windows of ``patch`` tiling a sample (stride = patch), Occlusion's
  layout (an int patch on ``[C, H, W]`` covers all channels of a pixel; a window past the
  edge is cut there); :func:`window_geometry`, :func:`window_masks` and
  :func:`count_windows` describe overlapping windows too;
* :func:`resolve_groups`: a user's ids broadcastable to one sample, checked;
* :func:`mask_ids`: group ids of the Taylor group expansions for (tuple) inputs, one
  tensor ``[1 or B, *shape_i]`` per input (any integer, no broadcasting), ``[1 or B, N]``;
* :func:`player_ids`: Captum's ``feature_mask`` as every attribution method reads it (the
  Shapley family, Occlusion/FeatureAblation, Lime): Captum's broadcasting, ids >= 0;
* :func:`default_groups`: at most ``max_groups`` square patches (or every feature).
"""
from __future__ import annotations

import math

import torch

from .inputs import Layout

__all__ = ["count_windows", "default_groups", "mask_ids", "player_ids", "resolve_groups",
           "window_geometry", "window_ids", "window_masks", "window_shape"]


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
        starts = torch.arange(n, device="cpu") * s
        pos = torch.arange(size, device="cpu")
        masks.append((pos >= starts[:, None]) & (pos < (starts[:, None] + p)))
    return masks


def count_windows(shape: tuple[int, ...], patch, stride=None) -> int:
    """The windows of one sample of ``shape`` (without the batch), as :class:`Occlusion`
    lays them out: ``prod(ceil((L - p) / s) + 1)`` over the occluded dimensions."""
    patch_t, stride_t, sizes = window_geometry(shape, patch, stride)
    return math.prod(math.ceil((n - p) / s) + 1 for n, p, s in zip(sizes, patch_t, stride_t))


def window_ids(sample_shape: tuple[int, ...], patch) -> torch.Tensor:
    """Window id of every feature when windows of ``patch`` tile a sample (stride = patch),
    shaped like one sample: the layout of :class:`Occlusion` (an int patch groups all
    channels of a pixel of ``[C, H, W]`` samples; windows past the edge are cut there)."""
    patch_t, _, sizes = window_geometry(tuple(sample_shape), patch, None)
    ids = torch.zeros((), dtype=torch.long, device="cpu")
    for mask in window_masks(sizes, patch_t, patch_t):
        ids = ids.unsqueeze(-1) * mask.shape[0] + mask.long().argmax(0)
    return ids.expand(tuple(sample_shape)).contiguous()


def window_geometry(shape: tuple[int, ...], patch, stride) -> tuple[tuple, tuple, tuple]:
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


def resolve_groups(groups, sample_shape: tuple[int, ...], name: str = "groups") -> torch.Tensor:
    """Check an integer id tensor broadcastable to one sample; returns it expanded, ``long``.

    Ids must be ``0..G-1`` (``G = max + 1``; an id that is never used is an empty group).
    """
    _check_integer(groups, name, f"group ids shaped like one sample {tuple(sample_shape)}")
    ids = _broadcast_ids(groups, tuple(sample_shape), name,
                         f"one sample of shape {tuple(sample_shape)}; give one id per feature "
                         "(like Captum's feature_mask, without the batch axis)",
                         "ids 0..G-1, got the negative id")
    return ids.to(torch.long).contiguous()


def _check_integer(ids, name: str, what: str) -> None:
    """``ids`` must be a tensor of an integer dtype (a TypeError naming ``name`` otherwise)."""
    if not isinstance(ids, torch.Tensor):
        raise TypeError(f"{name} must be an integer tensor of {what}, got {type(ids).__name__}")
    if ids.dtype.is_floating_point or ids.is_complex() or ids.dtype == torch.bool:
        raise TypeError(f"{name} must be an integer tensor of {what}, got dtype {ids.dtype}")


def _broadcast_ids(ids: torch.Tensor, shape: tuple[int, ...], name: str, target: str,
                   nonnegative: str) -> torch.Tensor:
    """``ids`` broadcast to ``shape``, all >= 0 (ValueErrors naming ``name``, ``target``
    the shape's description and ``nonnegative`` the rule, e.g. "ids 0..G-1, got")."""
    try:
        full = torch.broadcast_to(ids, shape)
    except RuntimeError:
        raise ValueError(f"{name} of shape {tuple(ids.shape)} does not broadcast to "
                         f"{target}") from None
    if full.numel() and int(full.min()) < 0:
        raise ValueError(f"{name} must hold {nonnegative} {int(full.min())}")
    return full


def default_groups(sample_shape: tuple[int, ...], max_groups: int) -> torch.Tensor:
    """Square patches (at most ``max_groups``) for ``[C, H, W]`` samples, else every feature
    when there are at most ``max_groups``; otherwise a ValueError naming ``groups``."""
    n = math.prod(sample_shape)
    if len(sample_shape) == 3:
        h, w = sample_shape[1:]
        side = next(p for p in range(1, max(h, w) + 1)
                    if math.ceil(h / p) * math.ceil(w / p) <= max_groups)
        return window_ids(tuple(sample_shape), side)
    if n <= max_groups:
        return torch.arange(n, device="cpu").view(sample_shape)
    raise ValueError(f"groups is required for samples of shape {tuple(sample_shape)} with {n} "
                     f"features (> max_groups={max_groups}): pass groups=<integer id tensor shaped "
                     "like one sample>, or raise max_groups to pair every feature")


def mask_ids(feature_mask, layout: Layout, batch: int, device) -> torch.Tensor:
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


def player_ids(feature_mask, x: torch.Tensor, patch=None,
               layout: Layout | None = None) -> tuple[torch.Tensor, int]:
    """``(ids [R, n_features] long, G)``: the player of every feature, ``R = 1`` (one grouping
    shared by the batch) or ``B`` (a grouping per sample), ``G = max id + 1``.

    ``feature_mask`` follows Captum's convention: integer ids ``>= 0`` whose tensor, with
    leading 1s prepended up to the input's dimension (batch included), broadcasts to the
    input; a first dimension of ``B`` gives every sample its own grouping, a 0-d tensor makes
    the whole input one player. For tuple inputs (``layout`` with several inputs) it is a
    tuple of one such mask per input (an id shared by two inputs is one player). An id no
    feature uses (of a sample) is a player without features, whose value is 0 (Captum's
    convention). ``patch``: the square windows of Occlusion's layout as players (one-tensor
    inputs). Default: every feature its own player.
    """
    shapes = (tuple(x.shape[1:]),) if layout is None else layout.shapes
    batch = x.shape[0]
    if patch is not None:
        if feature_mask is not None:
            raise ValueError("give at most one of feature_mask and patch (both define players)")
        if len(shapes) > 1:
            raise ValueError("patch players are for one-tensor inputs; give tuple inputs a "
                             "feature_mask (one integer id tensor per input)")
        ids = window_ids(shapes[0], patch).reshape(1, -1).to(x.device)
        return ids, int(ids.max()) + 1
    if feature_mask is None:
        n = sum(math.prod(s) for s in shapes)
        return torch.arange(n, device=x.device)[None], n
    if len(shapes) > 1:
        if not isinstance(feature_mask, (tuple, list)) or len(feature_mask) != len(shapes):
            raise TypeError(f"feature_mask must be a tuple of {len(shapes)} integer id tensors "
                            "(one per input) for tuple inputs")
        masks, names = tuple(feature_mask), [f"feature_mask[{i}]" for i in range(len(shapes))]
    else:
        if isinstance(feature_mask, (tuple, list)) and len(feature_mask) == 1:
            feature_mask = feature_mask[0]
        masks, names = (feature_mask,), ["feature_mask"]
    parts = [_player_mask(m, shape, batch, name) for m, shape, name in zip(masks, shapes, names)]
    rows = max(p.shape[0] for p in parts)
    ids = torch.cat([p.expand(rows, -1) for p in parts], 1).to(x.device)
    return ids, int(ids.max()) + 1 if ids.numel() else 0


def _player_mask(mask, shape: tuple[int, ...], batch: int, name: str) -> torch.Tensor:
    """One input's mask as ``[1 or B, n]`` long ids (Captum's broadcasting, checked)."""
    _check_integer(mask, name, "player ids")
    full_dim = len(shape) + 1
    if mask.dim() > full_dim:
        raise ValueError(f"{name} has {mask.dim()} dimensions, more than the input's "
                         f"{full_dim} (batch included): {tuple(mask.shape)}")
    mask = mask.reshape((1,) * (full_dim - mask.dim()) + tuple(mask.shape))
    if mask.shape[0] not in (1, batch):
        raise ValueError(f"{name}'s first dimension must be 1 (shared) or {batch} (one grouping "
                         f"per sample), got shape {tuple(mask.shape)}")
    full = _broadcast_ids(mask, (mask.shape[0],) + tuple(shape), name,
                          f"the input [{batch}, {', '.join(map(str, shape))}]; give one id per "
                          "feature (like Captum's feature_mask)", "player ids >= 0, got")
    return full.reshape(mask.shape[0], -1).to(torch.long)
