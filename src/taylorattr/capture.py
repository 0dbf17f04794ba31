"""One graph capture shared by every engine that runs a model on something other than
tensors (Taylor mode's Jets, the layer-wise DeepLIFT/LRP rules).

``capture(model, example_inputs)`` exports the model with ``torch.export`` (Python control
flow that does not depend on data is run, not traced), lowers it to PyTorch's core ATen
operation set (``run_decompositions``, keeping the operations in ``keep`` whole: a rule
for them is faster or more exact than their decomposition; the device's fused kernels,
:data:`DEVICE_KERNELS`, decomposed to their math form, so the graph is the same whichever
kernel the device would pick), drops guard and assertion nodes, and returns a
:class:`CoreGraph`:

    graph nodes         n_1 .. n_N, each ``n_i = op_i(args)`` with op_i an ATen overload
                        (``torch.ops.aten.convolution.default``) or ``operator.getitem``
    depends_on_input    D(n) = n is a user input, or some argument of n has D
    constants           every node with not D(n) (parameters, buffers, positional tables,
                        masks, ``detach``-ed values) is computed on tensors as usual

Parameters and buffers are lifted to placeholders and fed at run time: from the live
module (so later in-place changes to its weights are seen), or from the program's state
for an ``ExportedProgram`` / a ``.pt2`` file saved with ``torch.export.save`` (pass the
program or the path as ``model``). The batch axis and sequence axis of every tensor input
(:func:`dynamic_axes`: positional and keyword, so a causal LM called with ``input_ids`` and
``attention_mask``) are exported as dynamic dimensions where the model allows it: one
capture serves every batch size and sequence length; an axis the model fixes stays static,
and :meth:`CoreGraph.fits` says for which inputs a capture holds, so that one fixed to a
shape is never run at another. :data:`STATS` counts the exports (and the loads of
:mod:`taylorattr.capture_cache`, which keeps captures on disk for later processes).

Engines use :meth:`CoreGraph.run` with a ``handler`` called on every input-dependent node
(``handler(node, args, kwargs)``, the arguments already evaluated), and
:meth:`CoreGraph.unsupported` / :func:`refuse` to report, in one error, every operation
they have no rule for (distinct ops, count, one source location each, what to do).

Why one module: the device-kernel decompositions are entries of the one table the capture
lowers with, rerouted and checked against the program it lowers, and every failure of
export, lowering or loading becomes the one :class:`CaptureError` built from the same
source-line reading as :func:`where`; apart, each half would reach into the other's
internals.

Example::

    from taylorattr.capture import capture
    graph = capture(model, (x,))
    print(graph.op_counts())                       # {'aten.convolution.default': 3, ...}
    y = graph.run(x)                               # equals model(x)
    y = graph.run(x, handler=lambda node, args, kwargs: node.target(*args, **kwargs))
"""
from __future__ import annotations

import contextlib
import copy
import inspect
import operator
import os
import re
import threading
import traceback
import warnings
import weakref
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch
from torch import fx, nn
from torch._decomp import get_decompositions
from torch._prims_common import compute_elementwise_output_logical_to_physical_perm
from torch._subclasses.fake_tensor import FakeTensor
from torch.fx.experimental.proxy_tensor import disable_proxy_modes_tracing
from torch.fx.experimental.symbolic_shapes import is_concrete_int
from torch.utils import _pytree as pytree

__all__ = ["CUTS", "DEFAULT_KEEP", "DEVICE_KERNELS", "STATS", "VERSION_GAPS", "CaptureError",
           "CaptureShapeWarning", "CaptureStats", "CoreGraph", "UnsupportedOps", "capture",
           "dynamic_axes", "op_name", "refuse", "where"]

aten = torch.ops.aten
_TORCH_DIR = os.path.dirname(torch.__file__)

#: Operations kept whole by default: their engine rules are exact and cheaper than their
#: decompositions (softplus: its decomposition's discarded ``exp`` branch overflows and
#: gives NaN gradients when the captured graph is differentiated).
DEFAULT_KEEP = (aten.native_layer_norm.default, aten._softmax.default,
                aten._log_softmax.default, aten.gelu.default, aten.softplus.default,
                aten.detach.default)


# --- device kernels: one capture whatever kernel the device would pick ------------------
# On CUDA, ``scaled_dot_product_attention`` dispatches (while the capture lowers it) to a
# fused kernel chosen for the device (efficient, flash, cuDNN attention), ``rms_norm`` to
# ``_fused_rms_norm``, batch norm to cuDNN/MIOpen; the CPU picks others. Each such kernel
# is decomposed here into the one math form, so the captured graph holds the same core
# operations (and values) on every device. The layout of each kernel's output is kept
# (the model's later ``view`` calls were traced against it), so a decomposition returns
# the math value laid out as the kernel's own meta function lays it out.

def _stride_order(like: torch.Tensor) -> list[int]:
    """The dimensions of ``like`` from the outermost in memory to the innermost."""
    return list(compute_elementwise_output_logical_to_physical_perm(like)[0])


