"""Element-wise subgraphs of one tensor as one activation, for the layer-wise rules.

A function written out of several element-wise operations of one input tensor ``x`` is
still one element-wise function ``z = phi(x)``; GPT-2's ``gelu_new``,

    phi(x) = 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3))),

a SiLU written ``x * sigmoid(x)``, a softplus or GELU-tanh by hand. Captured as core ATen
operations it is a product of two input-dependent tensors (``x`` and ``0.5 (1 + tanh(...))``),
which the rules would split half and half (the Shapley product rule), where AttnLRP and
DeepLIFT treat the activation as one function: the identity rule ``R_x = R_z`` for
AttnLRP, DeepLIFT's Rescale ``(phi(x) - phi(x~)) / (x - x~)`` on the whole of it. A chain
of one-argument steps needs it too under LRP: ``log(1 + exp(x))`` would give the
constant 1 its share of the relevance at the sum (DeepLIFT's multipliers of a chain
compose to the whole's Rescale either way).

:func:`fuse_elementwise` finds every maximal region of the captured graph that

* is made of element-wise operations (``torch.Tag.pointwise``, the activations kept
  whole) whose output has the shape of the region's input ``x``,
* depends on the input through ``x`` only (every input-dependent argument of a member is
  ``x`` or another member; the other arguments are Python numbers),
* has one output (one member used outside the region) and at least two operations,

and replaces it by one node ``taylorattr::elementwise(x)`` computing the region (the
operation :mod:`.graph` captures ``elementwise = True`` modules as), which the planner
classifies as an element-wise activation. The forward is unchanged; the graph is fused in
place, once (a fused graph has no region left to fuse).
"""
from __future__ import annotations

import torch
from torch import fx, nn

from .graph import _DECLARED, KEPT_WHOLE  # graph registers taylorattr::elementwise

__all__ = ["FusedElementwise", "fuse_elementwise"]

_KEPT = frozenset(op.overloadpacket for op in KEPT_WHOLE)


class FusedElementwise(nn.Module):
    """One element-wise region of a captured graph as a module of its one input."""

    elementwise = True

    def __init__(self, graph: fx.Graph):
        super().__init__()
        self.region = fx.GraphModule(nn.Module(), graph)

    def forward(self, x):
        return self.region(x)


def _elementwise(node: fx.Node) -> bool:
    target = node.target
    return node.op == "call_function" and isinstance(target, torch._ops.OpOverload) and (
        torch.Tag.pointwise in target.tags or target.overloadpacket in _KEPT
        or target.overloadpacket is torch.ops.taylorattr.elementwise) and \
        not target.is_view and not target._schema.is_mutable and \
        "rand" not in target.name() and "bernoulli" not in target.name()


def _shape(node) -> tuple | None:
    val = node.meta.get("val") if isinstance(node, fx.Node) else None
    if isinstance(val, torch.Tensor) and val.is_floating_point():
        return tuple(val.shape), val.dtype
    return None


def _live_nodes(graph: fx.Graph, source: fx.Node) -> set:
    """The nodes whose value depends on ``source`` (floating tensors)."""
    live = {source}
    for node in graph.nodes:
        if node is source or _shape(node) is None:
            continue
        deps: list = []
        fx.node.map_arg((node.args, node.kwargs), deps.append)
        if any(d in live for d in deps):
            live.add(node)
    return live


def _regions(graph: fx.Graph, live: set) -> dict:
    """``source -> members`` (in graph order): every live element-wise node whose live
    arguments all stem from one ``source`` of the same shape (through members)."""
    src: dict = {}
    members: dict = {}
    for node in graph.nodes:
        if node not in live or not _elementwise(node):
            continue
        args: list = []
        fx.node.map_arg((node.args, node.kwargs), args.append)
        if any(a not in live for a in args):
            continue  # a constant or parameter tensor argument: not a function of x alone
        roots = {src.get(a, a) for a in args}
        if len(roots) != 1:
            continue
        root = roots.pop()
        if _shape(root) is None or _shape(node) != _shape(root):
            continue
        src[node] = root
        members.setdefault(root, []).append(node)
    return members


def _components(nodes: list) -> list:
    """The members of one source split into their connected parts (joined where one is an
    argument of another), each in graph order."""
    part = {n: n for n in nodes}

    def find(n):
        while part[n] is not n:
            part[n] = part[part[n]]
            n = part[n]
        return n
    for n in nodes:
        args: list = []
        fx.node.map_arg((n.args, n.kwargs), args.append)
        for a in args:
            if a in part:
                part[find(a)] = find(n)
    groups: dict = {}
    for n in nodes:
        groups.setdefault(find(n), []).append(n)
    return list(groups.values())


def _fuse(graph: fx.Graph, source: fx.Node, nodes: list, keep: list) -> bool:
    region = set(nodes)
    outputs = [n for n in nodes if any(u not in region for u in n.users)]
    if len(outputs) != 1 or len(nodes) < 2:
        return False
    out = outputs[0]
    if any(n is not out and any(u not in region for u in n.users) for n in nodes):
        return False
    sub = fx.Graph()
    env = {source: sub.placeholder("x")}
    needed = _ancestors(out, region)
    for n in nodes:
        if n in needed:
            env[n] = sub.node_copy(n, lambda a: env[a])
    sub.output(env[out])
    module = FusedElementwise(sub)
    keep.append(module)  # held by the captured module: the op finds it by id
    _DECLARED[id(module)] = module
    with graph.inserting_after(out):
        fused = graph.call_function(torch.ops.taylorattr.elementwise.default,
                                    (source, id(module)))
    fused.meta = dict(out.meta)
    out.replace_all_uses_with(fused)
    for n in reversed(nodes):
        if not n.users:
            graph.erase_node(n)
    return True


def _ancestors(out: fx.Node, region: set) -> set:
    seen, stack = set(), [out]
    while stack:
        n = stack.pop()
        if n in seen or n not in region:
            continue
        seen.add(n)
        fx.node.map_arg((n.args, n.kwargs), stack.append)
    return seen


def fuse_elementwise(module: fx.GraphModule, source_name: str) -> int:
    """Fuse every element-wise region of one tensor (module docstring) in ``module``'s
    graph, whose input is the placeholder ``source_name``; the number of regions fused."""
    graph = module.graph
    source = next(n for n in graph.nodes if n.op == "placeholder" and n.name == source_name)
    keep = module.__dict__.setdefault("_taylorattr_fused", [])
    fused = 0
    for root, nodes in _regions(graph, _live_nodes(graph, source)).items():
        for component in _components(nodes):
            fused += _fuse(graph, root, component, keep)
    if fused:
        module.recompile()
    return fused
