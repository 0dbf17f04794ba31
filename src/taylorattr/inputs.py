"""The input side of every method: tuple inputs, ``additional_forward_args`` and layers.

Every method computes on one batch-first tensor (``_attribute(x, baselines, target, f_x)``).
This module turns what a user explains into that tensor and back, once for all methods:

* **Tuple inputs** ``(x_1, ..., x_m)`` with ``x_i`` of shape ``[B, *s_i]`` become one flat
  tensor ``X = [x_1.flatten(1), ..., x_m.flatten(1)]`` of shape ``[B, sum_i n_i]``; the model
  is wrapped as ``F(X) = model(split(X)_1, ..., split(X)_m, *additional_forward_args)`` and
  the attributions of ``F`` are split back. Since ``F(X) = model(x_1, ..., x_m)`` exactly,
  ``delta = X - X~`` is all inputs' deltas together, and every method's equation holds
  unchanged for the tuple.
* **Layers** (``layer=``, Captum's ``Layer*`` methods): the attributed variable is the
  layer's output ``h`` (its input with ``attribute_to_layer_input=True``) and the model is
  ``F(h) = model(x, *additional_forward_args)`` with that output replaced by ``h``; the rest
  of the network is evaluated at the inputs ``x`` (as Captum's ``LayerIntegratedGradients``
  does). A point baseline is mapped through the model: ``h~ = layer's output at x~``.
  Distribution baselines (reference sets, noise) are given in the layer's space. A layer
  returning (with ``attribute_to_layer_input``: receiving) several tensors has their tuple
  as ``h``, joined like tuple inputs; its attributions are a tuple.
* **Per-sample context.** Tensors in ``additional_forward_args`` (and, for layers, the
  inputs themselves) belong to one sample each. A method may call ``F`` on any number of
  rows in any order (Integrated Gradients step-major, Expected Gradients sample-major,
  Occlusion window-major, in chunks that need not hold whole multiples of ``B``), so rows
  cannot be matched to samples by their count. With a per-sample context the method is
  therefore run sample by sample, each run seeing ``F`` with that sample's context
  expanded to the rows it is given: exact for every method's row layout.
* **Neurons** (:class:`NeuronView`): a neuron of a layer seen as the model's output.

Why one module: tuple inputs, layers and neurons are one mapping (what the user explains
-> one batch-first tensor and back), and the wrappers that apply it (``InputModel``, the
layer injection, ``View``) share the ``Layout``; split apart, each would import the others.
"""
from __future__ import annotations

import math
import threading
from contextlib import contextmanager
from dataclasses import dataclass, fields, is_dataclass, replace

import torch
from torch import nn

from ._validation import broadcast_baselines, check_inputs

__all__ = [
    "InputModel",
    "Layout",
    "ModelWrapper",
    "NeuronView",
    "View",
    "as_tuple",
    "check_additional_args",
    "check_layer",
    "follow_mode",
    "kept",
    "layer_activations",
    "point_baselines",
    "repeat_option",
    "swap_layer",
    "whole_batch_view",
]


def as_tuple(inputs, name: str = "inputs") -> tuple[tuple, bool]:
    """``(tuple of tensors, was_tuple)``; a tensor is a 1-tuple."""
    if isinstance(inputs, torch.Tensor):
        return (inputs,), False
    if isinstance(inputs, (tuple, list)):
        if not inputs:
            raise ValueError(f"{name} must be a tensor or a non-empty tuple of tensors, got an "
                             "empty tuple")
        for i, t in enumerate(inputs):
            if not isinstance(t, torch.Tensor):
                raise TypeError(f"{name}[{i}] must be a torch.Tensor, got {type(t).__name__}")
        return tuple(inputs), True
    raise TypeError(f"{name} must be a torch.Tensor or a tuple of tensors, got "
                    f"{type(inputs).__name__}")


