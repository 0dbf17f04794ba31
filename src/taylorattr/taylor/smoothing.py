"""Smooth surrogates of piecewise-linear networks, for Taylor analysis of ReLU models
(``ta.smooth``; the module is not called ``smooth`` so that it cannot shadow the function).

``smooth(model, beta)`` deep-copies ``model`` and replaces every kink by a smooth function
that tends to it as ``beta`` grows:

    ReLU(x)       -> softplus_beta(x) = log(1 + exp(beta x)) / beta         (gap log 2 / beta)
    ReLU6(x)      -> softplus_beta(x) - softplus_beta(x - 6)                 (a smooth clamp)
    LeakyReLU(x)  -> a x + (1 - a) softplus_beta(x)
    MaxPool(x)    -> (1/beta) log sum_{window} exp(beta x)                   (gap <= log n / beta)

    clamp(x, a, b) -> a + softplus_beta(x - a) - softplus_beta(x - b)      (Hardtanh, ReLU6)
    Hardswish(x)  -> x clamp~(x + 3, 0, 6) / 6,  Hardsigmoid -> clamp~(x + 3, 0, 6) / 6
    PReLU(x)      -> a x + (1 - a) softplus_beta(x)                          (learned a)

Modules are swapped in place (max-pool with any ``ceil_mode``, padding and dilation);
functional calls (``F.relu``, ``torch.relu``, ``x.relu()``, ``F.relu6``, ``F.leaky_relu``,
``F.max_pool1d/2d``) are found by torch.fx and rerouted to the same surrogates; whatever is
left (a model torch.fx cannot trace, clamps, ``F.hardswish``, the ``clamp_min`` inside
``F.normalize``) is rewritten in the model's captured core-ATen graph (:func:`smooth_graph`).
**One function**: calling the smoothed model runs that rewritten graph (captured on its
first call per input signature, or by ``smooth`` itself when given ``inputs``), the
function Taylor mode expands and ``output_gap`` measures, whatever is captured later. ``beta="auto"`` with ``inputs=`` picks the
smallest beta whose output gap is at most ``tolerance`` (5%) of ``|f(x) - f(x~)|``. The smoothed model takes the model's own arguments (several inputs, extra
arguments), so tuple inputs, ``additional_forward_args`` and ``layer=`` reach it as they
reach the model. The result is a :class:`SmoothedModel`; given ``inputs`` it reports
``output_gap = max |f_smooth(inputs) - f(inputs)|``. Its Taylor terms of order >= 2 are
non-zero (the original's vanish almost everywhere) and tend to the kinks' as beta grows.

Example::

    smoothed = ta.smooth(relu_cnn, beta=10.0, inputs=x)
    print(smoothed.output_gap)          # how far the surrogate is from the original on x
    terms = ta.taylor_terms(smoothed, x, order=3)

Why one module: the surrogate modules, the module swap, the torch.fx and captured-graph
rewrites and ``beta="auto"`` all build and tune the same surrogate classes; the Taylor
rules for them live with the engine (``taylor/mode/rules/surrogates.py``).
"""
from __future__ import annotations

import copy
import math
import operator
import warnings
from numbers import Real

import torch
import torch.nn.functional as F
from torch import fx, nn

from .. import _fx
from .. import _validation as V
from ..capture import CaptureError, capture, op_name, where

__all__ = ["AUTO_BETAS", "SmoothClamp", "SmoothHardswish", "SmoothLeakyReLU", "SmoothMaxPool",
           "SmoothPReLU", "SmoothReLU", "SmoothReLU6", "SmoothedModel", "smooth", "smooth_graph"]


class SmoothReLU(nn.Module):
    """``softplus_beta(x) = log(1 + exp(beta x)) / beta``; PyTorch returns ``x`` where
    ``beta x > 20`` (an error below ``exp(-20) / beta``)."""

    def __init__(self, beta: float):
        super().__init__()
        self.beta = float(beta)

    def forward(self, x):
        return F.softplus(x, self.beta)


