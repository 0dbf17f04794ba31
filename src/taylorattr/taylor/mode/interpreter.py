"""Running a traced model on Jets: ``propagate(model, x, v, K)`` returns

    f(x + t v_r) = sum_{k=0..K} c_k t^k,   c_k = D^k f(x)[v_r, ..., v_r] / k!

for every direction ``v_r`` at once. Each node whose arguments depend on the input is
dispatched to its rule (:mod:`taylorattr.taylor.mode.registry`); every other node runs as
usual. A refusal names the op, its source line and what the user can do.
"""
from __future__ import annotations

import builtins

import torch
from torch import fx, nn

from ... import _fx
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


def trace(model: nn.Module) -> fx.GraphModule:
    """Trace ``model`` with torch.fx, keeping polynomial activations, registered module
    types and registered functions whole; defaulted forward arguments fixed."""
    return _fx.trace(model, "Taylor-mode propagation", UnsupportedOperation,
                     leaf_modules=R.leaf_modules(), autowrap_functions=R.user_functions())


def piecewise_linear_ops(gm: fx.GraphModule) -> list[str]:
    """Names of the piecewise-linear operations (ReLU, max-pool, ...) in a traced model."""
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


def propagate(model: nn.Module | fx.GraphModule, inputs: torch.Tensor, directions: torch.Tensor,
              order: int) -> Jet:
    """Taylor coefficients of ``t -> model(inputs + t * v)`` for every direction ``v``.

    ``inputs``: ``[B, *s]``; ``directions``: ``[B, m, *s]``. Returns a :class:`Jet` whose
    ``primal`` is ``model(inputs)`` and whose ``series[k-1, b, r]`` is
    ``D^k model(inputs[b])[v_br, ..., v_br] / k!`` for ``k = 1..order``.
    """
    gm = model if isinstance(model, fx.GraphModule) else trace(model)
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
