"""The Taylor-mode interpreter: a model captured as core ATen operations
(:mod:`taylorattr.capture`) run on truncated Taylor series.

Each input-dependent node of the captured graph gets a :class:`CoreJet`: its value
``x_0`` (the node's own tensor, any shape: no axis is singled out as the batch) and the
coefficients ``x_1..x_K`` stacked as ``series[k-1, r]`` for ``m`` directions ``r``:

    x(t) = x_0 + sum_{k=1..K} x_k t^k     (the node's value along f(x + t v_r))

Each node is dispatched to its rule in :mod:`.registry` (user rules first, then the
families of :mod:`taylorattr.taylor.mode.rules`); an op whose result is not a floating
tensor (comparisons, masks, sizes) is locally constant and evaluated on the values. The
shared builders every rule uses live here: CoreJet arithmetic (``+ - * /``, Cauchy
products ``(ab)_k = sum_j a_j b_{k-j}`` and the quotient recurrence), ``unary`` (a
recurrence of :mod:`taylorattr.series`), ``linear`` / :func:`joint_linear` (a map linear in
its input-dependent arguments, ``y_k = L(x_k)``, run by ``torch.vmap`` over the stacked
coefficients so every shape argument means what it meant for ``x_0``) and
:func:`bilinear`.

:func:`trace` decides what kind of model it is given (an ``nn.Module``, an
``ExportedProgram``, a ``.pt2`` path, a :class:`TaylorProgram`) in one place and keeps one
capture per input signature; :func:`propagate` runs it. Per graph, two checks run once
(recorded in ``CoreGraph.passed``): every input-dependent op has a rule, and one sample's
output does not depend on another sample's input.

Why one module: the series type, its arithmetic and the interpreter that dispatches graph
nodes to rules are one mechanism; the rules' families live apart in :mod:`.rules`.
"""
from __future__ import annotations

import operator
import os
import weakref
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn
from torch.utils import _pytree as pytree

from ... import series as S
from ..._codegen import Call, Constant, Generated, lifted_reader
from ..._validation import cpu_generator, draw, run_model
from ...capture import CaptureError, CoreGraph, capture, op_name, refuse, where
from ...capture_cache import capture as cached_capture
from . import registry as R

__all__ = ["CoreJet", "Jet", "TaylorProgram", "UnsupportedOperation", "bilinear", "binary",
           "check", "is_jet", "joint_linear", "piecewise_linear_ops", "piecewise_nodes",
           "propagate", "propagate_core", "rank", "trace"]

aten = torch.ops.aten


class UnsupportedOperation(TypeError):
    """An operation the Taylor-mode interpreter has no exact rule for."""


@dataclass
class Jet:
    """What :func:`propagate` returns: the truncated Taylor series of the model output.

    ``primal``: ``[B, *s]``, ``f(x)``; ``series``: ``[K, B, m, *s]``, the coefficients of
    ``t^1..t^K`` of ``f(x + t v_r)`` for the ``m`` directions of each sample. ``affine``:
    the output is affine in ``t`` (coefficients 2..K are zero)."""

    primal: torch.Tensor
    series: torch.Tensor
    affine: bool = False

    @property
    def order(self) -> int:
        return self.series.shape[0]


