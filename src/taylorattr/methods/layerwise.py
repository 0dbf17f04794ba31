"""The layer-wise propagation engine behind DeepLIFT (Rescale) and epsilon-LRP.

Both methods are *modified gradients* (Ancona et al. 2018): run the network forward,
then backpropagate with the local derivative of every elementwise nonlinearity
``x_j^(l+1) = sigma(y_j)`` replaced by a per-neuron multiplier, and every linear map
left exact. A rule is the small configuration that says which multiplier:

=============  ===============================================  ======================
rule           multiplier of a nonlinearity ``sigma`` at ``y``   linear layers ``z``
=============  ===============================================  ======================
``deeplift``   ``(sigma(y) - sigma(y~)) / (y - y~)``             exact gradient
               (``sigma'(y)`` where ``|y - y~| < 1e-10``)
``epsilon``    ``sigma(y) / (y + eps * s(y))``                   ``z / (z + eps * s(z))``
=============  ===============================================  ======================

with ``s(v) = +1 if v >= 0 else -1`` and ``y~`` the value of ``y`` on the baseline run.
DeepLIFT's attribution is ``(x - x~) * g`` and epsilon-LRP's is ``x * g`` where ``g`` is
the modified gradient at the input. This is exactly Captum's DeepLift (Rescale) and
LRP with ``EpsilonRule`` everywhere (its relevance ``R = t * g`` at every tensor ``t``):
the epsilon rule of a Linear/Conv/average-pool layer with output ``z`` divides the
relevance by ``z + eps s(z)``, and relevance passes an activation unchanged; when the
layer's only users are activations both steps fuse into the activation's multiplier,
otherwise the layer itself gets the factor ``z / (z + eps s(z))``.

Supported, found by tracing ``model.forward`` with ``torch.fx`` (once per model):

* weighted layers: ``nn.Linear``, ``nn.Conv1d``, ``nn.Conv2d``, ``nn.Conv3d``;
* average pooling: ``nn.AvgPool1d/2d/3d``, ``nn.AdaptiveAvgPool1d/2d/3d``;
* elementwise nonlinearities, as modules: ``nn.Sigmoid``, ``nn.Tanh``, ``nn.Softplus``,
  ``nn.ReLU``, ``nn.LeakyReLU``, ``nn.ELU``, ``nn.GELU``, ``nn.SiLU``, ``nn.Softsign`` and
  **any module with the class attribute ``elementwise = True``** (it promises to act on
  each entry independently, e.g. a polynomial activation); as functions or tensor
  methods: ``torch.sigmoid``, ``torch.tanh``, ``torch.relu`` and their ``F.*`` forms,
  ``F.softplus``, ``F.leaky_relu``, ``F.elu``, ``F.gelu``, ``F.silu``, ``F.softsign``;
* structure, which is linear and propagates by the exact gradient: ``nn.Flatten``,
  ``nn.Unflatten``, ``nn.Identity``, dropout in eval mode, ``view``/``reshape``/
  ``flatten``/``permute``/``transpose``/``(un)squeeze``/indexing, ``torch.cat``/``stack``,
  sums and differences of tensors (simple branches, residual additions), sums and means,
  and multiplication or division by a constant (a number or a tensor that does not
  depend on the input).

Anything else that depends on the input (``nn.MaxPool2d``, ``nn.BatchNorm2d``,
``torch.exp``, ``x * x``, a data-dependent ``if``) raises :class:`UnsupportedModelError`
naming every offending operation and where it is. The engine never falls back to the
plain gradient (Captum does, silently, for nonlinearities it cannot see).

Per-layer records. ``records=True`` also returns one :class:`LayerRecord` per weighted
layer (Linear/Conv) holding its input and baseline input ``x^(l), x~^(l)``, its output
``y, y~`` (the pre-activation), the elementwise activation applied next (the layer's
only user; ``None`` means identity) and its output ``x^(l+1), x~^(l+1)``, the rule's
per-neuron multiplier and the upstream modified gradient. For epsilon-LRP the baseline
of every layer is zero (``x~^(l) = 0``, so ``y~ = b``), as in the paper's supplement.
:func:`edge_terms`, :func:`local_relevance` and :func:`global_relevance` turn a record
into per-edge matrices.
"""
from __future__ import annotations

