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
from dataclasses import replace
from typing import Any, Literal, overload

import torch

from .._validation import select_output
from ..groups import count_windows, player_ids, window_geometry, window_masks
from ..inputs import Layout
from ..runtime.cost import Cost
from ._base import Attributed, AttributionMethod
from ._call import CONSTRUCTED, Attributions, Baselines, Inputs, Target, given
from ._passes import check_optional_positive_int, default_chunk_rows, grid_blocks

__all__ = ["Occlusion"]


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
    traits = replace(AttributionMethod.traits, perturbation=True)

    @overload
    def attribute(self, inputs: Inputs, baselines: Baselines = ..., target: Target = ..., *,
                  patch: Any = ..., stride: Any = ..., feature_mask: Any = ...,
                  perturbations_per_eval: int | None = ...,
                  return_convergence_delta: Literal[False] = ..., show_progress: bool = ...,
                  strict: bool = ..., additional_forward_args: Any = ..., layer: Any = ...,
                  attribute_to_layer_input: Any = ..., layer_baselines: Any = ...,
                  layer_delta: str = ...) -> Attributions: ...

    @overload
    def attribute(self, inputs: Inputs, baselines: Baselines = ..., target: Target = ..., *,
                  patch: Any = ..., stride: Any = ..., feature_mask: Any = ...,
                  perturbations_per_eval: int | None = ...,
                  return_convergence_delta: Literal[True], show_progress: bool = ...,
                  strict: bool = ..., additional_forward_args: Any = ..., layer: Any = ...,
                  attribute_to_layer_input: Any = ..., layer_baselines: Any = ...,
                  layer_delta: str = ...) -> tuple[Attributions, torch.Tensor]: ...

    def attribute(self, inputs: Inputs, baselines: Baselines = 0.0, target: Target = None, *,
                  patch: Any = 1, stride: Any = None, feature_mask: Any = None,
                  perturbations_per_eval: int | None = None,
                  return_convergence_delta: bool = False, show_progress: bool = False,
                  strict: bool = False, additional_forward_args: Any = None,
                  layer: Any = CONSTRUCTED, attribute_to_layer_input: Any = CONSTRUCTED,
                  layer_baselines: Any = None,
                  layer_delta: str = "layer") -> Attributions | tuple[Attributions, torch.Tensor]:
        """Occlusion: attributions shaped like ``inputs`` (with
        ``return_convergence_delta=True`` and the delta ``[B]``); its options are
        ``_attribute``'s, the shared arguments :data:`~taylorattr.methods._call.SHARED_DOC`."""
        return self.explain(**given(locals())).result()

    def _attribute(self, call, x, base, t, fx, *, patch=1, stride=None, feature_mask=None,
                   perturbations_per_eval: int | None = None, show_progress: bool = False):
        """Options: ``patch`` window size, an int or a tuple (``(h, w)`` for images; one entry
        per input for tuple inputs); ``stride`` window step, same form as ``patch`` (default
        ``patch``); ``feature_mask`` integer group ids instead of windows (one mask per input
        for tuple inputs); ``perturbations_per_eval`` occluded copies per model call (rows
        across samples and windows; Captum counts windows per sample instead), default
        automatic."""
        chunk = check_optional_positive_int(perturbations_per_eval, "perturbations_per_eval")
        chunk = chunk or default_chunk_rows(x, backward=False, model=call.model)
        layout = call.layout or Layout.of((x,), False)
        if feature_mask is not None:
            if not (isinstance(patch, int) and patch == 1) or stride is not None:
                raise ValueError("give either feature_mask (groups) or patch/stride (windows), "
                                 "not both")
            ids, _ = player_ids(feature_mask, x, None, layout)  # Captum's mask reader
            return Attributed(self._ablate(call.model, x, base, t, fx, ids, chunk, show_progress),
                              base.unsqueeze(1))
        if not layout.flat:
            return Attributed(self._windows(call.model, x, base, t, fx, patch, stride, chunk,
                                            show_progress), base.unsqueeze(1))
        patches = layout.per_input(patch, "patch", lambda v: isinstance(v, int))
        strides = layout.per_input(stride, "stride", lambda v: v is None or isinstance(v, int))
        parts = []
        for i, (o, n, shape) in enumerate(zip(layout.offsets, layout.sizes, layout.shapes)):
            if n == 0:  # an input without features: no window to occlude
                parts.append(x.new_zeros(x.shape[0], 0))
                continue
            parts.append(self._windows(call.model, x, base, t, fx, patches[i], strides[i], chunk,
                                       show_progress, (o, n, shape)).reshape(x.shape[0], n))
        return Attributed(torch.cat(parts, 1), base.unsqueeze(1))

    def _cost(self, x, options):
        """One forward per (sample, window), or per (sample, group) with ``feature_mask``;
        one reference (the baseline)."""

        patch, stride = options.get("patch", 1), options.get("stride")
        mask = options.get("feature_mask")
        if mask is not None:
            ids, _ = player_ids(mask, x)
            return Cost(forward_rows=x.shape[0] * torch.unique(ids).numel()), 1
        return Cost(forward_rows=x.shape[0] * count_windows(tuple(x.shape[1:]), patch,
                                                             stride)), 1

    def _windows(self, model, x, base, t, fx, patch, stride, chunk, show_progress, part=None):
        """Window drops of one input (``part = (offset, size, shape)`` inside the flat
        tensor of tuple inputs; None: ``x`` itself), spread back to its features."""
        shape = tuple(x.shape[1:]) if part is None else (part[2] or (1,))  # [B]: one feature
        patch_t, stride_t, sizes = window_geometry(shape, patch, stride)
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

        drops = _drops(model, x, base, t, fx, n_windows, member, chunk, show_progress)
        # Spread the drops back: sum over the windows covering a feature, / their count.
        attr = drops.t().reshape((batch,) + tuple(counts))
        for m in masks:
            mf = m.to(attr.dtype)
            attr = torch.tensordot(attr, mf, dims=([1], [0]))  # window axis k -> feature axis k
            attr = attr / mf.sum(0)  # the new feature axis is appended last
        attr = attr.view((batch,) + (1,) * len(lead) + sizes).expand((batch,) + shape)
        return attr.to(x.dtype).contiguous()

    def _ablate(self, model, x, base, t, fx, ids, chunk, show_progress):
        """Group drops; each feature gets its group's drop (``ids``: ``[1 or B, N]``)."""
        values, inverse = torch.unique(ids, return_inverse=True)
        per_sample = ids.shape[0] > 1
        batch = x.shape[0]

        def member(g0, g1, s0=0, s1=1):
            rows = inverse[s0:s1] if per_sample else inverse
            g = torch.arange(g0, g1, device=x.device).view(-1, 1, 1)
            return (rows.unsqueeze(0) == g).view((g1 - g0, rows.shape[0]) + tuple(x.shape[1:]))

        drops = _drops(model, x, base, t, fx, values.numel(), member, chunk,
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