class CoreJet:
    """Truncated Taylor series of one node of a captured graph (module docstring).

    ``primal``: the value; ``series``: ``[K', m, *primal.shape]`` with ``K' = K`` or, for an
    ``affine`` node (coefficients 2..K are zero, as between the input and the first
    nonlinearity), ``K' = 1``."""

    def __init__(self, primal: torch.Tensor, series: torch.Tensor, order: int,
                 affine: bool = False):
        self.primal, self.series, self._order, self.affine = primal, series, order, affine

    @property
    def order(self) -> int:
        return self._order

    @property
    def m(self) -> int:
        return self.series.shape[1]

    def full(self) -> torch.Tensor:
        """All ``K`` coefficients ``[K, m, *s]`` (zeros appended for an affine node)."""
        if self.series.shape[0] == self._order:
            return self.series
        pad = self.series.new_zeros((self._order - self.series.shape[0],) + self.series.shape[1:])
        return torch.cat([self.series, pad])

    def coeffs(self) -> list[torch.Tensor]:
        """``[x_0, x_1, ..., x_K]`` (``x_0`` without the direction axis: it broadcasts)."""
        out = [self.primal] + list(self.series.unbind(0))
        zero = self.primal.new_zeros(())
        return out + [zero] * (self._order + 1 - len(out))

    @classmethod
    def from_coeffs(cls, coeffs: list, like: CoreJet) -> CoreJet:
        primal = coeffs[0]
        shape = (like.m,) + tuple(primal.shape)
        return cls(primal, torch.stack([torch.as_tensor(c, dtype=primal.dtype,
                                                        device=primal.device).expand(shape)
                                        for c in coeffs[1:]]), like.order)

    def unary(self, rule: Callable) -> CoreJet:
        """Apply a series rule (a function of the coefficient list, e.g. ``series.tanh``)."""
        return CoreJet.from_coeffs(rule(self.coeffs()), self)

    def linear(self, fn: Callable, fn_series: Callable | None = None) -> CoreJet:
        """A map affine in this tensor: ``fn`` on the value, ``fn_series`` (``fn`` without its
        constant part; default ``fn``) on every coefficient, each shaped like the value."""
        primal = fn(self.primal)
        rows = self.series.reshape((-1,) + self.series.shape[2:])
        out = torch.vmap(fn_series or fn)(rows)
        return CoreJet(primal, out.reshape(self.series.shape[:2] + out.shape[1:]), self._order,
                       self.affine)

    def withrank(self, n: int) -> CoreJet:
        """The same series with leading axes of size 1 added up to rank ``n`` (broadcasting)."""
        d = self.primal.dim()
        if d >= n:
            return self
        shape = (1,) * (n - d) + tuple(self.primal.shape)
        return CoreJet(self.primal.reshape(shape), self.series.reshape(self.series.shape[:2] + shape),
                       self._order, self.affine)

    def __neg__(self):
        return CoreJet(-self.primal, -self.series, self._order, self.affine)

    # exact arithmetic with CoreJets, tensors or numbers, on both sides (:func:`binary`)
    def __add__(self, other):
        return binary(self, other, "add")

    def __radd__(self, other):
        return binary(other, self, "add")

    def __sub__(self, other):
        return binary(self, other, "sub")

    def __rsub__(self, other):
        return binary(other, self, "sub")

    def __mul__(self, other):
        return binary(self, other, "mul")

    def __rmul__(self, other):
        return binary(other, self, "mul")

    def __truediv__(self, other):
        return binary(self, other, "div")

    def __rtruediv__(self, other):
        return binary(other, self, "div")


def is_jet(v) -> bool:
    return isinstance(v, CoreJet)


def rank(v) -> int:
    return v.primal.dim() if is_jet(v) else (v.dim() if isinstance(v, torch.Tensor) else 0)


def binary(a, b, op: str) -> CoreJet:
    """``a op b`` (add/sub/mul/div) with broadcasting, at least one a :class:`CoreJet`."""
    n = max(rank(a), rank(b))
    a = a.withrank(n) if is_jet(a) else a
    b = b.withrank(n) if is_jet(b) else b
    jet = a if is_jet(a) else b
    if op in ("add", "sub"):
        fn = torch.add if op == "add" else torch.sub
        if is_jet(a) and is_jet(b):
            primal = fn(a.primal, b.primal)
            if a.affine and b.affine:
                sa, sb, affine = a.series, b.series, True
            else:
                sa, sb, affine = a.full(), b.full(), False
            series = fn(sa, sb)
            return CoreJet(primal, series.expand(series.shape[:2] + primal.shape), jet.order, affine)
        if is_jet(a):
            primal = fn(a.primal, b)
            return CoreJet(primal, a.series.expand(a.series.shape[:2] + primal.shape), a.order,
                           a.affine)
        primal = fn(a, b.primal)
        series = b.series.expand(b.series.shape[:2] + primal.shape)
        return CoreJet(primal, -series if op == "sub" else series, b.order, b.affine)
    if op == "mul":
        if is_jet(a) and is_jet(b):
            return CoreJet.from_coeffs(S.mul(a.coeffs(), b.coeffs()), jet)
        c = b if is_jet(a) else a
        primal = jet.primal * c
        series = jet.series * c
        return CoreJet(primal, series.expand(series.shape[:2] + primal.shape), jet.order, jet.affine)
    if op == "div":
        if is_jet(b):
            coeffs = a.coeffs() if is_jet(a) else [torch.as_tensor(a, dtype=b.primal.dtype, device=b.primal.device)] + \
                [b.primal.new_zeros(())] * b.order
            return CoreJet.from_coeffs(S.div(coeffs, b.coeffs()), jet)
        primal = a.primal / b
        series = a.series / b
        return CoreJet(primal, series.expand(series.shape[:2] + primal.shape), a.order, a.affine)
    raise AssertionError(op)