def _laid_out_like(value: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """``value`` (same shape as ``like``) with the memory order of ``like``: the same
    numbers, so that views traced against the fused kernel's output stay valid."""
    order = _stride_order(like)
    if order == list(range(value.dim())):
        return value.contiguous()
    inverse = [order.index(d) for d in range(len(order))]
    return value.permute(order).contiguous().permute(inverse)


def _kernel_outputs(op, args, kwargs) -> tuple:
    """The outputs ``op`` itself gives for these arguments' shapes, strides and dtypes
    (its meta function, run without recording it into the graph being traced)."""
    def meta(a):
        return torch.empty_strided(a.shape, a.stride(), dtype=a.dtype, device="meta") \
            if isinstance(a, torch.Tensor) and not isinstance(a, FakeTensor) else a

    with disable_proxy_modes_tracing():
        args, kwargs = torch.utils._pytree.tree_map(meta, (args, kwargs))
        return op(*args, **kwargs)


def _math_attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False,
                    scale=None) -> torch.Tensor:
    """Scaled dot-product attention in its math form (the CPU's reference kernel):

        out = softmax(q k^T * s + B) v,   s = scale or 1/sqrt(q.shape[-1]),

    B the additive float mask (or 0 / -inf from a boolean or causal one; a row masked
    everywhere gives 0), key/value heads repeated to the query's for grouped-query
    attention. ``dropout_p > 0`` gives the math kernel's random ``native_dropout``, as on
    the CPU (every engine refuses it by name: call ``model.eval()``)."""
    if attn_mask is not None and attn_mask.dtype == torch.bool:  # True: attend
        attn_mask = torch.where(attn_mask, 0.0, float("-inf")).to(query.dtype)
    gqa = query.dim() >= 3 and key.dim() >= 3 and query.shape[-3] != key.shape[-3]
    kwargs = {"scale": scale, "enable_gqa": True} if gqa else {"scale": scale}
    return aten._scaled_dot_product_attention_math.default(
        query, key, value, attn_mask, dropout_p, is_causal, None, **kwargs)[0]


def _attention_kernel(op):
    """The decomposition of one fused attention kernel ``op``: its first output from
    :func:`_math_attention`, laid out as the kernel lays it out; the others (log-sum-exp,
    random seeds, debug masks: only a backward pass reads them) zeros of the kernel's
    shapes."""
    schema = op._schema.arguments

    def decomposition(*args, **kwargs):
        values = {a.name: a.default_value for a in schema if a.has_default_value()}
        values.update({a.name: v for a, v in zip(schema, args)}, **kwargs)
        q, k, v = (values[a.name] for a in schema[:3])
        out = _math_attention(q, k, v, values.get("attn_mask", values.get("attn_bias")),
                              values.get("dropout_p", 0.0), values.get("is_causal", False),
                              values.get("scale"))
        kernel = _kernel_outputs(op, args, kwargs)
        rest = (out.new_zeros(r.shape, dtype=r.dtype) if isinstance(r, torch.Tensor) else r
                for r in kernel[1:])
        return (_laid_out_like(out, kernel[0]), *rest)

    decomposition.__name__ = f"math_{op._schema.name.split('::')[-1]}"
    return decomposition


def _fused_rms_norm(x, normalized_shape, weight=None, eps=None):
    """RMSNorm over the last ``len(normalized_shape)`` axes, in float32 for half types:

        y = x / sqrt(mean(x^2) + eps) * weight,   eps default: the machine epsilon

    Returns ``(y, 1/sqrt(mean(x^2) + eps))`` as ``aten._fused_rms_norm`` does."""
    dims = list(range(x.dim() - len(normalized_shape), x.dim()))
    acc = x.float() if x.dtype in (torch.float16, torch.bfloat16) else x
    eps = torch.finfo(acc.dtype).eps if eps is None else eps
    rstd = torch.rsqrt(acc.pow(2).mean(dims, keepdim=True) + eps)
    y = acc * rstd
    if weight is not None:
        y = y * weight
    return y.to(x.dtype), rstd


def _rms_norm(x, normalized_shape, weight=None, eps=None):
    """``F.rms_norm`` itself, before it picks a kernel (:func:`_fused_rms_norm`'s ``y``)."""
    return _fused_rms_norm(x, normalized_shape, weight, eps)[0]


def _vendor_batch_norm(x, weight, bias, running_mean, running_var, training, momentum, eps):
    """cuDNN/MIOpen batch norm as the core ``_native_batch_norm_legit_no_training`` (eval;
    ``y = (x - mean) / sqrt(var + eps) * weight + bias``) or ``native_batch_norm``
    (training: batch statistics, which the engines refuse by name)."""
    if training or running_mean is None:
        return aten.native_batch_norm.default(x, weight, bias, running_mean, running_var,
                                              training, momentum, eps)
    return aten._native_batch_norm_legit_no_training.default(
        x, weight, bias, running_mean, running_var, momentum, eps)


def _cudnn_batch_norm(*args):
    y, mean, invstd = _vendor_batch_norm(*args)
    return y, mean, invstd, args[0].new_zeros((0,), dtype=torch.uint8)


def _fused_dropout(x, p, generator=None):
    """``_fused_dropout`` (``p``: the probability to *keep*) as ``native_dropout`` (the
    probability to drop): random, so every engine refuses it by its core name."""
    y, mask = aten.native_dropout.default(x, 1.0 - p, True)
    return y, mask.to(torch.uint8)


def _biased(gates, bias):
    """``gates + bias`` (the fused RNN-cell kernels' optional biases)."""
    return gates if bias is None else gates + bias


