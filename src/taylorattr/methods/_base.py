"""The one shared base of the attribution methods.

Every method follows one call contract (docs/design.md)::

    Method(model).attribute(inputs, [baselines,] target=None, *, <its options>,
                            return_convergence_delta=False, ...)

* ``inputs`` is a batch-first float tensor ``[B, ...]`` or a tuple of them; attributions have
  its structure and shapes. ``additional_forward_args`` (a value or a tuple) follow the
  inputs in every model call; ``layer=`` (a submodule) attributes to that layer's output
  (its input with ``attribute_to_layer_input=True``). :mod:`taylorattr.inputs` says how:
  every method computes on one tensor, the pipeline adapts the rest.
* ``target`` is None (the argmax of the model's output for each sample), an int, or a
  ``[B]`` integer tensor. The explained quantity is the model's output column
  ``target`` (a logit), or the output itself for models returning ``[B]``.
* With ``return_convergence_delta=True`` the call returns ``(attributions, delta)``,
  ``delta = sum(attributions) - (f(x) - f(baseline))`` per sample (Captum's sign).

A method is its ``_attribute`` (the arithmetic, returning an
:class:`~taylorattr.methods._call.Attributed`), its declared
:class:`~taylorattr.methods._call.Traits` (among them what it adapts before the pipeline:
a layer option of its own, a route) and its written ``attribute`` (its options named, for
readers and editors); the call itself is the pipeline's (:mod:`._pipeline`):
``attribute -> explain -> run -> _attribute``. Nothing of a call is stored on the method.
"""
from __future__ import annotations

import functools
import inspect
from typing import Any

import torch

from .._validation import check_bool, check_inputs, check_model
from ..inputs import check_layer
from ..runtime.cost import Cost
from ._call import CONSTRUCTED, Attributed, Call, Trait, Traits, settle
from ._pipeline import (
    Explanation,
    Request,
    Several,
    explained,
    prepare,
    read_call_output,
    run,
    single_input,
)

__all__ = ["Attributed", "AttributionMethod", "Call", "Explanation", "ImplicitBaselineMethod",
           "Request", "Several", "Traits"]


@functools.cache
def _own_options(attributes: tuple) -> tuple[tuple[str, inspect.Parameter], ...]:
    """The keyword-only parameters of a method's ``_attribute`` (``attributes``: those its
    classes define, most derived first) but ``show_progress``; one taking ``**kwargs`` (a
    wrapper of its parent's) adds its parent's. Read once (``inspect.signature``: 45 us)."""
    own: dict[str, inspect.Parameter] = {}
    for attribute in attributes:
        params = inspect.signature(attribute).parameters.values()
        for p in params:
            if p.kind is inspect.Parameter.KEYWORD_ONLY and p.name != "show_progress":
                own.setdefault(p.name, p)
        if all(p.kind is not inspect.Parameter.VAR_KEYWORD for p in params):
            break
    return tuple(own.items())


def own_layer(options: dict, layer, to_input, key: str, input_key: str) -> dict:
    """``options`` with ``layer`` as the option ``key`` (``to_input``: ``input_key``);
    giving both, different, is refused."""
    options = dict(options)
    if layer is not None:
        if options.get(key) is not None and options[key] is not layer:
            raise ValueError(f"give the layer once: {key}= or layer=")
        options[key] = layer
        options[input_key] = options.get(input_key, False) or to_input
    return options


def layer_of(method, layer, to_input, options: dict) -> tuple[Any, bool, dict]:
    """``(layer, attribute_to_layer_input, options)`` of a call: the constructor's layer
    unless given; a method with a layer option of its own (``Traits.layer_option``) gets
    the layer as that option, and the call attributes to no layer."""
    if layer is CONSTRUCTED:
        layer = method._layer
    if to_input is CONSTRUCTED:
        to_input = method._to_layer_input if layer is method._layer else False
    if method.traits.layer_option:
        return None, False, own_layer(options, layer, to_input, *method.traits.layer_option)
    return layer, to_input, options


