"""The layer-wise rules: how each kind of operation (:mod:`.ops`) passes the modified
gradient backward under DeepLIFT (Rescale) and epsilon-LRP.

Both methods are *modified gradients* (Ancona et al. 2018). At every tensor ``t`` the
engine carries ``g_t``, the modified gradient of the explained output; the attribution is
``(x - x~) * g_x`` (DeepLIFT) or ``x * g_x`` (epsilon-LRP, whose relevance at every
tensor is ``R_t = t * g_t``, as in Captum). One rule per kind of operation
(``s(v) = +1 if v >= 0 else -1``; ``a~``: the value at the baseline):

=================  ======================================================================
rule               backward pass of ``z = op(y)`` / ``z = op(a, b)``
=================  ======================================================================
Gradient           ``g_y = J_op(y)^T g_z`` (exact; linear operations, both methods)
Rescale            ``g_y = g_z (op(y) - op(y~)) / (y - y~)`` (``op'(y)`` where
                   ``|y - y~| < 1e-10``); DeepLIFT, elementwise nonlinearities
MaxRescale         Captum's DeepLIFT max rule, ``M = max(z, z~)``: ``g_y = (J_op(y)^T
                   [g_z (M - z~)] + J_op(y~)^T [g_z (z - M)]) / (y - y~)``
ShapleyProduct     ``dz = B(da, (b + b~)/2) + B((a + a~)/2, db)`` for a bilinear ``B``
                   (``a * b``, matmul): the exact two-player Shapley split of the change
                   (DeepSHAP's rule for two-input operations; Lundberg & Lee 2017)
ShapleyBinary      the same split for any elementwise ``f(a, b)``: ``a`` gets
                   ``[f(a, b~) - f(a~, b~) + f(a, b) - f(a~, b)] / 2``
ComposedDeepLift   softmax as ``exp(y - logsumexp(y))``: Rescale on ``exp``, the
                   log-sum-exp with its gradient at the mean-value point of the segment
                   (``softmax(y~ + t dy)`` with ``t`` where it explains ``dL`` exactly);
                   layer/group norm in the rules above (``rsqrt``/``x^2``: Rescale;
                   ``c * r``: ShapleyProduct): complete exactly, no quadrature
Epsilon            ``g_y = J_op(y)^T [g_z z / (z + eps s(z))]`` (LRP layers)
WinnerTakeAll      Epsilon on max selection: all of ``R_j`` to the arg-max
PassRelevance      ``g_y = g_z op(y) / (y + eps s(y))``: ``R_y = R_z`` (LRP activations;
                   AttnLRP's identity rule)
UniformProduct     ``a * b`` / matmul: half the gradient to each factor, ``R_a = R_b =
                   R_z / 2`` (AttnLRP's uniform rule, eq. 7); a broadcast factor (a gate
                   or normaliser with fewer entries than the product) is held constant
                   and the other factor takes all (CP-LRP, Ali et al. 2022)
ConstantDivisor    ``a / b``: ``b`` held constant (a normaliser), ``R_a = R_z``
ConstantNormaliser LayerNorm/GroupNorm with the standard deviation held constant
                   (Ali et al. 2022, lxt's ``layer_norm_forward``)
=================  ======================================================================

Softmax under epsilon-LRP is its exact gradient: AttnLRP's softmax rule ``R_x = x (R -
s sum R)`` is gradient times input. When a layer's only users are activations, its
Epsilon factor is carried by the activations' PassRelevance multiplier (as in Captum).

Why one module: the table above is the concept, one rule per kind and method; the
composed softmax/LayerNorm rules are built from the Rescale and Shapley rules beside
them, and the two rule sets at the end read the table row by row.
"""
from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch

from .graph import op_name
from .ops import KINDS

