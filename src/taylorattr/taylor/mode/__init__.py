"""Taylor-mode propagation of a univariate Taylor series through a PyTorch model.

For a model f, a point x and m directions v_1..v_m per sample,
propagate(model, x, v, order=K) returns the coefficients of

    f(x + t v_r) = sum_{k=0..K} c_k t^k,   c_k = D^k f(x)[v_r, ..., v_r] / k!

for every direction at once. The model is captured once per input signature with
torch.export and lowered to PyTorch's core ATen operations (taylorattr.capture; Python
control flow that does not depend on data runs, parameters are read live), and every
node that depends on the input is run on a CoreJet (taylor/mode/core.py): the value and
its coefficients. Ops linear in the input (views, permutes, convolutions, pooling, cat,
where) act on the coefficients through torch.vmap, so shapes, static batch sizes and
permutes or unbinds that move the batch axis mean what they mean for the value; products
are Cauchy products; nonlinearities use the exact recurrences of taylorattr.series;
LayerNorm and softmax keep their own exact rules (taylor/mode/rules/, one module per
family). The cost grows like K (linear ops) plus K^2 (recurrences and products), not the
~2.5x per order of nested jvp. One first-order check per capture refuses a model in which
one sample's output depends on another sample's input.

Supported: the core operations listed by supported_ops() (docs/supported_ops.md) and
everything registered with register_taylor_rule; anything PyTorch decomposes into them
(Hardswish, Upsample, batch_norm, GELU, stochastic depth in eval, TransformerEncoderLayer,
scaled_dot_product_attention, ...) needs nothing more. Piecewise-linear ops (ReLU, clamp,
max-pool) are exact inside their linear region, so their terms of order >= 2 vanish;
taylorattr.smooth(model, beta) (or beta="auto" with inputs=) replaces them by smooth
surrogates. Operations without a rule are refused in one UnsupportedOperation listing
each op, its count, its first source line and what to do.

Registering a rule: on an ATen operation (torch.ops.aten.<op>.<overload>, or the packet
torch.ops.aten.<op> for all overloads) or on a torch.library custom op, which is how a
module or function of your own is kept whole (torch.export leaves a custom op as one
node). The rule receives CoreJets for input-dependent arguments and returns a CoreJet
built from CoreJet arithmetic (+ - * /), jet.unary(series_fn) and jet.linear(fn):

    import torch, taylorattr as ta
    from taylorattr import series as S

    @torch.library.custom_op("mylib::asinh", mutates_args=())
    def asinh(x: torch.Tensor) -> torch.Tensor:   # d/dx asinh(x) = (1 + x^2)^(-1/2)
        return torch.asinh(x)

    asinh.register_fake(torch.empty_like)          # its output's shape, for torch.export

    def asinh_rule(x):
        def series_fn(c):
            slope = S.power(S.polynomial(c, [1.0, 0.0, 1.0]), -0.5)
            return S.compose(c, torch.asinh(c[0]), lambda k, _: slope[k])
        return x.unary(series_fn)

    remove = ta.register_taylor_rule(asinh, asinh_rule)
    terms = ta.taylor_terms(model_calling_asinh, x, order=3)
    remove()                                       # forget the rule again

The same rule registered for torch.ops.aten.asinh.default serves models that call
torch.asinh directly.
"""
from __future__ import annotations

import torch

from . import rules  # noqa: F401 (the families register their rules)
from .core import (
    CoreJet,
    Jet,
    TaylorProgram,
    UnsupportedOperation,
    piecewise_linear_ops,
    propagate,
    trace,
)
from .registry import register_taylor_rule, supported_ops, supported_ops_markdown

__all__ = ["CoreJet", "Jet", "TaylorProgram", "UnsupportedOperation", "piecewise_linear_ops",
           "propagate", "register_taylor_rule", "supported_ops", "supported_ops_markdown",
           "timing_pass", "trace"]


def timing_pass(model):
    """A callable ``(x, directions, order)`` running one Taylor-mode pass of ``model`` (traced
    once, here): what :func:`taylorattr.runtime.cost.measure_rates` times."""
    gm = trace(model)

    def run(x, directions, order):  # the first call captures the graph for x
        with torch.no_grad():
            propagate(gm, x, directions, order)

    return run