def _jets(tree, out: list | None = None) -> list[CoreJet]:
    """The CoreJets among a node's arguments, in order (plain tuples, lists and dicts are
    walked here; other containers by ``torch.utils._pytree``, as before)."""
    out = [] if out is None else out
    kind = type(tree)
    if isinstance(tree, CoreJet):
        out.append(tree)
    elif kind is tuple or kind is list:
        for v in tree:
            _jets(v, out)
    elif kind is dict:
        for v in tree.values():
            _jets(v, out)
    elif pytree._get_node_type(tree) in pytree.SUPPORTED_NODES:
        out += [v for v in pytree.tree_leaves(tree, is_leaf=is_jet) if is_jet(v)]
    return out


def _map(tree, fn):
    """``tree`` with ``fn`` applied to each CoreJet (containers as :func:`_jets`)."""
    kind = type(tree)
    if isinstance(tree, CoreJet):
        return fn(tree)
    if kind is tuple or kind is list:
        return kind(_map(v, fn) for v in tree)
    if kind is dict:
        return {k: _map(v, fn) for k, v in tree.items()}
    if pytree._get_node_type(tree) in pytree.SUPPORTED_NODES:
        return pytree.tree_map(lambda v: fn(v) if is_jet(v) else v, tree, is_leaf=is_jet)
    return tree


def joint_linear(op, args, kwargs, additive: bool = False, strip: Callable | None = None):
    """``op`` linear in all its input-dependent arguments jointly. ``additive``: floating
    constant tensors among the arguments are additive (a constant branch, a constant part
    of a cat) and become zeros for the coefficients; ``strip(args, kwargs)`` removes other
    constant parts (a bias, a pad value) for the coefficients."""
    jets = _jets((args, kwargs))
    like = jets[0]
    primal = op(*_map(args, lambda j: j.primal), **_map(kwargs, lambda j: j.primal))
    affine = all(j.affine for j in jets)
    stacks = [(j.series if affine else j.full()) for j in jets]
    lead = stacks[0].shape[:2]
    flat = [s.reshape((-1,) + s.shape[2:]) for s in stacks]
    s_args, s_kwargs = (args, kwargs) if strip is None else strip(args, kwargs)
    if additive:
        s_args, s_kwargs = pytree.tree_map(
            lambda v: torch.zeros_like(v) if isinstance(v, torch.Tensor) and not is_jet(v)
            and v.is_floating_point() else v, (s_args, s_kwargs), is_leaf=is_jet)

    def per_row(*rows):
        it = iter(rows)
        a, k = _map((s_args, s_kwargs), lambda _: next(it))
        return op(*a, **k)

    out = torch.vmap(per_row)(*flat)
    wrap = (lambda p, s: CoreJet(p, s.reshape(lead + s.shape[1:]), like.order, affine))
    if isinstance(primal, (tuple, list)):
        return type(primal)(wrap(p, s) for p, s in zip(primal, out))
    return wrap(primal, out)