def _fused_lstm_cell(input_gates, hidden_gates, cx, input_bias=None, hidden_bias=None):
    """CUDA's ``_thnn_fused_lstm_cell`` (``nn.LSTMCell`` / ``torch.lstm_cell`` on CUDA;
    the gates ``x W_ih^T`` and ``h W_hh^T`` come in computed), in its math form:

        i, f, g, o = chunk4(x W_ih^T + h W_hh^T + b_ih + b_hh)
        c' = sigmoid(f) c + sigmoid(i) tanh(g),   h' = sigmoid(o) tanh(c')

    Returns ``(h', c', workspace)``, the workspace (read by the backward kernel only) zeros."""
    gates = _biased(_biased(input_gates + hidden_gates, input_bias), hidden_bias)
    i, f, g, o = gates.chunk(4, 1)
    cy = torch.sigmoid(f) * cx + torch.sigmoid(i) * torch.tanh(g)
    return torch.sigmoid(o) * torch.tanh(cy), cy, input_gates.new_zeros(input_gates.shape)


def _fused_gru_cell(input_gates, hidden_gates, hx, input_bias=None, hidden_bias=None):
    """CUDA's ``_thnn_fused_gru_cell`` (``nn.GRUCell`` / ``torch.gru_cell`` on CUDA), in
    its math form (``a = x W_ih^T + b_ih``, ``b = h W_hh^T + b_hh``, each chunked r, z, n):

        r = sigmoid(a_r + b_r),  z = sigmoid(a_z + b_z),  n = tanh(a_n + r b_n)
        h' = n + z (h - n)

    Returns ``(h', workspace)``, the workspace (backward only) zeros."""
    a = _biased(input_gates, input_bias).chunk(3, 1)
    b = _biased(hidden_gates, hidden_bias).chunk(3, 1)
    r, z = torch.sigmoid(a[0] + b[0]), torch.sigmoid(a[1] + b[1])
    n = torch.tanh(a[2] + r * b[2])
    rows, width = hx.shape[0], hx.shape[1]
    return n + z * (hx - n), hx.new_zeros((rows, 5 * width))


def _cudnn_grid_sampler(x, grid):
    """cuDNN's grid sampler (``F.grid_sample`` on CUDA where cuDNN accepts it: 4-D,
    bilinear, zero padding, ``align_corners=True``) as the core ``grid_sampler_2d`` with
    those settings."""
    return aten.grid_sampler_2d.default(x, grid, 0, 0, True)


def _device_kernels() -> dict:
    table = {}
    attention = ("_scaled_dot_product_flash_attention_for_cpu",
                 "_scaled_dot_product_flash_attention", "_scaled_dot_product_efficient_attention",
                 "_scaled_dot_product_cudnn_attention",
                 "_scaled_dot_product_fused_attention_overrideable",
                 "_scaled_dot_product_attention_math_for_mps")
    for name in attention:
        packet = getattr(aten, name, None)
        if packet is not None and hasattr(packet, "default"):
            table[packet.default] = _attention_kernel(packet.default)
    others = {"_fused_rms_norm": _fused_rms_norm, "rms_norm": _rms_norm,
              "cudnn_batch_norm": _cudnn_batch_norm,
              "miopen_batch_norm": _vendor_batch_norm, "_fused_dropout": _fused_dropout,
              "_thnn_fused_lstm_cell": _fused_lstm_cell, "_thnn_fused_gru_cell": _fused_gru_cell,
              "cudnn_grid_sampler": _cudnn_grid_sampler}
    for name, fn in others.items():
        packet = getattr(aten, name, None)
        if packet is not None and hasattr(packet, "default"):
            table[packet.default] = fn
    return table


#: Device- and backend-specific kernels -> their decomposition into core operations
#: (module docstring): every ``_scaled_dot_product_*_attention`` variant this torch has
#: (flash, flash for CPU, efficient, cuDNN, overrideable, MPS math) to the math attention
#: of :func:`_math_attention`, ``_fused_rms_norm`` (and ``rms_norm``, before it picks it)
#: to :func:`_fused_rms_norm`, cuDNN and MIOpen batch norm to the core batch norm,
#: ``_fused_dropout`` to ``native_dropout``, CUDA's fused LSTM and GRU cells
#: (``_thnn_fused_lstm_cell``, ``_thnn_fused_gru_cell``: ``nn.LSTMCell``/``nn.GRUCell``) to
#: their gate equations, ``cudnn_grid_sampler`` to ``grid_sampler_2d``. (Whole RNNs,
#: ``nn.LSTM``/``nn.GRU``/``nn.RNN``, never reach ``_cudnn_rnn``/``miopen_rnn``: torch's
#: table decomposes them into cells first, on every device; convolutions stay the core
#: ``convolution``, whose device kernel is chosen below the graph.) (``_fused_sdp_choice``, the kernel choice
#: itself, returns an int that export evaluates while tracing: it is never a node; every
#: kernel it can pick is here.) Applied by every capture; an op named in ``keep`` stays
#: whole.
DEVICE_KERNELS: dict = _device_kernels()

#: Device kernels that are also composite (``CompositeImplicitAutograd``) ops: torch.export
#: applies a decomposition of such an op only where the device has no kernel of its own
#: for it (on CUDA it has), so a node of one in a program is first turned back into the
#: public op that chose it (same arguments), whose decomposition always applies.
_REROUTE = {getattr(aten, "_fused_rms_norm", None): aten.rms_norm.default}
_REROUTE = {packet.default: public for packet, public in _REROUTE.items() if packet is not None}