def check_batch(parts: tuple, name: str = "inputs", floats: bool = True,
                vectors: bool = False) -> int:
    """Every part batch-first with the same batch size (float, finite when ``floats``);
    ``vectors``: a part may be ``[B]`` (one feature per sample). Beside others, an input may
    have no features (Captum's empty sparse input: nothing of it is attributed)."""
    batch = None
    for i, t in enumerate(parts):
        label = name if len(parts) == 1 else f"{name}[{i}]"
        empty = len(parts) > 1 and t.dim() >= 2 and t.shape[0] > 0 and t.numel() == 0
        if floats and not empty:  # an input without features beside others: no players
            check_inputs(t.unsqueeze(1) if vectors and t.dim() == 1 else t, label)
        elif t.dim() < 1 or t.shape[0] == 0:
            raise ValueError(f"{label} must be batch-first with at least one sample, got shape "
                             f"{tuple(t.shape)}")
        if batch is None:
            batch = t.shape[0]
        elif t.shape[0] != batch:
            raise ValueError(f"{label} has {t.shape[0]} samples but {name}[0] has {batch}; "
                             "every input must hold the same samples (batch-first)")
    if floats and len(parts) > 1 and all(t.numel() == 0 for t in parts):
        raise ValueError(f"{name} must have at least one feature; every input is empty")
    return batch


@dataclass(frozen=True)
class Layout:
    """Feature shapes ``s_i`` of the attributed tensors and whether they came as a tuple."""

    shapes: tuple[tuple[int, ...], ...]
    is_tuple: bool

    @classmethod
    def of(cls, parts: tuple, is_tuple: bool) -> Layout:
        return cls(tuple(tuple(p.shape[1:]) for p in parts), is_tuple)

    @property
    def sizes(self) -> tuple[int, ...]:
        return tuple(math.prod(s) for s in self.shapes)

    @property
    def offsets(self) -> tuple[int, ...]:
        out, o = [], 0
        for n in self.sizes:
            out.append(o)
            o += n
        return tuple(out)

    @property
    def flat(self) -> bool:
        """True when the method works on the flat concatenation (two or more inputs, or an
        input ``[B]`` of one feature per sample, which the method sees as ``[B, 1]``)."""
        return len(self.shapes) > 1 or () in self.shapes

    def join(self, parts) -> torch.Tensor:
        """``[R, *s_1], ..., [R, *s_m]`` -> the method's tensor (``[R, sum n_i]`` if flat)."""
        if not self.flat:
            return parts[0]
        return torch.cat([p.reshape(p.shape[0], -1) for p in parts], 1)

    def split(self, x: torch.Tensor, lead: int = 1) -> tuple:
        """Inverse of :meth:`join` for a tensor with ``lead`` leading (row) dimensions."""
        if not self.flat:
            return (x,)
        rows = (-1,) if lead == 1 else tuple(x.shape[:lead])  # (-1,): traceable by torch.fx
        return tuple(x[(slice(None),) * lead + (slice(o, o + n),)].reshape(
            (rows if n else tuple(x.shape[:lead])) + s)  # an empty input: no -1 to infer
            for o, n, s in zip(self.offsets, self.sizes, self.shapes))

    def result(self, parts: tuple):
        """The user's structure: a tuple for tuple inputs, else the tensor."""
        return tuple(parts) if self.is_tuple else parts[0]

    def per_input(self, value, name: str, is_leaf) -> tuple:
        """``value`` for every input: a tuple/list of one value per input (tuple inputs), or one
        value that ``is_leaf`` recognises, used for every input."""
        if isinstance(value, (tuple, list)) and not is_leaf(value):
            if len(value) != len(self.shapes):
                raise ValueError(f"{name} must give one entry per input ({len(self.shapes)}), "
                                 f"got {len(value)}")
            return tuple(value)
        if self.is_tuple and len(self.shapes) > 1 and isinstance(value, torch.Tensor):
            raise TypeError(f"{name} must be a scalar or a tuple with one entry per input "
                            f"({len(self.shapes)} inputs), got a single tensor")
        return (value,) * len(self.shapes)


