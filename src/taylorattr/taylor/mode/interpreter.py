"""Running a model on Jets: ``propagate(model, x, v, K)`` returns

    f(x + t v_r) = sum_{k=0..K} c_k t^k,   c_k = D^k f(x)[v_r, ..., v_r] / k!

for every direction ``v_r`` at once. ``trace(model)`` gives a :class:`TaylorProgram`: by
default the model captured as core ATen operations (:mod:`taylorattr.capture`, one capture
per input signature, run by :mod:`taylorattr.taylor.mode.core`); a model that uses a module
type, function or tensor method with a user rule (``ta.register_taylor_rule``) is traced
with torch.fx instead and each node dispatched to its rule
(:mod:`taylorattr.taylor.mode.registry`), as is a model ``torch.export`` cannot capture but
torch.fx can. A refusal names every op without a rule, its source line and what to do.
"""
from __future__ import annotations

import builtins
import os
import weakref

import torch
from torch import fx, nn

from ... import _fx
from ...capture import CaptureError, CoreGraph, capture
from . import core
from . import registry as R
from .jet import BatchSecond, Jet, UnsupportedOperation, any_jet, is_jet
from .rules_pointwise import (
    PIECEWISE_FUNCTIONS,
    PIECEWISE_METHODS,
    PIECEWISE_MODULES,
    is_polynomial_module,
    polynomial_module,
)

ADVICE = ("What you can do: use an operation listed in docs/supported_ops.md "
          "(taylorattr.taylor.mode.supported_ops()), register an exact rule with "
          "ta.register_taylor_rule({key}, rule), or, for a ReLU/max-pool network, analyse "
          "ta.smooth(model, beta) instead.")
ADVICE_ARGS = ("What you can do: the op is supported with other arguments (keep the batch axis "
               "first and whole, as docs/supported_ops.md says), or override its rule with "
               "ta.register_taylor_rule({key}, rule, replace=True); for a ReLU/max-pool network, "
               "analyse ta.smooth(model, beta) instead.")


def trace_fx(model: nn.Module) -> fx.GraphModule:
    """Trace ``model`` with torch.fx, keeping polynomial activations, registered module
    types and registered functions whole; defaulted forward arguments fixed."""
    return _fx.trace(model, "Taylor-mode propagation", UnsupportedOperation,
                     leaf_modules=R.leaf_modules(), autowrap_functions=R.user_functions())


def _uses_user_rules(model: nn.Module) -> bool:
    """Whether the model needs the fx route: a module type with a user rule occurs in it, or
    a user rule for a Python function or tensor method exists."""
    if any(e.family == "user" for e in R.METHOD_RULES.values()):
        return True
    if any(e.family == "user" and not isinstance(k, torch._ops.OpOverload)
           for k, e in R.FUNCTION_RULES.items()):
        return True
    user_types = tuple(k for k, e in R.MODULE_RULES.items() if e.family == "user")
    return bool(user_types) and any(isinstance(m, user_types) for m in model.modules())