def _rerouted(program):
    """``program`` with each :data:`_REROUTE` node whose first output alone is used
    replaced by the public op (a copy; the program itself is left as it is)."""
    def movable(node):  # only the first output used (a loaded program reads all, unused)
        return node.op == "call_function" and node.target in _REROUTE and all(
            u.target is operator.getitem and (u.args[1] == 0 or not u.users)
            for u in node.users)

    if not any(movable(n) for n in program.graph.nodes):
        return program
    program = copy.deepcopy(program)
    graph = program.graph_module.graph
    for node in [n for n in graph.nodes if movable(n)]:
        with graph.inserting_before(node):
            public = graph.call_function(_REROUTE[node.target], node.args, node.kwargs)
        public.meta = dict(node.meta)
        for user in list(node.users):
            if user.args[1] == 0:
                public.meta["val"] = user.meta.get("val")
                user.replace_all_uses_with(public)
            graph.erase_node(user)
        graph.erase_node(node)
    program.graph_module.recompile()
    return program

#: Operations that torch's default table decomposes in some versions only, with torch's own
#: decomposition: the capture holds the same core operations on every supported torch.
#: ``linalg_vector_norm`` (``F.normalize``, ``Tensor.norm``): torch 2.11 keeps it whole
#: (its refs decomposition joined the default table later, pytorch PR 185735), so on 2.11
#: XCiT's graph held it and the layer-wise engines refused it.
VERSION_GAPS: dict = get_decompositions([aten.linalg_vector_norm.default])

#: Ops whose value is treated as a constant by the input-dependence analysis (``detach``:
#: the model asks for a value without derivatives, e.g. a numerically stabilising shift).
CUTS = {aten.detach.default}

#: Reads of an input's shape (a dynamic axis's size): the same at the input and at the
#: baseline, so what is computed from them alone (positions ``arange(L)``, a rotary
#: table, a causal mask) is a constant of the call, as it is in a capture of fixed shapes.
SHAPE_READS = {aten.sym_size.int, aten.sym_stride.int, aten.sym_numel.default,
               aten.sym_storage_offset.default}

#: Guard and assertion nodes, dropped from the captured graph.
_GUARDS = {aten._assert_tensor_metadata.default, aten._assert_scalar.default,
           aten.sym_constrain_range_for_size.default, aten.sym_constrain_range.default,
           aten._assert_async.msg, aten._assert_async.default}


class CaptureError(TypeError):
    """The model could not be captured (``torch.export`` failed)."""


class CaptureShapeWarning(UserWarning):
    """A model torch.export could not export with a dynamic batch size and sequence length
    (it raised): it is captured once per input shape (said once per model class)."""


@dataclass
class CaptureStats:
    """What the captures of this process cost: ``exports`` (models traced with
    ``torch.export`` and lowered), ``loaded`` (captures read from the disk cache,
    :mod:`taylorattr.capture_cache`), ``stored`` (captures written to it)."""

    exports: int = 0
    loaded: int = 0
    stored: int = 0

    def reset(self) -> None:
        self.exports = self.loaded = self.stored = 0


#: The counters of this process (:class:`CaptureStats`).
STATS = CaptureStats()


class UnsupportedOps(TypeError):
    """Operations an engine has no rule for; ``ops`` maps each op's name to its nodes."""

    def __init__(self, message: str, ops: dict[str, list[fx.Node]]):
        super().__init__(message)
        self.ops = ops


def op_name(target) -> str:
    """``'aten.convolution.default'`` for an ATen overload; the qualified name otherwise."""
    if isinstance(target, torch._ops.OpOverload):
        ns, _, rest = target.name().partition("::")
        return f"{ns}.{rest}" + ("" if "." in rest else ".default")
    if target is operator.getitem:
        return "getitem"
    return f"{getattr(target, '__module__', '')}.{getattr(target, '__qualname__', repr(target))}"


@dataclass
class _Lifted:
    kind: str      # "parameter", "buffer" or "constant"
    fqn: str       # the module attribute (or the program's constant) it comes from


