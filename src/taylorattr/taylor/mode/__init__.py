"""Taylor-mode propagation of a univariate Taylor series through a PyTorch model.

For a model f, a point x and m directions v_1..v_m per sample,
propagate(model, x, v, order=K) returns the coefficients of

    f(x + t v_r) = sum_{k=0..K} c_k t^k,   c_k = D^k f(x)[v_r, ..., v_r] / k!

for every direction at once. The model is traced with torch.fx (defaulted forward
arguments fixed at their defaults) and interpreted with a Jet in place of each tensor
that depends on the input: the primal x_0 (shared by all directions) and the higher
coefficients [K, B, m, ...]. Affine layers act on the coefficients without their bias;
nonlinearities use the exact recurrences of taylorattr.series; products are Cauchy
products. The cost grows like K (affine layers) plus K^2 (recurrences and products),
not the ~2.5x per order of nested jvp.

Supported: the modules, functions and tensor methods listed by supported_ops()
(docs/supported_ops.md), any module with `elementwise = True` and polynomial `coeffs`,
and everything registered with register_taylor_rule. Piecewise-linear ops (ReLU,
max-pool) are exact inside their linear region, so their terms of order >= 2 vanish;
taylorattr.smooth(model, beta) replaces them by smooth surrogates. Any other operation
on an input-dependent tensor raises UnsupportedOperation naming the op, its source
line and what to do.

Registering a rule for your own module (kept whole while tracing), function or tensor
method: the rule receives Jets for input-dependent arguments and returns a Jet built
from Jet arithmetic (+ - * /), jet.unary(series_fn) and jet.linear(fn):

    import torch, taylorattr as ta
    from taylorattr import series as S

    class Asinh(torch.nn.Module):          # d/dx asinh(x) = (1 + x^2)^(-1/2)
        def forward(self, x):
            return torch.asinh(x)

    def asinh_rule(module, x):
        def series_fn(c):
            slope = S.power(S.polynomial(c, [1.0, 0.0, 1.0]), -0.5)
            return S.compose(c, torch.asinh(c[0]), lambda k, _: slope[k])
        return x.unary(series_fn)

    remove = ta.register_taylor_rule(Asinh, asinh_rule, pointwise=True)
    terms = ta.taylor_terms(model_using_Asinh, x, order=3)
    remove()                               # forget the rule again
"""
from __future__ import annotations

import torch

from . import (  # noqa: F401 (they register their rules)
    rules_affine,
    rules_attention,
    rules_norm,
    rules_pointwise,
    rules_surrogates,
)
from .interpreter import TaylorProgram, piecewise_linear_ops, propagate, trace, trace_fx
from .jet import BatchSecond, Jet, UnsupportedOperation
from .registry import register_taylor_rule, supported_ops, supported_ops_markdown

__all__ = ["BatchSecond", "Jet", "TaylorProgram", "UnsupportedOperation", "piecewise_linear_ops",
           "propagate", "register_taylor_rule", "supported_ops", "supported_ops_markdown",
           "timing_pass", "trace", "trace_fx"]


def timing_pass(model):
    """A callable ``(x, directions, order)`` running one Taylor-mode pass of ``model`` (traced
    once, here): what :func:`taylorattr.runtime.cost.measure_rates` times."""
    gm = trace(model)

    def run(x, directions, order):  # the first call captures the graph for x
        with torch.no_grad():
            propagate(gm, x, directions, order)

    return run
