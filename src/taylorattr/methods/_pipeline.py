"""One ``attribute`` call, step by step, as plain functions of the method and the call.

    prepare(method, inputs, ...)  -> Call         the one forward, Captum's conventions
    run(method, call)             -> Explanation  _attribute on the rows, then per rows:
        check(method, call, rows, result)         completeness check or delta
    self_check(...)                               the check, a failing sample recomputed
    delta(call, attributions, fx, refs, target)   sum(a) - (f(x) - mean_k f(x~_k))

The method takes part only through its ``_attribute`` (which returns an
:class:`~taylorattr.methods._call.Attributed`) and its declared
:class:`~taylorattr.methods._call.Traits`; no step is a method a subclass could override.
What a method adapts before ``prepare`` is declared there too: its ``route`` reads the call
as given (a :class:`Request`) and returns it adapted or answers it by a path of its own.
``attribute -> explain -> run -> _attribute`` is the whole stack of a call.

Checks that depend only on the model and the shapes of a call (the model's signature, a
layer's place in the model) are cached on the method, keyed by what they depend on, so a
small call pays them once (:func:`_once`).

Why one module: the steps of a call are one sequence (the forward that decides the
conventions, the rows, the check that reads what ``_attribute`` returned, the delta);
splitting them would scatter that order and the values passed between them.
"""
from __future__ import annotations

import inspect
import typing
import warnings
from collections.abc import Mapping
from contextlib import nullcontext
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

import torch

from .._validation import (
    broadcast_baselines,
    check_bool,
    check_inputs,
    model_output,
    read_output,
    run_model,
    select_output,
)
from ..baselines import Baseline, Noise, Point, ReferenceSet
from ..inputs import (
    InputModel,
    Layout,
    as_tuple,
    check_additional_args,
    check_batch,
    check_layer,
    layer_activations,
    point_baselines,
    repeat_option,
    slice_option,
    swap_layer,
)
from ..runtime import completeness as selfcheck
from . import _conventions as conventions
from ._call import Attributed, Call
from ._passes import chunk_ranges, default_chunk_rows, per_sample_sum

__all__ = ["Explanation", "Request", "Several", "check", "delta", "explained", "prepare",
           "read_call_output", "run", "self_check"]


@dataclass(frozen=True)
class Explanation:
    """What one ``attribute`` call computed: the attributions, the references they explain
    the change against (``[B, n, ...]``, None: ``f(x)`` itself), ``f(x)``, the resolved
    target and the convergence delta (None unless asked), and ``delta_of``, the difference
    the delta measures: ``"model"`` ``sum(a) - (f(x) - f(x~))``, the whole model at the
    references; ``"layer"`` (``layer=`` with ``layer_delta="layer"``) ``sum(a) - (f(x) -
    f(x | layer at its reference value, every other path at x))``."""

    attributions: Any  # a tensor, or a tuple of them (the inputs' structure)
    references: Any
    output: torch.Tensor
    target: torch.Tensor | None
    delta: torch.Tensor | None = None
    delta_of: str | None = None
    #: standard errors of sampled attributions (ShapleyValues), shaped like them; else None
    standard_error: object = None

    def result(self) -> Any:
        """``attributions``, or ``(attributions, delta)`` when the delta was asked for."""
        return self.attributions if self.delta is None else (self.attributions, self.delta)


@dataclass(frozen=True)
class Several:
    """The calls of several layers (``layer=[l_1, ..., l_k]``), one :class:`Explanation` each."""

    explanations: tuple

    def result(self) -> list:
        """One result per layer, in order (Captum's list for a list of layers)."""
        return [e.result() for e in self.explanations]


@dataclass(frozen=True)
class Request:
    """An ``explain`` call as given, before :func:`prepare`: what a method's declared route
    (:attr:`~taylorattr.methods._call.Traits.route`) reads, and returns adapted (or answers
    with an :class:`Explanation` of its own). ``options`` are the method's own, ``shared``
    the shared arguments but the layer, ``model`` None (the method's) or a view of it."""

    inputs: Any
    baselines: Any
    target: Any
    options: Mapping
    shared: Mapping
    layer: Any = None
    attribute_to_layer_input: bool = False
    model: Any = None