import operator
import weakref
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import fx, nn

from .._validation import model_output, resolve_target, select_output

__all__ = [
    "DEEPLIFT_RESCALE",
    "RESCALE_THRESHOLD",
    "LayerRecord",
    "Propagation",
    "Rule",
    "UnsupportedModelError",
    "denominator",
    "edge_terms",
    "epsilon_rule",
    "global_relevance",
    "local_relevance",
    "propagate",
]

#: ``|y - y~|`` below which DeepLIFT's Rescale multiplier falls back to ``sigma'(y)``
#: (Captum's ``eps=1e-10``).
RESCALE_THRESHOLD = 1e-10


class UnsupportedModelError(TypeError):
    """The model holds an operation the layer-wise rules cannot propagate through."""


# ---------------------------------------------------------------------------------------
# What the engine understands
# ---------------------------------------------------------------------------------------
ELEMENTWISE_MODULES = (nn.Sigmoid, nn.Tanh, nn.Softplus, nn.ReLU, nn.LeakyReLU, nn.ELU,
                       nn.GELU, nn.SiLU, nn.Softsign)
WEIGHTED_MODULES = (nn.Linear, nn.Conv1d, nn.Conv2d, nn.Conv3d)
POOL_MODULES = (nn.AvgPool1d, nn.AvgPool2d, nn.AvgPool3d, nn.AdaptiveAvgPool1d,
                nn.AdaptiveAvgPool2d, nn.AdaptiveAvgPool3d)
DROPOUT_MODULES = (nn.Dropout, nn.Dropout1d, nn.Dropout2d, nn.Dropout3d, nn.AlphaDropout)
PASS_MODULES = (nn.Flatten, nn.Unflatten, nn.Identity) + DROPOUT_MODULES

ELEMENTWISE_FUNCTIONS = {torch.sigmoid, torch.tanh, torch.relu, F.relu, F.sigmoid, F.tanh,
                         F.softplus, F.leaky_relu, F.elu, F.gelu, F.silu, F.softsign}
ELEMENTWISE_METHODS = {"sigmoid", "tanh", "relu"}
LINEAR_FUNCTIONS = {torch.flatten, torch.reshape, torch.cat, torch.concat, torch.stack,
                    torch.add, torch.sub, torch.neg, torch.transpose, torch.permute,
                    torch.squeeze, torch.unsqueeze, torch.sum, torch.mean, operator.add,
                    operator.sub, operator.neg, operator.pos, operator.getitem,
                    F.avg_pool1d, F.avg_pool2d, F.avg_pool3d, F.adaptive_avg_pool1d,
                    F.adaptive_avg_pool2d, F.adaptive_avg_pool3d}
LINEAR_METHODS = {"view", "reshape", "flatten", "contiguous", "permute", "transpose",
                  "squeeze", "unsqueeze", "add", "sub", "neg", "sum", "mean", "expand",
                  "clone", "view_as", "reshape_as", "expand_as"}
SCALING_FUNCTIONS = {operator.mul, operator.truediv, torch.mul, torch.div}
SCALING_METHODS = {"mul", "div"}
STATIC_METHODS = {"size", "dim"}  # results describe the shape, not the values


def _is_elementwise_module(m: nn.Module) -> bool:
    return isinstance(m, ELEMENTWISE_MODULES) or getattr(m, "elementwise", False) is True


