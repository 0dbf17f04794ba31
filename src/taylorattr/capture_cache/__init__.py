"""Captures kept across processes: :func:`capture` is :func:`taylorattr.capture.capture`
with the decomposed ``torch.export`` program of an ``nn.Module`` kept on disk, one file per
model structure and input specification, so that a new process (a notebook, a CLI run, a
test suite, each rank of a torchrun job) loads the capture instead of tracing and lowering
the model again (``taylorattr.capture.STATS`` counts exports, loads and stores).

An entry is found by a key, the SHA-256 of everything the captured graph depends on
besides the parameter and buffer values (which the capture reads from the live model at
every run, so a fine-tuned copy of the same architecture reuses the entry):

    key = H(format, torch, Python and taylorattr versions, the capture's own code,
            model structure, input specification, operations kept whole, device kinds)

* **model structure** (:func:`model_digest`): for every module (every name it is reachable
  by), its class (module, qualified name, and the SHA-256 of the source file of every
  class of its MRO outside torch: a different ``forward``, activation or helper in that
  file is a different key), its training flag, its own attributes (hyper-parameters,
  flags, configs, plain tensors by value; functions by their code), its parameters' and
  buffers' names, shapes, dtypes and device kinds. A model the key cannot describe (hooks,
  a ``forward`` patched on an instance, an attribute whose only description is its
  address, a class without a source file) gets no key and is never cached on disk.
* **input specification**: per input, its dtype, device kind, rank and the sizes of its
  static axes (the axes exported as dynamic, :func:`taylorattr.capture.dynamic_axes`, are
  left out where the capture kept them dynamic); non-tensor inputs by value.

An entry also lists the source files its graph's nodes were traced through (their
``stack_trace``) with their SHA-256; a file changed since (a helper edited in place) makes
the entry stale. A file is ``MAGIC``, one JSON header line (payload length and SHA-256,
source files), then the graph in plain values (:func:`_portable`, ``torch.save`` read back
with ``weights_only=True``): its nodes (ATen targets, arguments, recorded dtypes and sizes, a
dynamic axis at a distinct prime size :data:`_PRIMES`; source lines and module paths), its
signature and input specifications, no weights and no symbolic expressions
(``torch.export.load``, which parses every symbolic size, was 80-90 % of a warm first call).
A truncated, corrupt or stale entry is refused with a :class:`CaptureCacheWarning`, deleted
and rebuilt. Entries are written to a temporary file and renamed (:mod:`taylorattr._io`):
concurrent processes see the old entry or the whole new one.

Where: ``$TAYLORATTR_CACHE_DIR``, else ``$XDG_CACHE_HOME/taylorattr``, else
``~/.cache/taylorattr``, in the folder ``captures``; ``TAYLORATTR_CACHE=0`` turns the disk
cache off (the capture still happens once per process).

What the key does not see (so may be reused wrongly): code outside the files of the
model's classes and outside the files its graph was traced through that changes the
graph without being on a traced line's call stack (a global flag read in ``forward``), a
module attribute whose ``repr`` hides its state, and process-wide settings other than the
default dtype (a ``torch.backends`` flag read while tracing). A graph read back records
numbers where the capture had symbols: a static axis of one of :data:`_PRIMES`' sizes would
pass for the batch axis in Taylor mode's check that samples stay separate.

Why one module: the key, the entry format and the cached capture are one mechanism (a key
means what its entry holds, and the capture decides which key an entry goes under).
"""
from __future__ import annotations

import enum
import functools
import hashlib
import importlib
import io
import json
import os
import re
import sys
import threading
import types
import warnings
from pathlib import Path

import torch
from torch import nn

from .. import __version__
from .._io import atomic_write_bytes, remove_stale_temporaries
from ..capture import _EXPORT_LOCK, DEFAULT_KEEP, STATS, CoreGraph, dynamic_axes, op_name
from ..capture import capture as _capture

__all__ = ["ENV_DIR", "ENV_SWITCH", "CaptureCacheWarning", "capture", "clear", "directory",
           "enabled", "entry_key", "info", "load", "model_digest", "store", "value_key"]

ENV_DIR = "TAYLORATTR_CACHE_DIR"
ENV_SWITCH = "TAYLORATTR_CACHE"
MAGIC = b"taylorattr-capture 2\n"
_SUFFIX = ".capture"
_TORCH_DIR = os.path.dirname(torch.__file__)
#: the code that makes a capture: its changes (a development checkout) change every key
_CODE = (Path(__file__).parent.with_name("capture.py"), Path(__file__))


