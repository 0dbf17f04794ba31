"""One ``attribute`` call as one frozen value, and the signatures of the methods' ``attribute``.

:meth:`AttributionMethod.prepare <taylorattr.methods.AttributionMethod.prepare>` normalises
a call once into a :class:`Call`: the inputs checked, the model run once on them, Captum's
conventions (integer inputs, outputs beyond ``[B, C]``, whole-batch outputs) decided from
the inputs' dtypes and the output's shape, the target resolved, the baselines put in the
attributed tensor's layout, and the model wrapped into the one-tensor view the method's
arithmetic runs on. :meth:`~taylorattr.methods.AttributionMethod.run` computes the
:class:`~taylorattr.methods.Explanation` of a call. Nothing of a call is kept on the
method object, so one method object serves several threads at once.

The signature of every method's ``attribute`` is built here from its own options (the
keyword-only parameters of its ``_attribute``) and the arguments every method shares,
documented once (:data:`SHARED_DOC`).
"""
from __future__ import annotations

import inspect
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

import torch

from ..inputs import Layout

__all__ = ["CONSTRUCTED", "SHARED", "SHARED_DOC", "SHARED_NAMES", "Call", "attribute_for",
           "signature_of"]


class _Constructed:
    """The default of ``layer`` / ``attribute_to_layer_input``: the constructor's value."""

    def __repr__(self) -> str:
        return "<as constructed>"


#: ``layer`` / ``attribute_to_layer_input`` not given: the constructor's value applies.
CONSTRUCTED = _Constructed()


@dataclass(frozen=True)
class Call:
    """One ``attribute`` call, normalised once (module docstring).

    ``model`` maps rows ``[R, ...]`` shaped like ``x[0]`` to outputs ``[R]`` / ``[R, C]``:
    the user's model seen on one tensor (tuple inputs joined, additional arguments bound,
    integer inputs cast back, an output beyond ``[B, C]`` flattened); with ``layer`` it is
    the user's model (wrapped for the conventions only), viewed through the layer when the
    call runs. ``x`` is the attributed tensor (the inputs joined, or the layer's values),
    ``baselines`` what the method's ``baseline_kind`` takes in ``x``'s layout, ``target``
    the resolved ``[B]`` classes (None: ``[B]`` outputs) and ``fx`` the explained output
    ``[B]`` (with its graph when the method reuses the forward's gradient). ``context``
    holds the per-sample tensors a structured call shows the model sample by sample.
    ``notes`` is the call's own record of what its passes report (the explained outputs
    at the references, standard errors): created with the call, never shared.
    """

    model: object
    layout: Layout
    x: torch.Tensor
    baselines: object
    target: torch.Tensor | None
    fx: torch.Tensor
    options: Mapping
    inputs: tuple = ()
    additional_forward_args: tuple = ()
    layer: object = None
    attribute_to_layer_input: bool = False
    context: tuple = ()
    want_delta: bool = False
    show_progress: bool = False
    strict: bool = False
    #: ``"model"`` / ``"layer"``: what the delta measures (``Explanation.delta_of``).
    delta_of: str = "model"
    #: the input baselines of a layer call with ``layer_delta="model"`` (one forward more).
    input_baselines: tuple | None = None
    #: integer inputs: the dtype each attribution is cast back to (None: unchanged).
    cast: tuple | None = None
    #: Captum's aggregate mode (:mod:`._conventions`): the whole-batch reading, else None.
    aggregate: object = None
    notes: dict = field(default_factory=dict, compare=False, repr=False)

    def report(self, values: torch.Tensor | None, total: torch.Tensor | None = None,
               casts: tuple = ()) -> None:
        """Called by a complete method's ``_attribute``: ``mean_k f(x~_k)`` per sample
        ``[B]``, read from passes it ran anyway; the base class checks completeness with it
        and computes the convergence delta from it (no second forward of the references).
        ``total``: what is complete when it is not the sum of the attributions (the player
        values, when a group's value is given to each of its features), ``[B]``.
        ``casts``: the casts below the inputs' dtype in the graph the method ran
        (:func:`taylorattr.runtime.completeness.downcasts`): kept for the call's check,
        which then holds the call to the lowest dtype's tolerance and names them."""
        if values is not None:
            self.notes["reference_outputs"] = (
                values.detach(), None if total is None else total.detach())
        if casts:
            self.notes["casts"] = tuple(casts)

    def casts(self) -> tuple:
        """The casts :meth:`report` was given during this call (none: ``()``)."""
        return self.notes.get("casts", ())

    def reported(self):
        """What the last ``_attribute`` reported (:meth:`report`), taken off the record."""
        return self.notes.pop("reference_outputs", None)

    def with_model(self, model) -> Call:
        """The same call seen through ``model`` (the layer's view during the call)."""
        return replace(self, model=model)