class SmoothReLU6(SmoothReLU):
    """``relu6(x) = relu(x) - relu(x - 6)`` with each ReLU smoothed: a smooth clamp to [0, 6]."""

    def forward(self, x):
        return F.softplus(x, self.beta) - F.softplus(x - 6.0, self.beta)


class SmoothLeakyReLU(SmoothReLU):
    """``leaky(x) = a x + (1 - a) relu(x)`` with the ReLU smoothed."""

    def __init__(self, beta: float, negative_slope: float):
        super().__init__(beta)
        self.negative_slope = float(negative_slope)

    def forward(self, x):
        a = self.negative_slope
        return a * x + (1.0 - a) * F.softplus(x, self.beta)


class SmoothClamp(SmoothReLU):
    """``clamp(x, lo, hi) = lo + relu(x - lo) - relu(x - hi)`` with each ReLU smoothed (one
    bound: ``lo + relu(x - lo)`` or ``hi - relu(hi - x)``); Hardtanh is ``clamp(x, -1, 1)``."""

    def __init__(self, beta: float, lo: float | None, hi: float | None):
        super().__init__(beta)
        self.lo, self.hi = lo, hi

    def forward(self, x):
        return self.apply_to(x, F.softplus)

    def apply_to(self, x, softplus):
        """The surrogate with ``softplus(t, beta)`` given (tensors or Taylor-mode Jets)."""
        if self.lo is None:
            return -softplus(-x + self.hi, self.beta) + self.hi
        y = softplus(x - self.lo, self.beta) + self.lo
        return y if self.hi is None else y - softplus(x - self.hi, self.beta)


class SmoothHardswish(SmoothClamp):
    """``hardswish(x) = x relu6(x + 3) / 6`` with the ReLU6 smoothed; ``gate_only``:
    Hardsigmoid ``relu6(x + 3) / 6``."""

    def __init__(self, beta: float, gate_only: bool = False):
        super().__init__(beta, 0.0, 6.0)
        self.gate_only = gate_only

    def apply_to(self, x, softplus):
        gate = super().apply_to(x + 3.0, softplus) * (1.0 / 6.0)
        return gate if self.gate_only else x * gate


class SmoothPReLU(SmoothReLU):
    """``prelu(x) = a x + (1 - a) relu(x)`` (learned slopes ``a`` per channel) smoothed."""

    def __init__(self, beta: float, weight: torch.Tensor):
        super().__init__(beta)
        self.weight = nn.Parameter(weight.detach().clone())

    def forward(self, x):
        a = self.weight.view(-1, *[1] * (x.dim() - 2)) if x.dim() > 1 and self.weight.numel() > 1 \
            else self.weight
        return a * x + (1.0 - a) * F.softplus(x, self.beta)


class SmoothMaxPool(nn.Module):
    """Log-sum-exp pooling with temperature ``1/beta`` (1-d or 2-d, max-pool geometry):

        y = s + (1/beta) log sum_{offsets o in the window} exp(beta (x_o - s))

    with ``s`` the window maximum, held constant: the value does not depend on ``s``, which
    only keeps ``exp`` in range. Each offset of the window is a strided slice of the input.
    Taylor mode runs the same :meth:`log_sum_exp` on Jets (its rule in
    :mod:`taylorattr.taylor.mode.rules.surrogates`)."""

    def __init__(self, beta: float, dims: int, kernel_size, stride=None, padding=0, dilation=1,
                 ceil_mode: bool = False):
        super().__init__()
        pair = (lambda v: (v,) * dims if isinstance(v, int) else tuple(v))
        self.beta, self.dims, self.ceil_mode = float(beta), dims, bool(ceil_mode)
        self.kernel_size, self.padding, self.dilation = pair(kernel_size), pair(padding), pair(dilation)
        self.stride = self.kernel_size if stride is None or stride == [] else pair(stride)

    def forward(self, x):
        return self.log_sum_exp(x, x.detach(), torch.exp, torch.log, F.pad,
                                lambda t, index: t[index])

    def log_sum_exp(self, x, values: torch.Tensor, exp, log, pad, index):
        """The pooling written once for tensors and Jets: ``values`` are ``x``'s values,
        ``exp``/``log``/``pad``/``index`` the operations on ``x``'s kind."""
        pool = F.max_pool1d if self.dims == 1 else F.max_pool2d
        shift = pool(values, self.kernel_size, self.stride, self.padding, self.dilation,
                     ceil_mode=self.ceil_mode)
        out = shift.shape[-self.dims:]
        pads = []
        for d in reversed(range(self.dims)):  # ceil_mode: the last window may pass the end
            size = values.shape[d - self.dims] + 2 * self.padding[d]
            need = (out[d] - 1) * self.stride[d] + self.dilation[d] * (self.kernel_size[d] - 1) + 1
            pads += [self.padding[d], self.padding[d] + max(0, need - size)]
        if any(pads):
            x = pad(x, pads, value=float("-inf"))
        total = None
        for offset in _offsets(self.kernel_size):
            where = [slice(None)] * (values.dim() - self.dims)
            for d in range(self.dims):
                start = offset[d] * self.dilation[d]
                where.append(slice(start, start + (out[d] - 1) * self.stride[d] + 1, self.stride[d]))
            term = exp((index(x, tuple(where)) - shift) * self.beta)
            total = term if total is None else total + term
        return log(total) * (1.0 / self.beta) + shift