class CoreGraph:
    """A model as a graph of core ATen operations (module docstring).

    Attributes: ``module`` (the ``fx.GraphModule``; its placeholders are the lifted
    parameters/buffers/constants, then the user inputs), ``program`` (the decomposed
    ``ExportedProgram``), ``inputs`` (the user-input placeholder nodes), ``nodes`` (the
    ``call_function`` nodes in execution order), ``batch_dynamic`` (whether the first
    input's axis 0 is symbolic: the capture serves every batch size), ``passed`` (names of
    the once-per-graph checks its users have run on it, e.g. Taylor mode's) and
    ``rewritten`` (whether a rewrite, ``ta.smooth``'s, changed it from the captured model).
    """

    passed: set[str]
    rewritten: bool

    def __init__(self, program, source: nn.Module | None):
        self.program = program
        self.passed = set()
        self.rewritten = False
        # the module whose live parameters feed the graph; held weakly, so that caches of
        # captures keyed by the module do not keep it alive
        self._source = None if source is None else weakref.ref(source)
        sig = program.graph_signature
        graph = fx.Graph()
        copies: dict = {}
        out = graph.graph_copy(program.graph, copies)
        graph.output(out)
        self.module = fx.GraphModule(program.graph_module, graph)
        by_name = {n.name: copies[n] for n in program.graph.nodes if n.op == "placeholder"}
        self.lifted: dict[str, _Lifted] = {}
        kinds = [("parameter", sig.inputs_to_parameters), ("buffer", sig.inputs_to_buffers),
                 ("constant", getattr(sig, "inputs_to_lifted_tensor_constants", {})),
                 ("constant", getattr(sig, "inputs_to_lifted_custom_objs", {}))]
        for kind, table in kinds:
            for name, fqn in table.items():
                self.lifted[by_name[name].name] = _Lifted(kind, fqn)
        # user inputs: placeholders, and the values of constant ones (``use_cache=False``)
        self._user = [by_name.get(name, _Constant(name)) if isinstance(name, str)
                      else _Constant(name) for name in sig.user_inputs]
        self.inputs = [n for n in self._user if isinstance(n, fx.Node)]
        for node in list(graph.nodes):
            if node.op == "call_function" and node.target in _GUARDS and not node.users:
                graph.erase_node(node)
        graph.eliminate_dead_code()
        self.module.recompile()
        self.refresh()
        #: per user input: its axes' sizes, None for a dynamic axis (a tensor), or its value
        #: (given by a program read back from disk, whose node values hold no symbols)
        specs = getattr(program, "input_specs", None) or \
            [_input_spec(n.meta.get("val")) for n in self.inputs]
        self._specs = dict(zip(self.inputs, specs))
        self.dims = [spec[0] for spec in specs]
        first = self.dims[0] if self.dims else None
        self.batch_dynamic = isinstance(first, tuple) and bool(first) and first[0] is None

    def fits(self, *args, **kwargs) -> bool:
        """Whether the graph holds for these inputs (the model's positional and keyword
        arguments): as many, each tensor of the captured dtype, device kind and rank, its
        static axes of the captured sizes and its dynamic ones at least 2 long (export
        specialises sizes 0 and 1); other values equal to the captured ones."""
        spec = getattr(getattr(self.program, "call_spec", None), "in_spec", None)
        if kwargs and spec is not None and spec.num_children == 2:
            order = spec.child(1).context or []
            if set(order) != set(kwargs):
                return False
            kwargs = {k: kwargs[k] for k in order}
        flat = pytree.tree_leaves((tuple(args), dict(kwargs)))
        if len(flat) != len(self._user):
            return False
        for node, value in zip(self._user, flat):
            if isinstance(node, _Constant):
                if isinstance(value, torch.Tensor) or value != node.value:
                    return False
                continue
            dims, dtype, device = self._specs[node]
            if dtype is None:
                if isinstance(value, torch.Tensor) or (dims is not None and dims != value):
                    return False
                continue
            if not isinstance(value, torch.Tensor) or value.dtype != dtype or \
                    value.device.type != device or value.dim() != len(dims):
                return False
            if any(n != d if d is not None else n < 2 for d, n in zip(dims, value.shape)):
                return False
        return True

    @property
    def source(self) -> nn.Module | None:
        """The captured module (None for a program or file, or once the module is gone);
        assign another module of the same structure to read its parameters instead."""
        return None if self._source is None else self._source()

    @source.setter
    def source(self, module: nn.Module | None) -> None:
        self._source = None if module is None else weakref.ref(module)

    def refresh(self) -> None:
        """Recompute :attr:`nodes` and the input dependence after editing ``module.graph``."""
        self.nodes = [n for n in self.module.graph.nodes if n.op == "call_function"]
        live = set(self.inputs)
        for node in self.nodes:
            if node.target not in CUTS and node.target not in SHAPE_READS and \
                    any(a in live for a in node.all_input_nodes):
                live.add(node)
        self._dependent = live
        # what run() needs per node, worked out once per graph: whether the handler computes
        # it, and the values it is the last user of (freed after it runs)
        self._handled = {n for n in self.nodes if n in live or
                         any(a in live for a in n.all_input_nodes)}
        self._frees = _last_uses(self.module.graph)

    def depends_on_input(self, node: fx.Node) -> bool:
        """Whether ``node``'s value depends on a user input (everything else is a constant)."""
        return node in self._dependent

    @property
    def output_node(self) -> fx.Node:
        return next(n for n in reversed(self.module.graph.nodes) if n.op == "output")

    def op_counts(self, dependent_only: bool = True) -> dict[str, int]:
        """How often each operation occurs (on input-dependent nodes only, by default)."""
        return dict(Counter(op_name(n.target) for n in self.nodes
                            if not dependent_only or self.depends_on_input(n)))

    def lifted_values(self, source: nn.Module | None = None) -> dict[str, torch.Tensor]:
        """Placeholder name -> the tensor it stands for (live attributes of ``source``, by
        default the module captured, when there is one; else the program's state).
        ``source`` may be another module of the captured one's structure."""
        values = {}
        state, constants = self.program.state_dict, self.program.constants
        source = self.source if source is None else source
        for name, lifted in self.lifted.items():
            live = _live_attribute(source, lifted) if source is not None else None
            if live is not None:
                values[name] = live
            elif lifted.fqn in state or lifted.fqn in constants:
                values[name] = state[lifted.fqn] if lifted.fqn in state else constants[lifted.fqn]
            else:  # a capture read from disk holds no weights of its own
                raise ValueError(f"the model whose {lifted.kind} {lifted.fqn!r} this capture "
                                 "reads is gone: keep it alive, or pass source=")
        return values

    def reads_all_weights(self, source: nn.Module) -> bool:
        """Whether every lifted parameter and buffer is read from ``source`` (none comes
        from the program's own state)."""
        return all(_live_attribute(source, lifted) is not None
                   for lifted in self.lifted.values() if lifted.kind in ("parameter", "buffer"))

    def run(self, *inputs, handler: Callable | None = None):
        """Evaluate the graph on ``inputs``; ``handler(node, args, kwargs)`` computes every
        input-dependent node and every node fed by one (a cut such as ``detach``, whose
        value is a constant; default: the op itself). Returns the model's output (a
        single value, or a tuple for several outputs)."""
        if len(inputs) != len(self.inputs):
            raise TypeError(f"the captured model takes {len(self.inputs)} input(s), got {len(inputs)}")
        env: dict[fx.Node, object] = dict(zip(self.inputs, inputs))
        lifted = self.lifted_values()
        for node in self.module.graph.nodes:
            if node.op == "placeholder":
                if node not in env:  # a lifted tensor, or a constant input's unused slot
                    env[node] = lifted.get(node.name)
                continue
            if node.op == "get_attr":
                env[node] = getattr(self.module, node.target)
                continue
            args, kwargs = fx.node.map_arg((node.args, node.kwargs), lambda a: env[a])
            if node.op == "output":
                result = args[0]
                return result[0] if isinstance(result, (tuple, list)) and len(result) == 1 else result
            if handler is not None and node in self._handled:
                env[node] = handler(node, args, kwargs)
            else:
                env[node] = node.target(*args, **kwargs)
            for used in self._frees.get(node, ()):
                env.pop(used, None)
        raise AssertionError("graph without output")

    def describe(self, node: fx.Node) -> str:
        """``aten.op.overload`` at ``module.path (Type)``, ``file:line (code)``."""
        return f"{op_name(node.target)} at {where(node)}"

    def unsupported(self, is_supported: Callable[[fx.Node], bool]) -> dict[str, list[fx.Node]]:
        """Op name -> the input-dependent nodes ``is_supported`` refuses, in graph order."""
        found: dict[str, list[fx.Node]] = {}
        for node in self.nodes:
            if self.depends_on_input(node) and not is_supported(node):
                found.setdefault(op_name(node.target), []).append(node)
        return found