def check_additional_args(args, batch: int) -> tuple:
    """``additional_forward_args`` as a tuple; every tensor in it is batch-first (``[B, ...]``)."""
    if args is None:
        return ()
    if not isinstance(args, tuple):
        args = (args,)
    for i, a in enumerate(args):
        if isinstance(a, torch.Tensor) and (a.dim() == 0 or a.shape[0] != batch):
            raise ValueError(
                f"additional_forward_args[{i}] is a tensor of shape {tuple(a.shape)}; tensors "
                f"passed there must be batch-first with one row per sample ({batch}), as the "
                "methods repeat them with the samples; keep a tensor shared by all samples "
                "inside the model instead")
    return args


def check_layer(model, layer, attribute_to_layer_input) -> None:
    if layer is None:
        if attribute_to_layer_input is not False:
            raise ValueError("attribute_to_layer_input applies only with layer=; give a layer "
                             "(a submodule of the model) or leave it False")
        return
    if not isinstance(attribute_to_layer_input, bool):
        raise TypeError(f"attribute_to_layer_input must be a bool, got "
                        f"{type(attribute_to_layer_input).__name__}")
    if not isinstance(layer, nn.Module):
        raise TypeError(f"layer must be an nn.Module (a submodule of the model), got "
                        f"{type(layer).__name__}")
    if not isinstance(model, nn.Module) or not any(m is layer for m in model.modules()):
        raise ValueError(f"layer ({type(layer).__name__}) is not a submodule of the model; "
                         "pass a module reachable from model.modules()")


def follow_mode(wrapper: nn.Module, model) -> None:
    """Put ``wrapper`` (a module wrapping ``model`` for a call) in ``model``'s train/eval mode
    without touching ``model``: ``nn.Module`` starts in train mode, which would warn about
    dropout the user's eval-mode model does not run, while ``wrapper.train(...)`` would set
    every module below it, the user's own included."""
    wrapper.training = model.training if isinstance(model, nn.Module) else False


class ModelWrapper(nn.Module):
    """A module around the user's model for a call: ``model`` (an ``nn.Module``, then a
    registered submodule, or any callable), the wrapper in its train/eval mode
    (:func:`follow_mode`)."""

    def __init__(self, model):
        super().__init__()
        follow_mode(self, model)
        self.model = model


def kept(value):
    """What a forward hook keeps of a layer's output (input): a copy (in the autograd graph),
    so that an in-place operation after the layer (``ReLU(inplace=True)``) does not change
    it; tuples element by element."""
    if isinstance(value, torch.Tensor):
        return value.clone()
    if isinstance(value, tuple):
        return tuple(kept(v) for v in value)
    return value


def watch(layer: nn.Module, to_input: bool, seen: list):
    """Keep (:func:`kept`) what ``layer`` receives (``to_input``: before it runs, so that an
    in-place layer cannot change it) or returns, in ``seen``, at every call; returns the hook
    handle. Only this thread's calls are kept: hooks are the module's, and other threads may
    run the same model meanwhile."""
    thread = threading.get_ident()
    if to_input:
        return layer.register_forward_pre_hook(
            lambda module, inp: None if threading.get_ident() != thread
            else seen.append(kept(inp if len(inp) > 1 else inp[0])))
    return layer.register_forward_hook(
        lambda module, inp, out: None if threading.get_ident() != thread
        else seen.append(kept(out)))


def layer_activations(model, layer, args: tuple, to_input: bool):
    """What the layer returns (``to_input``: receives) when ``model(*args)`` runs: a tensor,
    or a tuple of tensors for a layer returning a tuple (receiving several tensors)."""
    seen = []
    handle = watch(layer, to_input, seen)
    try:
        with torch.no_grad():
            model(*args)
    finally:
        handle.remove()
    if not seen:
        raise ValueError(f"layer ({type(layer).__name__}) is not called by the model's forward")
    if len(seen) > 1:
        raise ValueError(f"layer ({type(layer).__name__}) is called {len(seen)} times in one "
                         "forward; pick a module used once")
    what = "input" if to_input else "output"
    parts = seen[0] if isinstance(seen[0], tuple) else (seen[0],)
    for h in parts:
        if not isinstance(h, torch.Tensor):
            raise TypeError(f"layer's {what} must be a tensor or a tuple of tensors to "
                            f"attribute to it, got {type(h).__name__}")
        if h.dtype not in (torch.float32, torch.float64):
            raise TypeError(f"layer's {what} must be float32/float64 to attribute to it, got "
                            f"{h.dtype}; pick a layer whose {what} is real-valued (e.g. the "
                            "embedding's output)")
    if isinstance(seen[0], tuple):
        return tuple(h.detach() for h in parts)
    return parts[0].detach()


