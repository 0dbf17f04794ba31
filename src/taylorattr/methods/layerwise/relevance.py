"""LRP rules in relevance form (Zennit's rules) and per-layer composites.

Here the engine's backward quantity *is* the relevance (as in Zennit, whose hooks replace
gradients by relevances): the explained output starts with relevance 1 (the method scales
by ``f(x)`` at the end; every rule is linear in the upstream relevance), and a layer
``z = L(y)`` (weights ``W``, bias ``b``; ``s(v) = v + eps (+1 if v >= 0 else -1)``) sends,
with ``J_{W', b'}`` the Jacobian of the layer with modified parameters:

=================  =====================================================================
rule               relevance at the layer input ``R_y`` from ``R_z``
=================  =====================================================================
epsilon            ``y * J^T [R_z / s(z)]``
z-plus             ``y+ * J_{W+, b+}^T [R_z / s(z+)] + y- * J_{W-, 0}^T [R_z / s(z+)]``,
                   ``z+ = L_{W+, b+}(y+) + L_{W-, 0}(y-)`` (Deep Taylor; = alpha 1, beta 0)
alpha-beta         ``alpha (z-plus part) - beta (the same with W+ and W- swapped)``,
                   ``alpha - beta = 1``
gamma              z-plus with ``W + gamma W+`` (and ``W + gamma W-`` for negative ``z``),
                   each output neuron taking the terms of its sign
flat               ``J_{1, 0}^T [R_z / s(L_{1, 0}(1))]`` (all weights 1, inputs 1)
w-square           ``J_{W^2, b^2}^T [R_z / s(L_{W^2, b^2}(1))]``
=================  =====================================================================

Activations and (eval) BatchNorm pass relevance unchanged (Zennit's ``Pass``); max
pooling, reshapes, slicing, concatenation and padding route relevance by their plain
gradient; every other operation converts epsilon-LRP's gradient-form rule to relevance
form, ``R_y = y G^T [R_z / s(z)]`` (:class:`Converted`): average pooling, means, sums and
residual additions split relevance in proportion (Zennit's ``Norm``), products of two
input-dependent tensors split it uniformly or hold a broadcast gate constant, LayerNorm
holds its standard deviation constant, softmax is gradient times input (AttnLRP). A composite picks each Linear/Conv's rule by type, and
optionally another rule for the first such layer (module order), as Zennit's
``LayerMapComposite`` and ``SpecialFirstLayerMapComposite`` do; ``layer_rules`` sets the
rule of named layers (Captum's per-layer ``module.rule``, its rules being :class:`LayerEpsilon`
with modified weights and :class:`Identity`).

Why one module: the layer rules, the converted rules of the other operations and the
composites that assign them are one rule set (``composite_rules``); the composites name
the rules, and the rules share the weighted-operation view (:class:`OpLayer`).
"""
from __future__ import annotations

import operator
import weakref
from collections.abc import Callable, Mapping

import torch
from torch import nn
from torch.func import functional_call

from .rules import (
    ConstantDivisor,
    ConstantNormaliser,
    Gradient,
    Rule,
    RuleSet,
    UniformProduct,
    _Modified,
    detached_forward,
)

__all__ = [
    "COMPOSITES",
    "RULES",
    "AlphaBeta",
    "Converted",
    "Flat",
    "Gamma",
    "Identity",
    "LayerEpsilon",
    "LayerMap",
    "Norm",
    "OpLayer",
    "Pass",
    "WSquare",
    "ZPlus",
    "composite_rules",
    "stabilize",
]


def stabilize(v: torch.Tensor, eps: float) -> torch.Tensor:
    """``v + eps * (+1 if v >= 0 else -1)`` (Zennit's stabilizer)."""
    return v + eps * torch.where(v >= 0, 1.0, -1.0).to(v.dtype)


#: (weight, bias) argument positions of the weighted ATen operations (else: the other operand)
_SLOTS = {"convolution": (1, 2), "addmm": (2, 0), "baddbmm": (2, 0)}