__all__ = [
    "DEEPLIFT_RESCALE",
    "FAMILIES",
    "RESCALE_THRESHOLD",
    "ComposedDeepLift",
    "ConstantDivisor",
    "ConstantNormaliser",
    "Epsilon",
    "Family",
    "Gradient",
    "MaxRescale",
    "PassRelevance",
    "Rescale",
    "Rule",
    "RuleSet",
    "ShapleyBinary",
    "ShapleyProduct",
    "UniformProduct",
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


class _Modified2(torch.autograd.Function):
    """Returns ``value`` forward; backward sends ``backward(grad)`` (a pair) to ``a, b``."""

    @staticmethod
    def forward(ctx, a, b, value, backward):
        ctx.backward = backward
        return value.view_as(value)

    @staticmethod
    def backward(ctx, grad):
        ga, gb = ctx.backward(grad)
        return ga, gb, None, None


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


def _vjp(fn: Callable, args: list, which: int, grad: torch.Tensor) -> torch.Tensor:
    """``J^T grad`` of ``fn(*args)`` with respect to ``args[which]``."""
    with torch.enable_grad():
        vals = [a.detach() for a in args]
        vals[which] = vals[which].clone().requires_grad_(True)
        (g,) = torch.autograd.grad(fn(*vals), vals[which], grad)
    return g


def _reduce_to(t: torch.Tensor, shape) -> torch.Tensor:
    """Sum ``t`` over the dimensions that broadcasting added or expanded to reach it."""
    extra = t.dim() - len(shape)
    if extra > 0:
        t = t.sum(tuple(range(extra)))
    dims = tuple(i for i, s in enumerate(shape) if s == 1 and t.shape[i] != 1)
    return t.sum(dims, keepdim=True) if dims else t


# ---------------------------------------------------------------------------------------
# Rules. Single-input rules: ``apply(fn, y, ref, scale)`` runs ``z = fn(y)`` with the
# rule's backward; ``ref = (y~, z~)`` from the baseline pass (rules with
# ``needs_reference``); ``scale``: whether an epsilon factor belongs on this output.
# Two-input rules (``inputs = 2``): ``apply(fn, (a, b), ((a~, b~), z~), scale)``.
# They return ``(z, multiplier or None)``; the multiplier goes into the layer records.
# ---------------------------------------------------------------------------------------
class Rule:
    """How one kind of operation passes the modified gradient backward."""

    label = ""
    needs_reference = False
    inputs = 1

    def apply(self, fn, y, ref, scale):
        raise NotImplementedError

    def refuses(self, op) -> str | None:
        """A reason this rule cannot handle ``op`` (an ATen overload), or None."""
        return None


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
    """Captum's DeepLIFT rule for max pooling (``deep_lift.maxpool``), for every max/min
    selection: with ``M = max(z, z~)`` the input side receives ``g (M - z~)`` routed to
    the arg-max of ``y`` plus ``g (z - M)`` routed to the arg-max of ``y~``, divided by
    ``y - y~`` (the plain gradient where ``|y - y~| < 1e-10``). Summed over the inputs
    this is ``g (z - z~)``: complete, also where the arg-maxes of ``y`` and ``y~`` differ."""

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


class ShapleyProduct(Rule):
    """DeepLIFT for a bilinear ``z = B(a, b)`` (``a * b``, matmul) of two input-dependent
    tensors: the two-player Shapley split ``dz = B(da, (b + b~)/2) + B((a + a~)/2, db)``,
    exact, so completeness is kept. In gradient form each factor's multiplier is the
    Jacobian of ``B`` with the other factor at its midpoint."""

    label = "two-player Shapley: B(da, (b + b~)/2) + B((a + a~)/2, db)"
    needs_reference = True
    inputs = 2

    def apply(self, fn, ys, ref, scale):
        a, b = ys
        (ar, br), _ = ref
        ad, bd = a.detach(), b.detach()
        with torch.no_grad():
            out = fn(ad, bd)
        am, bm = (ad + ar) / 2, (bd + br) / 2

        def backward(g):
            return _vjp(fn, [ad, bm], 0, g), _vjp(fn, [am, bd], 1, g)

        return _Modified2.apply(a, b, out, backward), None


def _partial(fn, a, b, which, out_shape):
    """Elementwise partial derivative of the pointwise ``fn(a, b)``, shaped like its output."""
    with torch.enable_grad():
        args = [a.detach().expand(out_shape).clone(), b.detach().expand(out_shape).clone()]
        args[which].requires_grad_(True)
        (g,) = torch.autograd.grad(fn(*args).sum(), args[which])
    return g


class ShapleyBinary(Rule):
    """DeepLIFT for an elementwise ``z = f(a, b)`` of two input-dependent tensors (``a /
    b``, ``maximum``, ``pow``): the two-player Shapley split,
    ``a`` gets ``c_a = [f(a, b~) - f(a~, b~) + f(a, b) - f(a~, b)] / 2`` and ``b`` the rest
    (``c_a + c_b = z - z~``), so the multiplier of ``a`` is ``c_a / (a - a~)`` (the mean
    of the partial derivatives at ``b`` and ``b~`` where ``|a - a~| < 1e-10``).

    The split averages the two orders in which the players join, ``a`` first
    (``c_a = f(a, b~) - f(a~, b~)``, ``c_b = f(a, b) - f(a, b~)``) and ``b`` first
    (``c_b = f(a~, b) - f(a~, b~)``, ``c_a = f(a, b) - f(a~, b)``). Where the average is
    ill-conditioned, ``|c_a| + |c_b| > |z - z~| / sqrt(eps)`` (the two shares cancel to
    fewer than half the digits; e.g. ``F.normalize``'s ``q / max(||q||, 1e-12)`` at a
    baseline with ``q~ = 0``, where ``f(a, b~) = a / 1e-12``), the element takes the order
    whose shares are the smaller instead: still complete (``c_a + c_b = z - z~`` in
    either order), without the cancellation (the multipliers of ``q`` stay ``1 / ||q||``
    rather than ``1e12``)."""

    label = "two-player Shapley: [f(a, b~) - f(a~, b~) + f(a, b) - f(a~, b)] / 2"
    needs_reference = True
    inputs = 2

    def apply(self, fn, ys, ref, scale):
        a, b = ys
        (ar, br), out_ref = ref
        ad, bd = a.detach(), b.detach()
        with torch.no_grad():
            out = fn(ad, bd)
            f_ab_, f_a_b = fn(ad, br), fn(ar, bd)
            # order "a first" (weight w) and "b first" (1 - w); Shapley: w = 1/2
            a_first = (f_ab_ - out_ref, out - f_ab_)
            b_first = (out - f_a_b, f_a_b - out_ref)
            c_a = (a_first[0] + b_first[0]) / 2
            c_b = (a_first[1] + b_first[1]) / 2
            size = c_a.abs() + c_b.abs()
            ill = size * torch.finfo(size.dtype).eps ** 0.5 > (out - out_ref).abs()
            w = torch.full_like(size, 0.5)
            if bool(ill.any()):
                first_a = (a_first[0].abs() + a_first[1].abs()) <= \
                    (b_first[0].abs() + b_first[1].abs())
                w = torch.where(ill, first_a.to(w.dtype), w)
                c_a = w * a_first[0] + (1 - w) * b_first[0]
                c_b = w * a_first[1] + (1 - w) * b_first[1]
        shape = out.shape

        def multiplier(c, d, which):
            small = d.abs() < RESCALE_THRESHOLD
            m = c / d
            if bool(small.expand(shape).any()):
                # a's slope at b~ (a first) and at b (b first); b's at a (a first), a~
                at = ((ad, br), (ad, bd)) if which == 0 else ((ad, bd), (ar, bd))
                slope = w * _partial(fn, *at[0], which, shape) + \
                    (1 - w) * _partial(fn, *at[1], which, shape)
                m = torch.where(small, slope, m)
            return m

        m_a, m_b = multiplier(c_a, ad - ar, 0), multiplier(c_b, bd - br, 1)

        def backward(g):
            return _reduce_to(g * m_a, a.shape), _reduce_to(g * m_b, b.shape)

        return _Modified2.apply(a, b, out, backward), None


# --- DeepLIFT on softmax and normalisation: composed of the rules above ------------------
def _rescale(f, y, yr):
    """``(f(y) with the Rescale backward, f(y~))``."""
    with torch.no_grad():
        zr = f(yr)
    return Rescale().apply(f, y, (yr, zr), False)[0], zr


def _product(a, ar, b, br):
    with torch.no_grad():
        zr = ar * br
    return ShapleyProduct().apply(torch.mul, (a, b), ((ar, br), zr), False)[0], zr


def _normalised(y, yr, dims, eps):
    """``(y - mean) * rsqrt(mean((y - mean)^2) + eps)`` over ``dims`` in DeepLIFT's rules:
    centring is linear, the square and ``rsqrt`` take Rescale, the product the
    two-player Shapley split."""
    c, cr = y - y.mean(dims, keepdim=True), yr - yr.mean(dims, keepdim=True)
    q, qr = _rescale(torch.square, c, cr)
    v, vr = q.mean(dims, keepdim=True), qr.mean(dims, keepdim=True)
    r, rr = _rescale(lambda t: torch.rsqrt(t + eps), v, vr)
    return _product(c, cr, r, rr)[0]


def _mean_value_weights(y, yr, dim, max_steps: int = 64):
    """The gradient of ``L = logsumexp`` at the point of the segment from ``y~`` to ``y``
    where it explains the change exactly (mean value theorem): ``w = softmax(y~ + t dy)``
    with ``w . dy = L(y) - L(y~)``. ``phi(t) = softmax(y~ + t dy) . dy`` rises with ``t``
    (``L`` is convex) from ``phi(0) <= dL`` to ``phi(1) >= dL``; ``t`` is found by Newton
    steps kept in the bracket (bisection when a step leaves it) until ``phi`` meets ``dL``
    to rounding, and what rounding leaves is moved onto ``w`` along the centred ``dy`` (so
    ``sum w = 1`` stays). ``w`` is a probability vector however far apart the logits of
    ``y`` and ``y~`` are. Masked logits (``-inf`` in both ``y`` and ``y~``) have ``dy = 0``
    and weight 0. Returns ``(w, dy)``."""
    dy = torch.where(y == yr, torch.zeros_like(y), y - yr)
    d_l = torch.logsumexp(y, dim, keepdim=True) - torch.logsumexp(yr, dim, keepdim=True)
    tol = 8 * torch.finfo(y.dtype).eps * (dy.abs().amax(dim, keepdim=True) + d_l.abs())
    lo, hi = torch.zeros_like(d_l), torch.ones_like(d_l)
    t = torch.full_like(d_l, 0.5)
    for _ in range(max_steps):
        w = torch.softmax(yr + t * dy, dim)
        mean = (w * dy).sum(dim, keepdim=True)
        if bool(((mean - d_l).abs() <= tol).all()):
            break
        below = mean < d_l
        lo, hi = torch.where(below, t, lo), torch.where(below, hi, t)
        slope = (w * dy * dy).sum(dim, keepdim=True) - mean * mean
        step = t + (d_l - mean) / torch.where(slope > 0, slope, torch.ones_like(slope))
        inside = (slope > 0) & (step > lo) & (step < hi)
        t = torch.where(inside, step, (lo + hi) / 2)
    w = torch.softmax(yr + t * dy, dim)
    c = dy - dy.mean(dim, keepdim=True)
    norm = (c * c).sum(dim, keepdim=True)
    left = d_l - (w * dy).sum(dim, keepdim=True)
    return w + torch.where(norm > 0, left / torch.where(norm > 0, norm, 1.0), 0.0) * c, dy


def _softmax(y, yr, dim, log):
    """``z = y - logsumexp(y)`` (log-softmax; softmax: ``p = exp(z)`` with Rescale), the
    log-sum-exp with the mean-value multiplier ``w`` of :func:`_mean_value_weights`:
    ``dz_i = dy_i - w . dy`` and ``dp_i = m_i dz_i``, ``m_i = (p_i - p~_i) / dz_i`` (``p_i``
    where ``|dz_i| < 1e-10``). The backward is ``g_i - w_i sum_j g_j`` (log) or
    ``g_i m_i - w_i sum_j g_j m_j``, so ``sum_i g_i dp_i = sum_j dy_j grad_j``: complete,
    with bounded multipliers (``p`` in [0, 1]) for logits of any size. ``dz`` is formed
    from ``dy`` and ``w`` rather than from two rounded ``z`` (whose difference loses the
    digits of large logits), so that the softmax is complete to the rounding of ``p``."""
    with torch.no_grad():
        yd = y.detach()
        w, dy = _mean_value_weights(yd, yr, dim)
        out = torch.log_softmax(yd, dim) if log else torch.softmax(yd, dim)
        if not log:
            dz = dy - (w * dy).sum(dim, keepdim=True)
            small = dz.abs() < RESCALE_THRESHOLD
            m = torch.where(small, out, (out - torch.softmax(yr, dim)) /
                            torch.where(small, torch.ones_like(dz), dz))
    if log:
        return _Modified.apply(y, out, lambda g: g - w * g.sum(dim, keepdim=True))
    return _Modified.apply(y, out, lambda g: g * m - w * (g * m).sum(dim, keepdim=True))


def _affine(n, weight, bias, shape):
    if weight is not None:
        n = n * weight.reshape(shape)
    if bias is not None:
        n = n + bias.reshape(shape)
    return n




def _layer_norm(args, y, yr, composed):
    _, shape, weight, bias, eps = (list(args) + [None, None, 1e-5])[:5]
    dims = tuple(range(-len(shape), 0))
    return _affine(composed(y, yr, dims, eps), weight, bias, tuple(shape))


def _group_norm(args, y, yr, composed):
    _, weight, bias, _, _, _, groups, eps = args
    v = composed(y.reshape(y.shape[0], groups, -1), yr.reshape(yr.shape[0], groups, -1),
                 (-1,), eps).reshape(y.shape)
    return _affine(v, weight, bias, (1, -1) + (1,) * (y.dim() - 2))


class ComposedDeepLift(Rule):
    """DeepLIFT on softmax, log-softmax, LayerNorm and GroupNorm, composed of complete
    steps: softmax as ``exp(y - logsumexp(y))`` (Rescale on ``exp``, the mean-value
    multiplier on log-sum-exp: :func:`_softmax`), the norms as centring, ``x^2`` and
    ``rsqrt`` (Rescale) and a product (two-player Shapley). Every step is complete, so the
    operation is complete exactly, with no quadrature error."""

    label = ("composed: exp(y - logsumexp y) (Rescale, mean-value logsumexp); norms: Rescale "
             "on x^2/rsqrt, two-player Shapley on the product")
    needs_reference = True
    wants_node = True

    def apply_node(self, op, args, y, ref):
        y_ref, name = ref[0], op_name(op)
        if "softmax" in name:
            return _softmax(y, y_ref, args[1], "log" in name)
        if "group_norm" in name:
            return _group_norm(args, y, y_ref, _normalised)
        return _layer_norm(args, y, y_ref, _normalised)


def _constant_std(y, yr, dims, eps):
    """``(y - mean) / std`` with ``std`` held constant (a detached value)."""
    c = y - y.mean(dims, keepdim=True)
    std = torch.sqrt(c.detach().square().mean(dims, keepdim=True) + eps)
    return c / std


class ConstantNormaliser(Rule):
    """epsilon-LRP on LayerNorm and GroupNorm: the standard deviation is held constant,
    so the operation is the linear map ``(y - mean) / std * w + b`` (Ali et al. 2022,
    "XAI for Transformers: better explanations through conservative propagation"; lxt's
    ``layer_norm_forward``)."""

    label = "normaliser held constant: (y - mean) / const(std) * w + b"
    wants_node = True

    def apply_node(self, op, args, y, ref):
        if "group_norm" in op_name(op):
            return _group_norm(args, y, y, _constant_std)
        return _layer_norm(args, y, y, _constant_std)


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
    """:class:`Epsilon` on max selection: the max's gradient routes all of ``R_j`` to the
    arg-max input (Captum's ``EpsilonRule`` on ``MaxPool*d``)."""

    label = "winner-take-all (epsilon rule, relevance to the arg-max)"


class PassRelevance(Rule):
    """Relevance passes an elementwise activation unchanged, ``R_y = R_z``: in gradient
    form ``g_y = g_z * op(y) / (y + eps s(y))``, the epsilon step of the layer before
    (AttnLRP's identity rule)."""

    label = "relevance passes: op(y) / (y + eps s(y))"

    def __init__(self, epsilon: float):
        self.epsilon = float(epsilon)

    def apply(self, fn, y, ref, scale):
        yd, out = detached_forward(fn, y)
        m = out / (yd + self.epsilon * stable_sign(yd))
        return scaled(y, out, m), m


class UniformProduct(Rule):
    """epsilon-LRP for ``a * b`` or a matmul of two input-dependent tensors: the uniform
    rule (AttnLRP, Achtibat et al. 2024, eq. 7), half of the gradient to each factor,
    ``R_a = R_b = R_z / 2``. An elementwise factor broadcast over the product (fewer
    entries: a gate as in squeeze-and-excitation, a normaliser as in RMSNorm) is held
    constant instead and the other factor takes all of ``R_z`` (CP-LRP, Ali et al. 2022;
    the signal-take-all rule of Arras et al. 2017)."""

    label = "uniform: R_a = R_b = R_z / 2 (a broadcast gate or normaliser held constant)"
    inputs = 2

    def apply(self, fn, ys, ref, scale):
        a, b = ys
        n = _entries(a, b) if "mul" in op_name(fn.op) else 0  # the elementwise product's
        wa = 0.0 if a.numel() < n <= b.numel() else (1.0 if b.numel() < n <= a.numel() else 0.5)
        wb = 1.0 - wa if wa != 0.5 else 0.5
        # the op's own backward, each factor's gradient scaled by its weight (a factor of
        # weight 0 held constant): J_a^T g * wa and J_b^T g * wb at (a, b)
        return fn(_weighted(a, wa), _weighted(b, wb)), None


def _entries(a: torch.Tensor, b: torch.Tensor) -> int:
    """Entries of the broadcast of ``a`` and ``b`` (0 where they do not broadcast)."""
    try:
        return math.prod(torch.broadcast_shapes(a.shape, b.shape))
    except RuntimeError:
        return 0


def _weighted(t: torch.Tensor, w: float) -> torch.Tensor:
    """``t`` forward; backward ``w`` times its gradient (none for ``w = 0``)."""
    if w == 0.0:
        return t.detach()
    return t if w == 1.0 else scaled(t, t.detach(), w)


class ConstantDivisor(Rule):
    """epsilon-LRP for ``a / b`` with both input-dependent: ``b`` is a normaliser held
    constant and ``R_a = R_z`` (CP-LRP); ``maximum``/``minimum`` route by their exact
    gradient (relevance to the larger/smaller one); other functions are refused."""

    label = "a / b: divisor held constant; maximum/minimum: to the winner"
    inputs = 2

    def refuses(self, op) -> str | None:
        name = str(getattr(op, "overloadpacket", op))
        if any(k in name for k in ("div", "maximum", "minimum", "fmax", "fmin")):
            return None
        return "no epsilon-LRP rule for this function of two input-dependent tensors"

    def apply(self, fn, ys, ref, scale):
        a, b = ys
        if "div" in op_name(fn.op):
            return fn(a, b.detach()), None
        return fn(a, b), None


# ---------------------------------------------------------------------------------------
# Kinds of operations and rule sets
# ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Family:
    """A kind of operation (:mod:`.ops`): its key, title, operations in words and a note."""

    key: str
    title: str
    operations: str
    note: str = ""


def _families() -> tuple[Family, ...]:
    notes = {"linear": "sums split relevance in proportion to the summands (no double "
                       "counting); guards and shape assertions carry no relevance",
             "norm": "an affine map per channel; epsilon-LRP folds it into a directly "
                     "preceding convolution/linear layer",
             "activation": "any composition of them with products and sums of one tensor "
                           "gets the Rescale multiplier of the whole (each step's multiplier "
                           "is a difference quotient)"}
    return tuple(Family(k, t, o, notes.get(k, "")) for k, t, o in KINDS)


FAMILIES: tuple[Family, ...] = _families()
_BY_KEY = {f.key: f for f in FAMILIES}


@dataclass(frozen=True)
class RuleSet:
    """A method's rule per kind: the kinds it lists are exactly what it supports."""

    name: str                      # "deeplift" | "epsilon_lrp" | "lrp_rules"
    method: str                    # the class name used in messages
    rules: Mapping[str, Rule]
    epsilon: float | None = None

    @property
    def needs_reference(self) -> bool:
        return any(r.needs_reference for r in self.rules.values())

    @property
    def families(self) -> tuple[Family, ...]:
        return tuple(f for f in FAMILIES if f.key in self.rules)

    def family(self, key: str) -> Family:
        return _BY_KEY[key]

    def linear_factor(self, z: torch.Tensor) -> torch.Tensor | None:
        """The epsilon factor ``z / (z + eps s(z))`` of a layer output, None for DeepLIFT."""
        rule = self.rules["weighted"]
        return rule.factor(z) if isinstance(rule, Epsilon) else None


DEEPLIFT_RESCALE = RuleSet("deeplift", "DeepLift", {
    "linear": Gradient(), "weighted": Gradient(), "norm": Gradient(), "avg_pool": Gradient(),
    "max_pool": MaxRescale(), "activation": Rescale(), "product": ShapleyProduct(),
    "binary": ShapleyBinary(), "softmax": ComposedDeepLift(), "layer_norm": ComposedDeepLift()})


@functools.lru_cache(maxsize=64)
def epsilon_rule(epsilon: float) -> RuleSet:
    """epsilon-LRP with the same ``epsilon`` everywhere (one rule set per value, so that
    every method object of that ``epsilon`` finds the same plans and generated passes)."""
    eps = Epsilon(epsilon)
    return RuleSet("epsilon_lrp", "EpsilonLRP", {
        "linear": Gradient(), "weighted": eps, "norm": eps, "avg_pool": eps,
        "max_pool": WinnerTakeAll(epsilon), "activation": PassRelevance(epsilon),
        "product": UniformProduct(), "binary": ConstantDivisor(), "softmax": Gradient(),
        "layer_norm": ConstantNormaliser()}, epsilon=float(epsilon))