class CaptureCacheWarning(UserWarning):
    """A disk-cache entry was refused (truncated, corrupt or stale) and is rebuilt."""


def enabled() -> bool:
    """Whether captures are kept on disk (``TAYLORATTR_CACHE`` is not 0/false/off/no)."""
    return os.environ.get(ENV_SWITCH, "1").strip().lower() not in ("0", "false", "off", "no")


def directory() -> Path:
    """The folder of the entries (module docstring)."""
    root = os.environ.get(ENV_DIR, "").strip()
    if not root:
        xdg = os.environ.get("XDG_CACHE_HOME", "").strip()
        root = os.path.join(xdg, "taylorattr") if xdg else \
            os.path.join(os.path.expanduser("~"), ".cache", "taylorattr")
    return Path(root) / "captures"


# --- keys ------------------------------------------------------------------------------
class _Unkeyable(Exception):
    """A value the key cannot describe without its address."""


_FILES: dict = {}  # (path, mtime_ns, size) -> SHA-256 of the file's bytes


def _file_digest(path: str) -> str | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    key = (path, st.st_mtime_ns, st.st_size)
    if key not in _FILES:
        with open(path, "rb") as fh:
            _FILES[key] = hashlib.sha256(fh.read()).hexdigest()
    return _FILES[key]


def _class_key(cls: type) -> tuple:
    """``cls`` and every class of its MRO below ``nn.Module``/``object``: module, qualified
    name and, outside torch, the SHA-256 of its source file."""
    parts = []
    for c in cls.__mro__:
        if c in (nn.Module, object):
            break
        entry = (c.__module__, c.__qualname__)
        module = sys.modules.get(c.__module__)
        path = getattr(module, "__file__", None)
        if path is None or "<" in c.__qualname__:
            raise _Unkeyable(f"class {c.__qualname__} has no source file")
        if not os.path.abspath(path).startswith(_TORCH_DIR):
            entry += (_file_digest(path),)
        parts.append(entry)
    return tuple(parts)


def _code_key(code: types.CodeType) -> tuple:
    consts = tuple(_code_key(c) if isinstance(c, types.CodeType) else repr(c)
                   for c in code.co_consts)
    return (code.co_name, code.co_code.hex(), consts, code.co_names)


_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+|0x[0-9a-fA-F]{6,}")


def value_key(v, depth: int = 0, memo: dict | None = None):
    """A description of ``v`` that is the same in every process for equal values, and
    differs for values that may change a captured graph (raises ``_Unkeyable`` where only
    an address would tell two values apart)."""
    memo = {} if memo is None else memo
    if depth > 6:
        raise _Unkeyable("nested too deep")
    if v is None or isinstance(v, (bool, int, float, complex, str, bytes)):
        return (type(v).__name__, repr(v))
    if isinstance(v, (torch.dtype, torch.device, torch.Size, torch.memory_format,
                      torch.layout)):
        return (type(v).__name__, str(v))
    if isinstance(v, enum.Enum):
        return ("enum", _class_key(type(v)), v.name)
    if isinstance(v, torch.Tensor):
        data = v.detach().cpu().contiguous()
        raw = data.view(torch.uint8) if data.numel() and data.dtype != torch.bool else data
        return ("tensor", tuple(v.shape), str(v.dtype), v.device.type,
                hashlib.sha256(raw.numpy().tobytes()).hexdigest())
    if isinstance(v, (tuple, list)):
        return (type(v).__name__, tuple(value_key(e, depth + 1, memo) for e in v))
    if isinstance(v, (set, frozenset)):
        return (type(v).__name__, tuple(sorted(repr(value_key(e, depth + 1, memo)) for e in v)))
    if isinstance(v, dict):
        return ("dict", tuple(sorted((repr(value_key(k, depth + 1, memo)),
                                      value_key(e, depth + 1, memo)) for k, e in v.items())))
    if isinstance(v, nn.Module):  # not a submodule: its tensors would be baked in
        raise _Unkeyable("a module held outside the module tree")
    if isinstance(v, type):
        return ("class", _class_key(v) if issubclass(v, nn.Module) or
                v.__module__ not in ("builtins",) else v.__qualname__)
    if isinstance(v, functools.partial):
        return ("partial", value_key(v.func, depth + 1, memo),
                value_key(v.args, depth + 1, memo), value_key(v.keywords, depth + 1, memo))
    if isinstance(v, types.MethodType):
        return ("method", value_key(v.__func__, depth + 1, memo), type(v.__self__).__qualname__)
    if isinstance(v, types.FunctionType):
        cells = tuple(value_key(c.cell_contents, depth + 1, memo) for c in v.__closure__ or ())
        return ("function", v.__module__, v.__qualname__, _code_key(v.__code__), cells)
    if callable(v) and getattr(v, "__module__", None) and hasattr(v, "__qualname__"):
        return ("builtin", v.__module__, v.__qualname__)  # torch.relu, math.sqrt, ...
    if isinstance(v, threading.local):
        return ("thread-local",)
    if id(v) in memo:
        return memo[id(v)]
    state = getattr(v, "__dict__", None)
    if isinstance(state, dict):  # a config object: its class and its state (less a hash of
        # itself, as transformers' GenerationConfig._original_object_hash, which Python
        # salts differently in every process)
        memo[id(v)] = ("object", type(v).__qualname__)  # a cycle back to it
        out = ("object", type(v).__module__, type(v).__qualname__,
               value_key({k: s for k, s in state.items()
                          if not k.startswith("__") and not k.endswith("_hash")},
                         depth + 1, memo))
        memo[id(v)] = out
        return out
    text = repr(v)
    if _ADDRESS.search(text):
        raise _Unkeyable(f"{type(v).__qualname__} is described by its address only")
    return ("repr", type(v).__module__, type(v).__qualname__, text)