def _offsets(kernel: tuple[int, ...]) -> list[tuple[int, ...]]:
    grids = [()]
    for k in kernel:
        grids = [g + (i,) for g in grids for i in range(k)]
    return grids


def _surrogate(m: nn.Module, beta: float) -> nn.Module | None:
    if isinstance(m, nn.ReLU):
        return SmoothReLU(beta)
    if isinstance(m, nn.ReLU6):
        return SmoothReLU6(beta)
    if isinstance(m, nn.Hardtanh):
        return SmoothClamp(beta, m.min_val, m.max_val)
    if isinstance(m, (nn.Hardswish, nn.Hardsigmoid)):
        return SmoothHardswish(beta, gate_only=isinstance(m, nn.Hardsigmoid))
    if isinstance(m, nn.LeakyReLU):
        return SmoothLeakyReLU(beta, m.negative_slope)
    if isinstance(m, nn.PReLU):
        return SmoothPReLU(beta, m.weight)
    if isinstance(m, (nn.MaxPool1d, nn.MaxPool2d)):
        if m.return_indices:
            raise ValueError(f"model: {type(m).__name__} with return_indices has no smooth "
                             "surrogate (the indices have no smooth counterpart)")
        dims = 1 if isinstance(m, nn.MaxPool1d) else 2
        return SmoothMaxPool(beta, dims, m.kernel_size, m.stride, m.padding, m.dilation,
                             m.ceil_mode)
    if isinstance(m, (nn.MaxPool3d, nn.AdaptiveMaxPool1d, nn.AdaptiveMaxPool2d)):
        raise TypeError(f"model: {type(m).__name__} has no smooth surrogate in ta.smooth "
                         "(ReLU, ReLU6, LeakyReLU, PReLU, Hardtanh, Hardswish, Hardsigmoid, "
                         "clamp and MaxPool1d/2d have one)")
    return None


def _functional(node: fx.Node, beta: float) -> nn.Module | None:
    """The surrogate for a functional kink in a traced graph (args taken from the node)."""
    args, kwargs = node.args[1:], dict(node.kwargs)
    if node.op == "call_method":
        return SmoothReLU(beta) if node.target in ("relu", "relu_") else None
    if node.op != "call_function":
        return None
    if node.target in (F.relu, torch.relu, torch.relu_):
        return SmoothReLU(beta)
    if node.target is F.relu6:
        return SmoothReLU6(beta)
    if node.target is F.leaky_relu:
        return SmoothLeakyReLU(beta, (args or (kwargs.get("negative_slope", 0.01),))[0])
    if node.target in (F.max_pool1d, F.max_pool2d):
        names = ("kernel_size", "stride", "padding", "dilation", "ceil_mode", "return_indices")
        given = dict(zip(names, args)) | kwargs
        if given.get("return_indices"):
            raise ValueError("model: F.max_pool with return_indices has no smooth surrogate")
        dims = 1 if node.target is F.max_pool1d else 2
        return SmoothMaxPool(beta, dims, given["kernel_size"], given.get("stride"),
                             given.get("padding", 0), given.get("dilation", 1),
                             bool(given.get("ceil_mode", False)))
    return None