def bilinear(op, a, b, *rest, **kw) -> CoreJet:
    """``op(a, b, ...)`` linear in ``a`` and in ``b``: ``c_k = sum_j op(a_j, b_{k-j})``."""
    if not (is_jet(a) and is_jet(b)):
        return joint_linear(lambda x, y: op(x, y, *rest, **kw), (a, b), {})
    ca, cb = a.coeffs(), b.coeffs()
    primal = op(ca[0], cb[0], *rest, **kw)
    like = a
    m = a.m
    left = torch.vmap(lambda s: op(ca[0], s, *rest, **kw))(b.full().reshape((-1,) + b.primal.shape))
    right = torch.vmap(lambda s: op(s, cb[0], *rest, **kw))(a.full().reshape((-1,) + a.primal.shape))
    K = a.order
    out = (left + right).reshape((K, m) + primal.shape)
    both = torch.vmap(lambda x, y: op(x, y, *rest, **kw))
    terms = [out[k - 1] for k in range(1, K + 1)]
    for k in range(2, K + 1):
        for j in range(1, k):
            terms[k - 1] = terms[k - 1] + both(ca[j].expand((m,) + a.primal.shape),
                                               cb[k - j].expand((m,) + b.primal.shape))
    return CoreJet(primal, torch.stack(terms), like.order)




_VALUE_FREE = {aten.sym_size, aten.sym_stride, aten.sym_numel, aten.sym_storage_offset,
               aten.zeros_like, aten.ones_like, aten.full_like, aten.empty_like, aten.new_zeros,
               aten.new_ones, aten.new_full, aten.new_empty, aten.rand_like, aten.randn_like}


def _packet(target):
    return target.overloadpacket if isinstance(target, torch._ops.OpOverload) else target


def _constant_result(node) -> bool:
    """Whether the node's value is locally constant in the input: not a floating tensor
    (a comparison, a mask, a size), or an op that reads only the input's shape."""
    if _packet(node.target) in _VALUE_FREE:
        return True
    val = node.meta.get("val")
    vals = val if isinstance(val, (tuple, list)) else (val,)
    if not vals or any(isinstance(v, torch.Tensor) and v.is_floating_point() for v in vals):
        return False
    return val is not None


def _entry(target) -> Callable | None:
    """The rule for a node's target (a surrogate module is bound as its first argument)."""
    entry = R.lookup(target)
    if entry is None:
        return None
    return (lambda *a, **k: entry.rule(target, *a, **k)) if isinstance(target, nn.Module) \
        else entry.rule


def supported(node) -> bool:
    return node.target is operator.getitem or _constant_result(node) or \
        R.lookup(node.target) is not None


ADVICE = ("What you can do: register an exact rule for each with "
          "ta.register_taylor_rule(torch.ops.aten.<op>.<overload>, rule) (docs/supported_ops.md "
          "lists the operations with rules), keep a module of your own whole as a "
          "torch.library custom op with its own rule, or replace the op in the model by "
          "supported ones; for a ReLU/max-pool network analyse ta.smooth(model, beta) instead.")


#: Ops that draw random numbers: a capture cannot replay the eager model's draws.
RANDOM = {aten.rand, aten.randn, aten.rand_like, aten.randn_like, aten.randint,
          aten.randint_like, aten.randperm, aten.bernoulli, aten.normal, aten.uniform,
          aten.multinomial, aten.exponential, aten.poisson}


def check(graph: CoreGraph) -> None:
    """Raise one :class:`UnsupportedOperation` listing every op without a rule (and every
    random op, input-dependent or not: its draws differ from the eager model's)."""
    if "taylor rules" in graph.passed:
        return
    found = graph.unsupported(supported)
    for node in graph.nodes:
        if _packet(node.target) in RANDOM:
            found.setdefault(f"{op_name(node.target)} (random numbers drawn in forward: make "
                             "them a buffer)", []).append(node)
    refuse(graph, found, "Taylor mode", ADVICE, UnsupportedOperation)
    graph.passed.add("taylor rules")


def piecewise_nodes(graph: CoreGraph) -> list[str]:
    """``op at module (Type)`` for each input-dependent piecewise-linear node."""
    return [f"{op_name(n.target)} at {where(n).split(',')[0]}" for n in graph.nodes
            if graph.depends_on_input(n) and _family(n.target) == "piecewise"]


