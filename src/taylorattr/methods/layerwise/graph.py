"""The graph the layer-wise engine runs: the model captured as core ATen operations.

``torch.export`` traces ``model.forward`` at an example input (batch dimension dynamic
where the model allows it, defaulted arguments at their defaults) and the graph is
decomposed to core ATen, except elementwise activations (SiLU, Hardswish, Mish, ...),
which stay whole so that each gets one rule. So every model, whatever its modules and
functional calls (``nn.MultiheadAttention``, ``F.scaled_dot_product_attention``,
``F.layer_norm``, torchvision's wrapped Swin functions, timm's blocks), reaches the planner
as the same small set of operations, and coverage follows from the graph.

Normalisation after capture:

* an operation with several outputs of which only the first is used (batch norm, layer
  norm, group norm, max pooling with indices, ``max.dim``) becomes one node computing that
  output (:func:`first_output`), so that every planned node produces one tensor;
* guard nodes (``_guards_fn``, ``_assert_*``) are removed: they carry no relevance;
* a module declaring ``elementwise = True`` is one operation
  (:func:`declared_elementwise`), whatever its forward is made of.

Parameters and buffers are read from the live model at every run (the graph refers to
them by their qualified names), so a model whose weights change needs no new capture.
"""
from __future__ import annotations

import operator
import os
import re
import weakref

import torch
from torch import fx, nn

__all__ = ["Captured", "capture", "first_output", "location", "module_path", "op_name"]

_TORCH_DIR = os.path.dirname(torch.__file__)
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


class first_output:  # noqa: N801 (used like the function it wraps)
    """``op(*args)[0]`` as one callable (a multi-output operation of which only the first
    output is used); ``op`` keeps its name in messages."""

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


class Captured:
    """A captured graph and whether its batch dimension is dynamic."""

    def __init__(self, module: fx.GraphModule, dynamic: bool):
        self.module, self.dynamic = module, dynamic

    @property
    def graph(self) -> fx.Graph:
        return self.module.graph


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
    :func:`declared_elementwise` (undone by :func:`_undeclare`)."""
    found = [m for m in model.modules() if getattr(m, "elementwise", False) is True]
    for m in found:
        _DECLARED[id(m)] = m
        m.forward = lambda x, _key=id(m): torch.ops.taylorattr.elementwise(x, _key)
    return found


def _undeclare(found: list[nn.Module]) -> None:
    for m in found:
        m.__dict__.pop("forward", None)


def _decompositions() -> dict:
    table = torch.export.default_decompositions()
    for op in KEPT_WHOLE:
        table.pop(op, None)
    return table


def _export(model: nn.Module, x: torch.Tensor, dynamic: bool):
    shapes = ({0: torch.export.Dim("batch", min=1)},) if dynamic else None
    declared = _declare(model)
    try:
        ep = torch.export.export(model, (x,), dynamic_shapes=shapes, strict=False)
    finally:
        _undeclare(declared)
    return ep.run_decompositions(_decompositions()).module()


def _normalise(gm: fx.GraphModule) -> None:
    graph = gm.graph
    for node in list(graph.nodes):
        if node.op == "call_module" and node.target == "_guards_fn" or (
                node.op == "call_function" and "assert" in str(node.target)):
            if not node.users:
                graph.erase_node(node)
            continue
        if node.op == "call_function" and node.target in _MULTI_OUTPUT:
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
    gm.recompile()


def capture(model: nn.Module, x: torch.Tensor, error: type[Exception]) -> Captured:
    """Export ``model`` at ``x`` (dynamic batch if the model allows it, else at this
    batch size); failures raise ``error`` naming the cause."""
    example = x.detach()
    if example.shape[0] == 1:  # export specialises a batch of one
        example = example.expand(2, *example.shape[1:]).clone()
    last = None
    for dynamic in (True, False):
        try:
            gm = _export(model, example if dynamic else x.detach(), dynamic)
            break
        except Exception as exc:  # export raises many kinds of errors
            last = exc
    else:
        raise error(
            f"the layer-wise engine captures the model with torch.export; exporting "
            f"{type(model).__name__} at an input of shape {tuple(x.shape)} failed: "
            f"{type(last).__name__}: {str(last).strip().splitlines()[0] if str(last) else ''}. "
            "What to do: make forward exportable (no Python branching on tensor values, "
            "no data-dependent shapes), or explain the model with a method that needs no "
            "graph (IntegratedGradients, GradientInput, Occlusion).") from last
    _normalise(gm)
    return Captured(gm, dynamic)


def op_name(target) -> str:
    """``"aten.sort.default"``: the ATen name of a node's target (through
    :class:`first_output`)."""
    return str(target.op if isinstance(target, first_output) else target)


_FRAME = re.compile(r'File "([^"]+)", line (\d+), in \S+\n\s*(.*)')


def location(node: fx.Node) -> str:
    """``"model.py:12 (h = torch.sort(h))"``: the innermost line outside torch that made
    ``node`` ("" when none is known)."""
    trace = node.meta.get("stack_trace") or ""
    frames = [f for f in _FRAME.findall(trace) if not f[0].startswith(_TORCH_DIR)]
    if not frames:
        return ""
    path, line, code = frames[-1]
    return f"{os.path.basename(path)}:{line} ({code.strip()})"


def module_path(node: fx.Node) -> tuple[str, str]:
    """``(path, class name)`` of the innermost module that made ``node`` (``("", "")``
    at the top level)."""
    stack = node.meta.get("nn_module_stack") or {}
    if not stack:
        return "", ""
    path, cls = list(stack.values())[-1]
    name = cls if isinstance(cls, str) else getattr(cls, "__qualname__", str(cls))
    return path, name.rsplit(".", 1)[-1]


_CAPTURES: weakref.WeakKeyDictionary[nn.Module, dict] = weakref.WeakKeyDictionary()


def cached_capture(model: nn.Module, x: torch.Tensor, signature, error) -> Captured:
    """:func:`capture`, cached per model, input row shape, dtype and device (and batch size
    where the batch is not dynamic); re-captured when ``signature`` changes."""
    table = _CAPTURES.setdefault(model, {})
    key = (signature, tuple(x.shape[1:]), x.dtype, x.device.type)
    found = table.get(key) or table.get(key + (x.shape[0],))
    if found is None:
        found = capture(model, x, error)
        table[key if found.dynamic else key + (x.shape[0],)] = found
    return found