#: Functional kinks torch.fx may show that :func:`_functional` does not reroute: the
#: captured graph's rewrite (:func:`smooth_graph`) handles them.
_LEFT_FUNCTIONS = {F.hardtanh, F.hardswish, F.hardsigmoid, torch.clamp, torch.clip,
                   torch.clamp_min, torch.clamp_max, torch.maximum, torch.minimum, torch.abs,
                   F.prelu, F.max_pool3d, F.adaptive_max_pool1d, F.adaptive_max_pool2d,
                   torch.max_pool2d, torch.max_pool1d}
_LEFT_METHODS = {"clamp", "clamp_", "clip", "clip_", "clamp_min", "clamp_max", "abs", "maximum",
                 "minimum"}


def _smooth_functional(model: nn.Module, beta: float) -> tuple[nn.Module, bool]:
    """Reroute functional kinks found by torch.fx to surrogate submodules (if any). Returns
    the model and whether torch.fx saw it whole with no kink left (else the captured
    graph's rewrite is needed when the smoothed model runs)."""
    try:
        gm = _fx.trace(model, "ta.smooth", ValueError, leaf_modules=(SmoothMaxPool,))
    except ValueError:
        return model, False
    count, complete = 0, True
    for node in list(gm.graph.nodes):
        surrogate = _functional(node, beta)
        if surrogate is None:
            if (node.op == "call_function" and node.target in _LEFT_FUNCTIONS) or \
                    (node.op == "call_method" and node.target in _LEFT_METHODS):
                complete = False
            continue
        name = f"smooth_{count}"
        count += 1
        gm.add_submodule(name, surrogate)
        with gm.graph.inserting_after(node):
            new = gm.graph.call_module(name, (node.args[0],))
        node.replace_all_uses_with(new)
        gm.graph.erase_node(node)
    if not count:
        return model, complete
    gm.graph.lint()
    gm.recompile()
    return gm, complete


_GRAPH_KINKS = ("relu", "hardtanh", "clamp", "clamp_min", "clamp_max", "leaky_relu",
                "max_pool2d_with_indices")


def _graph_surrogate(node: fx.Node, beta: float) -> nn.Module | None:
    """The surrogate for a piecewise-linear core ATen node (None: none here)."""
    name = getattr(getattr(node.target, "overloadpacket", None), "__name__", "")
    args, kw = node.args, node.kwargs
    if name == "relu":
        return SmoothReLU(beta)
    if name == "hardtanh":
        return SmoothClamp(beta, float(args[1]) if len(args) > 1 else -1.0,
                           float(args[2]) if len(args) > 2 else 1.0)
    if name in ("clamp", "clamp_min", "clamp_max"):
        lo = args[1] if len(args) > 1 else kw.get("min")
        hi = args[2] if len(args) > 2 else kw.get("max")
        if name == "clamp_max":
            lo, hi = None, lo
        if isinstance(lo, fx.Node) or isinstance(hi, fx.Node):
            return None  # tensor bounds
        return SmoothClamp(beta, None if lo is None else float(lo), None if hi is None else float(hi))
    if name == "leaky_relu":
        return SmoothLeakyReLU(beta, float(args[1]) if len(args) > 1 else 0.01)
    if name == "max_pool2d_with_indices":
        if any(u.target is not operator.getitem or u.args[1] != 0 for u in node.users):
            return None  # the indices are used
        kernel = args[1]
        stride = args[2] if len(args) > 2 and args[2] else kernel
        return SmoothMaxPool(beta, 2, kernel, stride, args[3] if len(args) > 3 else 0,
                             args[4] if len(args) > 4 else 1, bool(args[5]) if len(args) > 5 else False)
    return None