# ---- what depends only on the model and the shapes: once per method ---------------------
def _once(method, key: tuple, compute):
    """``compute()``, cached on ``method`` under ``key``: what it depends on, the objects
    (models, layers: by identity, and kept alive by the cache so that no identity is
    reused) and shapes, never a tensor's values. A rerun on another model, layer or shape
    computes it afresh; at most 64 entries are kept."""
    cache = method._checked
    ident = tuple(id(k) if not isinstance(k, (int, bool, tuple, str)) else k for k in key)
    hit = cache.get(ident)
    if hit is None:
        if len(cache) >= 64:
            cache.clear()
        hit = cache[ident] = (key, compute())
    return hit[1]


def _single_input(model) -> bool:
    """True when ``model.forward`` takes exactly one argument without a default."""
    try:
        params = inspect.signature(model.forward if hasattr(model, "forward") else model)
    except (TypeError, ValueError):
        return True
    required = [p for p in params.parameters.values()
                if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
                and p.default is p.empty]
    var = any(p.kind is p.VAR_POSITIONAL for p in params.parameters.values())
    return len(required) == 1 and not var


def single_input(method, model) -> bool:
    """:func:`_single_input` of ``model``, once per model object."""
    return _once(method, ("single", model), lambda: _single_input(model))


# ---- prepare ----------------------------------------------------------------------------
def prepare(method, inputs, baselines=None, target=None, *, options=None,
            additional_forward_args=None, layer=None, attribute_to_layer_input=False,
            layer_baselines=None, layer_delta: str = "layer",
            return_convergence_delta: bool = False, show_progress: bool = False,
            strict: bool = False, model=None, output=None) -> Call:
    """The call normalised once (:class:`~taylorattr.methods._call.Call`): arguments
    checked, the model run once on the inputs (with the graph when the method reuses its
    gradient), Captum's conventions decided from the inputs' dtypes and the output's shape
    (:mod:`._conventions`), target and ``f(x)`` resolved, baselines in the attributed
    tensor's layout, the model wrapped into the method's one-tensor view. ``model``: run
    this model instead of the method's own (a wrapper seeing the user's model as another
    method's call does). ``output``: the model's output at ``inputs`` when the caller has it
    (then no forward runs here; not for a method that reuses the forward's graph)."""
    traits = method.traits
    if output is not None and traits.gradient_at_inputs:
        raise ValueError(f"output: {type(method).__name__} reuses the graph of its own "
                         "forward of the inputs; give no output")
    want_delta = check_bool(return_convergence_delta, "return_convergence_delta")
    check_bool(show_progress, "show_progress")
    if check_bool(strict, "strict") and not traits.checked:
        raise ValueError(f"strict applies to the methods that check their "
                         f"completeness on every call; {type(method).__name__}'s "
                         "attributions are not complete by construction")
    if layer_delta not in ("layer", "model"):
        raise ValueError(f"layer_delta must be 'layer' or 'model', got {layer_delta!r}")
    if layer is None and layer_baselines is not None:
        raise ValueError("layer_baselines applies only with layer=")
    model = method.model if model is None else model
    if layer is None:
        check_layer(model, None, attribute_to_layer_input)
    else:  # the layer's place in the model: once per model, layer and side
        _once(method, ("layer", model, layer, attribute_to_layer_input),
              lambda: check_layer(model, layer, attribute_to_layer_input))
    flags = {"options": MappingProxyType(dict(options or {})), "want_delta": want_delta,
             "show_progress": show_progress, "strict": strict}
    if layer is None and additional_forward_args is None and \
            isinstance(inputs, torch.Tensor) and inputs.dim() >= 2 and \
            not conventions.discrete(inputs):
        return _prepare_plain(method, model, inputs, baselines, target, flags, output)
    return _prepare_structured(method, model, inputs, baselines, target,
                               additional_forward_args, layer, attribute_to_layer_input,
                               layer_baselines, layer_delta, flags, output)


def _prepare_plain(method, model, inputs, baselines, target, flags, output=None) -> Call:
    """One float tensor ``[B, ...]``, no additional arguments, no layer."""
    x = check_inputs(inputs).detach()
    if method.traits.gradient_at_inputs:
        x = x.clone().requires_grad_(True)
    if output is not None:
        out = output
    else:
        with torch.set_grad_enabled(method.traits.gradient_at_inputs):
            out = run_model(model, x)
    read = read_call_output(method, out, (x,), target, discrete=False, layer=None)
    if read.aggregate:
        return _aggregate_call(model, (x,), False, baselines, target, (), read, flags)
    layout = Layout.of((x,), False)
    return Call(read.wrap(model, (None,)), layout, x, _baselines(method, baselines, x.detach()),
                read.target, read.fx, inputs=(x.detach(),), **flags)