_BARE = frozenset(vars(nn.Module()))  # the attributes every module has
_GLOBAL_HOOKS = ("_global_forward_hooks", "_global_forward_pre_hooks",
                 "_global_backward_hooks", "_global_backward_pre_hooks")


def model_digest(model: nn.Module) -> str | None:
    """The SHA-256 of ``model``'s structure (module docstring), or None where it cannot be
    described (then the capture is never kept on disk)."""
    if any(getattr(nn.modules.module, h, None) for h in _GLOBAL_HOOKS):
        return None
    parts, first, memo = [], {}, {}
    try:
        for name, m in model.named_modules(remove_duplicate=False):
            if id(m) in first:
                parts.append((name, "alias of", first[id(m)]))
                continue
            first[id(m)] = name
            if m._forward_hooks or m._forward_pre_hooks or m._backward_hooks or \
                    getattr(m, "_backward_pre_hooks", None) or "forward" in vars(m):
                return None
            own = tuple(sorted((k, value_key(v, 0, memo)) for k, v in vars(m).items()
                               if k not in _BARE))
            tensors = tuple((k, tuple(t.shape), str(t.dtype), t.device.type,
                             k in m._non_persistent_buffers_set)
                            for k, t in (*m._parameters.items(), *m._buffers.items())
                            if t is not None)
            parts.append((name, _class_key(type(m)), m.training, own, tensors))
    except _Unkeyable:
        return None
    return hashlib.sha256(repr(parts).encode()).hexdigest()


def entry_key(*parts) -> str:
    """The key of an entry: ``parts`` (model digest, input specification, ...) with the
    versions and the capture's own code."""
    code = tuple(_file_digest(str(p)) for p in _CODE)
    head = ("format 1", torch.__version__, sys.version_info[:2], __version__, code,
            str(torch.get_default_dtype()))
    return hashlib.sha256(repr((head, parts)).encode()).hexdigest()


# --- entries ---------------------------------------------------------------------------
def _path(key: str) -> Path:
    return directory() / f"{key}{_SUFFIX}"


def _sources(program) -> list[list[str]]:
    """``[path, sha256]`` of every file outside torch that a node was traced through."""
    found = set()
    for node in program.graph.nodes:
        for path in re.findall(r'File "([^"]+)", line', node.meta.get("stack_trace") or ""):
            if not path.startswith(_TORCH_DIR) and not path.startswith("<"):
                found.add(path)
    return sorted([p, _file_digest(p)] for p in found if _file_digest(p) is not None)


class _Unportable(Exception):
    """A graph the entry format cannot hold (the capture then lives in this process only)."""


#: sizes given to the symbols of a dynamic capture in the stored node values (distinct
#: primes, unlikely as a static size: an axis of the batch's size holds exactly the batch's
#: value, as it held the batch's symbol; small enough that a tensor of four such axes has a
#: size torch can compute)
_PRIMES = (10007, 10009, 10037, 10039, 10061, 10067, 10069, 10079)