def _family(target) -> str | None:
    entry = R.lookup(target)
    return None if entry is None else entry.family


def _primal(v):
    return v.primal if is_jet(v) else v


def _handle(node, args, kwargs):
    if node.target is operator.getitem:
        return args[0][args[1]]
    if _constant_result(node) or not _jets((args, kwargs)):  # e.g. fed only by masks
        return node.target(*_map(args, _primal), **_map(kwargs, _primal))
    rule = _entry(node.target)
    if rule is None:
        raise UnsupportedOperation(f"{op_name(node.target)} has no Taylor-mode rule")
    return rule(*args, **kwargs)


def _has_jet(v) -> bool:
    if isinstance(v, CoreJet):
        return True
    if isinstance(v, (tuple, list)):
        return any(_has_jet(e) for e in v)
    if isinstance(v, dict):
        return any(_has_jet(e) for e in v.values())
    return False


def _on_values(target):
    """``target`` called on the values of its arguments (a locally constant result)."""
    def call(*args, **kwargs):
        return target(*_map(args, _primal), **_map(kwargs, _primal))
    return call


def _kernel(node):
    """What computes ``node`` in the generated pass: :func:`_handle`'s choice made once,
    so that only the check for series among the arguments is left to each call."""
    target = node.target
    if target is operator.getitem:
        return operator.getitem
    on_values = _on_values(target)
    if _constant_result(node):
        return on_values
    rule = _entry(target)

    def kernel(*args, **kwargs):
        if not (_has_jet(args) or _has_jet(kwargs)):  # e.g. fed only by masks
            return on_values(*args, **kwargs)
        if rule is None:
            raise UnsupportedOperation(f"{op_name(target)} has no Taylor-mode rule")
        return rule(*args, **kwargs)
    return kernel


def _emit(graph: CoreGraph):
    def emit(node):
        if node.op == "get_attr":
            return Constant(getattr(graph.module, node.target))
        if graph.depends_on_input(node) or any(graph.depends_on_input(a)
                                               for a in node.all_input_nodes):
            return Call(_kernel(node), tuple(node.args), dict(node.kwargs))
        return Call(node.target, tuple(node.args), dict(node.kwargs))
    return emit


#: CoreGraph -> (its node list, the rule table's version, the generated pass, its
#: placeholders, the reader of its lifted inputs): generated
#: again when the graph is edited (``CoreGraph.refresh`` makes a new node list) or a rule
#: is registered or removed.
_GENERATED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _run(graph: CoreGraph, x):
    """``graph`` on the series ``x`` through its generated pass (:mod:`taylorattr._codegen`;
    the same calls as ``graph.run(x, handler=_handle)`` in straight-line code)."""
    entry = _GENERATED.get(graph)
    if entry is None or entry[0] is not graph.nodes or entry[1] != R.version():
        names = [n for n in graph.module.graph.nodes if n.op == "placeholder"]
        entry = (graph.nodes, R.version(), Generated(graph.module.graph, _emit(graph),
                                                     "taylor_pass"), names, lifted_reader(graph))
        _GENERATED[graph] = entry
    if len(graph.inputs) != 1:
        raise TypeError(f"the captured model takes {len(graph.inputs)} input(s), got 1")
    lifted = entry[4](graph.source)
    first = graph.inputs[0]
    out = entry[2](None, [x if p is first else lifted[p.name] for p in entry[3]])
    return out[0] if isinstance(out, (tuple, list)) and len(out) == 1 else out


MIXING_ADVICE = (
    "Taylor terms are per sample, so each sample must be computed on its own; this op mixes "
    "the samples of the batch (as softmax/var/einsum over the batch dimension, or a batch-first "
    "tensor fed to MultiheadAttention(batch_first=False), do). What you can do: keep the batch "
    "dimension out of it, or give the op a per-sample rule with ta.register_taylor_rule; for a "
    "ReLU/max-pool network analyse ta.smooth(model) instead.")