def _data_dependent(graph) -> set:
    """The nodes whose value depends on the inputs' values, also through integer indices
    and cuts (an embedding of token ids: Taylor mode holds it constant, the smoothed model
    still computes it from the ids, as the module route's surrogates do)."""
    live = set(graph.inputs)
    for node in graph.nodes:
        if any(a in live for a in node.all_input_nodes):
            live.add(node)
    return live


def smooth_graph(graph, beta: float) -> list[str]:
    """Replace every input-dependent piecewise-linear node of a captured graph
    (:class:`taylorattr.capture.CoreGraph`) that has a surrogate (input-dependent also
    through integer indices: :func:`_data_dependent`); returns their names
    (``module (Type): op``). What remains is listed by Taylor mode's piecewise warning."""
    replaced = []
    g = graph.module.graph
    data = _data_dependent(graph)
    for node in list(graph.nodes):
        if node not in data or not any(
                getattr(getattr(node.target, "overloadpacket", None), "__name__", "") == k
                for k in _GRAPH_KINKS):
            continue
        surrogate = _graph_surrogate(node, beta)
        if surrogate is None:
            continue
        # a module instance as a call_function target: torch.fx names nodes (and writes
        # code) from the target's __name__, which instances lack
        surrogate.__name__ = f"smooth_{op_name(node.target).split('.')[1]}"
        with g.inserting_after(node):
            new = g.call_function(surrogate, (node.args[0],))
        if "max_pool" in str(node.target):
            for user in list(node.users):
                user.replace_all_uses_with(new)
                g.erase_node(user)
        else:
            node.replace_all_uses_with(new)
        new.meta = {k: v for k, v in node.meta.items() if k != "val"}
        g.erase_node(node)
        replaced.append(f"{where(new).split(',')[0]}: {op_name(node.target)} (graph)")
    graph.refresh()
    return replaced


class SmoothedModel(nn.Module):
    """A smoothed copy of a model. ``module``: the copy; ``beta``; ``replaced``: the names of
    the kinks replaced; ``output_gap``: ``max |f_smooth - f|`` on the inputs given to
    :func:`smooth` (``None`` without inputs); :meth:`gap` measures it on other inputs.

    Kinks that no module swap reaches (functional calls torch.fx cannot see, Hardswish
    written out, clamps) are replaced in the model's captured core-ATen graph
    (:func:`smooth_graph`), one capture per input signature (:meth:`taylor_core_graph`);
    calling the smoothed model runs that graph where it differs from ``module`` (calls
    run ``module`` alone when torch.fx saw the whole copy and no kink was left)."""

    def __init__(self, module: nn.Module, original: nn.Module, beta: float, replaced: list[str]):
        super().__init__()
        self.module = module
        self.__dict__["original"] = original  # not a submodule: its parameters stay its own
        self.beta = beta
        self.replaced = replaced
        self.output_gap: float | None = None
        self.__dict__["_graphs"] = []
        self.__dict__["_structure"] = _structure(module)

    def taylor_core_graph(self, *inputs: torch.Tensor):
        """The smoothed core graph for inputs shaped like ``inputs`` (one tensor or several
        positional tensors; captured on first use)."""
        for key, graph in self._graphs:
            if key == _graph_key(inputs, graph):
                return graph
        graph = capture(self.module, tuple(i.detach() for i in inputs))
        names = smooth_graph(graph, self.beta)
        graph.rewritten = bool(names)
        if names:  # kinks only the capture shows: calls run the rewritten graph from now on
            self.__dict__["_graph_route"] = True
        self.replaced += [n for n in names if n not in self.replaced]
        self._graphs.append((_graph_key(inputs, graph), graph))
        return graph

    def set_beta(self, beta: float) -> None:
        """Change the sharpness of every surrogate (modules and captured graphs) in place."""
        self.beta = float(beta)
        for m in self.module.modules():
            if isinstance(m, (SmoothReLU, SmoothMaxPool)):
                m.beta = self.beta
        for _, graph in self._graphs:
            for node in graph.nodes:
                if isinstance(node.target, (SmoothReLU, SmoothMaxPool)):
                    node.target.beta = self.beta

    def forward(self, *args, **kwargs):
        """The smoothed model on the user model's arguments (tensors, tuples of inputs,
        additional arguments): one function from the moment :func:`smooth` returns.

        Positional tensors run the smoothed core graph captured for their signature
        (:meth:`taylor_core_graph`, captured on the first call): the very function Taylor
        mode expands, with every kink the capture shows replaced, including those inside
        composite functions (``F.normalize``'s ``clamp_min``, ``F.hardswish``'s clamps);
        where that capture replaced nothing, the copy runs as a module (the same function).
        Inside another capture (``torch.export`` of a model that calls this one: tuple
        inputs, ``layer=``), with a forward hook on a submodule or a submodule swapped
        (a ``layer=`` call's injected layer output), with keyword arguments or on a model
        ``torch.export`` cannot capture, the copy runs with the kinks rerouted
        to the same surrogates at the call (:class:`_Surrogates`, written as the capture
        decomposes them): a capture cannot nest, and layer hooks must fire once."""
        if torch.compiler.is_exporting():
            return self._module_route(*args, **kwargs)
        tensors = bool(args) and not kwargs and all(isinstance(a, torch.Tensor) for a in args)
        if tensors and self.__dict__.get("_capturable", True) and not _hooked(self.module) \
                and _structure(self.module) == self._structure:
            try:
                graph = self.taylor_core_graph(*args)
            except CaptureError:
                self.__dict__["_capturable"] = False
                self.__dict__["_graph_route"] = True
            else:
                return graph.run(*args) if graph.rewritten else self.module(*args)
        return self._module_route(*args, **kwargs)

    def _module_route(self, *args, **kwargs):
        """The copy run as a module, with the kinks rerouted at the call where any capture
        (or torch.fx) found kinks the module swap did not reach."""
        if self.__dict__.get("_graph_route", True):
            with _Surrogates(self.beta):
                return self.module(*args, **kwargs)
        return self.module(*args, **kwargs)

    @torch.no_grad()
    def gap(self, inputs: torch.Tensor) -> float:
        """``max |f_smooth(inputs) - f(inputs)|`` over every sample and output."""
        V.check_inputs(inputs)
        return float((self(inputs) - self.original(inputs)).abs().max())