class OpLayer:
    """A weighted ATen operation (convolution, addmm, mm) seen as a layer: its weight and
    bias arguments, and the operation with them replaced. With ``fold`` (weight, bias,
    running mean, running variance and eps of an eval-mode batch norm right after it), the
    folded layer ``bn(op(y))``, as Zennit's ``SequentialMergeBatchNorm`` canonizer makes it:
    ``W' = W gamma / sigma``, ``b' = (b - mu) gamma / sigma + beta``."""

    def __init__(self, call, fold=None):
        name = str(call.op.overloadpacket).rsplit(".", 1)[-1]
        self.call, self.is_conv = call, name == "convolution"
        w, b = _SLOTS.get(name, (1 - call.positions[0], None))
        self.slots = (w, b)
        self.weight = call.args[w].detach()
        self.bias = None if b is None or call.args[b] is None else call.args[b].detach()
        if fold is not None:  # also a layer without a bias slot (a bias-free Linear: mm)
            gamma, beta, mean, var, eps = fold
            scale = (var + eps).rsqrt() * (1.0 if gamma is None else gamma)
            shape = [1] * self.weight.dim()
            shape[0 if self.is_conv else -1] = -1
            self.weight = self.weight * scale.reshape(shape)
            bias = torch.zeros_like(mean) if self.bias is None else self.bias
            self.bias = (bias - mean) * scale + (0.0 if beta is None else beta)

    def __call__(self, inp, params=None):
        if params is None:
            params = {"weight": self.weight, "bias": self.bias}
        args = list(self.call.args)
        args[self.call.positions[0]] = inp
        w, b = self.slots
        args[w] = params["weight"]
        bias = params.get("bias")
        if b is not None and bias is not None:
            args[b] = bias
        out = self.call.op(*args, **self.call.kwargs)
        return out + bias if b is None and bias is not None else out  # the folded bias of mm


def _run(layer, inp, params):
    if isinstance(layer, OpLayer):
        return layer(inp, params)
    return functional_call(layer, params, (inp,))


def _vjp(layer, inp, params, grad_out):
    """``J^T grad_out`` of ``layer`` with ``params`` at ``inp``."""
    with torch.enable_grad():
        i = inp.detach().requires_grad_(True)
        (g,) = torch.autograd.grad(_run(layer, i, params), i, grad_out)
    return g


def _params(layer, weight_fn, bias_fn=None) -> dict:
    """``weight_fn(W)`` and ``bias_fn(b)`` (None: zero bias) as a parameter dict."""
    out = {"weight": weight_fn(layer.weight.detach())}
    if getattr(layer, "bias", None) is not None:
        b = layer.bias.detach()
        out["bias"] = torch.zeros_like(b) if bias_fn is None else bias_fn(b)
    return out


def _pos(t):
    return t.clamp(min=0)


def _neg(t):
    return t.clamp(max=0)


class LayerRule(Rule):
    """A rule on a Linear/Conv module: forward unchanged, ``relevance`` backward."""

    def __init__(self, stabilizer: float = 1e-6):
        self.stabilizer = float(stabilizer)

    def apply(self, fn, y, ref, scale):
        yd, out = detached_forward(fn, y)
        return _Modified.apply(y, out, lambda r: self.relevance(fn, yd, r)), None

    def relevance(self, layer, y, r):  # pragma: no cover
        raise NotImplementedError


def _same(t):
    return t


class LayerEpsilon(LayerRule):
    """The epsilon rule ``R_y = y J_{W', b'}^T [R_z / s(z')]``, ``z' = L_{W', b'}(y)``, with
    the layer's own parameters (``W' = W``, ``b' = b``) or modified ones: ``weight`` and
    ``bias`` map ``W`` and ``b`` (Captum's rules are this form: its gamma rule is
    ``W' = W + gamma W+``, its alpha-1-beta-0 rule ``W' = W+``, with ``b`` kept or zeroed).
    """

    label = "epsilon: y J^T [R / s(z)]"

    def __init__(self, stabilizer: float = 1e-6, *, weight=None, bias=None, label=None):
        super().__init__(stabilizer)
        self.weight, self.bias = weight or _same, bias or _same
        if label is not None:
            self.label = label

    def relevance(self, layer, y, r):
        p = _params(layer, self.weight, self.bias)
        return y * _vjp(layer, y, p, r / stabilize(_run(layer, y, p), self.stabilizer))


class Identity(LayerRule):
    """Relevance passes the layer unchanged, ``R_y = R_z`` (Captum's ``IdentityRule``); the
    layer must keep its input's shape."""

    label = "identity: R_y = R_z"

    def __init__(self):
        super().__init__(0.0)

    def relevance(self, layer, y, r):
        if r.shape != y.shape:
            raise ValueError(f"the identity rule needs a layer that keeps its input's shape; "
                             f"this one maps {tuple(y.shape[1:])} to {tuple(r.shape[1:])} "
                             "(choose another rule for it)")
        return r