class TaylorProgram(nn.Module):
    """What :func:`trace` returns: the model (calling it runs the model) and its captures,
    one :class:`~taylorattr.capture.CoreGraph` per input signature (one for every batch
    size where the batch axis exports as dynamic), or its torch.fx graph (``fx``) on the
    user-rule route. A model with a ``taylor_core_graph(inputs)`` method (a smoothed
    model) supplies its own graphs."""

    def __init__(self, model, fx_module: fx.GraphModule | None = None,
                 graph: CoreGraph | None = None, graphs: list | None = None):
        super().__init__()
        self.model = model
        self.fx = fx_module
        self._graphs: list[tuple[object, CoreGraph]] = [] if graphs is None else graphs
        self.last: CoreGraph | None = graph
        if graph is not None:
            self._graphs.append((None, graph))

    def forward(self, *args, **kwargs):
        return self.model(*args, **kwargs)

    @staticmethod
    def _key(x: torch.Tensor, graph: CoreGraph | None):
        dynamic = graph is not None and graph.batch_dynamic and x.shape[0] >= 2
        return (("B",) if dynamic else (x.shape[0],)) + tuple(x.shape[1:]), x.dtype, x.device.type

    def graph(self, x: torch.Tensor) -> CoreGraph:
        """The core graph for inputs shaped like ``x`` (captured on first use)."""
        for key, graph in self._graphs:
            if key is None or key == self._key(x, graph):
                self.last = graph
                return graph
        own = getattr(self.model, "taylor_core_graph", None)
        graph = own(x) if own is not None else capture(self.model, (x.detach(),))
        self._graphs.append((self._key(x, graph), graph))
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
    ``ExportedProgram`` or the path of a ``.pt2`` file (``torch.export.save``)."""
    if isinstance(model, TaylorProgram):
        if inputs is not None and model.fx is None:
            model.graph(inputs)
        return model
    if isinstance(model, (str, os.PathLike, torch.export.ExportedProgram)):
        graph = capture(model)
        return TaylorProgram(graph.program.module(), graph=graph)
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be an nn.Module, an ExportedProgram or a .pt2 path, got "
                        f"{type(model).__name__}")
    if _uses_user_rules(model) and not hasattr(model, "taylor_core_graph"):
        return TaylorProgram(model, fx_module=trace_fx(model))
    signature = _signature(model)
    cached = _CAPTURES.get(model)
    if cached is None or cached[0] != signature:
        cached = (signature, [])
        _CAPTURES[model] = cached
    program = TaylorProgram(model, graphs=cached[1])
    if inputs is not None:
        try:
            program.graph(inputs)
        except CaptureError as exc:
            try:
                return TaylorProgram(model, fx_module=trace_fx(model))
            except UnsupportedOperation:
                raise UnsupportedOperation(str(exc)) from exc
    return program


def piecewise_linear_ops(model) -> list[str]:
    """Names of the piecewise-linear operations (ReLU, max-pool, ...) in a traced model (a
    :class:`TaylorProgram` with a captured graph, or a torch.fx graph)."""
    if isinstance(model, TaylorProgram):
        if model.fx is None:
            return [] if model.last is None else core.piecewise_nodes(model.last)
        model = model.fx
    return _piecewise_fx(model)


def _piecewise_fx(gm: fx.GraphModule) -> list[str]:
    found = []
    for node in gm.graph.nodes:
        if node.op == "call_module" and isinstance(gm.get_submodule(node.target), PIECEWISE_MODULES):
            found.append(f"{node.target} ({type(gm.get_submodule(node.target)).__name__})")
        elif node.op == "call_function" and node.target in PIECEWISE_FUNCTIONS:
            found.append(getattr(node.target, "__name__", str(node.target)))
        elif node.op == "call_method" and node.target in PIECEWISE_METHODS:
            found.append(f"Tensor.{node.target}")
    return found


def _to_batch_first(value, ndim: int):
    """Argument of a pointwise rule applied to the batch-first Jet behind a BatchSecond:
    constants shaped for the sequence-first layout are transposed the same way."""
    if isinstance(value, BatchSecond):
        return value.jet
    if isinstance(value, torch.Tensor) and value.dim() >= 2:
        full = value.reshape((1,) * (ndim - value.dim()) + tuple(value.shape))
        return full.transpose(0, 1)
    return value


def _call(entry: R.Entry, args, kwargs):
    has_second = []
    fx.node.map_aggregate((args, kwargs), lambda v: has_second.append(v)
                          if isinstance(v, BatchSecond) else None)
    if not has_second or getattr(entry.rule, "accepts_batch_second", False):
        return entry.rule(*args, **kwargs)
    ndim = has_second[0].jet.primal.dim()
    if not entry.is_pointwise(args, kwargs, ndim):
        raise UnsupportedOperation(
            "this op on a sequence-first tensor (made by transpose(0, 1)) is not supported; "
            "transpose(0, 1) back to batch-first before it, or use batch_first=True")
    args, kwargs = fx.node.map_aggregate((args, kwargs), lambda v: _to_batch_first(v, ndim))
    out = entry.rule(*args, **kwargs)
    return BatchSecond(out) if is_jet(out) else out


class TaylorInterpreter(fx.Interpreter):
    """Interprets a traced model on :class:`Jet` values (see :func:`propagate`)."""

    def __init__(self, gm: fx.GraphModule):
        super().__init__(gm)
        self.extra_traceback = False  # refusals carry their own node description

    def run_node(self, n: fx.Node):
        try:
            return super().run_node(n)
        except UnsupportedOperation as exc:
            if getattr(exc, "annotated", False):
                raise
            no_rule = len(exc.args) > 1
            reason = exc.args[0]
            key = exc.args[1] if no_rule else self._key(n)
            advice = ADVICE if no_rule else ADVICE_ARGS
            err = UnsupportedOperation(f"{_fx.describe(n, self.module)}: {reason}. "
                                       + advice.format(key=key))
            err.annotated = True
            raise err from exc

    def _key(self, n: fx.Node) -> str:
        """How ``register_taylor_rule`` names the op of node ``n``."""
        if n.op == "call_module":
            return type(self.fetch_attr(n.target)).__name__
        return _fx._name(n.target) if n.op == "call_function" else f"'Tensor.{n.target}'"

    def call_module(self, target, args, kwargs):
        module = self.fetch_attr(target)
        if not any_jet(args, kwargs):
            return module(*args, **kwargs)
        if is_polynomial_module(module):
            return polynomial_module(module, *args, **kwargs)
        entry = R.module_entry(module)
        if entry is None:
            raise UnsupportedOperation(f"{type(module).__name__} has no Taylor-mode rule",
                                       type(module).__name__)
        return _call(entry, (module,) + tuple(args), kwargs)

    def call_function(self, target, args, kwargs):
        if not any_jet(args, kwargs):
            return target(*args, **kwargs)
        if target is builtins.getattr:
            obj, name = args
            primal = obj.primal if is_jet(obj) else obj.jet.primal.transpose(0, 1)
            if name in ("shape", "dtype", "device", "ndim"):
                return getattr(primal, name)
            raise UnsupportedOperation(f"attribute '{name}' of an input-dependent tensor")
        entry = R.FUNCTION_RULES.get(target)
        if entry is None:
            raise UnsupportedOperation(f"{_fx._name(target)} has no Taylor-mode rule",
                                       _fx._name(target))
        return _call(entry, args, kwargs)

    def call_method(self, target, args, kwargs):
        if not any_jet(args, kwargs):
            return getattr(args[0], target)(*args[1:], **kwargs)
        if target in ("size", "dim"):
            obj = args[0]
            primal = obj.primal if is_jet(obj) else obj.jet.primal.transpose(0, 1)
            return getattr(primal, target)(*args[1:], **kwargs)
        entry = R.METHOD_RULES.get(target)
        if entry is None:
            raise UnsupportedOperation(f"Tensor.{target} has no Taylor-mode rule",
                                       f"'Tensor.{target}'")
        return _call(entry, args, kwargs)


def propagate(model, inputs: torch.Tensor, directions: torch.Tensor, order: int) -> Jet:
    """Taylor coefficients of ``t -> model(inputs + t * v)`` for every direction ``v``.

    ``model``: an ``nn.Module``, a :class:`TaylorProgram` from :func:`trace` (reuses its
    captures), or a torch.fx ``GraphModule`` (interpreted as traced). ``inputs``:
    ``[B, *s]``; ``directions``: ``[B, m, *s]``. Returns a :class:`Jet` whose ``primal`` is
    ``model(inputs)`` and whose ``series[k-1, b, r]`` is
    ``D^k model(inputs[b])[v_br, ..., v_br] / k!`` for ``k = 1..order``.
    """
    if isinstance(model, fx.GraphModule) and not isinstance(model, TaylorProgram):
        return _propagate_fx(model, inputs, directions, order)
    program = trace(model)
    if program.fx is not None:
        return _propagate_fx(program.fx, inputs, directions, order)
    return core.propagate_core(program.graph(inputs), inputs, directions, order)


def _propagate_fx(gm: fx.GraphModule, inputs, directions, order) -> Jet:
    series = torch.zeros((order,) + tuple(directions.shape), dtype=inputs.dtype, device=inputs.device)
    series[0] = directions
    out = TaylorInterpreter(gm).run(Jet(inputs, series, affine=True))
    if isinstance(out, BatchSecond):
        raise UnsupportedOperation("the model output is sequence-first (transpose(0, 1) it back "
                                   "to batch-first)")
    if not is_jet(out):
        raise UnsupportedOperation(
            f"model output is {type(out).__name__}, not a single tensor that depends on the input")
    return out
