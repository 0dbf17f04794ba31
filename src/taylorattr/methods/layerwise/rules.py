"""The layer-wise rules: which operations the engine understands, and how each passes
the modified gradient backward under DeepLIFT (Rescale) and epsilon-LRP.

Both methods are *modified gradients* (Ancona et al. 2018). At every tensor ``t`` of the
network the engine carries ``g_t``, the modified gradient of the explained output; the
attribution is ``(x - x~) * g_x`` (DeepLIFT) or ``x * g_x`` (epsilon-LRP, whose relevance
at every tensor is ``R_t = t * g_t``, as in Captum). Each operation *family* below
(:data:`FAMILIES`) is matched by module class, function or tensor method; each rule set
(:data:`DEEPLIFT_RESCALE`, :func:`epsilon_rule`) maps every family it supports to one
small rule class (in the spirit of zennit's ``rules.py``):

==================  =========================================================================
rule                backward pass of ``z = op(y)`` (``s(v) = +1 if v >= 0 else -1``)
==================  =========================================================================
:class:`Gradient`   ``g_y = J_op(y)^T g_z`` (exact; linear and affine operations)
:class:`Rescale`    ``g_y = g_z * (op(y) - op(y~)) / (y - y~)``, ``op'(y)`` where
                    ``|y - y~| < 1e-10`` (DeepLIFT, elementwise nonlinearities)
:class:`MaxRescale` Captum's DeepLIFT max-pool rule, ``M = max(z, z~)``:
                    ``g_y = (J_op(y)^T[g_z (M - z~)] + J_op(y~)^T[g_z (z - M)]) / (y - y~)``
:class:`Epsilon`    ``g_y = J_op(y)^T [g_z * z / (z + eps s(z))]``, i.e.
                    ``R_i = sum_j z_ji / (z_j + eps s(z_j)) R_j`` (LRP layers)
:class:`WinnerTakeAll` :class:`Epsilon` on max pooling: all of ``R_j`` goes to the arg-max
:class:`PassRelevance` ``g_y = g_z * op(y) / (y + eps s(y))``, i.e. ``R_y = R_z`` (LRP
                    activations; this is also the epsilon step of the layer before)
==================  =========================================================================

When a layer's only users are activations, its :class:`Epsilon` factor is carried by
the activations' :class:`PassRelevance` multiplier (one division per neuron, as in
Captum); otherwise the layer's output gets the factor itself.
:func:`~taylorattr.methods.layerwise.table.supported_operations` generates the support
table from these objects; the error of an unsupported model quotes the same table, so the
two cannot disagree.
"""
from __future__ import annotations

import operator
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

__all__ = [
    "DEEPLIFT_RESCALE",
    "FAMILIES",
    "RESCALE_THRESHOLD",
    "Epsilon",
    "Family",
    "Gradient",
    "MaxRescale",
    "PassRelevance",
    "Rescale",
    "Rule",
    "RuleSet",
    "WinnerTakeAll",
    "epsilon_rule",
]

#: ``|y - y~|`` below which DeepLIFT's multipliers fall back to the plain derivative
#: (Captum's ``eps=1e-10``).
RESCALE_THRESHOLD = 1e-10


# ---------------------------------------------------------------------------------------
# Autograd helpers
# ---------------------------------------------------------------------------------------
class _Modified(torch.autograd.Function):
    """Returns ``value`` forward; backward sends ``backward(grad)`` to ``inp``."""

    @staticmethod
    def forward(ctx, inp, value, backward):
        ctx.backward = backward
        return value.view_as(value)

    @staticmethod
    def backward(ctx, grad):
        return ctx.backward(grad), None, None


def scaled(inp: torch.Tensor, value: torch.Tensor, factor: torch.Tensor) -> torch.Tensor:
    """``value`` forward, ``grad * factor`` backward to ``inp``."""
    return _Modified.apply(inp, value, lambda g: g * factor)


def stable_sign(v: torch.Tensor) -> torch.Tensor:
    """``+1`` where ``v >= 0``, ``-1`` elsewhere (Captum's epsilon-rule sign)."""
    return torch.where(v >= 0, 1.0, -1.0).to(v.dtype)


