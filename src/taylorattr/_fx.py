"""One torch.fx toolkit for the interpreters that run a model on something other than
tensors (Taylor mode's Jets; later the layer-wise DeepLIFT/LRP rules).

* :class:`Tracer` keeps modules declaring ``elementwise = True`` (and any module type or
  function an interpreter names) whole, and records the user's source line of every node;
* :func:`concrete_args` fixes the defaulted arguments of ``forward`` (``forward(x,
  extra=None)``) at their defaults, so tracing does not stumble on ``if extra is not None``;
* :func:`trace` returns a ``GraphModule`` or raises the interpreter's own error naming the
  cause;
* :func:`describe` names a node for an error message: the op, the submodule it sits in and
  the source line that created it.
"""
from __future__ import annotations

import inspect
import os
import sys
import traceback

import torch
from torch import fx, nn

__all__ = ["Tracer", "concrete_args", "describe", "node_args", "trace"]

_TORCH_DIR = os.path.dirname(torch.__file__)


class Tracer(fx.Tracer):
    """fx tracer keeping elementwise modules and ``leaf_modules`` whole; records stack traces.

    ``leaf_modules``: module types never traced into (exact types: a subclass with its own
    forward is traced); ``autowrap_functions``: plain Python
    functions recorded as single calls (as ``torch.fx.wrap`` would)."""

    def __init__(self, leaf_modules: tuple[type, ...] = (), autowrap_functions: tuple = ()):
        super().__init__(autowrap_functions=tuple(autowrap_functions))
        self.leaf_modules = tuple(leaf_modules)
        # torch's own recording (CapturedTraceback) imports ~900 modules (sympy, ...) on its
        # first use, seconds in the first call of a process; the Python stack is enough here
        self.record_stack_traces = False

    def create_node(self, *args, **kwargs):
        node = super().create_node(*args, **kwargs)
        summary = self._filter_traceback_frames(traceback.extract_stack(sys._getframe(1)))
        if summary:
            node.stack_trace = "".join(summary.format()).strip()
        return node

    def _filter_traceback_frames(self, summary):
        """Keep the innermost frame outside torch below the trace call: the user's line that
        made the node (none for nodes made by torch's own modules, e.g. nn.Sequential)."""
        frames = list(summary)
        inside = [i for i, f in enumerate(frames) if f.filename == __file__]
        frames = frames[inside[-1] + 1:] if inside else frames
        user = [f for f in frames if not f.filename.startswith(_TORCH_DIR)]
        return traceback.StackSummary.from_list(user[-1:])

    def is_leaf_module(self, m: nn.Module, qualname: str) -> bool:
        if getattr(m, "elementwise", False) is True or type(m) in self.leaf_modules:
            return True
        return super().is_leaf_module(m, qualname)


def concrete_args(model: nn.Module) -> dict:
    """The defaulted parameters of ``model.forward`` after the first, fixed at their defaults."""
    try:
        params = list(inspect.signature(model.forward).parameters.values())
    except (TypeError, ValueError):
        return {}
    return {p.name: p.default for p in params[1:]
            if p.default is not inspect.Parameter.empty
            and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}


def trace(model: nn.Module, what: str, error: type[Exception] = TypeError,
          leaf_modules: tuple[type, ...] = (), autowrap_functions: tuple = ()) -> fx.GraphModule:
    """Trace ``model`` for ``what`` (e.g. "Taylor-mode propagation"); failures raise ``error``."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be an nn.Module for {what}, got {type(model).__name__}")
    fixed = concrete_args(model)
    try:
        graph = Tracer(leaf_modules, autowrap_functions).trace(model, concrete_args=fixed or None)
    except Exception as exc:  # fx raises many kinds of errors for untraceable code
        where = ""
        frames = [f for f in traceback.extract_tb(exc.__traceback__)
                  if not f.filename.startswith(_TORCH_DIR) and f.filename != __file__]
        if frames:
            where = f" at {frames[-1].filename}:{frames[-1].lineno} ({(frames[-1].line or '').strip()})"
        fixed_note = (f" (defaulted arguments fixed at their defaults: "
                      f"{', '.join(f'{k}={v!r}' for k, v in fixed.items())})") if fixed else ""
        raise error(
            f"{what} needs a model whose forward torch.fx can trace: straight-line code over "
            f"submodules, without branching on tensor values{fixed_note}; tracing "
            f"{type(model).__name__} failed{where}: {type(exc).__name__}: {exc}") from exc
    return fx.GraphModule(model, graph)


def _name(target) -> str:
    mod = getattr(target, "__module__", None) or ""
    name = getattr(target, "__name__", repr(target))
    if mod == "_operator":
        mod = "operator"
    elif mod in ("torch._C._nn", "torch.nn.functional"):
        mod = "torch.nn.functional"
    elif mod.startswith("torch._C") or mod == "torch._VariableFunctions":
        mod = "torch"
    return f"{mod + '.' if mod else ''}{name}"


def describe(node: fx.Node, model: nn.Module) -> str:
    """``"GELU module 'mlp.act' (model.py:12: h = self.act(h))"``-style name of a node."""
    if node.op == "call_module":
        m = model.get_submodule(node.target)
        what = f"{type(m).__name__} module '{node.target}'"
    elif node.op == "call_function":
        what = f"function {_name(node.target)}"
    elif node.op == "call_method":
        what = f"tensor method .{node.target}()"
    else:
        what = f"{node.op} '{node.target}'"
    stack = node.meta.get("nn_module_stack")
    if stack and node.op != "call_module":
        path = list(stack.keys())[-1]
        if path:
            what += f" inside '{path}'"
    if node.stack_trace:
        lines = [ln.strip() for ln in node.stack_trace.strip().splitlines() if ln.strip()]
        if lines:
            what += f" ({'; '.join(lines[-2:])})"
    return what


def node_args(node: fx.Node) -> list:
    """Every argument of ``node`` (nested ones included), flattened."""
    out: list = []
    fx.node.map_arg((node.args, node.kwargs), out.append)
    return out