class _Inject(nn.Module):
    """Stands in for ``layer`` while calls attribute to it: in a thread attributing to it,
    returns the injected value (a tensor or a tuple) as the layer's output, or runs the
    layer on it in place of its input(s); in any other thread it is the layer itself. The
    value and the direction are the thread's own, so calls in several threads at once
    each see their own value, and the model stays itself for everyone else."""

    def __init__(self, layer: nn.Module):
        super().__init__()
        follow_mode(self, layer)
        self.layer = layer
        self._local = threading.local()

    @property
    def value(self):
        return getattr(self._local, "value", None)

    @property
    def to_input(self) -> bool | None:
        """This thread's direction: True (the layer's input), False (its output) or None
        (this thread does not attribute to the layer)."""
        return getattr(self._local, "to_input", None)

    @value.setter
    def value(self, value) -> None:
        self._local.value = value

    def forward(self, *args, **kwargs):
        to_input = self.to_input
        if to_input is None:  # a thread that does not attribute to this layer
            return self.layer(*args, **kwargs)
        # a copy in the graph: in-place operations of the model (ReLU(inplace=True)) may
        # overwrite what they get, never the attributed tensor itself
        if to_input:
            value = kept(self.value if isinstance(self.value, tuple) else (self.value,))
            return self.layer(*value, *args[len(value):], **kwargs)
        return kept(self.value)


#: (id(model), id(layer)) -> [the injector in the model's slots, the slots, active calls]
_SWAPS: dict[tuple[int, int], list] = {}
_SWAPS_LOCK = threading.Lock()


@contextmanager
def swap_layer(model: nn.Module, layer: nn.Module, to_input: bool):
    """Replace every occurrence of ``layer`` in ``model`` by an :class:`_Inject` for the block
    and yield it; the layer is put back when the last call attributing to it (in any thread)
    ends. Calls from several threads share one injector, each with its own value and
    direction, so layer calls on one model are re-entrant and thread-safe, and other calls
    meanwhile see the layer itself. Works for eager calls and torch.fx tracing."""
    key = (id(model), id(layer))
    with _SWAPS_LOCK:
        entry = _SWAPS.get(key)
        if entry is None:
            inject = _Inject(layer)
            slots = [(parent, name) for parent in model.modules()
                     for name, child in parent._modules.items() if child is layer]
            for parent, name in slots:
                parent._modules[name] = inject
            entry = _SWAPS[key] = [inject, slots, 0]
        entry[2] += 1
    inject, local = entry[0], entry[0]._local
    before = (getattr(local, "to_input", None), getattr(local, "value", None))
    local.to_input, local.value = bool(to_input), None
    try:
        yield inject
    finally:
        local.to_input, local.value = before  # a nested call in this thread ends
        with _SWAPS_LOCK:
            entry[2] -= 1
            if entry[2] == 0:
                for parent, name in entry[1]:
                    parent._modules[name] = layer
                del _SWAPS[key]