def _signed(layer, y, r, w_pos, w_neg, b_pos, stab):
    """``y+ J_{w_pos, b_pos}^T q + y- J_{w_neg, 0}^T q``, ``q = r / s(L_{w_pos,b_pos}(y+) +
    L_{w_neg,0}(y-))``: the relevance of the terms z-plus-like rules keep."""
    yp, yn = _pos(y), _neg(y)
    p1, p2 = _params(layer, w_pos, b_pos), _params(layer, w_neg)
    z = _run(layer, yp, p1) + _run(layer, yn, p2)
    q = r / stabilize(z, stab)
    return yp * _vjp(layer, yp, p1, q) + yn * _vjp(layer, yn, p2, q), z


class ZPlus(LayerRule):
    label = "z-plus (Deep Taylor): positive contributions only"

    def relevance(self, layer, y, r):
        return _signed(layer, y, r, _pos, _neg, _pos, self.stabilizer)[0]


class AlphaBeta(LayerRule):
    label = "alpha-beta: alpha (positive) - beta (negative contributions)"

    def __init__(self, alpha: float = 2.0, beta: float = 1.0, stabilizer: float = 1e-6):
        super().__init__(stabilizer)
        if alpha < 0 or beta < 0 or alpha - beta != 1:
            raise ValueError(f"alpha and beta must be >= 0 with alpha - beta = 1, got "
                             f"alpha={alpha}, beta={beta}")
        self.alpha, self.beta = float(alpha), float(beta)
        self.label = f"alpha-beta (alpha={alpha:g}, beta={beta:g})"

    def relevance(self, layer, y, r):
        plus = _signed(layer, y, r, _pos, _neg, _pos, self.stabilizer)[0]
        minus = _signed(layer, y, r, _neg, _pos, _neg, self.stabilizer)[0]
        return self.alpha * plus - self.beta * minus


class Gamma(LayerRule):
    label = "gamma: positive weights boosted by gamma"

    def __init__(self, gamma: float = 0.25, stabilizer: float = 1e-6):
        super().__init__(stabilizer)
        if not gamma >= 0:
            raise ValueError(f"gamma must be >= 0, got {gamma}")
        self.gamma = float(gamma)

    def relevance(self, layer, y, r):
        g = self.gamma
        with torch.no_grad():
            z = _run(layer, y, _params(layer, lambda w: w, lambda b: b))

        def up(t):
            return t + g * _pos(t)

        def down(t):
            return t + g * _neg(t)
        # outputs > 0: (y+, W + g W+, b + g b+) and (y-, W + g W-, 0); outputs < 0: swapped
        plus = _signed(layer, y, r * (z > 0), up, down, up, self.stabilizer)[0]
        minus = _signed(layer, y, r * (z < 0), down, up, down, self.stabilizer)[0]
        return plus + minus


class Flat(LayerRule):
    label = "flat: relevance spread uniformly over the receptive field"

    def relevance(self, layer, y, r):
        ones, p = torch.ones_like(y), _params(layer, torch.ones_like)
        return _vjp(layer, ones, p, r / stabilize(_run(layer, ones, p), self.stabilizer))


class WSquare(LayerRule):
    label = "w-square: relevance in proportion to w^2"

    def relevance(self, layer, y, r):
        ones, p = torch.ones_like(y), _params(layer, torch.square, torch.square)
        return _vjp(layer, ones, p, r / stabilize(_run(layer, ones, p), self.stabilizer))


_ROUTES = frozenset(getattr(torch.ops.aten, n) for n in (
    "view", "_unsafe_view", "reshape", "permute", "transpose", "t", "expand", "clone",
    "contiguous", "alias", "squeeze", "unsqueeze", "slice", "select", "cat", "stack", "split",
    "split_with_sizes", "unbind", "narrow", "flip", "roll", "index_select", "index", "gather",
    "constant_pad_nd", "_to_copy", "lift_fresh_copy", "pixel_shuffle", "pixel_unshuffle",
    "upsample_nearest1d", "upsample_nearest2d", "upsample_nearest3d", "_unsafe_index",
    "repeat") if hasattr(torch.ops.aten, n))


