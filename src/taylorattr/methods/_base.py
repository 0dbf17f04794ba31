"""The one shared base of the attribution methods.

Every method follows one call contract (docs/design.md)::

    Method(model).attribute(inputs, [baselines,] target=None, *, <its options>,
                            return_convergence_delta=False, ...)

* ``inputs`` is a batch-first float tensor ``[B, ...]`` or a tuple of them; attributions
  have its structure and shapes. ``additional_forward_args`` (a value or a tuple) follow the
  inputs in every model call; ``layer=`` (a submodule) attributes to that layer's output
  (its input with ``attribute_to_layer_input=True``). :mod:`taylorattr.inputs` says how:
  every method computes on one tensor, the base class adapts the rest.
* ``target`` is None (the argmax of the model's output for each sample), an int, or a
  ``[B]`` integer tensor. The explained quantity is the model's output column
  ``target`` (a logit), or the output itself for models returning ``[B]``.
* With ``return_convergence_delta=True`` the call returns ``(attributions, delta)``,
  ``delta = sum(attributions) - (f(x) - f(baseline))`` per sample (Captum's sign).

One call is one pipeline: ``attribute`` binds its arguments to the method's signature
(:mod:`._call`), :meth:`AttributionMethod.explain` (the public entry point of drivers such
as :mod:`taylorattr.captum`) normalises them once into a frozen
:class:`~taylorattr.methods._call.Call` (:meth:`~AttributionMethod.prepare`: the one
forward of the inputs, Captum's conventions decided from dtypes and shapes) and
:meth:`~AttributionMethod.run` computes it: the method's ``_attribute`` on the call, the
completeness check and the delta. Nothing of a call is stored on the method object.

Why one module: the call contract (checks, target, structured inputs, chunked passes,
delta) is one sequence every method runs; splitting it would scatter that order.
"""
from __future__ import annotations

import functools
import inspect
from contextlib import nullcontext
from dataclasses import dataclass
from types import MappingProxyType

import torch