def read_call_output(method, out, parts, target, discrete: bool, layer, uneven=None):
    """The model's output at the inputs read by Captum's conventions: whole-batch
    (aggregate mode, perturbation methods), else :func:`taylorattr._validation.read_output`
    (beyond ``[B, C]`` flattened, tuple targets as columns, integer outputs of integer
    inputs carried as float64), checked."""
    batch = parts[0].shape[0]
    if not isinstance(out, torch.Tensor):
        raise TypeError(f"model must return a torch.Tensor, got {type(out).__name__}")
    if method.traits.perturbation and layer is None and (out.dim() == 0 or
                                                         out.shape[0] != batch):
        return conventions.Reading(out=out, aggregate=True)
    if uneven is not None:
        raise uneven
    like = parts[0] if discrete else next((p for p in parts if p.is_floating_point()), parts[0])
    _, flat, t, fx = read_output(out, target, like, discrete)
    return conventions.Reading(out=out, target=t, fx=fx, flat=flat, discrete=discrete)


def _prepare_structured(method, model, inputs, baselines, target, extra, layer, to_input,
                        layer_baselines, layer_delta, flags, output=None) -> Call:
    """Tuple inputs, additional forward arguments, layers, ``[B]`` and integer inputs
    (:mod:`taylorattr.inputs`, :mod:`._conventions`); ``layer_baselines``: point baselines
    given in the layer's space (Captum's ``LayerFeatureAblation``) instead of input
    baselines mapped through the model."""
    kind = method.traits.baseline_kind
    if layer_baselines is not None and kind != "point":
        raise ValueError("layer_baselines applies to point-baseline methods with layer=")
    against_model = layer_delta == "model" and layer is not None
    if against_model and flags["want_delta"] and (kind != "point"
                                                  or layer_baselines is not None):
        raise ValueError("layer_delta='model' measures f(x) - f(x~) at input baselines: "
                         "it applies to point-baseline methods without layer_baselines")
    parts, is_tuple = as_tuple(inputs)
    discrete = layer is None and any(conventions.discrete(p) for p in parts)
    if discrete:
        conventions.check_discrete(method, parts, is_tuple)
    try:
        batch, uneven = check_batch(parts, floats=layer is None and not discrete,
                                    vectors=True), None
    except ValueError as exc:  # inputs of different lengths: only a whole-batch output
        if not (method.traits.perturbation and layer is None) or parts[0].dim() == 0 or \
                not all(p.dim() for p in parts):
            raise
        batch, uneven = parts[0].shape[0], exc
    extra = check_additional_args(extra, batch)
    parts = tuple(p.detach() for p in parts)
    if output is not None:
        out = output
    else:
        name = "model (integer and bool inputs reach it as they are: does it take " \
            "them?)" if discrete else "model"
        with torch.no_grad():
            out = run_model(lambda _: model(*parts, *extra), parts[0], name)
    read = read_call_output(method, out, parts, target, discrete, layer, uneven)
    if read.aggregate:
        return _aggregate_call(model, parts, is_tuple, baselines, target, extra, read, flags)
    cast = None
    if discrete:  # carried as float64 (exact up to 2**53), cast back in every model call
        cast = tuple(out.dtype if conventions.discrete(p) else p.dtype for p in parts)
        dtypes = tuple(p.dtype for p in parts)
        parts = tuple(p.double() if conventions.discrete(p) else p for p in parts)
        check_batch(parts, vectors=True)
    else:
        dtypes = (None,) * len(parts)
    model = read.wrap(model, dtypes)
    t, fx = read.target, read.fx
    input_base = None
    if layer is None:
        layout = Layout.of(parts, is_tuple)
        x = layout.join(parts)
        base = _structured_baselines(method, baselines, parts, layout)
    else:
        h, h_tuple = as_tuple(layer_activations(model, layer, parts + extra, to_input))
        layout = Layout.of(h, h_tuple)
        x = layout.join(h)
        # point baselines are the inputs' (mapped below), distributions the layer's
        base = _structured_baselines(method, baselines, h, layout if h_tuple else None) \
            if kind == "distribution" else \
            _structured_baselines(method, baselines, parts, None)
        if layer_baselines is not None:
            base = layout.join(point_baselines(layer_baselines, h, "layer_baselines"))
        elif kind == "point":
            input_base = base
            base = layout.join(as_tuple(layer_activations(model, layer, base + extra,
                                                          to_input))[0])
            if base.shape != x.shape:
                raise ValueError(f"layer's {'input' if to_input else 'output'} at the "
                                 f"baselines has shape {tuple(base.shape)}, at the inputs "
                                 f"{tuple(x.shape)}; give baselines the model maps alike")
    context = (parts if layer is not None else ()) + tuple(
        a for a in extra if isinstance(a, torch.Tensor))
    if layer is None:  # the one-tensor view (a layer's view is made when the call runs)
        model = InputModel(model, layout, extra)
    return Call(model, layout, x, base, t, fx, inputs=parts, additional_forward_args=extra,
                layer=layer, attribute_to_layer_input=to_input, context=context,
                delta_of="model" if against_model or layer is None else "layer",
                input_baselines=input_base if against_model else None, cast=cast, **flags)