class Converted(Rule):
    """Relevance form of a gradient-form rule ``G`` (:mod:`.rules`) on an operation with
    input-dependent arguments ``y`` and output ``z``: ``R_y = y * G^T [R_z / s(z)]``.

    With ``G`` the exact gradient this is the epsilon rule without parameters (Zennit's
    ``Norm``): a sum ``a + b`` splits relevance in proportion, ``R_a = a / s(a + b) R``,
    a mean or average pooling likewise, a constant added absorbs its share. With
    epsilon-LRP's product, divisor and normaliser rules it is the conservative
    transformer rules of AttnLRP/CP-LRP in relevance form. Operations that only move
    values (reshapes, slicing, concatenation, padding with zeros, nearest upsampling)
    route relevance by their gradient instead (no stabiliser)."""

    converts = True

    def __init__(self, inner: Rule, stabilizer: float = 1e-6):
        self.inner, self.stabilizer = inner, float(stabilizer)
        self.inputs, self.label = inner.inputs, f"y G^T [R / s(z)], G: {inner.label}"

    def routes(self, op) -> bool:
        return op is operator.getitem or getattr(op, "overloadpacket", None) in _ROUTES

    def stabilize(self, z: torch.Tensor) -> torch.Tensor:
        return stabilize(z, self.stabilizer)

    def refuses(self, op) -> str | None:
        return self.inner.refuses(op)


def Norm(stabilizer: float = 1e-6) -> Converted:
    """Zennit's ``Norm`` rule (average pooling, means, sums): the epsilon rule of a
    parameter-free linear map, ``R_y = y J^T [R / s(z)]``."""
    return Converted(Gradient(), stabilizer)


class Pass(Rule):
    """Relevance passes unchanged (Zennit's ``Pass``): activations, BatchNorm."""

    label = "pass: R_y = R_z"

    def apply(self, fn, y, ref, scale):
        with torch.no_grad():
            out = fn(y.detach())
        return _Modified.apply(y, out, lambda r: r), None


class LayerMap(Rule):
    """A rule per Linear/Conv module (by identity), for composites, applied to the
    weighted operation itself (:class:`OpLayer`); an operation of no such module takes the
    convolution or dense rule by its op."""

    def __init__(self, rules: Mapping[int, LayerRule], label: str, conv: LayerRule,
                 dense: LayerRule):
        self.rules, self.label, self.conv, self.dense = dict(rules), label, conv, dense

    def apply(self, fn, y, ref, scale):
        layer = OpLayer(fn, fn.fold)
        rule = self.rules.get(id(fn.module)) or (self.conv if layer.is_conv else self.dense)
        yd, out = detached_forward(fn, y)  # the operation's own value (before any fold)
        return _Modified.apply(y, out, lambda r: rule.relevance(layer, yd, r)), None


#: Single rules by name (constructor keyword arguments in parentheses).
RULES: Mapping[str, Callable[..., LayerRule]] = {
    "epsilon": lambda epsilon=1e-6, **_: LayerEpsilon(epsilon),
    "z_plus": lambda stabilizer=1e-6, **_: ZPlus(stabilizer),
    "alpha1_beta0": lambda stabilizer=1e-6, **_: AlphaBeta(1, 0, stabilizer),
    "alpha2_beta1": lambda stabilizer=1e-6, **_: AlphaBeta(2, 1, stabilizer),
    "gamma": lambda gamma=0.25, stabilizer=1e-6, **_: Gamma(gamma, stabilizer),
    "flat": lambda stabilizer=1e-6, **_: Flat(stabilizer),
    "w_square": lambda stabilizer=1e-6, **_: WSquare(stabilizer),
}
#: Composites as Zennit names them: (first layer, convolutions, dense layers).
COMPOSITES: Mapping[str, tuple] = {
    "epsilon_plus": (None, "z_plus", "epsilon"),
    "epsilon_plus_flat": ("flat", "z_plus", "epsilon"),
    "epsilon_alpha2_beta1": (None, "alpha2_beta1", "epsilon"),
    "epsilon_alpha2_beta1_flat": ("flat", "alpha2_beta1", "epsilon"),
}
_CONV = (nn.Conv1d, nn.Conv2d, nn.Conv3d)
_WEIGHTED = _CONV + (nn.Linear,)