class _Tracer(fx.Tracer):
    """Keeps modules declaring ``elementwise = True`` whole (leaves) while tracing."""

    def __init__(self):
        super().__init__()
        self.record_stack_traces = True

    def _filter_traceback_frames(self, summary):
        """Keep the innermost frame outside torch: the user's line that made the node."""
        import os
        import traceback

        torch_dir = os.path.dirname(torch.__file__)
        user = [f for f in summary if not f.filename.startswith(torch_dir)]
        return traceback.StackSummary.from_list(user[-1:])

    def is_leaf_module(self, m: nn.Module, qualname: str) -> bool:
        if getattr(m, "elementwise", False) is True:
            return True
        return super().is_leaf_module(m, qualname)


def _signature(model: nn.Module):
    """Changes when submodules are replaced or ``forward`` is swapped (re-trace then)."""
    fwd = getattr(model.forward, "__func__", model.forward)
    return (fwd,) + tuple((name, id(m)) for name, m in model.named_modules())


def _describe(node: fx.Node, model: nn.Module) -> str:
    if node.op == "call_module":
        m = model.get_submodule(node.target)
        what = f"{type(m).__name__} module '{node.target}'"
    elif node.op == "call_function":
        mod = getattr(node.target, "__module__", None) or ""
        name = getattr(node.target, "__name__", repr(node.target))
        what = f"function {mod + '.' if mod else ''}{name}"
    else:
        what = f"tensor method .{node.target}()"
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


def _node_args(node: fx.Node) -> list:
    out = []
    fx.node.map_arg((node.args, node.kwargs), out.append)
    return out


@dataclass
class _Plan:
    graph: fx.Graph
    signature: tuple
    kinds: dict            # node name -> "act" | "weighted" | "pool" | "dropout"
    act_of: dict           # weighted node name -> its activation node name (sole user)
    unfused: set           # linear node names that carry the epsilon factor themselves
    weighted_order: list   # weighted node names in execution order
    targets: dict          # node name -> module path (call_module nodes)