def _target(target):
    if isinstance(target, torch._ops.OpOverload):
        return ("op", target.name(), target._overloadname)
    if isinstance(target, (types.BuiltinFunctionType, types.FunctionType)) and \
            getattr(target, "__module__", None) in ("_operator", "operator", "math", "torch") \
            and "." not in target.__qualname__:
        return ("py", "operator" if target.__module__ == "_operator" else target.__module__,
                target.__qualname__)
    raise _Unportable(f"target {target!r}")


def _untarget(spec):
    if spec[0] == "op":
        ns, _, name = spec[1].partition("::")
        packet = getattr(getattr(torch.ops, ns), name.partition(".")[0])
        return getattr(packet, spec[2])
    return getattr(importlib.import_module(spec[1]), spec[2])


def _size(n, symbols: dict) -> int:
    if isinstance(n, int):
        return n
    expr = n.node.expr
    free = sorted(expr.free_symbols, key=str)
    for sym in free:
        if sym not in symbols:
            if len(symbols) == len(_PRIMES):
                raise _Unportable("too many symbols")
            symbols[sym] = _PRIMES[len(symbols)]
    return int(expr.xreplace({sym: symbols[sym] for sym in free}))


def _value(v, symbols: dict):
    """A node's recorded value for the file: tensors as ``("T", sizes, dtype)``, symbolic
    sizes as their value at :data:`_PRIMES`."""
    if isinstance(v, torch.Tensor):
        return ("T", tuple(_size(n, symbols) for n in v.shape), v.dtype)
    if isinstance(v, torch.SymInt):
        return ("I", _size(v, symbols))
    if isinstance(v, (tuple, list)):
        return ("L", [_value(e, symbols) for e in v])
    if v is None or isinstance(v, (bool, int, float)):
        return ("V", v)
    raise _Unportable(f"value {type(v).__name__}")


def _unvalue(v):
    if v[0] == "T":
        return torch.empty(v[1], dtype=v[2], device="meta")
    if v[0] == "L":
        return [_unvalue(e) for e in v[1]]
    return v[1]


def _arg(a):
    if isinstance(a, torch.fx.Node):
        return ("__node__", a.name)
    if isinstance(a, tuple):  # (fx's immutable containers as plain ones)
        return tuple(_arg(e) for e in a)
    if isinstance(a, list):
        return [_arg(e) for e in a]
    if isinstance(a, dict):
        return {k: _arg(e) for k, e in a.items()}
    if isinstance(a, torch.memory_format):
        return ("__memory_format__", str(a).rpartition(".")[2])
    if a is None or isinstance(a, (bool, int, float, str, torch.dtype, torch.device,
                                   torch.layout)):
        return a
    raise _Unportable(f"argument {type(a).__name__}")


def _unarg(a, env: dict):
    if isinstance(a, tuple) and len(a) == 2 and a[0] == "__node__":
        return env[a[1]]
    if isinstance(a, tuple) and len(a) == 2 and a[0] == "__memory_format__":
        return getattr(torch, a[1])
    if isinstance(a, (tuple, list)):
        return type(a)(_unarg(e, env) for e in a)
    if isinstance(a, dict):
        return {k: _unarg(e, env) for k, e in a.items()}
    return a


def _module_stack(stack) -> dict | None:
    if not stack:
        return None
    return {k: (path, kind if isinstance(kind, str) else f"{kind.__module__}.{kind.__qualname__}")
            for k, (path, kind) in stack.items()}


def _portable(graph: CoreGraph) -> dict:
    """What :class:`CoreGraph` reads of a decomposed program, in plain values (no weights,
    no symbolic expressions): the nodes (ATen targets, arguments, recorded values with
    sizes, source lines and module paths), the signature, the input specifications, the
    pytree specs and the lifted constants that are not the model's own tensors."""
    program = graph.program
    sig = program.graph_signature
    symbols: dict = {}
    nodes = []
    for n in program.graph.nodes:
        if n.op not in ("placeholder", "call_function", "output"):
            raise _Unportable(f"a {n.op} node")
        nodes.append({"name": n.name, "op": n.op,
                      "target": n.target if n.op == "placeholder" else
                      None if n.op == "output" else _target(n.target),
                      "args": _arg(n.args), "kwargs": _arg(n.kwargs),
                      "val": _value(n.meta.get("val"), symbols),
                      "stack_trace": n.meta.get("stack_trace"),
                      "nn_module_stack": _module_stack(n.meta.get("nn_module_stack"))})
    own = set(sig.inputs_to_parameters.values()) | set(sig.inputs_to_buffers.values())
    table = {k: dict(getattr(sig, k, {})) for k in (
        "inputs_to_parameters", "inputs_to_buffers", "inputs_to_lifted_tensor_constants",
        "inputs_to_lifted_custom_objs")}
    if table["inputs_to_lifted_custom_objs"]:
        raise _Unportable("custom objects")
    spec = program.call_spec
    return {"nodes": nodes, "signature": table, "user_inputs": list(sig.user_inputs),
            "input_specs": [graph._specs[n] for n in graph.inputs],
            "in_spec": torch.utils._pytree.treespec_dumps(spec.in_spec),
            "out_spec": torch.utils._pytree.treespec_dumps(spec.out_spec),
            "constants": {k: t for k, t in program.constants.items()
                          if k not in own and isinstance(t, torch.Tensor)}}