def _batch_axes(node, inputs: torch.Tensor, graph: CoreGraph) -> list[int]:
    """The axes of ``node``'s value that may be its batch axis: those of the symbolic batch
    size in a dynamic capture, else those of size ``B``."""
    val = node.meta.get("val")
    if not isinstance(val, torch.Tensor):
        return []
    batch = graph.inputs[0].meta["val"].shape[0]
    if graph.batch_dynamic:
        return [i for i, n in enumerate(val.shape) if str(n) == str(batch)]
    return [i for i, n in enumerate(val.shape) if n == inputs.shape[0]]


def _coupled(jet: CoreJet, axes: list[int]) -> bool:
    """Whether samples other than 0 move along every candidate batch axis."""
    first = jet.series[0, 0]
    return bool(axes) and all(bool((first.narrow(a, 1, first.shape[a] - 1).abs() > 0).any())
                              for a in axes)


def check_samples_separate(graph: CoreGraph, inputs: torch.Tensor) -> None:
    """Refuse a graph in which one sample's value depends on another sample's input: one
    first-order pass along a direction that moves sample 0 only. In a dynamic capture the
    batch axis of every node is known (its symbolic size) and the first node where another
    sample moves is named; otherwise the output (batch axis first) decides and the first
    node with a moving axis of size ``B`` is named. Done once per graph."""
    if "samples separate" in graph.passed or inputs.dim() == 0 or inputs.shape[0] < 2:
        return
    direction = torch.zeros_like(inputs)
    # a local generator: the check must not move the user's global random stream
    direction[0] = draw(torch.randn, inputs[0].shape, generator=cpu_generator(0),
                        device=inputs.device, dtype=torch.float64).to(inputs.dtype)
    suspects = []

    def watch(node, args, kwargs):
        out = _handle(node, args, kwargs)
        if is_jet(out) and not suspects and _coupled(out, _batch_axes(node, inputs, graph)):
            if graph.batch_dynamic:
                raise UnsupportedOperation(f"{graph.describe(node)}: {MIXING_ADVICE}")
            suspects.append(node)
        return out

    with torch.no_grad():
        out = graph.run(CoreJet(inputs.detach(), direction[None, None], 1, affine=True),
                        handler=watch)
    if is_jet(out) and out.primal.dim() > 0 and out.primal.shape[0] == inputs.shape[0] \
            and _coupled(out, [0]):
        node = suspects[0] if suspects else graph.output_node
        raise UnsupportedOperation(f"{graph.describe(node)}: {MIXING_ADVICE}")
    graph.passed.add("samples separate")


def propagate_core(graph: CoreGraph, inputs: torch.Tensor, directions: torch.Tensor,
                   order: int) -> Jet:
    """Taylor coefficients of ``t -> model(inputs + t v)`` for every direction, on a captured
    graph. ``directions``: ``[B, m, *s]``; returns a :class:`Jet` (``series`` ``[K, B, m, ...]``)."""
    spec = getattr(getattr(graph.program, "call_spec", None), "out_spec", None)
    if spec is not None and not spec.is_leaf():  # (y,), [y], {"logits": y}, a ModelOutput
        raise TypeError(f"model must return a torch.Tensor, got a {spec.type.__name__} of "
                        "outputs: wrap it so that forward returns the one tensor to explain")
    check(graph)
    check_samples_separate(graph, inputs)
    x = CoreJet(inputs, directions.transpose(0, 1).unsqueeze(0), order, affine=True)
    out = _run(graph, x)
    if not is_jet(out):
        raise UnsupportedOperation(
            f"model output is {type(out).__name__}, not a single tensor that depends on the input")
    if out.primal.dim() == 0:
        raise ValueError("model must return a batch-first tensor of shape [B] or [B, C], got a "
                         "0-dimensional output")
    return Jet(out.primal, out.full().transpose(1, 2), affine=out.affine and order > 0)