#: The arguments every method's ``attribute`` takes besides its own options, documented
#: once here and referred to from each method's ``attribute``.
SHARED_DOC = """
Shared arguments (every method; see :class:`taylorattr.methods.AttributionMethod`):
    inputs: a batch-first tensor ``[B, ...]`` or a tuple of them; attributions have
        its structure and shapes.
    baselines: the reference (the method's ``baseline_kind``): a scalar, a tensor
        broadcastable to ``inputs`` or one baseline per sample for point methods (a
        tuple for tuple inputs); a :mod:`taylorattr.baselines` distribution for the
        others; absent for methods with an implicit reference.
    target: None (argmax class), an int, a ``[B]`` integer tensor (on any device: it is
        moved to the model output's, as Captum accepts a CPU target beside CUDA inputs), a
        list of ints; a tuple (or a list of tuples) indexing an output beyond ``[B, C]``.
    return_convergence_delta: also return ``sum(a) - (f(x) - f(baselines))`` per sample
        (Captum's sign), averaged over the references a method draws. Its floor is the
        arithmetic's: about 1e-7 of ``|f(x) - f(x~)|`` in float32 on the CPU; CUDA
        float32 convolutions run in TF32 by default (about 1e-4 relative; set
        ``torch.backends.cudnn.allow_tf32 = False`` and
        ``torch.backends.cuda.matmul.allow_tf32 = False`` or use float64); about 1e-2 in
        float16/bfloat16.
    show_progress: a tqdm bar over the method's chunks.
    strict: complete methods: a failed completeness check raises instead of warning.
    additional_forward_args: a value or tuple passed after the inputs to every model
        call; tensors in it are batch-first ``[B, ...]``.
    layer: a submodule (or a list of them: one result per layer); attributions are then
        w.r.t. its output (its input with ``attribute_to_layer_input=True``); baselines
        stay input baselines. Default: the constructor's.
    layer_baselines: point baselines given in the layer's space instead of input
        baselines mapped through the model (Captum's ``LayerFeatureAblation``).
    layer_delta: with ``layer=``: ``"layer"`` (default) ``f(x) - f(x | layer at its
        baseline value)``, the change layer attributions are complete for; ``"model"``
        (Captum's ``Layer*``) ``f(x) - f(x~)``, the whole model at the input baselines.
"""

_KW = inspect.Parameter.KEYWORD_ONLY
_POS = inspect.Parameter.POSITIONAL_OR_KEYWORD

#: The shared keyword-only arguments, in signature order, with their defaults.
SHARED = (("return_convergence_delta", False), ("show_progress", False), ("strict", False),
          ("additional_forward_args", None), ("layer", CONSTRUCTED),
          ("attribute_to_layer_input", CONSTRUCTED), ("layer_baselines", None),
          ("layer_delta", "layer"))

#: Their names.
SHARED_NAMES = frozenset(k for k, _ in SHARED)


def signature_of(cls) -> inspect.Signature:
    """``attribute``'s signature for ``cls``: ``inputs``, ``baselines`` (unless the
    reference is implicit), ``target``, the class's own options, the shared arguments."""
    params = [inspect.Parameter("self", _POS), inspect.Parameter("inputs", _POS)]
    if cls.baseline_kind != "none":
        default = cls.__dict__.get("baselines_default",
                                   0.0 if cls.baseline_kind == "point" else None)
        params.append(inspect.Parameter("baselines", _POS, default=default))
    params.append(inspect.Parameter("target", _POS, default=None))
    own = cls.options()
    params += [p.replace(kind=_KW) for p in own.values() if p.kind is _KW]
    params += [inspect.Parameter(k, _KW, default=v) for k, v in SHARED if k not in own]
    if cls.open_options:  # a tunnel's inner method, given at construction: its options
        params.append(inspect.Parameter("inner_options", inspect.Parameter.VAR_KEYWORD))
    return inspect.Signature(params)


def attribute_for(cls):
    """The ``attribute`` of ``cls``: binds the call to :func:`signature_of` (an unknown
    keyword is refused naming it and the method) and returns
    ``self.explain(...).result()``."""
    sig = signature_of(cls)
    names = [p.name for p in sig.parameters.values()
             if p.kind in (_KW, _POS) and p.name != "self"]
    var = next((p.name for p in sig.parameters.values()
                if p.kind is inspect.Parameter.VAR_KEYWORD), None)
    implicit = cls.baseline_kind == "none"

    def attribute(self, *args, **kwargs):
        if var is None:
            unknown = sorted(set(kwargs) - set(names))
            if unknown:
                own = ", ".join(k for k in type(self).options()) or "none"
                raise TypeError(f"{type(self).__name__}.attribute got unexpected keyword "
                                f"argument(s) {', '.join(map(repr, unknown))} (its options: "
                                f"{own}; shared: {', '.join(k for k, _ in SHARED)})")
        bound = sig.bind(self, *args, **kwargs)
        bound.apply_defaults()
        given = dict(bound.arguments)
        given.pop("self")
        if var is not None:  # a tunnel's inner options
            given.update(given.pop(var, None) or {})
        inputs, target = given.pop("inputs"), given.pop("target")
        baselines = None if implicit else given.pop("baselines")
        ex = self.explain(inputs, baselines, target, **given)
        self._keep(ex)
        return ex.result()

    attribute.__signature__ = sig
    attribute.__qualname__ = f"{cls.__qualname__}.attribute"
    attribute.__name__ = "attribute"
    attribute.__module__ = cls.__module__
    own_doc = inspect.cleandoc(cls._attribute.__doc__ or "")
    attribute.__doc__ = (f"Attributions shaped like ``inputs`` ({cls.__name__}).\n\n"
                         f"{own_doc}\n{SHARED_DOC}")
    return attribute