@dataclass
class _Constant:
    value: object  # a user input torch.export made a constant of the graph


def _input_spec(val) -> tuple:
    """``(dims, dtype, device kind)`` of a user input's recorded value (``dims``: each
    axis' size, None for a dynamic one), or ``(value, None, None)`` for a non-tensor."""
    if isinstance(val, torch.Tensor):
        return (tuple(int(n) if is_concrete_int(n) else None for n in val.shape), val.dtype,
                val.device.type)
    return (val, None, None)


def _last_uses(graph: fx.Graph) -> dict[fx.Node, list[fx.Node]]:
    """Node -> the argument nodes whose last use it is (freed after it runs)."""
    last: dict[fx.Node, fx.Node] = {}
    for node in graph.nodes:
        for a in node.all_input_nodes:
            last[a] = node
    table: dict[fx.Node, list[fx.Node]] = {}
    for arg, user in last.items():
        if arg.op != "placeholder":
            table.setdefault(user, []).append(arg)
    return table


def where(node: fx.Node) -> str:
    """The module path and type a node sits in and the user's source line that made it."""
    stack = node.meta.get("nn_module_stack") or {}
    module = "(model)"
    if stack:
        path, kind = list(stack.values())[-1]
        kind_name = kind if isinstance(kind, str) else getattr(kind, "__name__", str(kind))
        module = f"{path or '(model)'} ({kind_name.rpartition('.')[2]})"
    trace = (node.meta.get("stack_trace") or "").strip().splitlines()
    line = ""
    files = [i for i, t in enumerate(trace) if t.strip().startswith("File ")]
    users = [i for i in files if _TORCH_DIR not in trace[i]]  # the user's own line first
    if files:
        at = (users or files)[-1]
        head = trace[at].strip()
        code = trace[at + 1].strip() if at + 1 < len(trace) else ""
        line = f", {head[5:]}" + (f": {code}" if code else "")
    return module + line


def refuse(graph: CoreGraph, found: dict[str, list[fx.Node]], what: str, advice: str,
           error: type[Exception] = UnsupportedOps) -> None:
    """Raise one error listing every unsupported op of ``found`` (count, first location)."""
    if not found:
        return
    lines = [f"{what} has no rule for {len(found)} operation(s) of this model:"]
    for name, nodes in found.items():
        lines.append(f"  - {name} (x{len(nodes)}), first at {where(nodes[0])}")
    lines.append(advice)
    message = "\n".join(lines)
    raise (error(message, found) if error is UnsupportedOps else error(message))


def _load(model):
    if isinstance(model, (str, os.PathLike)):
        if not os.path.exists(model):
            raise FileNotFoundError(f"model: no such file {os.fspath(model)!r} (a .pt2 program "
                                    "saved with torch.export.save)")
        try:
            with _torch_deprecations_silenced():
                return torch.export.load(model)
        except Exception as exc:  # a corrupt or foreign file: torch raises many kinds
            raise _capture_error(exc, f"model: could not load {os.fspath(model)!r} with "
                                 "torch.export.load", "What you can do: pass a .pt2 file "
                                 "saved with torch.export.save (by this torch version), or the "
                                 "nn.Module itself.") from exc
    return model


