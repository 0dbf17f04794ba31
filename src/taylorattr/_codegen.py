"""A captured graph's pass as one straight-line Python function, generated once.

An interpreter (``fx.Interpreter``, :meth:`taylorattr.capture.CoreGraph.run`) pays, at
every node of every call, for looking up the node's arguments, choosing what computes it
and freeing the values it was the last user of. :func:`generate` does that work once per
graph and pass: it writes a function whose lines call, node by node, the callable the
engine chose for that node (the ATen operation itself, or a rule kernel bound to the
node), on variables holding the earlier nodes' values, and drops each value after its
last use::

    def run(S, inputs):
        x, w = inputs
        v_conv = k0(x, w, None, c1, c2)      # k0: the node's callable, c1, c2: constants
        del x
        v_relu = k1(S, v_conv)                # a kernel taking the per-call state S
        del v_conv
        return v_relu

The engine describes each node by ``emit(node)``: a :class:`Call` (a callable and its
arguments, where graph nodes stand for their values and :data:`STATE` for the per-call
state), or a :class:`Constant` (a value fixed for the graph, e.g. a ``get_attr``). The
generated function evaluates the same callables on the same arguments in the same order
as the interpreter, so its results are bitwise the interpreter's.

Plain literals (``int``, finite ``float``, ``bool``, ``str``, ``None``) are written into
the code; every other constant (dtypes, devices, tensors, functions) is passed in as a
global of the generated function.
"""
from __future__ import annotations

import contextlib
import math
import re
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field

from torch import fx
from torch.fx.immutable_collections import immutable_dict, immutable_list

__all__ = ["STATE", "Call", "Constant", "Generated", "LiveAttributes", "generate", "interpret",
           "interpreting", "lifted_reader"]


_LISTS = (list, immutable_list)  # fx keeps a node's list arguments as immutable_list
_DICTS = (dict, immutable_dict)


class _State:
    def __repr__(self):
        return "STATE"


#: Stands, among a :class:`Call`'s arguments, for the per-call state the generated
#: function is given (its first parameter).
STATE = _State()


@dataclass
class Call:
    """``fn(*args, **kwargs)``; graph nodes among the arguments (nested in tuples, lists
    and dicts too) stand for their values."""

    fn: Callable
    args: tuple = ()
    kwargs: dict = field(default_factory=dict)


@dataclass
class Constant:
    """A node whose value is fixed for the graph."""

    value: object


def default_emit(node: fx.Node) -> Call:
    """The node's own operation on its own arguments."""
    return Call(node.target, tuple(node.args), dict(node.kwargs))


class _Writer:
    def __init__(self):
        self.globals: dict = {}
        self.names: dict = {}   # id(object) -> global name (one per object)
        self.used: list = []    # node names referenced by the current line

    def constant(self, value, prefix: str = "c") -> str:
        key = id(value)
        if key not in self.names:
            name = f"{prefix}{len(self.globals)}"
            self.globals[name] = value
            self.names[key] = name
        return self.names[key]

    def render(self, v, var) -> str:
        if v is STATE:
            return "S"
        if isinstance(v, fx.Node):
            self.used.append(v)
            return var[v]
        if v is None or type(v) in (bool, int, str):
            return repr(v)
        if type(v) is float and math.isfinite(v):
            return repr(v)
        if type(v) is tuple:
            inner = ", ".join(self.render(e, var) for e in v)
            return f"({inner},)" if v else "()"
        if type(v) in _LISTS:
            return "[" + ", ".join(self.render(e, var) for e in v) + "]"
        if type(v) in _DICTS and all(type(k) is str for k in v):
            return "{" + ", ".join(f"{k!r}: {self.render(e, var)}" for k, e in v.items()) + "}"
        if type(v) is slice and any(isinstance(e, fx.Node) for e in (v.start, v.stop, v.step)):
            return (f"slice({self.render(v.start, var)}, {self.render(v.stop, var)}, "
                    f"{self.render(v.step, var)})")
        return self.constant(v)


def generate(graph: fx.Graph, emit: Callable[[fx.Node], Call | Constant] = default_emit,
             name: str = "run") -> Callable:
    """``run(S, inputs)``: the graph evaluated on ``inputs`` (the placeholders' values, in
    graph order), each ``call_function`` node (and ``get_attr`` node) as ``emit`` says;
    returns the output node's argument. ``S`` is passed to the calls that name
    :data:`STATE`. The source is kept as ``run.__source__``."""
    w = _Writer()
    var: dict = {}
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    for i, n in enumerate(graph.nodes):
        var[n] = f"v{i}_" + re.sub(r"\W", "_", n.name, flags=re.ASCII)[:56]  # identifiers only
    lines: list[tuple[str, list]] = []  # (code, nodes it reads)
    result = None
    for n in graph.nodes:
        if n.op == "placeholder":
            continue
        if n.op == "output":
            w.used = []
            result = w.render(n.args[0], var)
            lines.append((f"return {result}", w.used))
            break
        what = emit(n)
        w.used = []
        if isinstance(what, Constant):
            code = f"{var[n]} = {w.constant(what.value)}"
        else:
            fn = w.constant(what.fn, "k")
            parts = [w.render(a, var) for a in what.args]
            for k, v in what.kwargs.items():
                value = w.render(v, var)
                parts.append(f"{k}={value}" if k.isidentifier() else f"**{{{k!r}: {value}}}")
            code = f"{var[n]} = {fn}({', '.join(parts)})"
        lines.append((code, w.used))
    # each value is dropped after the line that reads it last (never one the output reads)
    last: dict = {}
    for i, (_, used) in enumerate(lines):
        for v in used:
            last[v] = i
    frees: dict = {}
    for v, i in last.items():
        frees.setdefault(i, []).append(var[v])
    body = ["def " + name + "(S, inputs):"]
    if placeholders:
        body.append("    " + ", ".join(var[p] for p in placeholders) + ", = inputs")
    for i, (code, _) in enumerate(lines):
        body.append("    " + code)
        if i in frees and not code.startswith("return"):
            body.append("    del " + ", ".join(dict.fromkeys(frees[i])))
    if result is None:
        body.append("    return None")
    source = "\n".join(body) + "\n"
    scope = dict(w.globals)
    exec(compile(source, f"<taylorattr generated {name}>", "exec"), scope)  # noqa: S102
    fn = scope[name]
    fn.__source__ = source
    return fn