def _graph_key(inputs, graph) -> tuple:
    inputs = inputs if isinstance(inputs, tuple) else (inputs,)
    dynamic = graph.batch_dynamic and inputs[0].dim() and inputs[0].shape[0] >= 2
    return tuple((("B",) if dynamic and x.dim() else tuple(x.shape[:1])) + tuple(x.shape[1:])
                 + (x.dtype, x.device.type) for x in inputs)


def _structure(module: nn.Module) -> tuple:
    """The submodules by name and identity: a ``layer=`` call swaps the layer for an
    injector, whose captured graph would hold its value as a constant."""
    return tuple((name, id(m)) for name, m in module.named_modules())


def _hooked(module: nn.Module) -> bool:
    """Whether a forward hook watches a submodule (a ``layer=`` call): the rewritten graph
    would not call it, so the copy runs as a module (:class:`_Surrogates`)."""
    return any(m._forward_hooks or m._forward_pre_hooks for m in module.modules())


class _Surrogates(torch.overrides.TorchFunctionMode):
    """The functional kinks (``clamp``/``clip``/``clamp_min``/``clamp_max``, ``F.relu``,
    ``F.relu6``, ``F.hardtanh``, ``F.hardswish``, ``F.hardsigmoid``, ``F.leaky_relu``,
    ``F.max_pool1d/2d`` and the ``clamp_min`` inside ``F.normalize``, as functions or tensor
    methods) computed by their surrogates while a module runs, as the rewritten graph
    computes them (:func:`_call_surrogate`); a parameter's own clamp (a learned logit scale)
    is left alone, as the graph's rewrite leaves nodes that do not depend on the input.
    The smoothed copy's route where its rewritten graph cannot run (inside another
    capture, with layer hooks)."""

    def __init__(self, beta: float):
        super().__init__()
        self.beta = beta

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if not args or not isinstance(args[0], torch.Tensor) or \
                not args[0].is_floating_point() or isinstance(args[0], nn.Parameter):
            return func(*args, **kwargs)  # a parameter's clamp does not depend on the input
        surrogate = _call_surrogate(func, args, kwargs, self.beta)
        if surrogate is None:
            return func(*args, **kwargs)
        return surrogate(args[0])  # the mode is off inside its own handler


