"""The values of one ``attribute`` call: the call normalised once (:class:`Call`), what a
method's ``_attribute`` returns (:class:`Attributed`), what a method declares about its
arithmetic (:class:`Traits`), and the arguments every ``attribute`` shares.

:func:`taylorattr.methods._pipeline.prepare` normalises a call once into a :class:`Call`:
the inputs checked, the model run once on them, Captum's conventions (integer inputs,
outputs beyond ``[B, C]``, whole-batch outputs) decided from the inputs' dtypes and the
output's shape, the target resolved, the baselines put in the attributed tensor's layout,
and the model wrapped into the one-tensor view the method's arithmetic runs on.
:func:`~taylorattr.methods._pipeline.run` computes the
:class:`~taylorattr.methods.Explanation` of a call from the :class:`Attributed` values its
``_attribute`` returns. Every value here is frozen and nothing of a call is kept on the
method object, so one method object serves several threads at once.

Every method writes its ``attribute`` out (its own options, then the shared arguments
documented once in :data:`SHARED_DOC`); its body is ``self.explain(**given(locals()))``.
"""
from __future__ import annotations

import inspect
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from typing import Any

import torch

from ..inputs import Layout

__all__ = ["CONSTRUCTED", "SHARED", "SHARED_DOC", "SHARED_NAMES", "Attributed", "Attributions",
           "Baselines", "Call", "Inputs", "Target", "Trait", "Traits", "given", "settle"]

#: ``inputs``: one batch-first tensor ``[B, ...]`` or a tuple of them.
Inputs = torch.Tensor | tuple[torch.Tensor, ...]
#: ``baselines``: a scalar, a tensor, a tuple of them or a :mod:`taylorattr.baselines` value.
Baselines = Any
#: ``target``: None, an int, a ``[B]`` integer tensor, a list of ints, or tuples of them.
Target = None | int | torch.Tensor | list | tuple
#: What ``attribute`` returns: attributions in the inputs' structure (a list for a list of
#: layers).
Attributions = torch.Tensor | tuple[torch.Tensor, ...] | list


class _Constructed:
    """The default of ``layer`` / ``attribute_to_layer_input``: the constructor's value."""

    def __repr__(self) -> str:
        return "<as constructed>"


#: ``layer`` / ``attribute_to_layer_input`` not given: the constructor's value applies.
CONSTRUCTED: Any = _Constructed()


@dataclass(frozen=True)
class Traits:
    """What a method declares about its arithmetic, read by the pipeline
    (:mod:`taylorattr.methods._pipeline`); a class states its own as ``traits =
    replace(Parent.traits, ...)``.

    ``baseline_kind``: ``"point"`` (a scalar or tensor: one reference per sample),
    ``"distribution"`` (a reference set or noise: :mod:`taylorattr.baselines`) or ``"none"``
    (an implicit zero reference; ``attribute`` takes no ``baselines``).
    ``gradient_at_inputs``: ``_attribute`` uses the gradient of ``f`` at the inputs; the
    pipeline then keeps the graph of its one forward (``x`` requires grad, ``fx`` has the
    graph), so the method spends one backward pass and no second forward.
    ``batch_options``: options holding one entry per sample (leading dimension ``B``), cut
    to the sample when a method runs sample by sample.
    ``perturbation``: the method only evaluates the model on copies of the inputs with
    features replaced; it then also takes integer and bool inputs and models whose output
    is one value (or a few) for the whole batch, Captum's aggregate mode
    (:mod:`taylorattr.methods._conventions`).
    ``open_options``: ``attribute`` takes options its signature cannot name (a NoiseTunnel
    around a method given at construction takes that method's options).
    ``complete``: the attributions are complete by construction, ``sum_i a_i = f(x) -
    mean_k f(x~_k)``: every call checks it (:mod:`taylorattr.runtime.completeness`) from the
    explained outputs at the references that ``_attribute`` returns
    (:attr:`Attributed.reference_outputs`, read from its own passes), recomputes a failing
    sample at batch 2 (point baselines) and warns, or raises with ``strict=True``.
    ``complete_within``: a method complete only up to a discretisation it controls
    (Integrated Gradients' quadrature) states its scale ``r``: its check accepts ``max(tol,
    r * max(|df|, sum_i |a_i|))``, without the batch-2 recomputation; 0: none.
    ``incomplete_cause``: the likely cause a failed completeness check names.
    ``layer_option``: ``(key, input_key)`` for a method with a layer of its own (Grad-CAM's
    ``conv_layer``, conductance's ``conductance_layer``): ``layer=`` (with
    ``attribute_to_layer_input``), at the call or at construction, names that option
    (``input_key``: its input instead), not a layer to attribute to.
    ``route``: a function ``route(method, request) -> Request | Explanation`` the call
    applies before :func:`~taylorattr.methods._pipeline.prepare`: it adapts the
    :class:`~taylorattr.methods._pipeline.Request` (tuple inputs joined, a model wrapped)
    or answers the call by a path of its own (a tunnel's noisy copies); None: none.
    """

    baseline_kind: str = "point"
    gradient_at_inputs: bool = False
    batch_options: tuple[str, ...] = ("draws", "feature_mask")
    perturbation: bool = False
    open_options: bool = False
    complete: bool = False
    complete_within: float = 0.0
    incomplete_cause: str = ("a rule that is not exact on one of the model's operations, "
                             "or a wrong gradient from torch's autograd; please report it")
    layer_option: tuple[str, str] | None = None
    route: Any = None

    @property
    def checked(self) -> bool:
        """Whether every call checks completeness (``complete`` or ``complete_within``)."""
        return self.complete or bool(self.complete_within)