class _Program:
    """A program read back from an entry: what :class:`CoreGraph` reads of an
    ``ExportedProgram`` (graph, signature, constants, pytree specs, input specifications);
    no weights (:meth:`CoreGraph.reads_all_weights` holds for every entry)."""

    def __init__(self, data: dict):
        graph = torch.fx.Graph()
        env: dict = {}
        for n in data["nodes"]:
            args, kwargs = _unarg(n["args"], env), _unarg(n["kwargs"], env)
            if n["op"] == "placeholder":
                node = graph.placeholder(n["target"])
            elif n["op"] == "output":
                node = graph.output(args[0])
            else:
                node = graph.call_function(_untarget(n["target"]), args, kwargs)
            node.name = n["name"]
            node.meta["val"] = _unvalue(n["val"])
            for key in ("stack_trace", "nn_module_stack"):
                if n[key] is not None:
                    node.meta[key] = n[key]
            env[n["name"]] = node
        self.graph = graph
        self.graph_module = nn.Module()
        self.graph_signature = types.SimpleNamespace(**data["signature"],
                                                     user_inputs=data["user_inputs"])
        self.input_specs = [tuple(s) for s in data["input_specs"]]
        self.call_spec = types.SimpleNamespace(
            in_spec=torch.utils._pytree.treespec_loads(data["in_spec"]),
            out_spec=torch.utils._pytree.treespec_loads(data["out_spec"]))
        self.state_dict = {}
        self.constants = data["constants"]


def store(key: str, graph: CoreGraph) -> bool:
    """Write ``graph`` (a fresh capture: :func:`_portable`) as the entry ``key``; False
    where it cannot be held or written (the capture then lives in this process only)."""
    try:
        buf = io.BytesIO()
        torch.save(_portable(graph), buf)
        payload = buf.getvalue()
        header = {"length": len(payload), "sha256": hashlib.sha256(payload).hexdigest(),
                  "sources": _sources(graph.program), "torch": torch.__version__}
        atomic_write_bytes(_path(key), MAGIC + json.dumps(header).encode() + b"\n" + payload)
        return True
    except Exception:  # noqa: BLE001 - an unserialisable op, a full or read-only disk
        return False


def _refuse(path: Path, why: str) -> None:
    warnings.warn(f"taylorattr: the cached capture {path} is {why}; it is deleted and the "
                  "model captured again", CaptureCacheWarning, stacklevel=4)
    try:
        path.unlink()
    except OSError:
        pass


def load(key: str):
    """The program of entry ``key`` (:class:`_Program`), or None (missing; truncated,
    corrupt or stale: then warned about and deleted)."""
    path = _path(key)
    try:
        data = path.read_bytes()
    except OSError:
        return None
    end = data.find(b"\n", len(MAGIC))
    try:
        if not data.startswith(MAGIC) or end < 0:
            raise ValueError
        header = json.loads(data[len(MAGIC):end])
        payload = data[end + 1:]
    except ValueError:
        _refuse(path, "not a taylorattr capture (corrupt)")
        return None
    if len(payload) != header.get("length") or \
            hashlib.sha256(payload).hexdigest() != header.get("sha256"):
        _refuse(path, f"truncated or corrupt ({len(payload)} of {header.get('length')} bytes "
                "or a wrong checksum)")
        return None
    for source, digest in header.get("sources", []):
        if _file_digest(source) != digest:
            _refuse(path, f"stale ({source} changed since it was captured)")
            return None
    try:
        return _Program(torch.load(io.BytesIO(payload), weights_only=True))
    except Exception as exc:  # noqa: BLE001 - an entry of another format or torch
        _refuse(path, f"unreadable by this torch ({type(exc).__name__})")
        return None


def entries() -> list[Path]:
    folder = directory()
    return sorted(folder.glob(f"*{_SUFFIX}")) if folder.is_dir() else []