class InputModel(nn.Module):
    """``F(X)``: the model seen by a method, on one tensor (see the module docstring).

    ``context`` tensors (the model's inputs when attributing to a layer, then the tensor
    ``additional_forward_args``) are held with one row (one sample) and expanded to the
    rows ``F`` is given; other additional arguments are passed unchanged.
    """

    def __init__(self, model, layout: Layout, extra: tuple, inject: _Inject | None = None,
                 n_inputs: int = 0):
        super().__init__()
        self.model = model
        self.layout = layout
        self.inject = inject
        self.to_input = None if inject is None else inject.to_input  # part of its structure
        self.n_inputs = n_inputs  # the model's own inputs (layer mode), first in the context
        self.extra = extra
        self.n_context = 0
        follow_mode(self, model)

    def set_context(self, tensors: tuple) -> None:
        """The per-sample tensors (``[1, ...]`` each) for the next calls."""
        for i, t in enumerate(tensors):
            self.register_buffer(f"context_{i}", t, persistent=False)
        self.n_context = len(tensors)

    def forward(self, x):
        rows = x.shape[0]
        ctx = [getattr(self, f"context_{i}") for i in range(self.n_context)]
        ctx = [c.expand((rows,) + tuple(c.shape[1:])) for c in ctx]
        tensors = iter(ctx[self.n_inputs:])
        extra = tuple(next(tensors) if isinstance(a, torch.Tensor) else a for a in self.extra)
        if self.inject is not None:
            self.inject.value = self.layout.result(self.layout.split(x))
            return self.model(*ctx[:self.n_inputs], *extra)
        return self.model(*self.layout.split(x), *extra)


def slice_option(value, b: int, batch: int):
    """Sample ``b`` of a per-sample option: tensors (and tuples of them, and dataclasses of
    them) with ``batch`` leading rows are cut to ``[1, ...]``; anything else is shared."""
    if isinstance(value, torch.Tensor):
        return value[b:b + 1] if value.dim() >= 1 and value.shape[0] == batch else value
    if isinstance(value, (tuple, list)):
        return type(value)(slice_option(v, b, batch) for v in value)
    if is_dataclass(value) and not isinstance(value, type):
        return replace(value, **{f.name: slice_option(getattr(value, f.name), b, batch)
                                 for f in fields(value) if f.init})
    return value


def repeat_option(value, copies: int, batch: int, rows: slice = slice(None)):
    """A per-sample option for ``copies`` copies of each sample of ``rows`` (sample-major):
    tensors with ``batch`` leading rows (also inside tuples and lists) and lists of ``batch``
    plain values (a class or a tuple target per sample) are cut to ``rows`` and repeated;
    anything else is shared and passes unchanged (the counterpart of :func:`slice_option`)."""
    if isinstance(value, torch.Tensor):
        if value.dim() >= 1 and value.shape[0] == batch:
            return value[rows].repeat_interleave(copies, 0)
        return value
    if isinstance(value, list) and len(value) == batch and not any(
            isinstance(v, torch.Tensor) or (isinstance(v, (tuple, list)) and any(
                isinstance(e, torch.Tensor) for e in v)) for v in value):
        return [v for v in value[rows] for _ in range(copies)]  # a class (tuple) per sample
    if isinstance(value, (tuple, list)):
        return type(value)(repeat_option(v, copies, batch, rows) for v in value)
    return value


def point_baselines(baselines, parts: tuple, name: str = "baselines") -> tuple:
    """Point baselines for every input: a scalar, a tensor (one input) or one per input."""

    per = Layout.of(parts, True).per_input(baselines, name, lambda v: False)
    names = [name] if len(parts) == 1 else [f"{name}[{i}]" for i in range(len(parts))]
    return tuple(broadcast_baselines(b, p, n) for b, p, n in zip(per, parts, names))


@dataclass
class View:
    """A whole-batch one-tensor view of a structured call (Taylor terms, metrics): ``model``
    maps ``x`` (rows = the samples, in order) to the user's model output; ``layer_swap``
    must be active while ``model`` runs or is traced when attributing to a layer."""

    model: InputModel
    x: torch.Tensor
    baselines: torch.Tensor
    layout: Layout
    layer: nn.Module | None
    to_input: bool

    def active(self):
        if self.layer is None:
            return _Null()
        return _Active(self)


class _Null:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


