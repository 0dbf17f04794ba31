"""The graph the layer-wise engine runs: the model as core ATen operations, from the
project's one capture (:func:`taylorattr.capture.capture`, ``torch.export`` lowered to
core ATen, guards dropped, batch and sequence axes dynamic where the model allows it;
kept on disk across processes by :mod:`taylorattr.capture_cache`).

So every model, whatever its modules and functional calls (``nn.MultiheadAttention``,
``F.scaled_dot_product_attention``, ``F.layer_norm``, torchvision's wrapped Swin
functions, timm's blocks, defaulted ``forward`` arguments), reaches the planner as the same
small set of operations, and coverage follows from the graph. On top of the shared
capture:

* elementwise activations (:data:`KEPT_WHOLE`: SiLU, Hardswish, Mish, ...) are kept whole,
  so that each gets one rule, and so is every module declaring ``elementwise = True``
  (captured as the one operation :func:`declared_elementwise`, whatever its forward is
  made of);
* an operation with several outputs of which only the first is used (batch norm, layer
  norm, group norm, max pooling with indices, ``max.dim``) becomes one node computing that
  output (:class:`first_output`), so that every planned node produces one tensor.

Parameters and buffers are read from the live model at every run.
"""
from __future__ import annotations

import operator
import threading
import weakref

import torch
from torch import fx, nn

from ..._validation import model_output
from ...capture import DEFAULT_KEEP, CaptureError, CoreGraph
from ...capture import op_name as _aten_name
from ...capture_cache import capture

__all__ = ["KEPT_WHOLE", "cached_capture", "capture_model", "declared_elementwise",
           "first_output", "module_path", "op_name", "structure_key"]

aten = torch.ops.aten

#: elementwise activations kept whole (one Rescale / identity rule each)
KEPT_WHOLE = (aten.silu.default, aten.hardswish.default, aten.hardsigmoid.default,
              aten.mish.default, aten.elu.default, aten.celu.default, aten.selu.default,
              aten.relu6.default, aten.softplus.default, aten.leaky_relu.default,
              aten.gelu.default, aten.hardtanh.default, aten._prelu_kernel.default)
_MULTI_OUTPUT = {aten._native_batch_norm_legit_no_training.default,
                 aten.native_layer_norm.default, aten.native_group_norm.default,
                 aten.max_pool2d_with_indices.default, aten.max_pool3d_with_indices.default,
                 aten.adaptive_max_pool2d.default, aten.adaptive_max_pool3d.default,
                 aten.max.dim, aten.min.dim}


class first_output:
    """``op(*args)[0]`` as one callable (a multi-output operation of which only the first
    output is used)."""

    def __init__(self, op):
        self.op = op
        self.__name__ = str(op)

    def __call__(self, *args, **kwargs):
        return self.op(*args, **kwargs)[0]

    def __repr__(self):
        return f"{self.op}[0]"

    def __eq__(self, other):
        return isinstance(other, first_output) and other.op == self.op

    def __hash__(self):
        return hash(("first_output", self.op))


def op_name(target) -> str:
    """``"aten.sort.default"``: the ATen name of a node's target (through
    :class:`first_output`)."""
    return _aten_name(target.op if isinstance(target, first_output) else target)


# --- modules declaring ``elementwise = True``: one operation each ---------------------
_DECLARED: weakref.WeakValueDictionary[int, nn.Module] = weakref.WeakValueDictionary()


@torch.library.custom_op("taylorattr::elementwise", mutates_args=())
def declared_elementwise(x: torch.Tensor, key: int) -> torch.Tensor:
    """A module declaring ``elementwise = True``, captured as one operation (its rule
    then applies to the whole module, as to a built-in activation)."""
    out = _DECLARED[key](x)
    return out.clone() if out is x else out


@declared_elementwise.register_fake
def _(x, key):
    return torch.empty_like(x)


def _declared_setup(ctx, inputs, output):
    ctx.save_for_backward(inputs[0])
    ctx.key = inputs[1]


def _declared_backward(ctx, grad):
    (x,) = ctx.saved_tensors
    with torch.enable_grad():
        xx = x.detach().requires_grad_(True)
        (g,) = torch.autograd.grad(_DECLARED[ctx.key](xx), xx, grad)
    return g, None


declared_elementwise.register_autograd(_declared_backward, setup_context=_declared_setup)


def _declare(model: nn.Module) -> list[nn.Module]:
    """Route the forward of each module declaring ``elementwise = True`` through
    :func:`declared_elementwise` while capturing (undone by :func:`_undeclare`)."""
    found = [m for m in model.modules() if getattr(m, "elementwise", False) is True]
    for m in found:
        _DECLARED[id(m)] = m
        m.forward = _declared_forward(id(m))
    return found


def _declared_forward(key: int):
    return lambda x: torch.ops.taylorattr.elementwise(x, key)


def _undeclare(found: list[nn.Module]) -> None:
    for m in found:
        m.__dict__.pop("forward", None)


# --- capture ----------------------------------------------------------------------------
def _normalise(graph: fx.Graph) -> None:
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target not in _MULTI_OUTPUT:
            continue
        users = list(node.users)
        if users and all(u.target is operator.getitem and u.args[1] == 0 for u in users):
            with graph.inserting_after(node):
                fused = graph.call_function(first_output(node.target), node.args, node.kwargs)
            fused.meta = dict(node.meta)
            fused.meta["val"] = users[0].meta.get("val")
            for u in users:
                u.replace_all_uses_with(fused)
                graph.erase_node(u)
            graph.erase_node(node)
    graph.lint()


def _example(x: torch.Tensor) -> torch.Tensor:
    """The input the engine captures at: ``x``, a batch of one widened to two (a batch of
    one would be specialised; the graph of a dynamic batch runs a batch of one as well)."""
    example = x.detach()
    if example.dim() and example.shape[0] == 1:
        example = example.expand(2, *example.shape[1:]).clone()
    return example