def _decompose(program, keep: Iterable, what: str):
    """``program`` lowered to core ATen with :data:`DEVICE_KERNELS` and
    :data:`VERSION_GAPS` decomposed (all but ``keep``); a failure raises :class:`CaptureError` naming the step, the user's line
    and what to do."""
    table = torch.export.default_decompositions()
    table.update(VERSION_GAPS)
    table.update(DEVICE_KERNELS)
    for op in keep:
        table.pop(op, None)
    try:
        with _torch_deprecations_silenced():
            return _rerouted(program).run_decompositions(table)
    except Exception as exc:  # lowering raises many kinds of errors
        raise _capture_error(exc, f"lowering {what} to core ATen operations failed",
                             "What you can do: replace the operation named above by standard "
                             "torch operations, or report the model (torch.export could "
                             "trace it but not lower it).") from exc


#: The modules whose deprecation warnings a capture silences (a regular expression on the
#: module a warning is attributed to): torch's internals; typing_extensions, which issues
#: torch's ``@deprecated`` warnings; and copy/copyreg, through which torch copies its own
#: objects (torch 2.11's run_decompositions deep-copies pytree specs: ``copyreg.__newobj__``
#: instantiates the deprecated ``LeafSpec``, "`isinstance(treespec, LeafSpec)` is
#: deprecated", a FutureWarning attributed to copyreg).
_TORCH_INTERNALS = r"(torch|typing_extensions|copy|copyreg)(\..*)?$"


@contextlib.contextmanager
def _torch_deprecations_silenced():
    """Export, lowering and loading without torch's deprecation noise: ``FutureWarning`` and
    ``DeprecationWarning`` raised by torch's own modules (:data:`_TORCH_INTERNALS`) about
    torch's own code are ignored, so a caller whose filters turn warnings into errors
    (``-W error``, pytest's ``filterwarnings = error``) can still capture. Every other
    warning keeps the caller's filters: the model's own, and torch's about the model's code
    (attributed to the model's line, not to torch)."""
    with warnings.catch_warnings():
        for category in (FutureWarning, DeprecationWarning):
            warnings.filterwarnings("ignore", category=category, module=_TORCH_INTERNALS)
        yield


def _capture_error(error: BaseException, what: str, advice: str,
                   why: str | None = None) -> CaptureError:
    """One :class:`CaptureError`: ``what``, the user's source line (from the traceback,
    or from the node's recorded trace torch quotes), ``why`` and the error's first line,
    ``advice``.
    A :class:`CaptureError` raised inside (a refused decomposition) is passed on."""
    seen = error
    while seen is not None:
        if isinstance(seen, CaptureError):
            return seen
        seen = seen.__cause__ or seen.__context__
    text = str(error).strip()
    frames = [(f.filename, f.lineno, (f.line or "").strip())
              for f in traceback.extract_tb(error.__traceback__)
              if not f.filename.startswith(_TORCH_DIR) and f.filename != __file__]
    quoted = re.findall(r'File "([^"]+)", line (\d+), in [^\n]*\n\s*([^\n]*)', text)
    frames += [(f, int(n), code.strip()) for f, n, code in quoted
               if not f.startswith(_TORCH_DIR) and f != __file__]
    at = f" at {frames[-1][0]}:{frames[-1][1]} ({frames[-1][2]})" if frames else ""
    first = text.splitlines()[0] if text else ""
    cause = f"{type(error).__name__}: {first}"
    return CaptureError(f"{what}{at}: " + (f"{why} ({cause}). " if why else f"{cause}. ")
                        + advice)


def _live_attribute(source: nn.Module, lifted) -> torch.Tensor | None:
    """The module's own parameter or buffer a lifted input stands for, or None for a
    constant or a path the module no longer has (a layer swapped in while capturing, as
    ``layer=`` attributions do, is gone again: the program holds the same tensors)."""
    if lifted.kind not in ("parameter", "buffer"):
        return None
    try:
        return (source.get_parameter if lifted.kind == "parameter" else source.get_buffer)(
            lifted.fqn)
    except AttributeError:
        return None


#: torch.export (tracing, decompositions) is not thread-safe: one capture at a time. Nor is
#: it safe while another thread runs PyTorch modules (its module hooks are global): the
#: first call that captures a model (or a layer view of it) belongs in one thread.
_EXPORT_LOCK = threading.RLock()


def capture(model, example_inputs: tuple | torch.Tensor | None = None,
            example_kwargs: dict | None = None, *, keep: Iterable = DEFAULT_KEEP,
            dynamic: bool = True) -> CoreGraph:
    """Capture ``model`` as a :class:`CoreGraph` of core ATen operations (one capture at a
    time in a process: torch.export is not thread-safe).

    Args:
        model: an ``nn.Module`` (put in eval mode first), a ``torch.export.ExportedProgram``
            or the path of a ``.pt2`` file saved with ``torch.export.save``.
        example_inputs: a tensor or a tuple of the model's positional inputs (not needed
            for a program).
        example_kwargs: keyword inputs, if any.
        keep: ATen overloads not decomposed (default :data:`DEFAULT_KEEP`).
        dynamic: export the axes of :func:`dynamic_axes` of every tensor input as dynamic
            (batch size, sequence length: one capture serves every size; an axis the model
            fixes stays static; where export fails with them, a :class:`CaptureShapeWarning`
            and static shapes).

    Each export of an ``nn.Module`` is counted in :data:`STATS`;
    :func:`taylorattr.capture_cache.capture` is this function with its captures kept on disk.
    """
    with _EXPORT_LOCK:
        return _capture(model, example_inputs, example_kwargs, keep, dynamic)