class _Active:
    def __init__(self, view: View):
        self.view = view
        self.cm = None

    def __enter__(self):
        self.cm = swap_layer(self.view.model.model, self.view.layer, self.view.to_input)
        self.view.model.inject = self.cm.__enter__()
        return self.view.model.inject

    def __exit__(self, *exc):
        return self.cm.__exit__(*exc)


def whole_batch_view(model, inputs, baselines=0.0, additional_forward_args=None, layer=None,
                     attribute_to_layer_input=False) -> View:
    """The one-tensor view for routines that evaluate all samples together (each row of
    ``x`` is its sample, so the context is held with all ``B`` rows)."""
    check_layer(model, layer, attribute_to_layer_input)
    parts, is_tuple = as_tuple(inputs)
    batch = check_batch(parts, floats=layer is None)
    extra = check_additional_args(additional_forward_args, batch)
    parts = tuple(p.detach() for p in parts)
    base_parts = point_baselines(baselines, parts)
    if layer is None:
        layout = Layout.of(parts, is_tuple)
        x, base = layout.join(parts), layout.join(base_parts)
    else:
        h, is_tuple = as_tuple(layer_activations(model, layer, parts + extra,
                                                 attribute_to_layer_input))
        layout = Layout.of(h, is_tuple)
        x = layout.join(h)
        base = layout.join(as_tuple(layer_activations(
            model, layer, base_parts + extra, attribute_to_layer_input))[0])
    wrapped = InputModel(model, layout, extra, None, len(parts) if layer is not None else 0)
    wrapped.set_context((parts if layer is not None else ()) + tuple(
        a for a in extra if isinstance(a, torch.Tensor)))
    return View(wrapped, x, base, layout, layer, attribute_to_layer_input)


class NeuronView(nn.Module):
    """A neuron of ``layer`` as a model: ``model`` run on its arguments, the output ``[B]`` is
    the layer's output (its input with ``to_input``) at ``selector``, so any method explains
    that neuron from the inputs (Captum's ``Neuron*`` attributions).

    ``selector``: an int (the neuron of a ``[B, N]`` layer output), a tuple of ints and
    slices indexing one sample's output (slices, and the axes a shorter tuple leaves: the
    selected neurons summed, as Captum aggregates them), or a callable mapping the layer output ``[B, ...]`` to ``[B]`` (a
    callable returning one value for the whole batch, e.g. a sum over it, is applied to
    every sample's output alone: the neuron of sample ``b`` is ``selector(h[b:b+1])``).
    """

    def __init__(self, model: nn.Module, layer: nn.Module, selector, to_input: bool = False):
        super().__init__()
        check_layer(model, layer, to_input)
        if not (callable(selector) or isinstance(selector, (int, tuple))) or \
                isinstance(selector, bool):
            raise TypeError(f"neuron_selector must be an int, a tuple of ints/slices or a "
                            f"callable, got {type(selector).__name__}")
        self.model, self.layer, self.selector, self.to_input = model, layer, selector, to_input
        follow_mode(self, model)

    def forward(self, *args):
        seen = []
        handle = watch(self.layer, self.to_input, seen)
        try:
            self.model(*args)
        finally:
            handle.remove()
        if len(seen) != 1:
            raise ValueError(f"layer ({type(self.layer).__name__}) must run once per forward "
                             f"pass to select a neuron of it, it ran {len(seen)} times")
        h = seen[0]
        if callable(self.selector):
            value = self.selector(h)
            if isinstance(value, torch.Tensor) and value.dim() == 0:
                # one value for the batch (e.g. a sum over it): read sample by sample
                if h.shape[0] == 1:
                    return value.reshape(1)
                return torch.stack([self.selector(h[b:b + 1]).reshape(()) for b in
                                    range(h.shape[0])])
            return value
        index = (self.selector,) if isinstance(self.selector, int) else self.selector
        if len(index) > h.dim() - 1:
            raise ValueError(f"neuron_selector {self.selector!r} has more indices than one "
                             f"sample of the layer's output has axes, shape "
                             f"{tuple(h.shape[1:])}")
        picked = h[(slice(None),) + tuple(index)]
        return picked.reshape(h.shape[0], -1).sum(1)