def build_plan(model: nn.Module, method: str) -> _Plan:
    """Trace ``model`` and classify every operation that depends on the input."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be an nn.Module for {method}, got {type(model).__name__}")
    try:
        graph = _Tracer().trace(model)
    except Exception as exc:  # fx raises many kinds of errors for untraceable code
        raise UnsupportedModelError(
            f"{method} needs a model whose forward torch.fx can trace (straight-line code "
            f"over submodules, no data-dependent control flow); tracing "
            f"{type(model).__name__} failed: {type(exc).__name__}: {exc}") from exc

    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    if len(placeholders) != 1:
        raise UnsupportedModelError(
            f"{method} needs a model whose forward takes exactly one tensor, "
            f"{type(model).__name__}.forward takes {len(placeholders)} arguments")

    live: set[str] = set()      # nodes whose value depends on the input
    kinds: dict[str, str] = {}
    bad: list[str] = []
    for node in graph.nodes:
        if node.op == "placeholder":
            live.add(node.name)
            continue
        if node.op in ("get_attr", "output"):
            continue
        arg_nodes = [a for a in _node_args(node) if isinstance(a, fx.Node)]
        live_args = [a for a in arg_nodes if a.name in live]
        if not live_args:
            continue  # a constant of the model (e.g. a function of the parameters)
        if node.op == "call_method" and node.target in STATIC_METHODS:
            continue
        if node.op == "call_function" and node.target is getattr:
            if node.args[1] in ("shape", "ndim", "dtype", "device"):
                continue
            bad.append(_describe(node, model))
            continue
        live.add(node.name)
        first_live = bool(node.args) and isinstance(node.args[0], fx.Node) \
            and node.args[0].name in live and len(live_args) == 1
        ok = True
        if node.op == "call_module":
            m = model.get_submodule(node.target)
            if _is_elementwise_module(m):
                kinds[node.name] = "act"
                ok = first_live
            elif isinstance(m, WEIGHTED_MODULES):
                kinds[node.name] = "weighted"
            elif isinstance(m, POOL_MODULES):
                kinds[node.name] = "pool"
            elif isinstance(m, DROPOUT_MODULES):
                kinds[node.name] = "dropout"
            elif isinstance(m, PASS_MODULES):
                pass
            else:
                ok = False
        elif node.op == "call_function":
            if node.target in ELEMENTWISE_FUNCTIONS:
                kinds[node.name] = "act"
                ok = first_live
            elif node.target in SCALING_FUNCTIONS:
                ok = len(live_args) == 1 and not (
                    node.target in (operator.truediv, torch.div) and node.args[0] not in live_args)
            else:
                ok = node.target in LINEAR_FUNCTIONS
        elif node.op == "call_method":
            if node.target in ELEMENTWISE_METHODS:
                kinds[node.name] = "act"
                ok = first_live
            elif node.target in SCALING_METHODS:
                ok = len(live_args) == 1 and node.args[0] in live_args
            else:
                ok = node.target in LINEAR_METHODS
        if not ok:
            kinds.pop(node.name, None)
            bad.append(_describe(node, model))
    if bad:
        listing = "\n  - ".join(bad)
        raise UnsupportedModelError(
            f"{method} cannot propagate through {len(bad)} operation(s) of "
            f"{type(model).__name__}:\n  - {listing}\n"
            "Supported: Linear/Conv1d/Conv2d/Conv3d, average pooling, flatten/reshape, "
            "additions, elementwise activations (Sigmoid, Tanh, Softplus, ReLU, LeakyReLU, "
            "ELU, GELU, SiLU, Softsign, or a module with `elementwise = True`), dropout in "
            "eval mode. See taylorattr.methods.layerwise.")

    act_of, unfused, weighted_order, targets = {}, set(), [], {}
    for node in graph.nodes:
        kind = kinds.get(node.name)
        if node.op == "call_module":
            targets[node.name] = node.target
        if kind not in ("weighted", "pool"):
            continue
        users = list(node.users)
        if kind == "weighted":
            weighted_order.append(node.name)
            if len(users) == 1 and kinds.get(users[0].name) == "act" \
                    and users[0].args[0] is node:
                act_of[node.name] = users[0].name
        if not users or not all(kinds.get(u.name) == "act" and u.args[0] is node
                                for u in users):
            unfused.add(node.name)
    return _Plan(graph, _signature(model), kinds, act_of, unfused, weighted_order, targets)


# ---------------------------------------------------------------------------------------
# Rules
# ---------------------------------------------------------------------------------------
class _Scale(torch.autograd.Function):
    """Identity in the forward pass (returns ``value``); ``grad * factor`` backward."""

    @staticmethod
    def forward(ctx, inp, value, factor):
        ctx.save_for_backward(factor)
        return value.view_as(value)

    @staticmethod
    def backward(ctx, grad):
        (factor,) = ctx.saved_tensors
        return grad * factor, None, None


def _stable_sign(v: torch.Tensor) -> torch.Tensor:
    """``+1`` where ``v >= 0``, ``-1`` elsewhere (Captum's epsilon-rule sign)."""
    return torch.where(v >= 0, 1.0, -1.0).to(v.dtype)


def _derivative(act: Callable, y: torch.Tensor) -> torch.Tensor:
    with torch.enable_grad():
        yy = y.detach().requires_grad_(True)
        (g,) = torch.autograd.grad(act(yy).sum(), yy)
    return g


@dataclass(frozen=True)
class Rule:
    """A propagation rule: the multiplier replacing a nonlinearity's local derivative.

    ``needs_reference``: whether a baseline forward pass supplies ``y~, sigma(y~)``.
    ``epsilon``: the epsilon-rule stabiliser, or None for no factor on linear layers.
    """

    name: str
    needs_reference: bool
    epsilon: float | None = None

    def activation_multiplier(self, act, y, out, y_ref, out_ref) -> torch.Tensor:
        if self.needs_reference:  # DeepLIFT Rescale
            dy = y - y_ref
            m = (out - out_ref).div_(dy)
            small = dy.abs_() < RESCALE_THRESHOLD
            if bool(small.any()):
                m = torch.where(small, _derivative(act, y), m)
            return m
        return out / (y + self.epsilon * _stable_sign(y))

    def linear_factor(self, z: torch.Tensor) -> torch.Tensor | None:
        if self.epsilon is None:
            return None
        return z / (z + self.epsilon * _stable_sign(z))


DEEPLIFT_RESCALE = Rule("deeplift", needs_reference=True)


def epsilon_rule(epsilon: float) -> Rule:
    return Rule("epsilon_lrp", needs_reference=False, epsilon=float(epsilon))


# ---------------------------------------------------------------------------------------
# Records
# ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class LayerRecord:
    """One weighted layer ``l`` (Linear/Conv) and the elementwise activation after it.

    ``y = layer(x^(l)) = sum_i z_ji + b_j`` with ``z_ji = w_ji x_i``;
    ``x^(l+1) = activation(y)``. Shapes: ``inputs``/``ref_inputs`` ``[B, *in]``, the
    others ``[B, *out]``. All tensors are detached.

    Attributes:
        name: the layer's module path in the model (e.g. ``"features.0"``).
        layer: the ``nn.Linear``/``nn.Conv*d`` module.
        activation: the elementwise activation applied to ``y`` (a callable), or None
            when the output is not followed by one (identity; the output layer).
        activation_name: its module path or function name (None for identity).
        inputs, ref_inputs: ``x^(l)`` and ``x~^(l)`` (zeros for epsilon-LRP).
        pre, ref_pre: ``y`` and ``y~ = layer(x~^(l))`` (``= b`` broadcast for LRP).
        post, ref_post: ``x^(l+1) = activation(y)`` and ``activation(y~)``.
        multiplier: the rule's per-neuron multiplier ``m_j`` (DeepLIFT:
            ``(post - ref_post) / (pre - ref_pre)``, or ``sigma'(y)`` where
            ``|pre - ref_pre| < 1e-10``; LRP: ``post / (pre + eps s(pre))``).
        upstream: modified gradient of the explained output w.r.t. ``post``
            (DeepLIFT's multiplier of ``x^(l+1)``; LRP's ``R_j / x_j^(l+1)``).
        rule: ``"deeplift"`` or ``"epsilon_lrp"``; epsilon: LRP's epsilon (else None).
    """

    name: str
    layer: nn.Module
    activation: Callable | None
    activation_name: str | None
    inputs: torch.Tensor
    ref_inputs: torch.Tensor
    pre: torch.Tensor
    ref_pre: torch.Tensor
    post: torch.Tensor
    ref_post: torch.Tensor
    multiplier: torch.Tensor
    upstream: torch.Tensor
    rule: str
    epsilon: float | None = None


def _neurons(record: LayerRecord, t: torch.Tensor) -> torch.Tensor:
    """``[B, out]`` for Linear, ``[B, C_out, L]`` (flattened positions) for conv layers."""
    if isinstance(record.layer, nn.Linear):
        return t
    return t.reshape(t.shape[0], t.shape[1], -1)


def edge_terms(record: LayerRecord) -> torch.Tensor:
    """Per-edge contributions: DeepLIFT ``z_ji - z~_ji``, epsilon-LRP ``z_ji = w_ji x_i``.

    Linear layers (2-D inputs): ``[B, out, in]``, entry ``[b, j, i]``. Conv1d/Conv2d:
    only the edges that exist, ``[B, C_out, L, K]`` where ``L`` runs over the output
    positions (row-major, as ``pre.flatten(2)``) and ``K = C_in/groups * prod(kernel)``
    over the receptive field (as ``F.unfold``; zero padding gives zero edges). The sum
    over the last axis is ``y - y~`` (DeepLIFT) or ``y - b`` (LRP). Conv3d has no edge
    form (TypeError).
    """
    layer = record.layer
    d = record.inputs - record.ref_inputs if record.rule == "deeplift" else record.inputs
    w = layer.weight.detach().to(d.dtype)
    if isinstance(layer, nn.Linear):
        if d.dim() != 2:
            raise ValueError(f"edge_terms needs 2-D inputs to Linear layer '{record.name}', "
                             f"got shape {tuple(d.shape)}")
        return w.unsqueeze(0) * d.unsqueeze(1)
    if not isinstance(layer, (nn.Conv1d, nn.Conv2d)):
        raise TypeError(f"edge_terms supports Linear, Conv1d and Conv2d layers, not "
                         f"{type(layer).__name__} '{record.name}'")
    if layer.padding_mode != "zeros" or isinstance(layer.padding, str) and layer.padding != "valid":
        raise ValueError(f"edge_terms supports zero padding given as integers, layer "
                         f"'{record.name}' has padding={layer.padding!r}, "
                         f"padding_mode={layer.padding_mode!r}")
    pad = (0,) * len(layer.kernel_size) if layer.padding == "valid" else layer.padding
    kernel, stride, dil = layer.kernel_size, layer.stride, layer.dilation
    if isinstance(layer, nn.Conv1d):
        d = d.unsqueeze(2)
        kernel, stride, dil, pad = (1,) + kernel, (1,) + stride, (1,) + dil, (0,) + tuple(pad)
    cols = F.unfold(d, kernel, dilation=dil, padding=pad, stride=stride)  # [B, C_in*k, L]
    b, g, c_out = d.shape[0], layer.groups, w.shape[0]
    cols = cols.view(b, g, -1, cols.shape[-1])
    if g > 1:
        cols = cols.repeat_interleave(c_out // g, dim=1)
    else:
        cols = cols.expand(b, c_out, cols.shape[2], cols.shape[3])
    e = w.reshape(1, c_out, -1, 1) * cols  # [B, C_out, K, L]
    return e.transpose(2, 3)


def denominator(record: LayerRecord) -> torch.Tensor:
    """The rule's per-neuron denominator: DeepLIFT ``y - y~``; LRP ``y + eps s(y)``.

    Shaped like the neuron axes of :func:`edge_terms` (``[B, out]`` / ``[B, C_out, L]``).
    The per-edge ratio of the paper is ``edge_terms / denominator[..., None]``.
    """
    if record.rule == "deeplift":
        return _neurons(record, record.pre - record.ref_pre)
    return _neurons(record, record.pre + record.epsilon * _stable_sign(record.pre))


def local_relevance(record: LayerRecord) -> torch.Tensor:
    """The local relevance ``a_ij^(l)`` of input ``i`` to neuron ``j`` (paper, Thm 4).

    DeepLIFT: ``(z_ji - z~_ji) / (y_j - y~_j) * (x_j^(l+1) - x~_j^(l+1))`` (computed as
    ``(z_ji - z~_ji) * m_j``, so where ``|y_j - y~_j| < 1e-10`` it is
    ``sigma'(y_j) (z_ji - z~_ji)``, as the engine propagates it); it sums over ``i`` to
    ``x_j^(l+1) - x~_j^(l+1)`` exactly (completeness per neuron).
    epsilon-LRP (supplement): ``z_ji / (y_j + eps s(y_j)) * (x_j^(l+1) - sigma(b_j))``;
    it sums to ``(y_j - b_j)/(y_j + eps s) * (x_j^(l+1) - sigma(b_j))``, which is the
    output change only for bias-free layers.
    Shape as :func:`edge_terms`.
    """
    e = edge_terms(record)
    if record.rule == "deeplift":
        factor = _neurons(record, record.multiplier)
    else:
        factor = _neurons(record, record.post - record.ref_post) / denominator(record)
    return e * factor.unsqueeze(-1)


def global_relevance(record: LayerRecord) -> torch.Tensor:
    """The relevance the full method sends along each edge: ``e_ji * m_j * upstream_j``.

    Summed over ``j`` (and, for conv layers, scattered back over positions) it is the
    method's attribution to the layer's input ``x^(l)``; for the first layer its total
    is the total attribution. Shape as :func:`edge_terms`.
    """
    e = edge_terms(record)
    factor = _neurons(record, record.multiplier * record.upstream)
    return e * factor.unsqueeze(-1)


# ---------------------------------------------------------------------------------------
# Execution
# ---------------------------------------------------------------------------------------
class _Runner(fx.Interpreter):
    """Runs the traced graph on the live model, applying the rule at marked nodes.

    ``reference=None``: the baseline pass (plain forward, remembers every activation's
    input and output). Otherwise the main pass: activations get the rule's multiplier
    (DeepLIFT reads ``y~, sigma(y~)`` from ``reference``).
    """

    def __init__(self, model, plan: _Plan, rule: Rule, reference: dict | None, record: bool):
        super().__init__(model, garbage_collect_values=True, graph=plan.graph)
        self.plan, self.rule, self.reference, self.record = plan, rule, reference, record
        self.acts: dict = {}      # act node -> (y, out) [reference pass] / (post, m) [main]
        self.layers: dict = {}    # weighted node -> (input, output, output after factor)
        self.act_fns: dict = {}   # act node -> (callable, label)

    def _activation(self, node: fx.Node, args, kwargs):
        rest = args[1:]
        if node.op == "call_module":
            m = self.fetch_attr(node.target)
            inplace = getattr(m, "inplace", False) is True
            fn, label = m, node.target
        elif node.op == "call_function":
            inplace = kwargs.get("inplace") is True or any(r is True for r in rest)
            f = node.target
            fn = (lambda y: f(y, *rest, **kwargs)) if (rest or kwargs) else f
            label = getattr(node.target, "__name__", str(node.target))
        else:
            inplace = False
            meth = getattr(torch.Tensor, node.target)
            fn = lambda y: meth(y, *rest, **kwargs)
            label = f"Tensor.{node.target}"
        if inplace:
            inner = fn
            fn = lambda y: inner(y.clone())
        return fn, label

    def run_node(self, n: fx.Node):
        kind = self.plan.kinds.get(n.name)
        if kind is None:
            return super().run_node(n)
        with self._set_current_node(n):
            args, kwargs = self.fetch_args_kwargs_from_env(n)
            if kind == "dropout":
                m = self.fetch_attr(n.target)
                if m.training:
                    raise ValueError(f"model: dropout module '{n.target}' is in training mode; "
                                     "call model.eval() before attributing")
                return args[0]
            if kind == "act":
                return self._run_activation(n, args, kwargs)
            out = getattr(self, n.op)(n.target, args, kwargs)
            wrapped = out
            if self.reference is not None and n.name in self.plan.unfused:
                factor = self.rule.linear_factor(out.detach())
                if factor is not None:
                    wrapped = _Scale.apply(out, out.detach(), factor)
            if kind == "weighted" and self.record:
                self.layers[n.name] = (args[0], out, wrapped)
            return wrapped

    def _run_activation(self, n, args, kwargs):
        y = args[0]
        fn, label = self._activation(n, args, kwargs)
        if self.record:
            self.act_fns[n.name] = (fn, label)
        if self.reference is None:  # baseline pass
            out = fn(y)
            self.acts[n.name] = (y, out)
            return out
        yd = y.detach()
        with torch.no_grad():
            out = fn(yd)
        y_ref, out_ref = self.reference.get(n.name, (None, None))
        m = self.rule.activation_multiplier(fn, yd, out, y_ref, out_ref)
        post = _Scale.apply(y, out, m)
        self.acts[n.name] = (post, m)
        return post


@dataclass
class Propagation:
    """What :func:`propagate` returns."""

    gradient: torch.Tensor           # modified gradient at the input, [B, ...]
    output: torch.Tensor             # explained output f(x), [B]
    ref_output: torch.Tensor | None  # f(x~) (DeepLIFT), [B]
    target: torch.Tensor | None
    records: list | None


def propagate(model: nn.Module, plan: _Plan, rule: Rule, x: torch.Tensor,
              x_ref: torch.Tensor | None, target, records: bool = False) -> Propagation:
    """One modified backward pass (plus a baseline forward pass for DeepLIFT)."""
    reference = None
    ref_out = None
    ref_runner = None
    if rule.needs_reference:
        ref_runner = _Runner(model, plan, rule, None, records)
        with torch.no_grad():
            ref_out = model_output(ref_runner.run, x_ref, name="model (at the baselines)")
        reference = ref_runner.acts
    runner = _Runner(model, plan, rule, reference if reference is not None else {}, records)
    xg = x.detach().requires_grad_(True)
    with torch.enable_grad():
        out = model_output(runner.run, xg)
        t = resolve_target(target, out)
        f = select_output(out, t)
        ref_f = None if ref_out is None else select_output(ref_out, t)
        posts = []
        if records:
            for name in plan.weighted_order:
                act = plan.act_of.get(name)
                posts.append(runner.acts[act][0] if act else runner.layers[name][2])
        grads = torch.autograd.grad(f.sum(), [xg] + posts, allow_unused=True)
    recs = None
    if records:
        recs = []
        for name, post, up in zip(plan.weighted_order, posts, grads[1:]):
            layer = model.get_submodule(plan.targets[name])
            inp, pre, _ = runner.layers[name]
            act = plan.act_of.get(name)
            fn, label = runner.act_fns[act] if act else (None, None)
            if rule.needs_reference:
                ref_inp, ref_pre, _ = ref_runner.layers[name]
                ref_post = ref_runner.acts[act][1] if act else ref_pre
            else:
                with torch.no_grad():
                    ref_inp = torch.zeros_like(inp)
                    ref_pre = layer(ref_inp)
                    ref_post = fn(ref_pre) if act else ref_pre
            m = None
            if act:
                m = runner.acts[act][1]
            elif name in plan.unfused:  # the factor the engine applied to this output
                m = rule.linear_factor(pre.detach())
            if m is None:
                m = torch.ones_like(pre)
            recs.append(LayerRecord(
                name=plan.targets[name], layer=layer, activation=fn, activation_name=label,
                inputs=inp.detach(), ref_inputs=ref_inp.detach(), pre=pre.detach(),
                ref_pre=ref_pre.detach(), post=post.detach(), ref_post=ref_post.detach(),
                multiplier=m.detach(),
                upstream=torch.zeros_like(post) if up is None else up.detach(),
                rule=rule.name, epsilon=rule.epsilon))
    grad = torch.zeros_like(x) if grads[0] is None else grads[0]
    return Propagation(grad, f.detach(), None if ref_f is None else ref_f.detach(), t, recs)


_PLANS: weakref.WeakKeyDictionary[nn.Module, dict] = weakref.WeakKeyDictionary()


def get_plan(model: nn.Module, method: str) -> _Plan:
    """The traced plan of ``model``, cached per model and re-traced when its submodules
    or its ``forward`` change (tracing costs milliseconds; a pass on a batch about as much).
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be an nn.Module for {method}, got {type(model).__name__}")
    plans = _PLANS.setdefault(model, {})
    plan = plans.get(method)
    if plan is None or plan.signature != _signature(model):
        plan = plans[method] = build_plan(model, method)
    return plan


class LayerwiseMethod:
    """Mixin for DeepLift and EpsilonLRP: the traced plan of ``self.model``."""

    def _get_plan(self) -> _Plan:
        return get_plan(self.model, type(self).__name__)