class Trait:
    """One field of a method's :class:`Traits`, read by its name (on the class or an
    instance: ``method.baseline_kind``); set on an instance, it replaces the instance's
    traits (a tunnel takes its inner method's baseline kind)."""

    def __set_name__(self, owner, name: str) -> None:
        self.name = name

    def __get__(self, obj, owner=None) -> Any:
        return getattr((owner if obj is None else obj).traits, self.name)

    def __set__(self, obj, value) -> None:
        obj.traits = replace(obj.traits, **{self.name: value})


@dataclass(frozen=True)
class Attributed:
    """What ``_attribute`` computed for its rows, and what the pipeline reads after it.

    ``attributions`` shaped like ``x``; ``references`` ``[B, n, ...]``, the points the
    attributions explain the change against (None: ``f(x)`` itself, epsilon-LRP).
    ``reference_outputs``: ``mean_k f(x~_k)`` per sample ``[B]``, read from passes the
    method ran anyway: a complete method's check and delta use it (no second forward of the
    references). ``total``: what is complete when it is not the sum of the attributions
    (the players' values, when a group's value is given to each of its features), ``[B]``.
    ``casts``: the casts below the inputs' dtype in the graph the method ran
    (:func:`taylorattr.runtime.completeness.downcasts`): the check is then held to the
    lowest dtype's tolerance and names them. ``pass_output``: the explained output ``f(x)``
    of the method's own widened pass (half-precision inputs run in float32): the check
    reads it, and the attributions and the delta are rounded to the inputs' dtype after.
    ``standard_errors``: of sampled attributions, shaped like them. ``layer_shapes``: the
    attributions join a layer's several tensors of these shapes (split in the result).
    """

    attributions: torch.Tensor
    references: torch.Tensor | None = None
    reference_outputs: torch.Tensor | None = None
    total: torch.Tensor | None = None
    casts: tuple = ()
    pass_output: torch.Tensor | None = None
    standard_errors: torch.Tensor | None = None
    layer_shapes: tuple | None = None

    @classmethod
    def of(cls, value) -> Attributed:
        """``value`` itself, or a plain ``(attributions, references)`` pair (a user's method
        that reports nothing else)."""
        if isinstance(value, cls):
            return value
        if not (isinstance(value, tuple) and len(value) == 2):
            raise TypeError(f"_attribute must return an Attributed or a pair (attributions, "
                            f"references), got {type(value).__name__}")
        return cls(*value)


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
    """

    model: Any
    layout: Layout
    x: torch.Tensor
    baselines: Any
    target: torch.Tensor | None
    fx: torch.Tensor
    options: Mapping
    inputs: tuple = ()
    additional_forward_args: tuple = ()
    layer: Any = None
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

#: The shared keyword-only arguments, in signature order, with their defaults.
SHARED = (("return_convergence_delta", False), ("show_progress", False), ("strict", False),
          ("additional_forward_args", None), ("layer", CONSTRUCTED),
          ("attribute_to_layer_input", CONSTRUCTED), ("layer_baselines", None),
          ("layer_delta", "layer"))

#: Their names.
SHARED_NAMES = frozenset(k for k, _ in SHARED)


def given(names: dict) -> dict:
    """The keyword arguments of :meth:`~taylorattr.methods.AttributionMethod.explain` from
    a written ``attribute``'s ``locals()``: ``self`` dropped, open options (``**options``:
    a tunnel's inner method's, a method of one's own) spread."""
    kw = {k: v for k, v in names.items() if k != "self" and k != "options"}
    kw.update(names.get("options") or {})
    return kw


def settle(cls) -> None:
    """A method class made whole: a trait set as a plain class attribute (``complete =
    True``, as a method of one's own may say it) folded into its :class:`Traits` value, and
    the docstring of the ``attribute`` it writes completed with its options' (its
    ``_attribute``'s docstring) and the shared arguments' (:data:`SHARED_DOC`)."""
    names = [f.name for f in fields(Traits)]
    plain = {k: cls.__dict__[k] for k in names
             if k in cls.__dict__ and not isinstance(cls.__dict__[k], Trait)}
    if plain:
        cls.traits = replace(cls.traits, **plain)
        for k in plain:
            setattr(cls, k, Trait())
            cls.__dict__[k].__set_name__(cls, k)
    written = cls.__dict__.get("attribute")
    if written is not None and written.__doc__ and SHARED_DOC not in written.__doc__:
        own = inspect.cleandoc(cls._attribute.__doc__ or "")
        written.__doc__ = f"{inspect.cleandoc(written.__doc__)}\n\n{own}\n{SHARED_DOC}"