class AttributionMethod:
    """Base class: holds the model; a method adds its ``_attribute``, its ``traits`` and its
    written ``attribute``::

        _attribute(call, x, baselines, target, f_x, *, show_progress, **options)
            -> Attributed(attributions shaped like x, references [B, n, ...] or None, ...)

    ``call.model`` is the model the arithmetic runs (rows shaped like ``x[0]``),
    ``call.layout`` the layout of ``x``; ``x, baselines, target, f_x`` are the rows this
    invocation explains (the whole batch, one sample of a structured call, or a sample
    recomputed by the completeness check); ``Attributed`` says what it returns (a plain
    pair ``(attributions, references)`` is read as one). The method's own options are the
    keyword-only parameters of its ``_attribute``; ``attribute`` names them; anything else
    is refused with a TypeError naming it.
    """

    #: The registry name (``taylorattr.registry.METHODS``) of the method.
    name: str = ""
    #: What the method declares about its arithmetic (:class:`~._call.Traits`).
    traits: Traits = Traits()
    baseline_kind = Trait()
    gradient_at_inputs = Trait()
    batch_options = Trait()
    perturbation = Trait()
    open_options = Trait()
    complete = Trait()
    complete_within = Trait()
    incomplete_cause = Trait()
    layer_option, route = Trait(), Trait()

    def __init_subclass__(cls, **kw):
        super().__init_subclass__(**kw)
        settle(cls)

    def __init__(self, model, *, layer=None, attribute_to_layer_input: bool = False) -> None:
        """``layer`` / ``attribute_to_layer_input``: the default of every ``attribute`` call
        (Captum's ``LayerIntegratedGradients(model, layer)`` style)."""
        check_model(model)
        for one in (layer if isinstance(layer, (list, tuple)) else [layer]):
            check_layer(model, one, attribute_to_layer_input)
        self._model, self._layer, self._to_layer_input = model, layer, attribute_to_layer_input
        self._checked: dict = {}  # checks of a model and shapes (_pipeline._once)

    model = property(lambda self: self._model, lambda self, value: setattr(self, "_model", value),
                     doc="The user's model.")

    def _check_plan(self) -> None:
        """Layer-wise methods: trace at construction (refusals come early), unless a layer or
        several inputs make each call trace."""
        if self._layer is None and single_input(self, self.model):
            self._get_plan()  # type: ignore[attr-defined]  # (the layer-wise methods')

    def __repr__(self) -> str:
        return f"{type(self).__name__}({type(self.model).__name__})"

    @classmethod
    def options(cls) -> dict[str, inspect.Parameter]:
        """The method's own options: keyword-only parameters of ``_attribute``."""
        return dict(_own_options(tuple(k.__dict__["_attribute"] for k in cls.__mro__
                                       if "_attribute" in k.__dict__)))

    def attribute(self, *args: Any, **kwargs: Any) -> Any:
        """A method of one's own: ``attribute(inputs, [baselines=0.0,] target=None, *, <its
        options>, <the shared arguments>)`` (every registered method writes its own)."""
        kind = self.traits.baseline_kind
        names = ("inputs", "target") if kind == "none" else ("inputs", "baselines", "target")
        if len(args) > len(names):
            raise TypeError(f"{type(self).__name__}.attribute takes {', '.join(names)} by position")
        return self.explain(**{"baselines": 0.0 if kind == "point" else None,
                               **dict(zip(names, args)), **kwargs}).result()

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
        layer, to_input, options = layer_of(self, layer, attribute_to_layer_input, options)
        shared = {"return_convergence_delta": return_convergence_delta,
                  "show_progress": show_progress, "strict": strict,
                  "additional_forward_args": additional_forward_args,
                  "layer_baselines": layer_baselines, "layer_delta": layer_delta}
        if isinstance(layer, (list, tuple)):  # several layers: one call each
            if not layer:
                raise ValueError("layer must be a submodule or a non-empty list of them")
            return Several(tuple(self.explain(inputs, baselines, target, **shared, layer=m,
                                              attribute_to_layer_input=to_input, model=model,
                                              **options) for m in layer))
        r = Request(inputs, baselines, target, options, shared, layer, to_input, model)
        if self.traits.route is not None:  # the method's declared adapter (Traits.route)
            r = self.traits.route(self, r)
            if isinstance(r, Explanation):  # answered by the route's own path
                return r
        return run(self, prepare(self, r.inputs, r.baselines, r.target, options=r.options,
                                 layer=r.layer, attribute_to_layer_input=r.attribute_to_layer_input,
                                 model=r.model, **r.shared))

    #: :func:`._pipeline.prepare` and :func:`._pipeline.run` of this method.
    prepare, run = prepare, run
    _read_output, _explained = read_call_output, staticmethod(explained)

    def _check_options(self, options, what: str = "attribute") -> None:
        unknown = sorted(options.keys() - self.options().keys())
        if unknown:
            accepted = ", ".join(sorted(self.options())) or "none"
            raise TypeError(f"{type(self).__name__}.{what} got unexpected keyword argument(s) "
                            f"{', '.join(map(repr, unknown))} (method options: {accepted})")

    def cost(self, inputs: torch.Tensor, baselines=None, target=None, *,
             return_convergence_delta: bool = False, **options) -> Cost:
        """The rows ``attribute(inputs, ..., **options)`` runs, counted from the method's
        plan without running the model (:class:`taylorattr.runtime.cost.Cost`): the one
        forward of ``inputs`` that resolves the target, the method's own rows (``_cost``:
        ``(Cost, references per sample for the delta)`` from its plan; NotImplementedError
        where unknown) and, with ``return_convergence_delta``, one forward per reference.
        ``baselines`` and ``target`` do not change the counts. One-tensor inputs only; the
        automatic chunk size's one-off memory probe is not counted."""
        check_bool(return_convergence_delta, "return_convergence_delta")
        if not isinstance(inputs, torch.Tensor) or options.get("layer") is not None or \
                options.get("additional_forward_args") is not None:
            raise TypeError("cost counts the rows of one-tensor inputs without layer= or "
                            "additional_forward_args; give a [B, ...] tensor")
        self._check_options(options, "cost")
        x = check_inputs(inputs).detach()
        own, n_refs = self._cost(x, {**options, "baselines": baselines})
        total = Cost(label=self.name, samples=x.shape[0], forward_rows=x.shape[0]) + own
        if return_convergence_delta and n_refs:
            total = total + Cost(forward_rows=x.shape[0] * n_refs)
        return total

    def _cost(self, x: torch.Tensor, options: dict) -> tuple[Cost, int]:
        raise NotImplementedError(f"{type(self).__name__} does not count its rows yet "
                                  "(no _cost); its cost is unknown before running it")

    def _attribute(self, *args: Any, **kwargs: Any) -> Attributed:
        raise NotImplementedError  # the method's arithmetic (class docstring)


class ImplicitBaselineMethod(AttributionMethod):
    """A method with a fixed reference (the zero input): ``attribute`` takes no baselines."""

    traits = Traits(baseline_kind="none")
