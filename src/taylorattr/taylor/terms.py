"""Exact order-K Taylor terms of a model's output change (docs/design.md).

With ``delta = x - x~`` and the explained output ``f`` (a logit by default),

    df = f(x) - f(x~) = sum_{k>=1} P_k,   P_k = (-1)^(k+1)/k! D^k f(x)[delta, ..., delta]

and, per feature ``i``,

    first_i          = d_i f(x) delta_i
    independent_i    = sum_{k=2..K} (-1)^(k+1)/k! d_i^k f(x) delta_i^k
    attribution_i    = sum_{k=1..K} (1/k) delta_i d_i( D^(k-1) f(x)[delta^(k-1)] ) (-1)^(k+1)/(k-1)!
                     (the Integrated-Gradients share of every order, Theorem 5)
    interactive_ig_i = attribution_i - first_i - independent_i
    interactive      = g_K - sum_i (first_i + independent_i),   g_K = sum_{k=1..K} P_k
    error            = df - g_K

How: one Taylor-mode pass along ``-delta`` gives ``c_k = D^k f(x)[(-delta)^k]/k! = -P_k``.
The IG share of order ``k`` equals ``delta_i d/dx_i c_{k-1}(x) / k`` with ``delta`` held
fixed, so one backward pass through that same pass gives every share at once. The
independent terms are ``n`` univariate expansions along ``-delta_i e_i``, propagated
``chunk_size`` directions at a time (the primal is shared, so memory stays bounded).
Their cost grows with the square of the input size; with ``groups=`` the terms are
group-level (``[B, G]``) and need one expansion per group along ``-delta`` restricted to it.

Why one module: the per-feature and the group terms, their costs and the shared pass
that gives every share at once build on one prepared expansion (``_prepare``).
"""
from __future__ import annotations

import contextlib
import warnings
import weakref
from dataclasses import dataclass, replace

import torch
from torch import nn
from tqdm.auto import tqdm

from .. import _validation as V
from ..groups import mask_ids
from ..inputs import Layout, whole_batch_view
from ..runtime.batching import series_rows
from ..runtime.completeness import check_total, downcasts
from ..runtime.cost import Cost
from .first_order_check import check_cost, first_order, reverse_misses, verify
from .mode import piecewise_linear_ops, propagate, trace

__all__ = ["TaylorTerms", "group_expansions", "group_expansions_cost", "taylor_attribution",
           "taylor_attribution_cost", "taylor_terms", "taylor_terms_cost"]


@dataclass(frozen=True)
class TaylorTerms:
    """Taylor decomposition of ``f(x) - f(x~)`` up to order ``order``.

    Per-feature fields (``first``, ``independent``, ``interactive_ig``) are shaped like the
    inputs (a tuple of tensors for tuple inputs; the layer's output with ``layer=``), or
    ``[B, G]`` group-level fields when :func:`taylor_terms` was given ``groups``;
    per-sample fields are ``[B]``; ``orders[:, k-1]`` is ``P_k``.

    ``output_change`` is the change the terms expand and ``error = output_change - total``
    its remainder. With ``layer=`` the expanded function is the model with the layer's
    output ``h`` as its input, so ``output_change = f(h) - f(h~)``: the model with the
    layer's output at its value minus the model with the layer's output replaced by its
    baseline ``h~`` (the layer's output at ``baselines``), the rest of the model unchanged.
    """

    order: int
    first: torch.Tensor
    independent: torch.Tensor
    interactive_ig: torch.Tensor
    interactive: torch.Tensor
    total: torch.Tensor
    output_change: torch.Tensor
    error: torch.Tensor
    orders: torch.Tensor

    def attribution(self) -> torch.Tensor:
        """``first + independent + interactive_ig``: the order-K IG reformulation; sums to ``total``."""
        if isinstance(self.first, tuple):
            return tuple(a + b + c for a, b, c in
                         zip(self.first, self.independent, self.interactive_ig))
        return self.first + self.independent + self.interactive_ig

    def relative_error(self) -> torch.Tensor:
        """``|error| / |output_change|`` per sample."""
        return self.error.abs() / self.output_change.abs()