def _aggregate_call(model, parts, is_tuple, baselines, target, extra, read, flags) -> Call:
    """Captum's aggregate mode (:mod:`._conventions`): the call's whole-batch reading."""
    agg = conventions.Aggregate.of(model, parts, is_tuple, baselines, extra, read.out,
                                   target, flags["want_delta"])
    return Call(model, Layout.of(parts, is_tuple), parts[0], baselines, None, read.out,
                inputs=parts, additional_forward_args=extra, aggregate=agg, **flags)


def _point(method, baselines):
    """A point baseline's value (a :class:`~taylorattr.baselines.Point` unwrapped); another
    :class:`~taylorattr.baselines.Baseline` is refused."""
    if isinstance(baselines, Point):
        return baselines.value
    if isinstance(baselines, Baseline):
        raise TypeError(f"baselines: {type(method).__name__} takes a point baseline (a "
                        f"scalar, tensor or tuple), got a {type(baselines).__name__}")
    return baselines


def _structured_baselines(method, baselines, parts: tuple, layout: Layout | None):
    """Baselines for tuple inputs or a layer: point baselines per input (joined when a
    layout is given), distribution baselines joined into the flat layout."""
    kind = method.traits.baseline_kind
    if kind == "none":
        return None
    if kind == "point":
        full = point_baselines(_point(method, baselines), parts)
        return full if layout is None else layout.join(full)
    if layout is None or not layout.flat:  # distribution, one tensor: the method checks
        return baselines
    if isinstance(baselines, ReferenceSet):
        baselines = baselines.samples
    if isinstance(baselines, (tuple, list)):
        if len(baselines) != len(layout.shapes) or not all(
                isinstance(b, torch.Tensor) for b in baselines):
            raise TypeError(f"baselines must be a tuple of {len(layout.shapes)} reference "
                            "tensors [N, ...] (one per input), a ReferenceSet of such a "
                            "tuple, or a Noise")
        for i, (b, s) in enumerate(zip(baselines, layout.shapes)):
            if tuple(b.shape[1:]) != s or b.shape[0] != baselines[0].shape[0]:
                raise ValueError(f"baselines[{i}] must have shape [N, {', '.join(map(str, s))}]"
                                 f" with the same N for every input, got {tuple(b.shape)}")
        return ReferenceSet(layout.join(tuple(baselines)))
    if isinstance(baselines, Noise) and isinstance(baselines.around, (tuple, list)):
        around = tuple(broadcast_baselines(a, p, f"baselines.around[{i}]") for i, (a, p)
                       in enumerate(zip(baselines.around, parts)))
        return Noise(baselines.std, layout.join(around))
    if isinstance(baselines, Noise) or baselines is None:
        return baselines
    raise TypeError(f"baselines must be a tuple of reference tensors (one per input), a "
                    f"Noise or None for tuple inputs, got {type(baselines).__name__}")


def _baselines(method, baselines, x: torch.Tensor):
    """Point baselines broadcast to ``x``; a distribution as given."""
    if method.traits.baseline_kind == "point":
        if isinstance(baselines, Point):
            baselines = baselines.value
        elif isinstance(baselines, Baseline):
            raise TypeError(f"baselines: {type(method).__name__} takes a point baseline (a "
                            f"scalar or tensor), got a {type(baselines).__name__}")
        return broadcast_baselines(baselines, x)
    return baselines