def info() -> dict:
    """``{"directory", "enabled", "entries", "bytes"}`` of the disk cache."""
    files = entries()
    size = 0
    for f in files:
        try:
            size += f.stat().st_size
        except OSError:
            pass
    return {"directory": str(directory()), "enabled": enabled(), "entries": len(files),
            "bytes": size}


def clear() -> int:
    """Delete every entry (and the temporaries of killed writers); returns how many
    entries were deleted."""
    count = 0
    for f in entries():
        try:
            f.unlink()
            count += 1
        except OSError:
            pass
    if directory().is_dir():
        remove_stale_temporaries(directory())
    return count


# --- the cached capture ----------------------------------------------------------------
def capture(model, example_inputs: tuple | torch.Tensor | None = None,
            example_kwargs: dict | None = None, *, keep=DEFAULT_KEEP,
            dynamic: bool = True) -> CoreGraph:
    """:func:`taylorattr.capture.capture` (same arguments), an ``nn.Module``'s capture read
    from disk where an entry holds for these inputs, else made and written there: under the
    key of its dynamic axes where the capture kept them all dynamic, else under the key of
    these very shapes. A model without a key (:func:`model_digest`), a capture that holds
    weights of its own (a layer swapped in while capturing), or ``TAYLORATTR_CACHE=0``:
    captured as :func:`taylorattr.capture.capture` does, nothing written."""
    if not isinstance(model, nn.Module) or example_inputs is None:
        return _capture(model, example_inputs, example_kwargs, keep=keep, dynamic=dynamic)
    args = (example_inputs,) if isinstance(example_inputs, torch.Tensor) else tuple(example_inputs)
    kwargs = dict(example_kwargs or {})
    keep = tuple(keep)
    with _EXPORT_LOCK:  # the capture's own lock: a load and an export of a model never race
        keys = _keys(model, args, kwargs, keep, dynamic)
        for key in keys:  # the dynamic entry first, then the one for these very shapes
            program = load(key)
            if program is not None:
                graph = CoreGraph(program, model)
                if graph.fits(*args, **kwargs) and graph.reads_all_weights(model):
                    STATS.loaded += 1
                    return graph
        graph = _capture(model, args, kwargs, keep=keep, dynamic=dynamic)
        if keys and graph.reads_all_weights(model) and \
                store(keys[0] if _all_dynamic(graph, args, kwargs) else keys[-1], graph):
            STATS.stored += 1
        return graph


def _input_spec(args: tuple, kwargs: dict, dynamic: bool) -> tuple:
    """What a capture depends on of its inputs: per input, a tensor's dtype, device kind,
    rank and axis sizes, those of :func:`~taylorattr.capture.dynamic_axes` as ``"*"`` when
    ``dynamic``; other values by value."""
    def one(value):
        if isinstance(value, torch.Tensor):
            axes = dynamic_axes(value) if dynamic else ()
            return ("tensor", str(value.dtype), value.device.type,
                    tuple("*" if a in axes else int(n) for a, n in enumerate(value.shape)))
        return value_key(value)

    flat, spec = torch.utils._pytree.tree_flatten((tuple(args), dict(kwargs)))
    return (str(spec), tuple(one(v) for v in flat))


def _keys(model, args, kwargs, keep, dynamic) -> list[str]:
    """The keys of this capture (none where the cache is off or the model's structure or
    an input cannot be described): for its dynamic axes, then for these shapes."""
    if not enabled():
        return []
    digest = model_digest(model)
    if digest is None:
        return []
    try:
        specs = [_input_spec(args, kwargs, True)] if dynamic else []
        specs.append(_input_spec(args, kwargs, False))
    except _Unkeyable:
        return []
    parts = (digest, sorted(op_name(k) for k in keep), dynamic)
    return [entry_key(parts, spec) for spec in specs]


def _all_dynamic(graph: CoreGraph, args: tuple, kwargs: dict) -> bool:
    """Whether the capture kept every axis of :func:`~taylorattr.capture.dynamic_axes` of
    its inputs dynamic (an example's axis of size 1 never is): then it holds for every size
    there and goes under the dynamic key."""
    flat = torch.utils._pytree.tree_leaves((tuple(args), dict(kwargs)))
    tensors = [v for v in flat if isinstance(v, torch.Tensor)]
    if len(tensors) != len(graph.dims):
        return False
    return all(dims[a] is None for v, dims in zip(tensors, graph.dims)
               for a in dynamic_axes(v))