def detached_forward(fn: Callable, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(y detached, fn(y) without a graph)``: the values a rule's modified backward uses."""
    yd = y.detach()
    with torch.no_grad():
        return yd, fn(yd)


def _derivative(fn: Callable, y: torch.Tensor) -> torch.Tensor:
    with torch.enable_grad():
        yy = y.detach().requires_grad_(True)
        (g,) = torch.autograd.grad(fn(yy).sum(), yy)
    return g


# ---------------------------------------------------------------------------------------
# Rules: ``apply(fn, y, ref, scale)`` runs ``z = fn(y)`` with the rule's backward pass.
# ``ref`` is ``(y~, z~)`` from the baseline pass (rules with ``needs_reference``);
# ``scale`` says whether an epsilon factor belongs on this output (the plan decides).
# They return ``(z, multiplier or None)``; the multiplier goes into the layer records.
# ---------------------------------------------------------------------------------------
class Rule:
    """How one family of operations passes the modified gradient backward."""

    label = ""
    needs_reference = False

    def apply(self, fn, y, ref, scale):
        raise NotImplementedError


class Gradient(Rule):
    """The exact gradient. For a linear or affine ``op``, DeepLIFT's
    ``(op(y) - op(y~)) / (y - y~)`` *is* its Jacobian, so nothing changes."""

    label = "exact gradient"

    def apply(self, fn, y, ref, scale):
        return fn(y), None


class Rescale(Rule):
    """DeepLIFT's Rescale multiplier ``(op(y) - op(y~)) / (y - y~)`` per neuron."""

    label = "Rescale: (op(y) - op(y~)) / (y - y~)"
    needs_reference = True

    def apply(self, fn, y, ref, scale):
        yd, out = detached_forward(fn, y)
        y_ref, out_ref = ref
        dy = yd - y_ref
        m = (out - out_ref) / dy
        small = dy.abs() < RESCALE_THRESHOLD
        if bool(small.any()):
            m = torch.where(small, _derivative(fn, yd), m)
        return scaled(y, out, m), m


class MaxRescale(Rule):
    """Captum's DeepLIFT rule for max pooling (``deep_lift.maxpool``): with
    ``M = max(z, z~)`` the input side receives ``g (M - z~)`` routed to the arg-max of
    ``y`` plus ``g (z - M)`` routed to the arg-max of ``y~``, divided by ``y - y~``
    (the plain gradient where ``|y - y~| < 1e-10``). Summed over the inputs this is
    ``g (z - z~)``: complete, also where the arg-maxes of ``y`` and ``y~`` differ."""

    label = "Captum's max-pool Rescale (arg-max of y and of y~)"
    needs_reference = True

    def apply(self, fn, y, ref, scale):
        yd, out = detached_forward(fn, y)
        y_ref, out_ref = ref

        def backward(g):
            top = torch.maximum(out, out_ref)
            with torch.enable_grad():
                a = yd.clone().requires_grad_(True)
                r = y_ref.clone().requires_grad_(True)
                za, zr = fn(a), fn(r)
                (plain,) = torch.autograd.grad(za, a, g, retain_graph=True)
                (u,) = torch.autograd.grad(za, a, g * (top - out_ref))
                (v,) = torch.autograd.grad(zr, r, g * (out - top))
            dy = yd - y_ref
            return torch.where(dy.abs() < RESCALE_THRESHOLD, plain, (u + v) / dy)

        return _Modified.apply(y, out, backward), None


class Epsilon(Rule):
    """The epsilon rule on a layer with output ``z``: ``R_i = sum_j z_ji / (z_j + eps
    s(z_j)) R_j``; in gradient form the factor ``z / (z + eps s(z))`` on ``z``."""

    label = "epsilon: z / (z + eps s(z)) on the output"

    def __init__(self, epsilon: float):
        self.epsilon = float(epsilon)

    def factor(self, z: torch.Tensor) -> torch.Tensor:
        return z / (z + self.epsilon * stable_sign(z))

    def apply(self, fn, y, ref, scale):
        z = fn(y)
        if not scale:
            return z, None
        zd = z.detach()
        f = self.factor(zd)
        return scaled(z, zd, f), f


class WinnerTakeAll(Epsilon):
    """:class:`Epsilon` on max pooling: the max's gradient routes all of ``R_j`` to the
    arg-max input (Captum's ``EpsilonRule`` on ``MaxPool*d``)."""

    label = "winner-take-all (epsilon rule, relevance to the arg-max)"


class PassRelevance(Rule):
    """Relevance passes an elementwise activation unchanged, ``R_y = R_z``: in gradient
    form ``g_y = g_z * op(y) / (y + eps s(y))``, the epsilon step of the layer before."""

    label = "relevance passes: op(y) / (y + eps s(y))"

    def __init__(self, epsilon: float):
        self.epsilon = float(epsilon)

    def apply(self, fn, y, ref, scale):
        yd, out = detached_forward(fn, y)
        m = out / (yd + self.epsilon * stable_sign(yd))
        return scaled(y, out, m), m


# ---------------------------------------------------------------------------------------
# Families of operations
# ---------------------------------------------------------------------------------------
def _first_live_only(node, live_args) -> bool:
    return len(live_args) == 1 and bool(node.args) and node.args[0] is live_args[0]


def _no_indices(node, model, live_args):
    if node.op == "call_module":
        wants = getattr(model.get_submodule(node.target), "return_indices", False)
    else:
        wants = node.kwargs.get("return_indices") is True or any(a is True for a in node.args[1:])
    return "returns indices (return_indices=True); use it without indices" if wants else None


def _running_stats(node, model, live_args):
    m = model.get_submodule(node.target)
    if m.track_running_stats and m.running_mean is not None:
        return None
    return ("normalises with the statistics of its own batch (track_running_stats=False), "
            "so it is not a fixed affine map; no layer-wise rule applies")


def _scaling(node, model, live_args):
    if len(live_args) != 1:
        return "multiplies or divides two input-dependent tensors (a gate); no layer-wise rule"
    if node.target in (operator.truediv, torch.div, "div") and node.args[0] is not live_args[0]:
        return "divides by an input-dependent tensor; no layer-wise rule"
    return None


@dataclass(frozen=True)
class Family:
    """Operations that share a rule: module classes, functions, tensor method names.

    ``single_input``: the live input must be the first and only input-dependent argument.
    ``check(node, model, live_args)`` returns a reason to refuse, or None.
    ``eval_only``: modules of this family must be in eval mode when attributing.
    """

    key: str
    title: str
    modules: tuple = ()
    functions: tuple = ()
    methods: tuple = ()
    single_input: bool = True
    check: Callable | None = None
    eval_only: bool = False
    note: str = ""
    declared: bool = field(default=False)  # also matches modules with ``elementwise = True``

    def matches(self, node, model) -> bool:
        if node.op == "call_module":
            m = model.get_submodule(node.target)
            return isinstance(m, self.modules) or (
                self.declared and getattr(m, "elementwise", False) is True)
        if node.op == "call_function":
            return any(node.target is f for f in self.functions)
        return node.op == "call_method" and node.target in self.methods

    def problem(self, node, model, live_args) -> str | None:
        if self.single_input and not _first_live_only(node, live_args):
            return "its input-dependent argument must be the first and only one"
        return self.check(node, model, live_args) if self.check else None


_DROPOUT = (nn.Dropout, nn.Dropout1d, nn.Dropout2d, nn.Dropout3d, nn.AlphaDropout)

FAMILIES: tuple[Family, ...] = (
    Family("weighted", "weighted layers", (nn.Linear, nn.Conv1d, nn.Conv2d, nn.Conv3d)),
    Family("norm", "batch normalisation (eval mode)",
           (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d), check=_running_stats,
           eval_only=True,
           note="an affine map per channel; epsilon-LRP folds it into a directly "
                "preceding Linear/Conv"),
    Family("avg_pool", "average pooling",
           (nn.AvgPool1d, nn.AvgPool2d, nn.AvgPool3d, nn.AdaptiveAvgPool1d,
            nn.AdaptiveAvgPool2d, nn.AdaptiveAvgPool3d),
           (F.avg_pool1d, F.avg_pool2d, F.avg_pool3d, F.adaptive_avg_pool1d,
            F.adaptive_avg_pool2d, F.adaptive_avg_pool3d)),
    Family("max_pool", "max pooling",
           (nn.MaxPool1d, nn.MaxPool2d, nn.MaxPool3d, nn.AdaptiveMaxPool1d,
            nn.AdaptiveMaxPool2d, nn.AdaptiveMaxPool3d),
           (F.max_pool1d, F.max_pool2d, F.max_pool3d, F.adaptive_max_pool1d,
            F.adaptive_max_pool2d, F.adaptive_max_pool3d), check=_no_indices),
    Family("activation", "elementwise activations",
           (nn.Sigmoid, nn.Tanh, nn.Softplus, nn.ReLU, nn.LeakyReLU, nn.ELU, nn.GELU,
            nn.SiLU, nn.Softsign),
           (torch.sigmoid, torch.tanh, torch.relu, F.relu, F.sigmoid, F.tanh, F.softplus,
            F.leaky_relu, F.elu, F.gelu, F.silu, F.softsign),
           ("sigmoid", "tanh", "relu"), declared=True,
           note="and any module with the class attribute `elementwise = True`"),
    Family("structure", "linear structure (branches, residual sums, concatenation)",
           (nn.Flatten, nn.Unflatten, nn.Identity),
           (torch.flatten, torch.reshape, torch.cat, torch.concat, torch.stack, torch.add,
            torch.sub, torch.neg, torch.transpose, torch.permute, torch.squeeze,
            torch.unsqueeze, torch.sum, torch.mean, operator.add, operator.sub,
            operator.neg, operator.pos, operator.getitem),
           ("view", "reshape", "flatten", "contiguous", "permute", "transpose", "squeeze",
            "unsqueeze", "add", "sub", "neg", "sum", "mean", "expand", "clone", "view_as",
            "reshape_as", "expand_as"), single_input=False,
           note="sums split relevance in proportion to the summands (no double counting)"),
    Family("scaling", "scaling by a constant",
           functions=(operator.mul, operator.truediv, torch.mul, torch.div),
           methods=("mul", "div"), single_input=False, check=_scaling,
           note="a number or a tensor that does not depend on the input"),
    Family("dropout", "dropout (eval mode: identity)", _DROPOUT, eval_only=True),
)
_BY_KEY = {f.key: f for f in FAMILIES}


# ---------------------------------------------------------------------------------------
# Rule sets and the support table
# ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class RuleSet:
    """A method's rule per family: the families it lists are exactly what it supports."""

    name: str                      # "deeplift" | "epsilon_lrp" (records' ``rule``)
    method: str                    # the class name used in messages
    rules: Mapping[str, Rule]
    epsilon: float | None = None
    #: families beyond :data:`FAMILIES` (e.g. relevance-form LRP's ``routing``), matched after
    extra_families: tuple = ()

    @property
    def needs_reference(self) -> bool:
        return any(r.needs_reference for r in self.rules.values())

    @property
    def families(self) -> tuple[Family, ...]:
        return tuple(f for f in FAMILIES + tuple(self.extra_families) if f.key in self.rules)

    def family(self, key: str) -> Family:
        return _BY_KEY.get(key) or next(f for f in self.extra_families if f.key == key)

    def linear_factor(self, z: torch.Tensor) -> torch.Tensor | None:
        """The epsilon factor ``z / (z + eps s(z))`` of a layer output, None for DeepLIFT."""
        rule = self.rules["weighted"]
        return rule.factor(z) if isinstance(rule, Epsilon) else None


def _linear_rules(rule: Rule) -> dict:
    return {"structure": Gradient(), "scaling": Gradient(), "dropout": Gradient(),
            "weighted": rule, "norm": rule, "avg_pool": rule}


DEEPLIFT_RESCALE = RuleSet("deeplift", "DeepLift", {
    **_linear_rules(Gradient()), "max_pool": MaxRescale(), "activation": Rescale()})


def epsilon_rule(epsilon: float) -> RuleSet:
    """epsilon-LRP with the same ``epsilon`` everywhere."""
    return RuleSet("epsilon_lrp", "EpsilonLRP", {
        **_linear_rules(Epsilon(epsilon)), "max_pool": WinnerTakeAll(epsilon),
        "activation": PassRelevance(epsilon)}, epsilon=float(epsilon))