# ---- run --------------------------------------------------------------------------------
def _row_sets(method, call: Call):
    """The rows ``_attribute`` runs on: the whole batch, or (a call whose model sees
    per-sample context) one sample at a time, the model set to that sample's context."""
    x, base, t, fx = call.x, call.baselines, call.target, call.fx
    if not call.context:
        yield x, base, t, fx, call.options
        return
    batch = x.shape[0]
    point, cut = method.traits.baseline_kind == "point", method.traits.batch_options
    for b in range(batch):
        call.model.set_context(tuple(c[b:b + 1] for c in call.context))
        yield (x[b:b + 1], base[b:b + 1] if point else base, None if t is None else t[b:b + 1],
               fx[b:b + 1], {k: slice_option(v, b, batch) if k in cut else v
                             for k, v in call.options.items()})


def run(method, call: Call) -> Explanation:
    """The :class:`Explanation` of a prepared call (:func:`prepare`): the method's
    ``_attribute`` on the whole batch (sample by sample when the model sees per-sample
    context), the completeness check and the delta of each (:func:`check`), attributions
    in the inputs' structure."""
    if call.aggregate is not None:
        return conventions.run_aggregate(method, call)
    layer = call.layer
    swap = swap_layer(call.model, layer, call.attribute_to_layer_input) \
        if layer is not None else nullcontext()
    done = []
    with swap as inject:
        view = call if layer is None else call.with_model(InputModel(
            call.model, call.layout, call.additional_forward_args, inject,
            n_inputs=len(call.inputs)))
        for rows in _row_sets(method, view):
            result = Attributed.of(method._attribute(view, *rows[:4],
                                                     show_progress=call.show_progress,
                                                     **rows[4]))
            done.append(check(method, view, rows, result))
    return _explanation(call, done)


def _explanation(call: Call, done: list) -> Explanation:
    """The :class:`Explanation` of the checked results of a call's row sets."""
    first, several = done[0][0], len(done) > 1
    attr = torch.cat([r.attributions for r, _ in done]) if several else first.attributions
    refs = first.references if first.references is None or not several else \
        torch.cat([r.references for r, _ in done])
    delta = (torch.cat([d for _, d in done]) if several else done[0][1]) if call.want_delta \
        else None
    if delta is not None and call.input_baselines is not None:  # Captum's: f at x~
        with torch.no_grad():
            out = model_output(lambda _: call.model(*call.input_baselines,
                                                    *call.additional_forward_args),
                               call.input_baselines[0], name="model (at the baselines)")
        delta = per_sample_sum(attr) - (call.fx - select_output(out, call.target)
                                        ).to(attr.dtype)
    layout = call.layout
    shapes = first.layer_shapes
    parts = layout.split(attr) if shapes is None else Layout(shapes, True).split(attr)
    if call.cast is not None:
        parts = tuple(a.to(d) for a, d in zip(parts, call.cast))
    refs = None if refs is None else layout.result(layout.split(refs, lead=2))
    errors = [r.standard_errors for r, _ in done]
    se = layout.result(layout.split(torch.cat(errors) if several else errors[0])) if all(
        e is not None for e in errors) else None
    result = layout.result(parts) if shapes is None else parts
    return Explanation(result, refs, call.fx.detach(), call.target, delta,
                       None if delta is None else call.delta_of, se)


def check(method, call: Call, rows, result: Attributed):
    """``(result, delta or None)`` of one row set: the attributions refused unless finite,
    checked for completeness where the method is complete (:func:`self_check`; the players'
    values where it reports their ``total``), the delta from the reported reference outputs
    or from a forward of the references (:func:`delta`)."""
    x, base, t, fx, options = rows
    finite(result.attributions)
    f_ref = result.reference_outputs if method.traits.checked else None
    if f_ref is None or result.total is not None:
        if f_ref is not None:  # the players' values are complete, not the features'
            total = typing.cast(torch.Tensor, result.total)
            got, bad, tol = selfcheck.misses(total.detach()[:, None], fx.detach(),
                                             f_ref.detach())
            if bool(bad.any()):
                selfcheck.report(type(method).__name__, got, fx, f_ref.detach(), bad, tol,
                                 False, method.traits.incomplete_cause, call.strict,
                                 casts=result.casts)
        return result, (delta(call, result.attributions, fx.detach(), result.references, t)
                        if call.want_delta else None)
    attr, d = self_check(method, call, x, base, t, fx.detach(), result, options)
    return Attributed(attr, result.references, standard_errors=result.standard_errors,
                      layer_shapes=result.layer_shapes), (d if call.want_delta else None)