class TaylorProgram(nn.Module):
    """What :func:`trace` returns: the model (calling it runs the model) and its captures,
    each a :class:`~taylorattr.capture.CoreGraph` used for every input it holds for (one
    for every batch size where the batch axis exports as dynamic). A model with a
    ``taylor_core_graph(inputs)`` method (a smoothed model) supplies its own graphs."""

    def __init__(self, model, graph: CoreGraph | None = None, graphs: list | None = None):
        super().__init__()
        self.model = model
        self._graphs: list[tuple[bool, CoreGraph]] = [] if graphs is None else graphs
        self.last: CoreGraph | None = graph
        if graph is not None:  # a program's one graph: used for every input
            self._graphs.append((True, graph))

    def forward(self, *args, **kwargs):
        return self.model(*args, **kwargs)

    def graph(self, x: torch.Tensor) -> CoreGraph:
        """The core graph for inputs shaped like ``x`` (captured on first use; a capture
        is reused where it holds for ``x``, :meth:`CoreGraph.fits`)."""
        for given, graph in self._graphs:
            if given or graph.fits(x):
                self.last = graph
                return graph
        own = getattr(self.model, "taylor_core_graph", None)
        try:
            graph = own(x) if own is not None else cached_capture(self.model, (x.detach(),))
        except CaptureError as exc:  # Taylor mode's own refusal, with the capture's reasons
            if own is None:  # inputs the model itself refuses: say so, naming the inputs
                with torch.no_grad():
                    run_model(self.model, x.detach())
            raise UnsupportedOperation(str(exc)) from exc
        self._graphs.append((False, graph))
        self.last = graph
        return graph


#: Model -> (structure signature, its captures): reused across calls while the model's
#: modules, their types and train/eval modes stay the same (the captures hold the model
#: weakly, so the entry goes with the model).
_CAPTURES: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _signature(model: nn.Module) -> tuple:
    return tuple((name, id(m), type(m), m.training) for name, m in model.named_modules())


def trace(model, inputs: torch.Tensor | None = None) -> TaylorProgram:
    """The model ready for :func:`propagate` (a :class:`TaylorProgram`); with ``inputs`` its
    core graph for them is captured now. ``model``: an ``nn.Module``, an
    ``ExportedProgram``, the path of a ``.pt2`` file (``torch.export.save``) or a
    TaylorProgram. The one place where the kind of model is decided."""
    if isinstance(model, TaylorProgram):
        program = model
    elif isinstance(model, (str, os.PathLike, torch.export.ExportedProgram)):
        if isinstance(model, (str, os.PathLike)) and not os.path.isfile(model):
            raise TypeError(f"model must be a callable (an nn.Module), a torch.export program or "
                            f"the path of a .pt2 file saved with torch.export.save; got "
                            f"{model!r}, which is no file")
        graph = capture(model)
        program = TaylorProgram(graph.program.module(), graph=graph)
    elif isinstance(model, nn.Module):
        signature = _signature(model)
        cached = _CAPTURES.get(model)
        if cached is None or cached[0] != signature:
            cached = (signature, [])
            _CAPTURES[model] = cached
        program = TaylorProgram(model, graphs=cached[1])
    else:
        raise TypeError(f"model must be an nn.Module, an ExportedProgram or a .pt2 path, got "
                        f"{type(model).__name__}")
    if inputs is not None:
        program.graph(inputs)
    return program


def piecewise_linear_ops(program: TaylorProgram) -> list[str]:
    """Names of the input-dependent piecewise-linear operations (ReLU, max-pool, ...) of a
    traced model's last captured graph."""
    return [] if program.last is None else piecewise_nodes(program.last)


def propagate(model, inputs: torch.Tensor, directions: torch.Tensor, order: int) -> Jet:
    """Taylor coefficients of ``t -> model(inputs + t * v)`` for every direction ``v``.

    ``model``: anything :func:`trace` takes (a :class:`TaylorProgram` reuses its captures).
    ``inputs``: ``[B, *s]``; ``directions``: ``[B, m, *s]``. Returns a :class:`Jet` whose
    ``primal`` is ``model(inputs)`` and whose ``series[k-1, b, r]`` is
    ``D^k model(inputs[b])[v_br, ..., v_br] / k!`` for ``k = 1..order``.
    """
    return propagate_core(trace(model).graph(inputs), inputs, directions, order)