from .._validation import (
    broadcast_baselines,
    check_bool,
    check_inputs,
    check_model,
    check_output,
    flat_target,
    model_output,
    resolve_target,
    run_model,
    select_output,
    tuple_target,
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
from ..runtime.cost import Cost
from . import _conventions as conventions
from ._call import CONSTRUCTED, Call, attribute_for
from ._passes import (
    chunk_ranges,
    default_chunk_rows,
    per_sample_sum,
)

__all__ = ["AttributionMethod", "Call", "Explanation", "ImplicitBaselineMethod", "Several"]

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


@functools.cache
def _own_options(attribute) -> tuple[tuple[str, inspect.Parameter], ...]:
    """The keyword-only parameters of a method's ``_attribute`` but ``show_progress``."""
    params = inspect.signature(attribute).parameters
    return tuple((k, p) for k, p in params.items()
                 if p.kind is inspect.Parameter.KEYWORD_ONLY and k != "show_progress")


class AttributionMethod:
    """Base class: holds the model and does the work every method shares.

    ``attribute`` binds its arguments to the method's signature (its own options and the
    shared arguments, :mod:`taylorattr.methods._call`), :meth:`prepare` checks the flags
    and the inputs, runs the model once to resolve the target and the explained output
    ``f(x)``, turns ``baselines`` into what the method's :attr:`baseline_kind` needs and
    freezes all of it into a :class:`~taylorattr.methods._call.Call`; :meth:`run` calls the
    subclass's ``_attribute`` and, on request, computes the convergence delta from the
    reference points ``_attribute`` reports::

        _attribute(call, x, baselines, target, f_x, *, show_progress, **options)
            -> (attributions shaped like x, references [B, n, ...] or None)

    ``call.model`` is the model the arithmetic runs (rows shaped like ``x[0]``),
    ``call.layout`` the layout of ``x``; ``x, baselines, target, f_x`` are the rows this
    invocation explains (the whole batch, one sample of a structured call, or a sample
    recomputed by the completeness check). ``references`` are the points the attribution
    explains the change against (``delta = sum(a) - (f(x) - mean_k f(references_k))``);
    None means the method explains ``f(x)`` itself (epsilon-LRP). The method's own options
    are the keyword-only parameters of its ``_attribute``; ``attribute``'s signature names
    them; anything else is refused with a TypeError naming it.
    Subclasses implement ``_attribute`` only; they are final (not meant to be subclassed).
    """

    #: The registry name (``taylorattr.registry.METHODS``) of the method.
    name: str = ""
    #: ``"point"`` (``baselines`` is a scalar or tensor: one reference per sample),
    #: ``"distribution"`` (a reference set or noise: :mod:`taylorattr.baselines`) or
    #: ``"none"`` (an implicit zero reference; ``attribute`` takes no ``baselines``).
    baseline_kind: str = "point"
    #: Whether ``_attribute`` uses the gradient of ``f`` at the inputs: the base class then
    #: keeps the graph of its one forward (``x`` requires grad, ``f_x`` has the graph), so
    #: the method spends one backward pass and no second forward.
    gradient_at_inputs: bool = False

    #: Options whose values hold one entry per sample (leading dimension ``B``): cut to the
    #: sample when a method runs sample by sample (:mod:`taylorattr.inputs`).
    batch_options: tuple[str, ...] = ("draws", "feature_mask")
    #: Whether the method only evaluates the model on copies of the inputs with features
    #: replaced (the perturbation methods): it then also takes integer and bool inputs
    #: (token ids, categorical features) and models whose output is one value (or a few)
    #: for the whole batch, Captum's aggregate mode (:mod:`taylorattr.methods._conventions`).
    perturbation: bool = False
    #: Whether ``attribute`` takes options its signature cannot name (a NoiseTunnel around
    #: a method given at construction takes that method's options).
    open_options: bool = False
    #: The input-side arguments every ``attribute`` takes (not the method's own options).
    INPUT_ARGS = ("additional_forward_args", "layer", "attribute_to_layer_input",
                  "layer_baselines", "layer_delta")
    #: Whether the attributions are complete by construction, ``sum_i a_i = f(x) -
    #: mean_k f(x~_k)``: every call then checks it (:mod:`taylorattr.runtime.completeness`)
    #: from the explained outputs at the references that ``_attribute`` reports with
    #: :meth:`Call.report <taylorattr.methods._call.Call.report>` from its own passes (no
    #: extra model call), recomputes a failing sample at batch 2 (point baselines) and
    #: warns, or raises with ``strict=True``.
    complete: bool = False
    #: A method complete only up to a discretisation it controls (Integrated Gradients'
    #: quadrature) states its scale ``r`` here: it reports ``f(x~)`` as a complete method
    #: does, and its check accepts ``max(tol, r * max(|df|, sum_i |a_i|))``
    #: (:mod:`taylorattr.runtime.completeness`), without the batch-2 recomputation; 0: none.
    complete_within: float = 0.0
    #: The likely cause a failed completeness check names.
    incomplete_cause: str = ("a rule that is not exact on one of the model's operations, "
                             "or a wrong gradient from torch's autograd; please report it")

    def __init_subclass__(cls, **kw):
        super().__init_subclass__(**kw)
        if "attribute" not in cls.__dict__:  # its signature names the class's own options
            cls.attribute = attribute_for(cls)

    def __init__(self, model, *, layer=None, attribute_to_layer_input: bool = False) -> None:
        """``layer`` / ``attribute_to_layer_input``: the default of every ``attribute`` call
        (Captum's ``LayerIntegratedGradients(model, layer)`` style)."""
        check_model(model)
        for one in (layer if isinstance(layer, (list, tuple)) else [layer]):
            check_layer(model, one, attribute_to_layer_input)
        self.model = model
        # private: code that rebuilds a method from its public attributes (the audit) keeps
        # working; the layer is a per-call default, not a registry setting
        self._layer = layer
        self._to_layer_input = attribute_to_layer_input

    @property
    def model(self):
        """The user's model."""
        return self._model

    @model.setter
    def model(self, value) -> None:
        self._model = value

    def _check_plan(self) -> None:
        """Layer-wise methods: trace at construction (refusals come early), except for models
        explained through a layer or taking several inputs: those are traced at each call."""
        if self._layer is None and _single_input(self._model):
            self._get_plan()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({type(self.model).__name__})"

    @classmethod
    def options(cls) -> dict[str, inspect.Parameter]:
        """The method's own options: keyword-only parameters of ``_attribute`` (read once
        per function: ``inspect.signature`` costs about 45 us, a sixth of a small call)."""
        return dict(_own_options(cls._attribute))

    def _keep(self, explanation) -> None:
        """What ``attribute`` keeps of its result beside returning it (nothing here)."""

    # ---- the public entry points ----------------------------------------------------
    def explain(self, inputs, baselines=None, target=None, *,
                return_convergence_delta: bool = False, show_progress: bool = False,
                strict: bool = False, additional_forward_args=None, layer=CONSTRUCTED,
                attribute_to_layer_input=CONSTRUCTED, layer_baselines=None,
                layer_delta: str = "layer", model=None, **options) -> Explanation | Several:
        """``attribute``'s call, returning the whole :class:`Explanation` (references,
        ``f(x)``, target, delta) rather than its result: the entry point of code driving a
        method by its options (:mod:`taylorattr.captum`, the registry). ``options`` are the
        method's own; an unknown one is refused naming it. A list of layers gives
        :class:`Several`. ``model``: run this model in place of the method's own (a view of
        it another call prepared: integer inputs cast back, an output flattened)."""
        self._check_options(options)
        layer, to_input = self._layer_of(layer, attribute_to_layer_input)
        shared = {"return_convergence_delta": return_convergence_delta,
                  "show_progress": show_progress, "strict": strict,
                  "additional_forward_args": additional_forward_args,
                  "layer_baselines": layer_baselines, "layer_delta": layer_delta}
        if isinstance(layer, (list, tuple)):  # several layers: one call each
            if not layer:
                raise ValueError("layer must be a submodule or a non-empty list of them")
            return Several(tuple(self.explain(inputs, baselines, target, **shared, layer=m,
                                              attribute_to_layer_input=to_input, model=model,
                                              **options)
                                 for m in layer))
        return self.run(self.prepare(inputs, baselines, target, options=options, layer=layer,
                                     attribute_to_layer_input=to_input, model=model, **shared))

    def _check_options(self, options) -> None:
        unknown = sorted(set(options) - set(self.options()))
        if unknown:
            accepted = ", ".join(sorted(self.options())) or "none"
            raise TypeError(f"{type(self).__name__}.attribute got unexpected keyword argument(s) "
                            f"{', '.join(map(repr, unknown))} (method options: {accepted}; "
                            f"input arguments: {', '.join(self.INPUT_ARGS)})")

    def _layer_of(self, layer, to_input):
        """``(layer, attribute_to_layer_input)`` of a call: the constructor's unless given."""
        if layer is CONSTRUCTED:
            layer = self._layer
        if to_input is CONSTRUCTED:
            to_input = self._to_layer_input if layer is self._layer else False
        return layer, to_input

    def prepare(self, inputs, baselines=None, target=None, *, options=None,
                additional_forward_args=None, layer=None, attribute_to_layer_input=False,
                layer_baselines=None, layer_delta: str = "layer",
                return_convergence_delta: bool = False, show_progress: bool = False,
                strict: bool = False, model=None, output=None) -> Call:
        """The call normalised once (:class:`~taylorattr.methods._call.Call`): arguments
        checked, the model run once on the inputs (with the graph when the method reuses
        its gradient), Captum's conventions decided from the inputs' dtypes and the
        output's shape (:mod:`._conventions`), target and ``f(x)`` resolved, baselines in
        the attributed tensor's layout, the model wrapped into the method's one-tensor
        view. ``model``: run this model instead of the method's own (a wrapper seeing the
        user's model as another method's call does). ``output``: the model's output at
        ``inputs`` when the caller has it (then no forward runs here; not for a method that
        reuses the forward's graph, :attr:`gradient_at_inputs`)."""
        if output is not None and self.gradient_at_inputs:
            raise ValueError(f"output: {type(self).__name__} reuses the graph of its own "
                             "forward of the inputs; give no output")
        want_delta = check_bool(return_convergence_delta, "return_convergence_delta")
        check_bool(show_progress, "show_progress")
        if check_bool(strict, "strict") and not (self.complete or self.complete_within):
            raise ValueError(f"strict applies to the methods that check their "
                             f"completeness on every call; {type(self).__name__}'s "
                             "attributions are not complete by construction")
        _layer_delta(layer_delta)
        if layer is None and layer_baselines is not None:
            raise ValueError("layer_baselines applies only with layer=")
        model = self._model if model is None else model
        check_layer(model, layer, attribute_to_layer_input)
        flags = {"options": MappingProxyType(dict(options or {})), "want_delta": want_delta,
                 "show_progress": show_progress, "strict": strict}
        if layer is None and additional_forward_args is None and \
                isinstance(inputs, torch.Tensor) and inputs.dim() >= 2 and \
                not conventions.discrete(inputs):
            return self._prepare_plain(model, inputs, baselines, target, flags, output)
        return self._prepare_structured(model, inputs, baselines, target,
                                        additional_forward_args, layer,
                                        attribute_to_layer_input, layer_baselines,
                                        layer_delta, flags, output)

    def _prepare_plain(self, model, inputs, baselines, target, flags, output=None) -> Call:
        """One float tensor ``[B, ...]``, no additional arguments, no layer."""
        x = check_inputs(inputs).detach()
        if self.gradient_at_inputs:
            x = x.clone().requires_grad_(True)
        if output is not None:
            out = output
        else:
            with torch.set_grad_enabled(self.gradient_at_inputs):
                out = run_model(model, x)
        read = self._read_output(out, (x,), target, discrete=False, layer=None)
        if read.aggregate:
            return self._aggregate_call(model, (x,), False, baselines, target, (), read, flags)
        layout = Layout.of((x,), False)
        return Call(read.wrap(model, (None,)), layout, x, self._baselines(baselines, x.detach()),
                    read.target, read.fx, inputs=(x.detach(),), **flags)

    def _read_output(self, out, parts, target, discrete: bool, layer, uneven=None):
        """The model's output at the inputs read by Captum's conventions: whole-batch
        (aggregate mode), beyond ``[B, C]`` (flattened, tuple targets as columns), integer
        (carried as float64 for integer inputs), else as it is; then checked."""
        batch = parts[0].shape[0]
        if not isinstance(out, torch.Tensor):
            raise TypeError(f"model must return a torch.Tensor, got {type(out).__name__}")
        if self.perturbation and layer is None and (out.dim() == 0 or out.shape[0] != batch):
            return conventions.Reading(out=out, aggregate=True)
        if uneven is not None:
            raise uneven
        flat = out.dim() > 2
        if flat or tuple_target(target):
            target = flat_target(target, out)
        view = out
        if (discrete or flat) and not (out.is_floating_point() or out.is_complex()):
            view = out.double()  # integer outputs of integer inputs: exact in float64
        if flat:
            view = view.flatten(1)
        check_output(view, parts[0] if discrete else next(
            (p for p in parts if p.is_floating_point()), parts[0]), "model")
        t = resolve_target(target, view)
        return conventions.Reading(out=out, target=t, fx=select_output(view, t), flat=flat,
                                   discrete=discrete)

    def _prepare_structured(self, model, inputs, baselines, target, extra, layer, to_input,
                            layer_baselines, layer_delta, flags, output=None) -> Call:
        """Tuple inputs, additional forward arguments, layers, ``[B]`` and integer inputs
        (:mod:`taylorattr.inputs`, :mod:`._conventions`); ``layer_baselines``: point
        baselines given in the layer's space (Captum's ``LayerFeatureAblation``) instead of
        input baselines mapped through the model."""
        if layer_baselines is not None and self.baseline_kind != "point":
            raise ValueError("layer_baselines applies to point-baseline methods with layer=")
        against_model = layer_delta == "model" and layer is not None
        if against_model and flags["want_delta"] and (self.baseline_kind != "point"
                                                      or layer_baselines is not None):
            raise ValueError("layer_delta='model' measures f(x) - f(x~) at input baselines: "
                             "it applies to point-baseline methods without layer_baselines")
        parts, is_tuple = as_tuple(inputs)
        discrete = layer is None and any(conventions.discrete(p) for p in parts)
        if discrete:
            conventions.check_discrete(self, parts, is_tuple)
        try:
            batch, uneven = check_batch(parts, floats=layer is None and not discrete,
                                        vectors=True), None
        except ValueError as exc:  # inputs of different lengths: only a whole-batch output
            if not (self.perturbation and layer is None) or parts[0].dim() == 0 or \
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
        read = self._read_output(out, parts, target, discrete, layer, uneven)
        if read.aggregate:
            return self._aggregate_call(model, parts, is_tuple, baselines, target, extra, read,
                                        flags)
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
            base = self._structured_baselines(baselines, parts, layout)
        else:
            h, h_tuple = as_tuple(layer_activations(model, layer, parts + extra, to_input))
            layout = Layout.of(h, h_tuple)
            x = layout.join(h)
            # point baselines are the inputs' (mapped below), distributions the layer's
            base = self._structured_baselines(baselines, h, layout if h_tuple else None) \
                if self.baseline_kind == "distribution" else \
                self._structured_baselines(baselines, parts, None)
            if layer_baselines is not None:
                base = layout.join(point_baselines(layer_baselines, h, "layer_baselines"))
            elif self.baseline_kind == "point":
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

    def _aggregate_call(self, model, parts, is_tuple, baselines, target, extra, read,
                        flags) -> Call:
        """Captum's aggregate mode (:mod:`._conventions`): the call's whole-batch reading."""
        agg = conventions.Aggregate.of(model, parts, is_tuple, baselines, extra, read.out,
                                       target, flags["want_delta"])
        x = parts[0]
        return Call(model, Layout.of(parts, is_tuple), x, baselines, None, read.out,
                    inputs=parts, additional_forward_args=extra, aggregate=agg, **flags)

    def run(self, call: Call) -> Explanation:
        """The :class:`Explanation` of a prepared call (:meth:`prepare`): the method's
        ``_attribute`` on the whole batch (sample by sample when the model sees per-sample
        context), the completeness check and the delta, attributions in the inputs'
        structure."""
        if call.aggregate is not None:
            return conventions.run_aggregate(self, call)
        layer = call.layer
        swap = swap_layer(call.model, layer, call.attribute_to_layer_input) \
            if layer is not None else nullcontext()
        with swap as inject:
            view = call if layer is None else call.with_model(InputModel(
                call.model, call.layout, call.additional_forward_args, inject,
                n_inputs=len(call.inputs)))
            if not call.context:
                attr, refs, delta = self._core(view, call.x, call.baselines, call.target,
                                               call.fx, call.options)
            else:
                attr, refs, delta = self._per_sample(view)
        layout = call.layout
        if delta is not None and call.input_baselines is not None:  # Captum's: f at x~
            with torch.no_grad():
                out = model_output(lambda _: call.model(*call.input_baselines,
                                                        *call.additional_forward_args),
                                   call.input_baselines[0], name="model (at the baselines)")
            delta = per_sample_sum(attr) - (call.fx - select_output(out, call.target)
                                            ).to(attr.dtype)
        parts = layout.split(attr)
        if call.cast is not None:
            parts = tuple(a.to(d) for a, d in zip(parts, call.cast))
        refs = None if refs is None else layout.result(layout.split(refs, lead=2))
        errors = call.notes.get("standard_errors")
        se = layout.result(layout.split(torch.cat(errors))) if errors and all(
            e is not None for e in errors) else None
        return Explanation(layout.result(parts), refs, call.fx.detach(), call.target, delta,
                           None if delta is None else call.delta_of, se)

    def _per_sample(self, call: Call):
        """Run the method once per sample, the model seeing that sample's context."""
        x, base, t, fx = call.x, call.baselines, call.target, call.fx
        batch = x.shape[0]
        attrs, refs, deltas = [], [], []
        for b in range(batch):
            call.model.set_context(tuple(c[b:b + 1] for c in call.context))
            base_b = base[b:b + 1] if self.baseline_kind == "point" else base
            opts = {k: slice_option(v, b, batch) if k in self.batch_options else v
                    for k, v in call.options.items()}
            a, r, d = self._core(call, x[b:b + 1], base_b, None if t is None else t[b:b + 1],
                                 fx[b:b + 1], opts)
            attrs.append(a)
            refs.append(r)
            deltas.append(d)
        ref = None if refs[0] is None else torch.cat(refs)
        return torch.cat(attrs), ref, (torch.cat(deltas) if call.want_delta else None)

    def _core(self, call, x, base, t, fx, options):
        """``(attributions, references, delta or None)`` of these rows."""
        attr, refs, f_ref = self._attribute_reported(call, x, base, t, fx, options,
                                                     call.show_progress)
        want_delta = call.want_delta
        if f_ref is None:
            return attr, refs, (self._delta(call, attr, fx.detach(), refs, t) if want_delta
                                else None)
        f_ref, total = f_ref
        if total is not None:  # the players' values are complete, not the features'
            casts = call.casts()
            delta, bad, tol = selfcheck.misses(total[:, None], fx.detach(), f_ref)
            if bool(bad.any()):
                selfcheck.report(type(self).__name__, delta, fx, f_ref, bad, tol, False,
                                 self.incomplete_cause, call.strict, casts=casts)
            return attr, refs, (self._delta(call, attr, fx.detach(), refs, t) if want_delta
                                else None)
        attr, delta = self._self_check(call, x, base, t, fx.detach(), attr, f_ref, options)
        return attr, refs, (delta if want_delta else None)

    def _attribute_reported(self, call, x, base, t, fx, options, show_progress):
        """``_attribute``'s ``(attributions, references)`` and the explained outputs at the
        references it reported (:meth:`Call.report`; None: nothing to check)."""
        call.reported()  # nothing left over from an earlier invocation
        call.notes.pop("casts", None)
        attr, refs = self._attribute(call, x, base, t, fx, show_progress=show_progress,
                                     **options)
        f_ref = call.reported() if self.complete or self.complete_within else None
        self._finite(attr)
        return attr, refs, f_ref

    # ---- the cost ------------------------------------------------------------------
    def cost(self, inputs: torch.Tensor, baselines=None, target=None, *,
             return_convergence_delta: bool = False, **options):
        """The rows ``attribute(inputs, ..., **options)`` runs, counted from the method's
        plan without running the model (:class:`taylorattr.runtime.cost.Cost`): the one forward of
        ``inputs`` that resolves the target, the method's own rows (:meth:`_cost`) and, with
        ``return_convergence_delta``, one forward per reference. ``baselines`` and
        ``target`` do not change the counts. One-tensor inputs only; the automatic chunk
        size's one-off memory probe is not counted.
        """

        check_bool(return_convergence_delta, "return_convergence_delta")
        if not isinstance(inputs, torch.Tensor) or options.get("layer") is not None or \
                options.get("additional_forward_args") is not None:
            raise TypeError("cost counts the rows of one-tensor inputs without layer= or "
                            "additional_forward_args; give a [B, ...] tensor")
        unknown = sorted(set(options) - set(self.options()))
        if unknown:
            raise TypeError(f"{type(self).__name__}.cost got unexpected keyword argument(s) "
                            f"{', '.join(map(repr, unknown))} (method options: "
                            f"{', '.join(sorted(self.options())) or 'none'})")
        x = check_inputs(inputs).detach()
        own, n_refs = self._cost(x, {**options, "baselines": baselines})
        total = Cost(label=self.name, samples=x.shape[0], forward_rows=x.shape[0]) + own
        if return_convergence_delta and n_refs:
            total = total + Cost(forward_rows=x.shape[0] * n_refs)
        return total

    def _cost(self, x: torch.Tensor, options: dict):
        """``(Cost of the method's own rows, references per sample for the delta)``;
        ``options`` are the call's options and its ``baselines``.

        Each method counts from its own plan (windows, steps, samples, permutations);
        a method without an override raises NotImplementedError (its cost is unknown).
        :func:`gradient_pass_cost` is the cost of one forward + backward pass of ``rows``.
        """
        raise NotImplementedError(f"{type(self).__name__} does not count its rows yet "
                                  "(no _cost); its cost is unknown before running it")

    # ---- the shared work ----------------------------------------------------------
    def _own_layer(self, options: dict, layer, to_input, key: str, input_key: str) -> dict:
        """For a method with a layer of its own (Grad-CAM's ``conv_layer``, conductance's
        ``conductance_layer``): ``layer=`` (``attribute_to_layer_input``), here or at
        construction, names that layer (``key``; ``input_key`` its input instead), not the
        base class's layer attribution. Giving both, different, is refused."""
        options = dict(options)
        layer, to_input = self._layer_of(layer, to_input)
        if layer is not None:
            if options.get(key) is not None and options[key] is not layer:
                raise ValueError(f"give the layer once: {key}= or layer=")
            options[key] = layer
            options[input_key] = options.get(input_key, False) or to_input
        return options

    def _self_check(self, call, x, base, t, fx, attr, f_ref, options):
        """``(attributions, delta)`` after the completeness check of
        :mod:`taylorattr.runtime.completeness`: failing samples recomputed once at batch 2 (the
        sample duplicated; point baselines), what stays beyond the tolerance warned about
        (raised with ``strict=True``), naming the casts below the attributions' dtype of the
        graph the method ran (:meth:`Call.casts`) first; held to :attr:`complete_within`."""
        casts, rtol = call.casts(), self.complete_within
        delta, bad, tol = selfcheck.misses(attr, fx, f_ref, rtol=rtol)
        tried = False
        if bool(bad.any()) and self.baseline_kind == "point" and not rtol:
            tried = True
            attr, delta, f_ref = attr.clone(), delta.clone(), f_ref.clone()
            batch = x.shape[0]
            for i in bad.nonzero().flatten().tolist():
                rows = slice(i, i + 1)
                opts = {k: repeat_option(v, 2, batch, rows) if k in self.batch_options else v
                        for k, v in options.items()}
                try:
                    a2, _, r2 = self._attribute_reported(
                        call, x[rows].detach().repeat_interleave(2, 0),
                        base[rows].repeat_interleave(2, 0),
                        None if t is None else t[rows].repeat_interleave(2, 0),
                        fx[rows].repeat_interleave(2, 0), opts, False)
                except (ValueError, TypeError, RuntimeError):  # e.g. a per-sample context
                    continue  # of one row: no repair; the warning below stands
                if r2 is None or r2[1] is not None:
                    continue
                r2 = r2[0]
                d2, bad2, _ = selfcheck.misses(a2[:1], fx[rows], r2[:1])
                if not bool(bad2.any()):
                    attr[i], delta[i], f_ref[i] = a2[0], d2[0], r2[0]
            delta, bad, tol = selfcheck.misses(attr, fx, f_ref)
        if bool(bad.any()):  # a discretisation's miss is not cancellation: no attr then
            selfcheck.report(type(self).__name__, delta, fx, f_ref, bad, tol, tried,
                             self.incomplete_cause, call.strict,
                             attr=None if rtol else attr, casts=casts)
        return attr, delta

    def _structured_baselines(self, baselines, parts: tuple, layout: Layout | None):
        """Baselines for tuple inputs or a layer: point baselines per input (joined when a
        layout is given), distribution baselines joined into the flat layout."""
        kind = self.baseline_kind
        if kind == "none":
            return None
        if kind == "point":
            if isinstance(baselines, Point):
                baselines = baselines.value
            elif isinstance(baselines, Baseline):
                raise TypeError(f"baselines: {type(self).__name__} takes a point baseline (a "
                                f"scalar, tensor or tuple), got a {type(baselines).__name__}")
            full = point_baselines(baselines, parts)
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

    def _baselines(self, baselines, x: torch.Tensor):
        if self.baseline_kind == "point":
            if isinstance(baselines, Point):
                baselines = baselines.value
            elif isinstance(baselines, Baseline):
                raise TypeError(f"baselines: {type(self).__name__} takes a point baseline (a "
                                f"scalar or tensor), got a {type(baselines).__name__}")
            return broadcast_baselines(baselines, x)
        return baselines

    @staticmethod
    def _explained(call: Call, rows: torch.Tensor, target: torch.Tensor | None,
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

    def _delta(self, call, attr, fx, refs, t) -> torch.Tensor:
        """``sum(a) - (f(x) - mean_k f(refs_k))`` per sample; ``sum(a) - f(x)`` without refs."""
        if refs is None:
            explained = fx
        else:
            batch, n = refs.shape[:2]
            rows = refs.reshape((batch * n,) + tuple(refs.shape[2:]))
            f_ref = self._explained(call, rows, None if t is None else t.repeat_interleave(n))
            explained = fx - f_ref.view(batch, n).mean(1)
        return per_sample_sum(attr) - explained.to(attr.dtype)

    @staticmethod
    def _finite(attributions: torch.Tensor) -> torch.Tensor:
        """Refuse non-finite attributions: the model was finite at the inputs, so NaN or inf
        here means it overflowed at an occluded copy, a path point or a baseline."""
        if not torch.isfinite(attributions).all():
            raise ValueError("model returned NaN or inf away from the inputs (at occluded copies, "
                             "integration-path points or baselines); the attributions are not finite")
        return attributions

    def _attribute(self, call, x, baselines, target, fx, *, show_progress=False):  # pragma: no cover
        raise NotImplementedError


class ImplicitBaselineMethod(AttributionMethod):
    """A method with a fixed reference (the zero input): ``attribute`` takes no baselines."""

    baseline_kind = "none"


def _layer_delta(value) -> str:
    if value not in ("layer", "model"):
        raise ValueError(f"layer_delta must be 'layer' or 'model', got {value!r}")
    return value


@dataclass(frozen=True)
class Explanation:
    """What one ``attribute`` call computed: the attributions, the references they explain
    the change against (``[B, n, ...]``, None: ``f(x)`` itself), ``f(x)``, the resolved
    target and the convergence delta (None unless asked), and ``delta_of``, the difference
    the delta measures: ``"model"`` ``sum(a) - (f(x) - f(x~))``, the whole model at the
    references; ``"layer"`` (``layer=`` with ``layer_delta="layer"``) ``sum(a) - (f(x) -
    f(x | layer at its reference value, every other path at x))``."""

    attributions: torch.Tensor
    references: torch.Tensor | None
    output: torch.Tensor
    target: torch.Tensor | None
    delta: torch.Tensor | None = None
    delta_of: str | None = None
    #: standard errors of sampled attributions (ShapleyValues), shaped like them; else None
    standard_error: object = None

    def result(self):
        """``attributions``, or ``(attributions, delta)`` when the delta was asked for."""
        return self.attributions if self.delta is None else (self.attributions, self.delta)


@dataclass(frozen=True)
class Several:
    """The calls of several layers (``layer=[l_1, ..., l_k]``), one :class:`Explanation` each."""

    explanations: tuple

    def result(self):
        """One result per layer, in order (Captum's list for a list of layers)."""
        return [e.result() for e in self.explanations]


AttributionMethod.attribute = attribute_for(AttributionMethod)