def self_check(method, call, x, base, t, fx, result: Attributed, options):
    """``(attributions, delta)`` after the completeness check of
    :mod:`taylorattr.runtime.completeness`: failing samples recomputed once at batch 2 (the
    sample duplicated; point baselines), what stays beyond the tolerance warned about
    (raised with ``strict=True``), naming the casts below the attributions' dtype of the
    graph the method ran first; held to ``complete_within``. A recomputation that raises is
    reported (a warning naming its error), never skipped silently. A widened pass (its own
    ``pass_output``) is checked at its float32 values and rounded to ``x``'s dtype after."""
    traits = method.traits
    attr, casts, rtol = result.attributions, result.casts, traits.complete_within
    f_ref = typing.cast(torch.Tensor, result.reference_outputs).detach()
    widened = result.pass_output is not None
    if widened:
        fx = result.pass_output
    delta, bad, tol = selfcheck.misses(attr, fx, f_ref, rtol=rtol)
    tried = False
    if bool(bad.any()) and traits.baseline_kind == "point" and not rtol:
        tried = True
        attr, delta, f_ref = attr.clone(), delta.clone(), f_ref.clone()
        batch = x.shape[0]
        for i in bad.nonzero().flatten().tolist():
            rows = slice(i, i + 1)
            opts = {k: repeat_option(v, 2, batch, rows) if k in traits.batch_options else v
                    for k, v in options.items()}
            try:
                again = Attributed.of(method._attribute(
                    call, x[rows].detach().repeat_interleave(2, 0),
                    base[rows].repeat_interleave(2, 0),
                    None if t is None else t[rows].repeat_interleave(2, 0),
                    fx[rows].repeat_interleave(2, 0), show_progress=False, **opts))
                finite(again.attributions)
            except (ValueError, TypeError, RuntimeError) as exc:
                warnings.warn(f"{type(method).__name__}: recomputing sample {i} at batch 2 "
                              f"for its completeness check failed ({type(exc).__name__}: "
                              f"{exc}); the check's result below stands unrepaired",
                              selfcheck.CompletenessWarning,
                              stacklevel=6)  # self_check, check, run, explain, attribute
                continue
            r2 = again.reference_outputs
            if r2 is None or again.total is not None:
                continue
            r2 = r2.detach()
            d2, bad2, _ = selfcheck.misses(again.attributions[:1], fx[rows], r2[:1])
            if not bool(bad2.any()):
                attr[i], delta[i], f_ref[i] = again.attributions[0], d2[0], r2[0]
        delta, bad, tol = selfcheck.misses(attr, fx, f_ref)
    if bool(bad.any()):  # a discretisation's miss is not cancellation: no attr then
        selfcheck.report(type(method).__name__, delta, fx, f_ref, bad, tol, tried,
                         traits.incomplete_cause, call.strict,
                         attr=None if rtol else attr, casts=casts)
    if widened:
        return attr.to(x.dtype), delta.to(x.dtype)
    return attr, delta


def explained(call: Call, rows: torch.Tensor, target: torch.Tensor | None,
              chunk: int | None = None) -> torch.Tensor:
    """The explained output of ``rows`` (no grad) under ``call.model``, in chunks of
    ``chunk`` rows."""
    n = rows.shape[0]
    chunk = chunk or default_chunk_rows(rows, backward=False, model=call.model)
    outs = []
    with torch.no_grad():
        for a, b in chunk_ranges(n, chunk):
            outs.append(select_output(call.model(rows[a:b]),
                                      None if target is None else target[a:b]))
    return torch.cat(outs)


def delta(call, attr, fx, refs, t) -> torch.Tensor:
    """``sum(a) - (f(x) - mean_k f(refs_k))`` per sample; ``sum(a) - f(x)`` without refs."""
    if refs is None:
        value = fx
    else:
        batch, n = refs.shape[:2]
        rows = refs.reshape((batch * n,) + tuple(refs.shape[2:]))
        f_ref = explained(call, rows, None if t is None else t.repeat_interleave(n))
        value = fx - f_ref.view(batch, n).mean(1)
    return per_sample_sum(attr) - value.to(attr.dtype)


def finite(attributions: torch.Tensor) -> torch.Tensor:
    """Refuse non-finite attributions: the model was finite at the inputs, so NaN or inf
    here means it overflowed at an occluded copy, a path point or a baseline."""
    if not torch.isfinite(attributions).all():
        raise ValueError("model returned NaN or inf away from the inputs (at occluded copies, "
                         "integration-path points or baselines); the attributions are not finite")
    return attributions