def _select(out: torch.Tensor, target: torch.Tensor | None) -> torch.Tensor:
    """Pick the target column of ``[B, C]`` or ``[K, B, m, C]``; leave ``[B]``/``[K, B, m]`` alone."""
    if target is None:
        return out
    if out.dim() == 2:
        return V.select_output(out, target)
    index = target.view(1, -1, 1, 1).expand(*out.shape[:3], 1)
    return out.gather(-1, index).squeeze(-1)


def _default_chunk(order: int, batch: int, n_features: int, entries: int | None = None,
                   max_rows: int | None = None) -> int:
    """Directions per pass: about 8192 series rows, at most 2^25 direction entries, and at
    most ``max_rows`` series rows (:func:`taylorattr.runtime.batching.series_rows`: the rows whose
    largest block stays off glibc's mmap path, measured on the model).

    ``n_features``: the directions to expand (features or groups); ``entries``: the
    features one direction spans (default ``n_features``; a group's direction spans the
    whole input, which bounds the chunk's input-sized tensors)."""
    return max(1, min(n_features, 8192 // (order * batch),
                      2**25 // (batch * (entries or n_features)),
                      (max_rows or 2**62) // batch))


def _expansion_chunk(model, inputs: torch.Tensor, order: int, groups: torch.Tensor,
                     chunk_size: int | None) -> int:
    """``chunk_size``, else the default directions per pass for expanding ``groups``
    (measured on ``model`` when one is given)."""
    if chunk_size is not None:
        return V.check_positive_int(chunk_size, "chunk_size")

    cap = None if model is None else series_rows(model, inputs, order)
    return _default_chunk(order, inputs.shape[0], int(groups.max()) + 1, groups.numel(), cap)


def _group_orders(gm, inputs, delta, target, groups, order, chunk_size, show_progress,
                  what: str = "group", sizer=None) -> torch.Tensor:
    """``P_k`` of the expansion along ``-delta`` restricted to each group: ``[B, G, K]``.

    ``groups`` holds a group id in ``0..G-1`` for every feature (shape ``inputs.shape[1:]``);
    the expansion of group ``g`` moves only its features, as occluding the group does.
    A group whose features all equal the baseline does not move: its terms are exactly 0
    and it is not propagated (on digits most pixels are background), so each sample
    expands only its moved groups, ``chunk_size`` of them per pass (None: the default,
    sized on ``sizer``, the user's model when it is the traced one, so its memory probe is
    cached across calls; :func:`_expansion_chunk`). ``what`` ("feature" or "group") names
    the expanded units in the progress bar, whose total is the passes.
    """
    chunk_size = _expansion_chunk(gm if sizer is None else sizer, inputs, order, groups,
                                  chunk_size)
    B = inputs.shape[0]
    ids = groups.reshape(-1).to(inputs.device)
    n_groups = int(ids.max()) + 1
    flat_delta = delta.reshape(B, -1)
    moved = _moved(delta, ids)
    # per sample, its moved groups first (in id order), then -1 as padding
    order_key = torch.where(moved, torch.arange(n_groups, device=ids.device), n_groups)
    table = torch.sort(order_key, dim=1).values
    table = torch.where(table == n_groups, -1, table)[:, :max(int(moved.sum(1).max()), 1)]
    result = torch.zeros(B, n_groups, order, dtype=inputs.dtype, device=inputs.device)
    starts = range(0, table.shape[1], chunk_size)
    desc = f"order-{order} expansions of {table.shape[1]} {what}s, {chunk_size} per pass"
    for start in tqdm(starts, desc=desc, total=len(starts), unit="pass",
                      disable=not show_progress, leave=False):
        chunk = table[:, start:start + chunk_size]  # [B, m] group ids, -1 = none
        member = ids[None, None, :] == chunk[:, :, None]  # [B, m, n]
        directions = -flat_delta[:, None, :] * member
        jet = propagate(gm, inputs, directions.view(B, chunk.shape[1], *inputs.shape[1:]), order)
        terms = -_select(jet.series, target).permute(1, 2, 0)  # [B, m, K]
        valid = chunk >= 0
        rows = torch.arange(B, device=ids.device)[:, None].expand_as(chunk)
        result[rows[valid], chunk[valid]] = terms[valid]
    return result


def _prepare(model, inputs, baselines, target, order, chunk_size=None):
    """Shared argument checks; returns the traced model, inputs, delta, target and None (no
    ``f(x~)``: :func:`_prepare_inputs` computes it only when asked)."""
    return _prepare_inputs(model, inputs, baselines, target, order, chunk_size)[:5]


def _prepare_inputs(model, inputs, baselines, target, order, chunk_size=None, structure=None,
                    baseline_output: bool = False, resolve: bool = True):
    """:func:`_prepare` that also returns the output at the baselines (with
    ``baseline_output``, else None; all of it, the caller selects the target) and
    the layout of the inputs (tuple inputs, ``additional_forward_args`` and ``layer`` in
    ``structure`` are mapped to one tensor by :func:`taylorattr.inputs.whole_batch_view`: the
    expansion direction is all inputs' deltas together). The kind of model (module,
    ``ExportedProgram``, ``.pt2`` path) is decided once, by :func:`~.mode.trace`; the model
    runs once at ``inputs`` to resolve the target (not with ``resolve=False``: the caller's
    Taylor-mode pass computes ``f(x)`` and resolves it, :func:`_ig_shares`) and, only when
    asked, once at the baselines."""
    program = trace(model)
    if isinstance(model, nn.Module):  # a program is run as it was exported: no mode to check
        V.check_model(model)
    model = program.model
    V.check_positive_int(order, "order")
    if chunk_size is not None:
        V.check_positive_int(chunk_size, "chunk_size")
    layout, active = None, contextlib.nullcontext
    if structure or not isinstance(inputs, torch.Tensor):
        view = whole_batch_view(model, inputs, baselines, **(structure or {}))
        with view.active():
            gm = trace(view.model, view.x)
        run, inputs, baselines, layout = gm, view.x, view.baselines, view.layout
        active = view.active  # the layer's output replaced while the view runs
        V.check_inputs(inputs, "inputs" if structure is None or "layer" not in structure
                       else "the layer's activations")
    else:
        V.check_inputs(inputs)
        baselines = V.broadcast_baselines(baselines, inputs)
        gm = trace(program, inputs)
        run = program
    if order >= 2:
        _warn_piecewise(model, gm, order)
    inputs = inputs.detach()
    f_base = None
    with torch.no_grad(), active():
        if resolve:
            target = V.resolve_target(target, V.model_output(run, inputs))
        if baseline_output:  # with layer=: f with the layer's output at its baseline
            f_base = V.model_output(run, baselines, name="model (at baselines)")
    return gm, inputs, inputs - baselines, target, f_base, layout, (run, active)


_WARNED: weakref.WeakSet = weakref.WeakSet()


def _warn_piecewise(model, gm, order: int) -> None:
    """Warn once per model that has piecewise-linear operations (ReLU, clamp, max-pool, ...)."""
    kinks = piecewise_linear_ops(gm)
    if not kinks or (isinstance(model, nn.Module) and model in _WARNED):
        return
    if isinstance(model, nn.Module):
        _WARNED.add(model)
    more = f" and {len(kinks) - 5} more" if len(kinks) > 5 else ""
    warnings.warn(
        f"model contains piecewise-linear operations ({'; '.join(kinks[:5])}{more}); their "
        f"derivatives of order >= 2 are zero almost everywhere, so the order-{order} terms "
        "reduce to first order inside each linear region. To see higher-order terms, analyse "
        "a smooth surrogate: ta.smooth(model, beta='auto', inputs=x) (it reports the beta it "
        "chose and the output gap). This warning is shown once per model.", stacklevel=4)


def _warn_degenerate(output_change: torch.Tensor, total: torch.Tensor, order: int) -> None:
    """Warn when the expansion explains almost nothing of ``f(x) - f(x~)``: ``|g_K| < 0.1
    |df|`` on a sample whose ``df`` is not negligible (e.g. a scale-invariant model, a
    bias-free layer followed by a normalisation, expanded towards a zero baseline)."""
    scale = output_change.abs()
    weak = (total.abs() < 0.1 * scale) & (scale > 1e-6 * (1 + scale.max()))
    if bool(weak.any()):
        samples = weak.nonzero().flatten().tolist()
        warnings.warn(
            f"the order-{order} expansion explains under 10% of f(x) - f(x~) for sample(s) "
            f"{samples[:10]} (error = {float((output_change - total)[weak].abs().max()):.3g}, "
            f"|df| = {float(scale[weak].max()):.3g}): the model may be (nearly) invariant along "
            "x - x~, as a bias-free layer followed by a normalisation is under scaling at a zero "
            "baseline. Use a baseline that is not a multiple of the input: a blurred input, the "
            "mean of a reference set (taylorattr.baselines.ReferenceSet) or noise "
            "(taylorattr.baselines.Noise).", stacklevel=3)


def _structure(additional_forward_args, layer, attribute_to_layer_input) -> dict | None:
    if additional_forward_args is None and layer is None and attribute_to_layer_input is False:
        return None
    return {"additional_forward_args": additional_forward_args, "layer": layer,
            "attribute_to_layer_input": attribute_to_layer_input}


def _split(layout, t: torch.Tensor):
    return t if layout is None else layout.result(layout.split(t))


def _ig_shares(gm, inputs, delta, target, order):
    """One Taylor-mode pass along ``-delta`` and its backward: ``(f(x), first, attribution,
    orders, target)``; ``target`` is resolved on the pass's own ``f(x)`` (no model call)."""
    x = inputs.clone().requires_grad_(True)
    jet = propagate(gm, x, -delta.unsqueeze(1), order)
    target = V.resolve_target(target, V.model_output(lambda _: jet.primal.detach(), inputs))
    f_x = _select(jet.primal, target)
    c = _select(jet.series, target)[:, :, 0]  # [K, B]: c_k = -P_k
    (grad,) = torch.autograd.grad(f_x.sum(), x, retain_graph=order > 1)
    first = (grad * delta).detach()
    if order > 1:
        shares = f_x + sum(c[k - 1] / (k + 1) for k in range(1, order))  # sum_k c_{k-1}/k
        (share_grad,) = torch.autograd.grad(shares.sum(), x)
        attribution = (share_grad * delta).detach()
    else:
        attribution = first
    return f_x.detach(), first, attribution, -c.detach().T.contiguous(), target


def _checked_shares(gm, runner, inputs, delta, target, order, layout, check, strict,
                    method):
    """:func:`_ig_shares`, then (``check``) the first order held to the model's own
    forward-mode derivative (:mod:`.first_order_check`): samples whose reverse sweep alone
    is wrong are recomputed at batch 2 (the sample duplicated), what stays wrong is
    warned about (raised with ``strict``)."""
    f_x, first, attribution, orders, target = _ig_shares(gm, inputs, delta, target, order)
    if not check:
        return f_x, first, attribution, orders, target
    run, active = runner
    casts = () if gm.last is None else downcasts(gm.last, inputs.dtype)
    smooth_only = bool(piecewise_linear_ops(gm))

    def reverse():
        return first.reshape(first.shape[0], -1).sum(1)
    found = first_order(run, inputs, delta, target, orders[:, 0], reverse(), f_x,
                        active=active, smooth_only=smooth_only)
    redo = reverse_misses(found)
    if redo and (layout is None or inputs.shape[0] == 1):  # a view holds B rows of context
        first, attribution = first.clone(), attribution.clone()
        for i in redo:
            two = slice(i, i + 1)
            try:
                _, f2, a2, _, _ = _ig_shares(gm, inputs[two].repeat_interleave(2, 0),
                                             delta[two].repeat_interleave(2, 0),
                                             None if target is None else
                                             target[two].repeat_interleave(2, 0), order)
            except (ValueError, TypeError, RuntimeError):
                continue  # the warning below stands
            first[i], attribution[i] = f2[0], a2[0]
        again = (reverse() - found.jvp).abs() <= found.tol
        found.reverse_bad = found.reverse_bad & ~again
    verify(found, orders[:, 0], reverse(), f_x, method, strict, casts, inputs.shape[0])
    return f_x, first, attribution, orders, target


def taylor_attribution(model, inputs, baselines=0.0, target=None, order: int = 2, *,
                       additional_forward_args=None, layer=None,
                       attribute_to_layer_input: bool = False, show_progress: bool = False,
                       check: bool = True, strict: bool = False):
    """The order-K Taylor attribution ``first + independent + interactive_ig`` alone.

    Each order's monomials are shared among their features in proportion to their
    exponents (Theorem 5), so the result sums to ``g_K``; order 1 is Gradient*Input
    w.r.t. the baseline. Costs one Taylor-mode pass and its backward sweeps
    (:func:`taylor_attribution_cost`); ``show_progress``: a tqdm bar (``leave=False``) over
    that one pass. ``check``: the first order is held to one forward-mode derivative of
    the model (:mod:`taylorattr.taylor.first_order_check`, about one forward; ``False``:
    not checked, nothing run); ``strict``: a wrong one raises instead of warning.
    """
    V.check_bool(show_progress, "show_progress")
    V.check_bool(check, "check")
    V.check_bool(strict, "strict")
    gm, inputs, delta, target, _, layout, runner = _prepare_inputs(
        model, inputs, baselines, target, order,
        structure=_structure(additional_forward_args, layer, attribute_to_layer_input),
        resolve=False)
    with tqdm(total=1, desc=f"order-{order} Taylor attribution", unit="pass",
              disable=not show_progress, leave=False) as bar:
        _, _, attribution, orders, _ = _checked_shares(gm, runner, inputs, delta, target,
                                                       order, layout, check, strict,
                                                       "taylor_attribution")
        bar.update(1)
    # self-check (Theorem 5): the shares sum to g_K = sum_k P_k, the change less the
    # stated remainder; from the same pass, no model call; at the precision of the graph
    # the pass ran (its casts below the inputs' dtype)
    check_total(attribution, orders.sum(1), "taylor_attribution",
                "the backward sweep of the Taylor-mode pass disagrees with the pass itself "
                "(a Taylor rule whose derivative is inconsistent with its series; please "
                "report the model)",
                casts=() if gm.last is None else downcasts(gm.last, inputs.dtype))
    return _split(layout, attribution)


def _resolve_groups(groups, feature_mask, delta, layout):
    """``groups`` or Captum's ``feature_mask`` -> ids ``0..G-1`` shaped like one sample of
    ``delta`` (the flat concatenation for tuple inputs), or None when neither is given."""
    if feature_mask is not None:
        if groups is not None:
            raise ValueError("give either groups (ids 0..G-1 shaped like one sample) or "
                             "feature_mask (Captum's form), not both")
        ids = mask_ids(feature_mask, layout or Layout.of((delta,), False), 1, delta.device)
        return torch.unique(ids, return_inverse=True)[1].view(delta.shape[1:])
    if groups is None:
        return None
    if layout is not None and layout.flat:
        per = layout.per_input(groups, "groups", lambda v: isinstance(v, torch.Tensor))
        for i, (g, shape) in enumerate(zip(per, layout.shapes)):
            if not isinstance(g, torch.Tensor) or tuple(g.shape) != shape:
                raise ValueError(f"groups[{i}] must be an integer tensor of the shape of one "
                                 f"sample of inputs[{i}] {shape}, got "
                                 f"{tuple(g.shape) if isinstance(g, torch.Tensor) else type(g).__name__}")
        groups = torch.cat([g.reshape(-1) for g in per])
    if not isinstance(groups, torch.Tensor):
        raise TypeError(f"groups must be an integer tensor, got {type(groups).__name__}")
    if groups.dtype.is_floating_point or groups.is_complex() or groups.dtype == torch.bool:
        raise TypeError(f"groups must be an integer tensor, got dtype {groups.dtype}")
    if groups.shape != delta.shape[1:]:
        raise ValueError(f"groups must have the shape of one sample {tuple(delta.shape[1:])}, got "
                         f"{tuple(groups.shape)}")
    if (groups < 0).any():
        raise ValueError(f"groups must hold ids 0..G-1, got the negative id {int(groups.min())}")
    return groups


def group_expansions(model, inputs, baselines=0.0, target=None, order: int = 2,
                     groups=None, chunk_size: int | None = None,
                     show_progress: bool = False, *, feature_mask=None,
                     additional_forward_args=None, layer=None,
                     attribute_to_layer_input: bool = False) -> torch.Tensor:
    """``g_K`` of the change obtained by moving only the features of one group to the baseline.

    ``groups``: integer ids ``0..G-1`` shaped like one sample (default: every feature its own
    group). Returns ``[B, G, K]`` with ``[..., k-1] = P_k(delta restricted to the group)``;
    summing over ``k`` gives the Taylor reformulation of occluding that group (Theorems 2, 3).
    Tuple inputs take one id tensor per input (ids shared across inputs form one group).
    ``feature_mask`` instead of ``groups``: Captum's form (any integer ids, shaped like the
    inputs with a first dimension of 1, one per input for tuples; as for
    :class:`~taylorattr.methods.Occlusion`); group ``g`` is then the ``g``-th smallest id.
    """
    V.check_bool(show_progress, "show_progress")
    gm, inputs, delta, target, _, layout, _ = _prepare_inputs(
        model, inputs, baselines, target, order, chunk_size,
        _structure(additional_forward_args, layer, attribute_to_layer_input))
    groups = _resolve_groups(groups, feature_mask, delta, layout)
    if groups is None:
        groups = torch.arange(delta[0].numel(), device=delta.device).view(delta.shape[1:])
    with torch.no_grad():
        return _group_orders(gm, inputs, delta, target, groups, order, chunk_size,
                             show_progress, sizer=model if layout is None else gm)


def taylor_terms(model, inputs, baselines=0.0, target=None, order: int = 2,
                 chunk_size: int | None = None, show_progress: bool = False, *,
                 groups=None, feature_mask=None, additional_forward_args=None, layer=None,
                 attribute_to_layer_input: bool = False, check: bool = True,
                 strict: bool = False) -> TaylorTerms:
    """Exact order-``order`` Taylor terms of ``f(inputs) - f(baselines)``.

    What each field costs: ``first``, ``attribution()``, ``total``, ``orders``,
    ``output_change`` and ``error`` come from one Taylor-mode pass along ``-delta`` and its
    backward sweep, at any order and input size. ``independent``, ``interactive_ig`` and
    ``interactive`` (for ``order >= 2``) also need one univariate expansion per moved
    feature, ``B x n`` Taylor-mode rows, so their cost grows with the square of the input
    size (150,528 expansions of a 3x224x224 image). For large inputs pass ``groups=``
    (e.g. 16x16-pixel patches): one expansion per moved group instead, and group-level
    fields.

    Args:
        model: an ``nn.Module`` mapping ``[B, ...]`` to ``[B, C]`` or ``[B]`` (captured with
            ``torch.export`` as core ATen operations, docs/supported_ops.md), a
            ``torch.export.ExportedProgram``, or the path of a ``.pt2`` file saved with
            ``torch.export.save`` (the model without its source code).
        inputs: ``[B, ...]`` float32/float64 tensor.
        baselines: scalar, tensor broadcastable to ``inputs``, or one baseline per sample.
        target: ``None`` (argmax class), an int, or a ``[B]`` tensor; ``None`` for ``[B]`` outputs.
        order: K >= 1.
        chunk_size: feature (or group) directions propagated together for the independent
            terms (default: about 8192 / (K * B), fewer for very large inputs); smaller uses
            less memory. Features equal to the baseline are not expanded (their terms are 0).
        show_progress: tqdm bar over the expansion passes (its total is the number of
            passes; it names the features or groups it expands).
        groups: integer ids ``0..G-1`` shaped like one sample (one tensor per input for tuple
            inputs; ids shared across inputs form one group), as for :func:`group_expansions`.
            Then ``first``, ``independent`` and ``interactive_ig`` are **group-level, shaped
            ``[B, G]``** (one tensor, also for tuple inputs or ``layer=``): ``first`` and the
            IG share summed within each group, ``independent[:, g] = sum_{k>=2} P_k(delta
            restricted to group g)`` (the group's own expansion, with every interaction
            *inside* the group), and ``interactive = total - sum_g (first_g +
            independent_g)`` holds only the interactions *between* groups. ``first +
            independent + interactive_ig`` still sums to ``total`` over ``G``. An id that
            no feature carries gives a zero column. Cost: one expansion per moved group.
        feature_mask: Captum's form of ``groups`` (any integer ids shaped like the inputs
            with a first dimension of 1, one per input for tuples); group ``g`` is the
            ``g``-th smallest id. Give ``groups`` or ``feature_mask``, not both.
        additional_forward_args, layer, attribute_to_layer_input: as for the methods
            (:mod:`taylorattr.inputs`); ``inputs`` may also be a tuple of tensors, with
            ``baselines`` a scalar or one entry per input. The expansion direction is then
            all inputs' deltas together (fields per input), or the layer's ``h - h~``;
            with ``layer=``, ``output_change`` is ``f(h) - f(h~)``, the model run with the
            layer's output at its value and at its baseline ``h~`` (the layer's output at
            ``baselines``), and ``error`` its remainder (:class:`TaylorTerms`).
        check: hold the first order (``orders[:, 0]`` and ``first``) to one forward-mode
            derivative of the model at ``inputs`` along ``x - x~``
            (:mod:`taylorattr.taylor.first_order_check`: ``B`` forward rows, central
            differences only on a disagreement; a wrong one warns with its likely cause,
            a cast below the inputs' precision named first). ``False``: not checked.
        strict: raise :class:`~taylorattr.runtime.completeness.CompletenessError` instead.
    """
    V.check_bool(show_progress, "show_progress")
    V.check_bool(check, "check")
    V.check_bool(strict, "strict")
    gm, inputs, delta, target, f_base, layout, runner = _prepare_inputs(
        model, inputs, baselines, target, order, chunk_size,
        _structure(additional_forward_args, layer, attribute_to_layer_input),
        baseline_output=True, resolve=False)
    groups = _resolve_groups(groups, feature_mask, delta, layout)
    sizer = model if layout is None else gm
    f_x, first, attribution, orders, target = _checked_shares(
        gm, runner, inputs, delta, target, order, layout, check, strict, "taylor_terms")
    f_base = V.select_output(f_base, target)
    total = orders.sum(1)
    if groups is not None:  # group-level fields: one [B, G] tensor whatever the layout
        first, attribution, independent = _grouped_fields(
            gm, inputs, delta, target, groups, order, chunk_size, show_progress, first,
            attribution, sizer)
        layout = None
    elif order >= 2:
        singletons = torch.arange(delta[0].numel(), device=delta.device).view(delta.shape[1:])
        with torch.no_grad():
            per_feature = _group_orders(gm, inputs, delta, target, singletons, order,
                                        chunk_size, show_progress, "feature", sizer)
        independent = per_feature[..., 1:].sum(-1).view_as(delta)
    else:
        independent = torch.zeros_like(first)
    output_change = f_x - f_base
    _warn_degenerate(output_change, total, order)
    separable = (first + independent).flatten(1).sum(1)
    return TaylorTerms(
        order=order,
        first=_split(layout, first),
        independent=_split(layout, independent),
        interactive_ig=_split(layout, attribution - first - independent),
        interactive=total - separable,
        total=total,
        output_change=output_change,
        error=output_change - total,
        orders=orders,
    )


def _grouped_fields(gm, inputs, delta, target, groups, order, chunk_size, show_progress,
                    first, attribution, sizer):
    """``first`` and the IG share summed within each group, and each group's independent
    term ``sum_{k>=2} P_k(delta restricted to the group)``: three ``[B, G]`` tensors."""
    B = inputs.shape[0]
    ids = groups.reshape(-1).to(inputs.device)
    n_groups = int(ids.max()) + 1

    def per_group(t):
        return t.new_zeros(B, n_groups).index_add_(1, ids, t.reshape(B, -1))

    first_g, attribution_g = per_group(first), per_group(attribution)
    if order < 2:
        return first_g, attribution_g, torch.zeros_like(first_g)
    with torch.no_grad():
        expansions = _group_orders(gm, inputs, delta, target, groups, order, chunk_size,
                                   show_progress, "group", sizer)
    return first_g, attribution_g, expansions[..., 1:].sum(-1)


# ----------------------------------------------------------------------------- cost
def _moved(delta: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """``[B, G]``: whether each sample moves any feature of each group (``ids``: the
    flat group id of every feature); unmoved groups are not expanded."""
    B = delta.shape[0]
    return torch.zeros(B, int(ids.max()) + 1, device=ids.device).index_add_(
        1, ids, (delta.reshape(B, -1) != 0).to(torch.float32)) > 0


def _moved_width(delta: torch.Tensor, groups: torch.Tensor) -> int:
    """The directions each sample expands (its moved groups), as many for every sample:
    the widest sample's count (at least 1), as :func:`_group_orders` pads them."""
    return max(int(_moved(delta, groups.reshape(-1).to(delta.device)).sum(1).max()), 1)


def _expansions_cost(B: int, width: int, order: int, chunk: int):
    return Cost(taylor_passes=-(-width // chunk), taylor_rows=B * width, order=order)


def group_expansions_cost(inputs: torch.Tensor, baselines=0.0, order: int = 2, groups=None,
                          chunk_size: int | None = None, model=None):
    """The rows :func:`group_expansions` runs on one-tensor inputs (a
    :class:`~taylorattr.runtime.cost.Cost`): one forward of the batch (the inputs, which
    resolve the target; ``f(x~)`` is not computed) and, per sample, one order-``order``
    Taylor-mode row per moved group, ``chunk_size`` directions per pass (the widest sample sets the passes). Runs no model; without
    ``chunk_size`` the passes are those the run makes on ``model`` when it is given (its
    memory per row caps the default chunk), else the fewest the run can make."""

    V.check_positive_int(order, "order")
    inputs = V.check_inputs(inputs)
    delta = inputs - V.broadcast_baselines(baselines, inputs)
    if groups is None:
        groups = torch.arange(delta[0].numel(), device=delta.device).view(delta.shape[1:])
    if not isinstance(groups, torch.Tensor) or groups.shape != delta.shape[1:]:
        raise ValueError(f"groups must be an integer tensor of the shape of one sample "
                         f"{tuple(delta.shape[1:])}")
    B = inputs.shape[0]
    cs = _expansion_chunk(model, inputs, order, groups, chunk_size)
    return Cost(label="group expansions", samples=B, forward_rows=B) + \
        _expansions_cost(B, _moved_width(delta, groups), order, cs)


def taylor_attribution_cost(inputs: torch.Tensor, baselines=0.0, order: int = 2,
                            check: bool = True):
    """The rows :func:`taylor_attribution` runs on one-tensor inputs: no forward (the
    Taylor-mode pass computes ``f(x)`` and resolves the target on it; ``f(x~)`` is not
    computed), one Taylor-mode pass along ``-delta`` (``B`` rows) swept backward once
    (order 1) or twice, and with ``check`` the first-order check's forward-mode pass of the
    batch (``B`` forward rows, :func:`~taylorattr.taylor.first_order_check.check_cost`);
    those of :func:`taylor_terms` without its forward at the baselines and its
    per-feature expansions. Runs no model."""

    V.check_positive_int(order, "order")
    B = V.check_inputs(inputs).shape[0]
    cost = Cost(label="taylor attribution", samples=B, forward_rows=0, taylor_passes=1,
                taylor_rows=B, taylor_backward_rows=B * (2 if order > 1 else 1), order=order)
    return cost + check_cost(inputs) if V.check_bool(check, "check") else cost


def taylor_terms_cost(inputs: torch.Tensor, baselines=0.0, order: int = 2,
                      chunk_size: int | None = None, groups=None, model=None,
                      check: bool = True):
    """The rows :func:`taylor_terms` runs on one-tensor inputs: one forward of the batch
    at the baselines (``f(x~)``, reported; ``f(x)`` comes from the Taylor-mode pass), one
    Taylor-mode pass along ``-delta`` (``B`` rows) swept backward once (order 1) or
    twice, and for ``order >= 2`` one univariate expansion per moved feature and sample
    (``B x`` the widest sample's moved features), or with ``groups`` (ids ``0..G-1`` shaped
    like one sample) one per moved group (``B x`` the widest sample's moved groups),
    ``chunk_size`` directions per pass. Runs no model (``model``: as for
    :func:`group_expansions_cost`; ``check``: the first-order check's ``B`` forward rows,
    as for :func:`taylor_attribution_cost`)."""
    cost = replace(taylor_attribution_cost(inputs, baselines, order, check),
                   label="taylor terms")
    inputs = V.check_inputs(inputs)
    delta = inputs - V.broadcast_baselines(baselines, inputs)
    B = inputs.shape[0]
    cost = cost + Cost(forward_rows=B)  # f(x~)
    if order >= 2:
        if groups is None:
            groups = torch.arange(delta[0].numel(), device=delta.device).view(delta.shape[1:])
        else:
            groups = _resolve_groups(groups, None, delta, None)
        cs = _expansion_chunk(model, inputs, order, groups, chunk_size)
        cost = cost + _expansions_cost(B, _moved_width(delta, groups), order, cs)
    return cost