_CLAMPS = {torch.clamp, torch.clip, torch.Tensor.clamp, torch.Tensor.clip, torch.clamp_min,
           torch.Tensor.clamp_min, torch.clamp_max, torch.Tensor.clamp_max}


def _call_surrogate(func, args, kwargs, beta):
    """The surrogate (a callable of ``args[0]``) for a functional kink called as
    ``func(*args, **kwargs)``; the same function as the captured graph's rewrite
    (:func:`smooth_graph`) of the operations the capture decomposes the call into."""
    if func in _CLAMPS:
        lo = args[1] if len(args) > 1 else kwargs.get("min")
        hi = args[2] if len(args) > 2 else kwargs.get("max")
        if func in (torch.clamp_max, torch.Tensor.clamp_max):
            lo, hi = None, lo
        if isinstance(lo, torch.Tensor) or isinstance(hi, torch.Tensor) or (lo is None
                                                                            and hi is None):
            return None  # tensor bounds
        return SmoothClamp(beta, None if lo is None else float(lo),
                           None if hi is None else float(hi))
    if func in (F.relu, torch.relu, torch.Tensor.relu):
        return SmoothReLU(beta)
    if func is F.relu6:
        return SmoothReLU6(beta)
    if func is F.hardtanh:
        lo = args[1] if len(args) > 1 else kwargs.get("min_val", -1.0)
        hi = args[2] if len(args) > 2 else kwargs.get("max_val", 1.0)
        return SmoothClamp(beta, float(lo), float(hi))
    if func in (F.hardswish, F.hardsigmoid):  # as the capture decomposes them:
        low, high = SmoothClamp(beta, 0.0, None), SmoothClamp(beta, None, 6.0)  # two clamps
        if func is F.hardsigmoid:
            return lambda x: high(low(x + 3)) / 6
        return lambda x: x * high(low(x + 3)) / 6
    if func is F.normalize:  # x / clamp(|x|_p, min=eps), as the capture decomposes it
        names = ("p", "dim", "eps")
        given = {"p": 2.0, "dim": 1, "eps": 1e-12} | dict(zip(names, args[1:])) | {
            k: v for k, v in kwargs.items() if k in names}
        if kwargs.get("out") is not None:
            return None
        clamp = SmoothClamp(beta, float(given["eps"]), None)
        return lambda x: x / clamp(torch.linalg.vector_norm(
            x, given["p"], given["dim"], keepdim=True)).expand_as(x)
    if func in (F.max_pool1d, F.max_pool2d, torch.max_pool1d, torch.max_pool2d):
        names = ("kernel_size", "stride", "padding", "dilation", "ceil_mode", "return_indices")
        given = dict(zip(names, args[1:])) | kwargs
        if given.get("return_indices"):
            return None
        dims = 1 if func in (F.max_pool1d, torch.max_pool1d) else 2
        return SmoothMaxPool(beta, dims, given["kernel_size"], given.get("stride"),
                             given.get("padding", 0), given.get("dilation", 1),
                             bool(given.get("ceil_mode", False)))
    if func is F.leaky_relu:
        return SmoothLeakyReLU(beta, float(args[1]) if len(args) > 1
                               else kwargs.get("negative_slope", 0.01))
    return None


#: The sharpness values ``beta="auto"`` tries, smallest first.
AUTO_BETAS = (1.0, 2.0, 5.0, 10.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1000.0)