_MADE: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def composite_rules(model: nn.Module, rule: str, *, epsilon: float = 1e-6,
                    stabilizer: float = 1e-6, gamma: float = 0.25,
                    layer_rules: Mapping | None = None) -> RuleSet:
    """The rule set of ``rule`` (a name in :data:`RULES`, every Linear/Conv, or in
    :data:`COMPOSITES`) for the Linear/Conv modules of ``model``; ``layer_rules`` sets the
    rule of named Linear/Conv modules (names as ``model.named_modules()`` gives them; each a
    name in :data:`RULES` or a :class:`LayerRule`), over the composite's choice.

    Made once per model, arguments and Linear/Conv modules (held with the model), so that
    every method object of the same settings finds the same plans and generated passes."""
    given = layer_rules or {}
    if not isinstance(given, Mapping) or not all(isinstance(k, str) for k in given):
        return _composite_rules(model, rule, epsilon, stabilizer, gamma, given)
    key = (rule, float(epsilon), float(stabilizer), float(gamma),
           tuple(sorted((k, v if isinstance(v, str) else ("rule", id(v)))
                        for k, v in given.items())),
           tuple((name, id(m)) for name, m in model.named_modules() if isinstance(m, _WEIGHTED)))
    try:
        made = _MADE.setdefault(model, {})
    except TypeError:  # not weakly referenceable: made every time
        return _composite_rules(model, rule, epsilon, stabilizer, gamma, given)
    if key not in made:  # the LayerRule objects are kept with it: their ids stay theirs
        made[key] = (_composite_rules(model, rule, epsilon, stabilizer, gamma, given),
                     tuple(given.values()))
    return made[key][0]


def _composite_rules(model, rule, epsilon, stabilizer, gamma, layer_rules) -> RuleSet:
    kw = {"epsilon": epsilon, "stabilizer": stabilizer, "gamma": gamma}
    if rule in RULES:
        first, conv, dense = None, rule, rule
    elif rule in COMPOSITES:
        first, conv, dense = COMPOSITES[rule]
    else:
        raise ValueError(f"rule must be one of {sorted(RULES) + sorted(COMPOSITES)}, got {rule!r}")
    per_module, first_done = {}, first is None
    for m in model.modules():
        if not isinstance(m, _WEIGHTED):
            continue
        name = first if not first_done else (conv if isinstance(m, _CONV) else dense)
        first_done = True
        per_module[id(m)] = RULES[name](**kw)
    per_module.update(_named_rules(model, layer_rules, kw))
    rules = {"weighted": LayerMap(per_module, rule, RULES[conv](**kw), RULES[dense](**kw)), "norm": Pass(), "activation": Pass(),
             "avg_pool": Norm(stabilizer), "max_pool": Gradient(),
             "linear": Converted(Gradient(), stabilizer),
             "product": Converted(UniformProduct(), stabilizer),
             "binary": Converted(ConstantDivisor(), stabilizer),
             "softmax": Converted(Gradient(), stabilizer),
             "layer_norm": Converted(ConstantNormaliser(), stabilizer)}
    return RuleSet("lrp_rules", "LRP", rules)


def _named_rules(model: nn.Module, layer_rules: Mapping, kw: dict) -> dict:
    """``layer_rules`` (module name -> rule name or :class:`LayerRule`) by module identity."""
    if not isinstance(layer_rules, Mapping):
        raise TypeError("layer_rules must be a dict mapping module names to rules, got "
                        f"{type(layer_rules).__name__}")
    modules = dict(model.named_modules())
    out = {}
    for name, r in layer_rules.items():
        if name not in modules:
            raise ValueError(f"layer_rules names {name!r}, which is not a module of the model "
                             "(names as model.named_modules() gives them)")
        if not isinstance(modules[name], _WEIGHTED):
            raise ValueError(  # noqa: TRY004 - a wrong module name, not a wrong type
                f"layer_rules[{name!r}]: rules are set on Linear/Conv layers, "
                             f"got {type(modules[name]).__name__} (relevance passes "
                             "activations and batch norm unchanged and splits sums and "
                             "average pools in proportion)")
        if isinstance(r, str) and r in RULES:
            out[id(modules[name])] = RULES[r](**kw)
        elif isinstance(r, LayerRule):
            out[id(modules[name])] = r
        else:
            raise ValueError(f"layer_rules[{name!r}] must be one of {sorted(RULES)} or a "
                             f"LayerRule, got {r!r}")
    return out