def dynamic_axes(value: torch.Tensor) -> tuple[int, ...]:
    """The axes of an input exported as dynamic: the batch axis 0, and axis 1 of an input
    of rank 2 or 3 (``[B, L]`` token ids and masks, ``[B, L, d]`` embeddings; where it is a
    feature or channel axis the model's weights fix it and export keeps it static)."""
    if value.dim() == 0:
        return ()
    return (0, 1) if value.dim() in (2, 3) else (0,)


def _dynamic_shapes(model: nn.Module, args: tuple, kwargs: dict):
    """``dynamic_shapes`` for torch.export: :func:`dynamic_axes` as ``Dim.AUTO`` (dynamic
    where the model allows, static where it fixes the size) for every tensor, positional
    or keyword, nested in tuples, lists and dicts."""
    def spec(value):
        if isinstance(value, torch.Tensor):  # (an axis of size 1 is specialised anyway)
            return {a: torch.export.Dim.AUTO for a in dynamic_axes(value)
                    if value.shape[a] >= 2} or None
        if isinstance(value, (tuple, list)):
            return type(value)(spec(v) for v in value)
        if isinstance(value, dict):
            return {k: spec(v) for k, v in value.items()}
        return None

    try:
        params = inspect.signature(model.forward).parameters
        bound = inspect.signature(model.forward).bind(*args, **kwargs).arguments
    except (TypeError, ValueError):
        return None
    shapes = {}
    for name, value in bound.items():
        kind = params[name].kind
        if kind is inspect.Parameter.VAR_KEYWORD:
            shapes[name] = {k: spec(v) for k, v in value.items()}
        else:
            shapes[name] = spec(value)
    return shapes


_WARNED: set = set()  # model classes a CaptureShapeWarning was given for


def _shape_warning(name: str, why: str) -> None:
    if name in _WARNED:
        return
    _WARNED.add(name)
    warnings.warn(f"taylorattr: {name} could not be captured with a dynamic batch size and "
                  f"sequence length ({why}); it is captured once per input shape instead (a "
                  "first call at each new shape costs a capture)", CaptureShapeWarning,
                  stacklevel=4)


def _capture(model, example_inputs, example_kwargs, keep, dynamic) -> CoreGraph:
    model = _load(model)
    keep = tuple(keep)
    if isinstance(model, torch.export.ExportedProgram):
        return CoreGraph(_decompose(model, keep, "the exported program"), None)
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be an nn.Module, an ExportedProgram or a .pt2 path, got "
                        f"{type(model).__name__}")
    if example_inputs is None:
        raise TypeError("example_inputs is required to capture an nn.Module")
    args = (example_inputs,) if isinstance(example_inputs, torch.Tensor) else tuple(example_inputs)
    kwargs = dict(example_kwargs or {})
    # contiguous examples: torch 2.14 fails to lower a program exported with a dynamic axis
    # from a strided view ("'NoneType' object has no attribute 'size'" in its _guards_fn)
    args, kwargs = pytree.tree_map_only(torch.Tensor, torch.Tensor.contiguous, (args, kwargs))
    name = type(model).__name__
    program = _export(model, args, kwargs, dynamic)
    graph = CoreGraph(_decompose(program, keep, name), model)
    STATS.exports += 1
    return graph


def _export(model: nn.Module, args: tuple, kwargs: dict, dynamic: bool):
    """The torch.export program: with the dynamic axes first where ``dynamic`` (``Dim.AUTO``:
    an axis the model's code fixes comes out static, silently), then with static shapes (a
    :class:`CaptureShapeWarning` when only those work); failures raise
    :class:`CaptureError`."""
    name = type(model).__name__
    shapes = _dynamic_shapes(model, args, kwargs) if dynamic else None
    attempts = ([shapes] if shapes else []) + [None]
    error = first_error = None
    for dynamic_shapes in attempts:
        try:
            with _torch_deprecations_silenced():
                program = torch.export.export(model, args, kwargs, dynamic_shapes=dynamic_shapes,
                                              strict=False)
        except Exception as exc:  # noqa: BLE001 - export raises many kinds of errors
            error = exc
            first_error = first_error or exc
            continue
        if dynamic_shapes is None and shapes:
            text = str(first_error).strip()
            _shape_warning(name, f"{type(first_error).__name__}: "
                                 f"{text.splitlines()[0] if text else ''}")
        return program
    if _data_dependent(error):
        raise _capture_error(
            error, f"torch.export could not capture {name}",
            "What you can do: compute both branches and pick with torch.where(condition, a, "
            "b) (or use torch.cond), keep such values as tensors; or, where the branch taken "
            "is the same at the input and the baseline, fix it in a wrapper whose forward "
            "has no such `if`, and attribute the wrapper; or use a method that runs the "
            "model as it is (IntegratedGradients, Occlusion, ShapleyValues).",
            why="forward depends on the input's values in Python (an `if` on a tensor, or "
            "a number read from one with .item()/int()/bool()), while a capture holds one "
            "path for every input") from error
    raise _capture_error(error, f"torch.export could not capture {name}",
                         "What you can do: make forward's control flow independent of the "
                         "input values (see torch.export's documentation), or export the "
                         "model yourself and pass the ExportedProgram / .pt2 file.") \
        from error


def _data_dependent(error: BaseException) -> bool:
    """Whether torch.export failed on Python control flow or numbers that depend on the
    input's values (a guard on a data-dependent symbol)."""
    while error is not None:
        if any("DataDependent" in k.__name__ for k in type(error).__mro__) or \
                "data-dependent" in str(error).split("\n", 1)[0]:
            return True
        error = error.__cause__ or error.__context__
    return False