def _auto_beta(smoothed: SmoothedModel, model, inputs, baselines, tolerance: float) -> None:
    """The smallest beta of :data:`AUTO_BETAS` whose output gap is at most ``tolerance``
    times ``|df| = max_c |f(x) - f(x~)|`` on every sample:

        max_c |f_beta(x_b) - f(x_b)| <= tolerance * max_c |f(x_b) - f(x~_b)|   for all b
    """
    with torch.no_grad():
        f = model(inputs)
        df = (f - model(V.broadcast_baselines(baselines, inputs))).abs().flatten(1).amax(1)
        for beta in AUTO_BETAS:
            smoothed.set_beta(beta)
            gap = (smoothed(inputs) - f).abs().flatten(1).amax(1)
            if bool((gap <= tolerance * df).all()):
                break
        else:
            warnings.warn(f"ta.smooth(beta='auto'): no beta up to {AUTO_BETAS[-1]:g} brings the "
                          f"output gap below {tolerance:g} x |df| (largest gap/|df| "
                          f"{float((gap / df).max()):.3g}); using beta={AUTO_BETAS[-1]:g}",
                          stacklevel=3)
    smoothed.output_gap = float(gap.max())
    smoothed.relative_gap = float((gap / df).max())
    smoothed.tolerance = tolerance


def smooth(model: nn.Module, beta: float | str, inputs: torch.Tensor | None = None, *,
           baselines=0.0, tolerance: float = 0.05) -> SmoothedModel:
    """A copy of ``model`` with every ReLU / ReLU6 / LeakyReLU / PReLU / Hardtanh /
    Hardswish / Hardsigmoid / clamp / max-pool replaced by its smooth surrogate of sharpness
    ``beta`` (module docstring); ``model`` is not changed.

    Args:
        model: an ``nn.Module``.
        beta: sharpness > 0 (the surrogate tends to the kink as ``beta`` grows), or
            ``"auto"``: the smallest of :data:`AUTO_BETAS` whose output gap on ``inputs``
            is at most ``tolerance * |df|`` for every sample, with ``|df|`` the largest
            output change ``|f(x) - f(baselines)|`` of that sample; the result's ``beta``,
            ``output_gap`` and ``relative_gap`` (largest gap / ``|df|``) report the choice.
        inputs: optional ``[B, ...]`` inputs on which ``output_gap`` is measured (required
            for ``beta="auto"``).
        baselines, tolerance: the baselines of ``|df|`` and the tolerance for ``"auto"``.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be an nn.Module, got {type(model).__name__}")
    auto = isinstance(beta, str) and beta == "auto"
    if auto:
        if inputs is None:
            raise ValueError("beta='auto' needs inputs= (the inputs on which the output gap "
                             "is measured)")
        if isinstance(tolerance, bool) or not isinstance(tolerance, Real) or not tolerance > 0:
            raise ValueError(f"tolerance must be a number > 0, got {tolerance!r}")
        beta = AUTO_BETAS[0]
    if isinstance(beta, bool) or not isinstance(beta, Real):
        raise TypeError(f"beta must be a real number > 0 or 'auto', got {type(beta).__name__}")
    if not math.isfinite(beta) or beta <= 0:
        raise ValueError(f"beta must be a finite number > 0, got {beta!r}")
    copy_ = copy.deepcopy(model)
    replaced = []
    for name, m in list(copy_.named_modules()):
        surrogate = _surrogate(m, float(beta))
        if surrogate is None:
            continue
        if not name:  # the model itself is a single kink
            copy_ = surrogate
        else:
            parent, _, leaf = name.rpartition(".")
            setattr(copy_.get_submodule(parent) if parent else copy_, leaf, surrogate)
        replaced.append(f"{name or '(model)'} ({type(m).__name__})")
    smoothed, complete = _smooth_functional(copy_, float(beta))
    if smoothed is not copy_:
        replaced += [f"{n.target} ({type(smoothed.get_submodule(n.target)).__name__}, functional)"
                     for n in smoothed.graph.nodes
                     if n.op == "call_module" and str(n.target).startswith("smooth_")]
    result = SmoothedModel(smoothed, model, float(beta), replaced)
    result.__dict__["_graph_route"] = not complete  # calls run the module where fx saw all
    result.train(model.training)
    if inputs is not None:
        V.check_inputs(inputs)
        if auto:
            _auto_beta(result, model, inputs, baselines, float(tolerance))
        else:
            result.output_gap = result.gap(inputs)
    return result
