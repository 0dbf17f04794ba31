"""The one shared base of the attribution methods.

Every method follows one call contract (docs/design.md)::

    Method(model).attribute(inputs, [baselines,] target=None, ...,
                            return_convergence_delta=False)

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

This module holds what the methods share: argument checks, the chunked passes and the
delta. Nothing here repairs an input; every error names the offending argument.

Why one module: the call contract (checks, target, structured inputs, chunked passes,
delta) is one sequence every method runs; splitting it would scatter that order.
"""
from __future__ import annotations

import inspect
from contextlib import nullcontext
from dataclasses import dataclass

import torch

from .._validation import (
    broadcast_baselines,
    check_bool,
    check_inputs,
    check_model,
    model_output,
    resolve_target,
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
from ..runtime.cost import Cost
from . import _conventions as conventions
from ._passes import (
    chunk_ranges,
    default_chunk_rows,
    per_sample_sum,
)

__all__ = ["AttributionMethod", "Explanation", "ImplicitBaselineMethod", "Several"]

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


class AttributionMethod:
    """Base class: holds the model and does the work every method shares.

    ``attribute`` checks the flags and the inputs, runs the model once to resolve the
    target and the explained output ``f(x)``, turns ``baselines`` into what the method's
    :attr:`baseline_kind` needs, calls the subclass's ``_attribute`` and, on request,
    computes the convergence delta from the reference points ``_attribute`` reports::

        _attribute(x, baselines, target, f_x, *, show_progress, **options)
            -> (attributions shaped like x, references [B, n, ...] or None)

    ``references`` are the points the attribution explains the change against
    (``delta = sum(a) - (f(x) - mean_k f(references_k))``); None means the method explains
    ``f(x)`` itself (epsilon-LRP). The method's own options are the keyword-only
    parameters of its ``_attribute``; anything else is refused with a TypeError naming it.
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
    #: The input-side arguments every ``attribute`` takes (not the method's own options).
    INPUT_ARGS = ("additional_forward_args", "layer", "attribute_to_layer_input",
                  "layer_baselines", "layer_delta")
    #: Whether the attributions are complete by construction, ``sum_i a_i = f(x) -
    #: mean_k f(x~_k)``: every call then checks it (:mod:`taylorattr.runtime.completeness`)
    #: from the explained outputs at the references that ``_attribute`` hands to
    #: :meth:`_reference_outputs` from its own passes (no extra model call), recomputes a
    #: failing sample at batch 2 (point baselines) and warns, or raises with ``strict=True``.
    complete: bool = False
    #: The likely cause a failed completeness check names.
    incomplete_cause: str = ("a rule that is not exact on one of the model's operations, "
                             "or a wrong gradient from torch's autograd; please report it")

    _active = None   # the wrapped model during a structured call
    _layout = None   # the attributed tensors' layout during a call
    _strict = False  # strict=True of the call: a failed completeness check raises
    _ref_out = None  # the explained outputs at the references _attribute reported, [B]

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
        """The user's model (during a call on tuple inputs / a layer: its one-tensor view)."""
        return self._active if self._active is not None else self._model

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

    def attribute(self, inputs: torch.Tensor, baselines=0.0, target=None, *,
                  return_convergence_delta: bool = False, show_progress: bool = False,
                  **options):
        """Attributions ``[B, ...]`` shaped like ``inputs``.

        Args:
            inputs: ``[B, ...]`` float32/float64 batch.
            baselines: the reference (see :attr:`baseline_kind` and
                :mod:`taylorattr.baselines`): a scalar, a tensor broadcastable to ``inputs``
                or one baseline per sample, for point methods.
            target: None (argmax class), an int, or a ``[B]`` integer tensor.
            return_convergence_delta: also return ``sum(a) - (f(x) - f(baselines))`` per
                sample (Captum's sign), averaged over the references a method draws.
                Its floor is the arithmetic's: about 1e-7 of ``|f(x) - f(baselines)|`` in
                float32 on the CPU, but on CUDA float32 convolutions run in TF32 by default
                (a 10-bit mantissa), so a complete method's delta is about 1e-4 relative
                (ResNet-50 DeepLIFT on an H200: 1.2e-4 of ``|df|``). For float32's own
                precision set ``torch.backends.cudnn.allow_tf32 = False`` and
                ``torch.backends.cuda.matmul.allow_tf32 = False`` (or use float64). In
                float16/bfloat16 (sums accumulated in float32) expect about 1e-2.
            additional_forward_args (option): a value or tuple passed after the inputs to
                every model call; tensors in it are batch-first ``[B, ...]``.
            layer (option): a submodule (or a list of them: a list of results, one per layer);
                attributions are then w.r.t. its output (input with
                ``attribute_to_layer_input=True``), ``baselines`` stay input baselines.
            layer_delta (option): what the delta measures with ``layer=`` (the result's
                :attr:`Explanation.delta_of`): ``"layer"`` (default, the library's
                convention) ``f(x) - f(x | layer at its baseline value, every other path
                at x)``, the change the layer attributions are complete for; ``"model"``
                (Captum's ``Layer*`` convention) ``f(x) - f(x~)``, the whole model at the
                input baselines (one forward more). They differ where other paths
                bypass the layer (RoBERTa's position ids computed from ``input_ids``, a
                tabular model's columns outside the embedding).
            (tuple inputs: ``baselines`` is a scalar or a tuple with one entry per input)
            show_progress: a tqdm bar over the method's chunks.
            **options: the method's own options (the keyword-only parameters of its
                ``_attribute``, e.g. ``n_steps`` for Integrated Gradients).
        """
        return self._run(inputs, baselines, target, options, show_progress,
                         return_convergence_delta).result()

    @classmethod
    def options(cls) -> dict[str, inspect.Parameter]:
        """The method's own options: keyword-only parameters of ``_attribute``."""
        params = inspect.signature(cls._attribute).parameters
        return {k: p for k, p in params.items()
                if p.kind is inspect.Parameter.KEYWORD_ONLY and k != "show_progress"}

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
    def _run(self, inputs, baselines, target, options: dict, show_progress,
             return_convergence_delta) -> Explanation:
        """Everything ``attribute`` does, with the references kept (the audit needs them)."""
        check_bool(return_convergence_delta, "return_convergence_delta")
        check_bool(show_progress, "show_progress")
        if "strict" in options:
            options = dict(options)
            strict = check_bool(options.pop("strict"), "strict")
            if strict and not self.complete:
                raise ValueError(f"strict applies to the methods that check their "
                                 f"completeness on every call; {type(self).__name__}'s "
                                 "attributions are not complete by construction")
            previous, self._strict = self._strict, strict
            try:
                return self._run(inputs, baselines, target, options, show_progress,
                                 return_convergence_delta)
            finally:
                self._strict = previous
        unknown = sorted(set(options) - set(self.options()) - set(self.INPUT_ARGS))
        if unknown:
            accepted = ", ".join(sorted(self.options())) or "none"
            raise TypeError(f"{type(self).__name__}.attribute got unexpected keyword argument(s) "
                            f"{', '.join(map(repr, unknown))} (method options: {accepted}; "
                            f"input arguments: {', '.join(self.INPUT_ARGS)})")
        options = dict(options)
        several = options.get("layer", self._layer)
        if isinstance(several, (list, tuple)):  # several layers: one call each
            if not several:
                raise ValueError("layer must be a submodule or a non-empty list of them")
            to_input = options.get("attribute_to_layer_input",
                                   self._to_layer_input if several is self._layer else False)
            return Several(tuple(self._run(inputs, baselines, target,
                                           {**options, "layer": m,
                                            "attribute_to_layer_input": to_input},
                                           show_progress, return_convergence_delta)
                                 for m in several))
        extra = options.pop("additional_forward_args", None)
        layer = options.pop("layer", self._layer)
        to_input = options.pop("attribute_to_layer_input",
                               self._to_layer_input if layer is self._layer else False)
        def plain():
            if layer is None and options.pop("layer_baselines", None) is not None:
                raise ValueError("layer_baselines applies only with layer=")
            return self._dispatch(inputs, baselines, target, extra, layer, to_input, options,
                                  show_progress, return_convergence_delta)

        return self._conventional(inputs, baselines, target, extra, layer, options,
                                  show_progress, return_convergence_delta, plain)

    def _own_layer(self, options: dict, key: str, input_key: str) -> dict:
        """For a method with a layer of its own (Grad-CAM's ``conv_layer``, conductance's
        ``conductance_layer``): ``layer=`` (``attribute_to_layer_input``), here or at
        construction, names that layer (``key``; ``input_key`` its input instead), not the
        base class's layer attribution. Giving both, different, is refused."""
        options = dict(options)
        layer = options.pop("layer", self._layer)
        to_input = options.pop("attribute_to_layer_input",
                               self._to_layer_input if layer is self._layer else False)
        if layer is not None:
            if options.get(key) is not None and options[key] is not layer:
                raise ValueError(f"give the layer once: {key}= or layer=")
            options[key] = layer
            options[input_key] = options.get(input_key, False) or to_input
        options["layer"] = None
        return options

    def _conventional(self, inputs, baselines, target, extra, layer, options, show_progress,
                      want_delta, run) -> Explanation:
        """``run()`` under Captum's conventions (:mod:`._conventions`): a wrapped call where
        the inputs or the target ask for one (integer inputs, tuple targets), the output read
        anew where the plain call refused it (beyond ``[B, C]``, or one for the batch).
        ``options`` are the method's own (without the arguments passed beside them)."""
        adapted = conventions.adapt(self, inputs, baselines, target, extra, layer, options,
                                    want_delta)
        if adapted is not None:
            return adapted.run(self, show_progress)
        try:
            return run()
        except (ValueError, TypeError):  # e.g. an output not shaped [B] / [B, C]
            whole = conventions.after_refusal(self, inputs, baselines, target, extra, layer,
                                            options, want_delta)
            if whole is None:
                raise
            return whole.run(self, show_progress)

    def _dispatch(self, inputs, baselines, target, extra, layer, to_input, options,
                  show_progress, return_convergence_delta) -> Explanation:
        """One tensor without extra arguments or a layer: here; the rest: structured."""
        if layer is None and extra is None and isinstance(inputs, torch.Tensor) and \
                inputs.dim() >= 2:
            _layer_delta(options.pop("layer_delta", "layer"))
            check_layer(self._model, None, to_input)
            x, t, fx = self._inputs_and_target(inputs, target, self.gradient_at_inputs)
            self._layout = Layout.of((x,), False)
            try:
                attr, refs, delta = self._core(x, self._baselines(baselines, x.detach()), t, fx,
                                               options, show_progress, return_convergence_delta)
            finally:
                self._layout = None
            return Explanation(attr, refs, fx.detach(), t, delta,
                               None if delta is None else "model")
        return self._run_structured(inputs, baselines, target, extra, layer, to_input, options,
                                    show_progress, return_convergence_delta,
                                    options.pop("layer_baselines", None))

    def _core(self, x, base, t, fx, options, show_progress, want_delta):
        attr, refs, f_ref = self._attribute_reported(x, base, t, fx, options, show_progress)
        if f_ref is None:
            return attr, refs, (self._delta(attr, fx.detach(), refs, t) if want_delta else None)
        f_ref, total = f_ref
        if total is not None:  # the players' values are complete, not the features'
            delta, bad, tol = selfcheck.misses(total[:, None], fx.detach(), f_ref)
            if bool(bad.any()):
                selfcheck.report(type(self).__name__, delta, fx, f_ref, bad, tol, False,
                                 self.incomplete_cause, self._strict)
            return attr, refs, (self._delta(attr, fx.detach(), refs, t) if want_delta
                                else None)
        attr, delta = self._self_check(x, base, t, fx.detach(), attr, f_ref, options)
        return attr, refs, (delta if want_delta else None)

    def _attribute_reported(self, x, base, t, fx, options, show_progress):
        """``_attribute``'s ``(attributions, references)`` and the explained outputs at the
        references it reported (:meth:`_reference_outputs`; None: nothing to check)."""
        self._ref_out = None
        try:
            attr, refs = self._attribute(x, base, t, fx, show_progress=show_progress, **options)
            f_ref = self._ref_out
        finally:
            self._ref_out = None
        self._finite(attr)
        return attr, refs, f_ref

    def _reference_outputs(self, values: torch.Tensor | None,
                           total: torch.Tensor | None = None) -> None:
        """Called by a complete method's ``_attribute``: ``mean_k f(x~_k)`` per sample
        ``[B]``, read from passes it ran anyway; the base class checks completeness with it
        and computes the convergence delta from it (no second forward of the references).
        ``total``: what is complete when it is not the sum of the attributions (the player
        values, when a group's value is given to each of its features), ``[B]``."""
        if self.complete and values is not None:
            self._ref_out = (values.detach(), None if total is None else total.detach())

    def _self_check(self, x, base, t, fx, attr, f_ref, options):
        """``(attributions, delta)`` after the completeness check of
        :mod:`taylorattr.runtime.completeness`: failing samples recomputed once at batch 2 (the
        sample duplicated; point baselines), what stays beyond the tolerance warned about
        (raised with ``strict=True``)."""
        delta, bad, tol = selfcheck.misses(attr, fx, f_ref)
        tried = False
        if bool(bad.any()) and self.baseline_kind == "point":
            tried = True
            attr, delta, f_ref = attr.clone(), delta.clone(), f_ref.clone()
            batch = x.shape[0]
            for i in bad.nonzero().flatten().tolist():
                rows = slice(i, i + 1)
                opts = {k: repeat_option(v, 2, batch, rows) if k in self.batch_options else v
                        for k, v in options.items()}
                try:
                    a2, _, r2 = self._attribute_reported(
                        x[rows].detach().repeat_interleave(2, 0),
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
        if bool(bad.any()):
            selfcheck.report(type(self).__name__, delta, fx, f_ref, bad, tol, tried,
                             self.incomplete_cause, self._strict)
        return attr, delta

    def _run_structured(self, inputs, baselines, target, extra, layer, to_input, options,
                        show_progress, want_delta, layer_baselines=None) -> Explanation:
        """Tuple inputs, additional forward arguments, layers (:mod:`taylorattr.inputs`);
        ``layer_baselines``: point baselines given in the layer's space (Captum's
        ``LayerFeatureAblation``) instead of input baselines mapped through the model."""
        if layer_baselines is not None and (layer is None or self.baseline_kind != "point"):
            raise ValueError("layer_baselines applies to point-baseline methods with layer=")
        against_model = _layer_delta(options.pop("layer_delta", "layer")) == "model" and \
            layer is not None
        if against_model and want_delta and (self.baseline_kind != "point"
                                             or layer_baselines is not None):
            raise ValueError("layer_delta='model' measures f(x) - f(x~) at input baselines: "
                             "it applies to point-baseline methods without layer_baselines")
        model = self._model
        check_layer(model, layer, to_input)
        parts, is_tuple = as_tuple(inputs)
        batch = check_batch(parts, floats=layer is None, vectors=True)
        extra = check_additional_args(extra, batch)
        parts = tuple(p.detach() for p in parts)
        with torch.no_grad():
            out = model_output(lambda _: model(*parts, *extra), parts[0])
        t = resolve_target(target, out)
        fx = select_output(out, t)
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
        swap = swap_layer(model, layer, to_input) if layer is not None else nullcontext()
        with swap as inject:
            wrapped = InputModel(model, layout, extra, inject,
                                 n_inputs=len(parts) if layer is not None else 0)
            self._active, self._layout = wrapped, layout
            try:
                if not context:
                    attr, refs, delta = self._core(x, base, t, fx, options, show_progress,
                                                   want_delta)
                else:
                    attr, refs, delta = self._per_sample(wrapped, context, x, base, t, fx,
                                                         options, show_progress, want_delta)
            finally:
                self._active, self._layout = None, None
        if delta is not None and against_model:  # Captum's: the whole model at x~
            with torch.no_grad():
                out = model_output(lambda _: model(*input_base, *extra), input_base[0],
                                   name="model (at the baselines)")
            delta = per_sample_sum(attr) - (fx - select_output(out, t)).to(attr.dtype)
        attr_parts = layout.split(attr)
        refs = None if refs is None else layout.result(layout.split(refs, lead=2))
        of = None if delta is None else ("model" if against_model or layer is None else "layer")
        return Explanation(layout.result(attr_parts), refs, fx, t, delta, of)

    def _per_sample(self, wrapped, context, x, base, t, fx, options, show_progress, want_delta):
        """Run the method once per sample, the model seeing that sample's context."""
        batch = x.shape[0]
        attrs, refs, deltas = [], [], []
        for b in range(batch):
            wrapped.set_context(tuple(c[b:b + 1] for c in context))
            base_b = base[b:b + 1] if self.baseline_kind == "point" else base
            opts = {k: slice_option(v, b, batch) if k in self.batch_options else v
                    for k, v in options.items()}
            a, r, d = self._core(x[b:b + 1], base_b, None if t is None else t[b:b + 1],
                                 fx[b:b + 1], opts, show_progress, want_delta)
            attrs.append(a)
            refs.append(r)
            deltas.append(d)
        ref = None if refs[0] is None else torch.cat(refs)
        return torch.cat(attrs), ref, (torch.cat(deltas) if want_delta else None)

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

    def _inputs_and_target(self, inputs, target, keep_graph: bool = False):
        """Check ``inputs``, run the model once on them and resolve ``target``.

        Returns ``(x, target_index, f_x)``: ``x`` detached and ``f_x`` the explained output
        per sample ``[B]``; with ``keep_graph`` ``x`` is a leaf requiring grad and ``f_x``
        keeps its graph, so a method needing the gradient at the inputs reuses this forward.
        """
        x = check_inputs(inputs).detach()
        if keep_graph:
            x = x.clone().requires_grad_(True)
        with torch.set_grad_enabled(keep_graph):
            out = model_output(self.model, x)
        t = resolve_target(target, out)
        return x, t, select_output(out, t)

    def _explained(self, rows: torch.Tensor, target: torch.Tensor | None,
                   chunk: int | None = None) -> torch.Tensor:
        """The explained output of ``rows`` (no grad), in chunks of ``chunk`` rows."""
        n = rows.shape[0]
        chunk = chunk or default_chunk_rows(rows, backward=False, model=self.model)
        outs = []
        with torch.no_grad():
            for a, b in chunk_ranges(n, chunk):
                outs.append(select_output(self.model(rows[a:b]),
                                          None if target is None else target[a:b]))
        return torch.cat(outs)

    def _delta(self, attr, fx, refs, t) -> torch.Tensor:
        """``sum(a) - (f(x) - mean_k f(refs_k))`` per sample; ``sum(a) - f(x)`` without refs."""
        if refs is None:
            explained = fx
        else:
            batch, n = refs.shape[:2]
            rows = refs.reshape((batch * n,) + tuple(refs.shape[2:]))
            f_ref = self._explained(rows, None if t is None else t.repeat_interleave(n))
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

    def _attribute(self, x, baselines, target, fx, *, show_progress=False):  # pragma: no cover
        raise NotImplementedError


class ImplicitBaselineMethod(AttributionMethod):
    """A method with a fixed reference (the zero input): ``attribute`` takes no baselines."""

    baseline_kind = "none"

    def attribute(self, inputs: torch.Tensor, target=None, *,
                  return_convergence_delta: bool = False, show_progress: bool = False,
                  **options):
        """Attributions shaped like ``inputs`` (see :meth:`AttributionMethod.attribute`; the
        reference is fixed by the method; ``**options`` include the input arguments)."""
        return self._run(inputs, None, target, options, show_progress,
                         return_convergence_delta).result()


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