def capture_model(model: nn.Module, x: torch.Tensor, error: type[Exception],
                  widen: bool = True) -> CoreGraph:
    """The shared capture of ``model`` at ``x`` for the layer-wise engine (module
    docstring); failures raise ``error``. Where the batch axis of the widened example comes
    out static (the model fixes it), the capture is made at ``x`` itself, so that it holds
    for ``x``; ``widen=False`` captures at ``x`` at once."""
    example = _example(x) if widen else x.detach()
    declared = _declare(model)
    failure = None
    try:
        core = capture(model, (example,), keep=tuple(DEFAULT_KEEP) + KEPT_WHOLE)
        if not core.fits(example if core.batch_dynamic else x.detach()):
            core = capture(model, (x.detach(),), keep=tuple(DEFAULT_KEEP) + KEPT_WHOLE)
    except CaptureError as exc:
        failure = exc
    finally:
        _undeclare(declared)
    if failure is not None:
        with torch.no_grad():  # inputs the model itself refuses: a ValueError naming them
            model_output(model, x.detach())
        raise error(f"the layer-wise engine captures the model with torch.export: {failure}") \
            from failure
    _normalise(core.module.graph)  # a fresh capture's own graph (a copy of the program's)
    core.module.recompile()
    core.refresh()
    return core


def module_path(node: fx.Node) -> tuple[str, str]:
    """``(path, class name)`` of the innermost module that made ``node`` (``("", "")``
    at the top level)."""
    stack = node.meta.get("nn_module_stack") or {}
    if not stack:
        return "", ""
    path, cls = list(stack.values())[-1]
    name = cls if isinstance(cls, str) else getattr(cls, "__qualname__", str(cls))
    return path, name.rsplit(".", 1)[-1]


_BARE = frozenset(vars(nn.Module()))  # the attributes every module has
_SHARED: dict = {}  # structure key -> its CoreGraphs, shared by models of that structure
_SHARED_MAX = 32


def _attribute_key(v):
    if isinstance(v, torch.Tensor):
        return ("tensor", tuple(v.shape), v.dtype, v.device.type,
                hash(v.detach().cpu().numpy().tobytes()) if v.numel() <= 4096 else id(v))
    if isinstance(v, (bool, int, float, str, type(None), tuple)):
        return v if not isinstance(v, tuple) or all(
            isinstance(e, (bool, int, float, str, type(None))) for e in v) else repr(v)
    return repr(v)  # functions, enums, ...; an object's address keeps it unshared


def structure_key(model: nn.Module):
    """What the captured graph of ``model`` depends on besides its parameter and buffer
    values (which are read live): each module's class, its own attributes (flags,
    hyper-parameters, plain tensors; not per-thread state) and its parameter and buffer
    shapes. None where the graph may hold more (hooks, modules declaring
    ``elementwise = True``, whose captured operation names the module itself): then the
    capture is the model's own."""
    parts, first = [], {}
    # every name a module is reachable by: an alias (a wrapper's ``self.layer`` naming one of
    # its model's modules) says which module plays which part
    for name, m in model.named_modules(remove_duplicate=False):
        if id(m) in first:
            parts.append((name, "alias of", first[id(m)]))
            continue
        first[id(m)] = name
        if m._forward_hooks or m._forward_pre_hooks or \
                getattr(m, "elementwise", False) is True:
            return None
        own = tuple(sorted((k, _attribute_key(v)) for k, v in vars(m).items()
                           if k not in _BARE and not isinstance(v, threading.local)))
        tensors = tuple((k, tuple(t.shape), t.dtype, t.device.type)
                        for k, t in (*m._parameters.items(), *m._buffers.items())
                        if t is not None)
        parts.append((name, type(m), m.training, own, tensors))
    return tuple(parts)


_CAPTURES: weakref.WeakKeyDictionary[nn.Module, list] = weakref.WeakKeyDictionary()


def _fitting(graphs: list, example: torch.Tensor, x: torch.Tensor):
    """The first graph of ``graphs`` that holds for ``x`` (captured at ``example``)."""
    for graph in graphs:
        if graph.fits(example if graph.batch_dynamic else x):
            return graph
    return None


def cached_capture(model: nn.Module, x: torch.Tensor, signature, error) -> CoreGraph:
    """:func:`capture_model`, cached per model and ``signature`` (captured again when it
    changes) and shared between models of the same :func:`structure_key` (tests and sweeps
    build many). A cached graph is used only where it holds for ``x``
    (:meth:`CoreGraph.fits`: the dtype, device kind, rank and static sizes it was captured
    for; a dynamic batch size or sequence length any size), so one capture serves every
    batch size and sequence length the model lets export keep dynamic, and a capture fixed
    to one shape is never run at another."""
    entry = _CAPTURES.get(model)
    if entry is None or entry[0] != signature:
        entry = _CAPTURES[model] = (signature, [])
    example = _example(x)
    found = _fitting(entry[1], example, x.detach())
    if found is not None:
        return found
    structure = structure_key(model)
    shared = _SHARED.get(structure, []) if structure is not None else []
    found = _fitting(shared, example, x.detach())
    if found is None:  # a static capture at the widened example: the model fixes its batch
        fixed = any(g.fits(example) and not g.batch_dynamic for g in entry[1] + shared)
        found = capture_model(model, x, error, widen=not fixed)
        if structure is not None:
            if structure not in _SHARED and len(_SHARED) >= _SHARED_MAX:
                _SHARED.pop(next(iter(_SHARED)))
            _SHARED.setdefault(structure, []).append(found)
    entry[1].append(found)
    return found