def interpret(graph: fx.Graph, emit: Callable[[fx.Node], Call | Constant], state, inputs):
    """The reference for :func:`generate`: the same calls made node by node from an
    environment (what the generated code does without its per-node lookups)."""
    env: dict = dict(zip([n for n in graph.nodes if n.op == "placeholder"], inputs))

    def load(v):
        if v is STATE:
            return state
        if isinstance(v, fx.Node):
            return env[v]
        if type(v) is tuple:
            return tuple(load(e) for e in v)
        if type(v) in _LISTS:
            return [load(e) for e in v]
        if type(v) in _DICTS:
            return {k: load(e) for k, e in v.items()}
        if type(v) is slice:
            return slice(load(v.start), load(v.stop), load(v.step))
        return v

    for n in graph.nodes:
        if n.op == "placeholder":
            continue
        if n.op == "output":
            return load(n.args[0])
        what = emit(n)
        if isinstance(what, Constant):
            env[n] = what.value
        else:
            env[n] = what.fn(*load(tuple(what.args)), **load(dict(what.kwargs)))
    return None


_INTERPRETING: list[bool] = []


@contextlib.contextmanager
def interpreting():
    """Within the block, every :class:`Generated` pass runs node by node
    (:func:`interpret`): the reference the generated code is tested against."""
    _INTERPRETING.append(True)
    try:
        yield
    finally:
        _INTERPRETING.pop()


class Generated:
    """A graph's pass as ``emit`` describes it, generated on its first call
    (:func:`generate`); ``Generated(...)(S, inputs)`` runs it."""

    def __init__(self, graph: fx.Graph, emit: Callable[[fx.Node], Call | Constant],
                 name: str = "run"):
        self.graph, self.emit, self.name = graph, emit, name
        self.fn: Callable | None = None

    def __call__(self, state, inputs):
        if _INTERPRETING:
            return interpret(self.graph, self.emit, state, inputs)
        if self.fn is None:
            self.fn = generate(self.graph, self.emit, self.name)
        return self.fn(state, inputs)


class LiveAttributes:
    """A generated pass's parameter and buffer inputs read from the live module.

    ``paths``: placeholder name -> ``(kind, path)``, kind ``"parameter"`` or ``"buffer"``
    and path a dotted attribute path (``"layer1.0.conv1.weight"``). Each path is resolved
    to its submodule's parameter or buffer table once per module (held weakly), so a call
    reads one dictionary entry per input, as the module's own ``forward`` does, instead
    of walking the path (``nn.Module.get_parameter``). A tensor assigned anew to a
    registered name is read; a path the module does not have, or a name it does not
    register as that kind, gives None (the caller then takes its own slower route)."""

    def __init__(self, paths: dict):
        self.paths = dict(paths)
        self._slots: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    def _resolve(self, module) -> list | None:
        slots = []
        for name, (kind, path) in self.paths.items():
            owner, _, attr = path.rpartition(".")
            try:
                sub = module.get_submodule(owner) if owner else module
            except AttributeError:
                return None
            table = sub._parameters if kind == "parameter" else sub._buffers
            if table.get(attr) is None:
                return None
            slots.append((name, table, attr))
        return slots

    def read(self, module) -> dict | None:
        """Placeholder name -> tensor, or None where a path does not resolve."""
        try:
            slots = self._slots[module]
        except KeyError:
            slots = self._slots[module] = self._resolve(module)
        except TypeError:  # a module that cannot be weakly referenced: resolved every time
            slots = self._resolve(module)
        if slots is None:
            return None
        out = {}
        for name, table, attr in slots:
            v = table.get(attr)
            if v is None:
                return None
            out[name] = v
        return out


def lifted_reader(core) -> Callable:
    """``read(source)``: placeholder name -> value for the lifted inputs of a captured graph
    ``core`` (a :class:`taylorattr.capture.CoreGraph`): its parameters and buffers read
    from ``source`` through :class:`LiveAttributes`, its constants looked up once;
    ``core.lifted_values(source)`` itself where a path does not resolve (or without a
    source)."""
    live = LiveAttributes({name: (lifted.kind, lifted.fqn) for name, lifted in core.lifted.items()
                           if lifted.kind in ("parameter", "buffer")})
    constants: dict = {}

    def read(source):
        values = None if source is None else live.read(source)
        if values is None:
            return core.lifted_values(source)
        if len(values) + len(constants) < len(core.lifted):
            every = core.lifted_values(source)
            constants.update({n: every[n] for n in core.lifted if n not in values})
        values.update(constants)
        return values
    return read
