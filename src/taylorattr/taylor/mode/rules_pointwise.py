"""Elementwise rules: smooth nonlinearities by the exact recurrences of
:mod:`taylorattr.series` (``y_k = (1/k) sum_j j x_j g_{k-j}`` with ``g`` the series of
``phi'``), and piecewise-linear ones (``y_k = x_k * phi'(x_0)``, exact off the kinks)."""
from __future__ import annotations

import operator

import torch
import torch.nn.functional as F
from torch import nn

from ... import series as S
from .jet import Jet, UnsupportedOperation, is_jet
from .registry import builtin

_SMOOTH = {
    "sigmoid": S.sigmoid, "tanh": S.tanh, "exp": S.exp, "log": S.log, "erf": S.erf,
    "square": lambda c: S.power(c, 2), "sqrt": lambda c: S.power(c, 0.5),
    "rsqrt": lambda c: S.power(c, -0.5), "reciprocal": lambda c: S.power(c, -1),
}


def _unary(series_rule):
    def rule(x, *_, **__):
        return x.unary(series_rule)
    return rule


for _name, _series in _SMOOTH.items():
    _keys = [f"Tensor.{_name}"] + [getattr(ns, _name) for ns in (torch, torch.special, F)
                                    if hasattr(ns, _name)]
    builtin(*dict.fromkeys(_keys), family="elementwise", pointwise=True)(_unary(_series))


@builtin(nn.Sigmoid, family="elementwise", pointwise=True)
def _sigmoid_module(m, x):
    return x.unary(S.sigmoid)


@builtin(nn.Tanh, family="elementwise", pointwise=True)
def _tanh_module(m, x):
    return x.unary(S.tanh)


@builtin(F.softplus, family="elementwise", pointwise=True)
def softplus(x: Jet, beta=1.0, threshold=20.0) -> Jet:
    return x.unary(lambda c: S.softplus(c, beta, threshold))


@builtin(nn.Softplus, family="elementwise", pointwise=True)
def _softplus_module(m, x):
    return softplus(x, m.beta, m.threshold)


@builtin(F.silu, family="elementwise", pointwise=True)
def silu(x: Jet, *_, **__) -> Jet:
    return x * x.unary(S.sigmoid)


@builtin(nn.SiLU, family="elementwise", pointwise=True)
def _silu_module(m, x):
    return silu(x)


@builtin(F.gelu, family="elementwise", pointwise=True)
def gelu(x: Jet, approximate: str = "none") -> Jet:
    if approximate not in ("none", "tanh"):
        raise UnsupportedOperation(f"gelu with approximate={approximate!r}")
    return x.unary(lambda c: S.gelu(c, approximate))


@builtin(nn.GELU, family="elementwise", pointwise=True)
def _gelu_module(m, x):
    return gelu(x, m.approximate)


def _pow(x, p) -> Jet:
    if not is_jet(x) or is_jet(p) or isinstance(p, torch.Tensor):
        raise UnsupportedOperation("pow with an input-dependent or tensor exponent")
    return x.unary(lambda c: S.power(c, float(p)))


builtin(torch.pow, operator.pow, "Tensor.pow", family="elementwise", pointwise=True)(_pow)


def is_polynomial_module(m: nn.Module) -> bool:
    """Modules declaring ``elementwise = True`` and polynomial ``coeffs`` (``PolyActivation``)."""
    return getattr(m, "elementwise", False) is True and hasattr(m, "coeffs")


def polynomial_module(m, x: Jet) -> Jet:
    return x.unary(lambda c: S.polynomial(c, [float(v) for v in m.coeffs]))


# ---------------------------------------------------------------- piecewise linear

def _masked(x: Jet, factor: torch.Tensor, value: torch.Tensor) -> Jet:
    return x.unary(lambda c: S.masked(c, factor.unsqueeze(1), value.unsqueeze(1)))


@builtin(F.relu, torch.relu, "Tensor.relu", family="piecewise", pointwise=True)
def relu(x: Jet, *_, **__) -> Jet:
    return _masked(x, x.primal > 0, F.relu(x.primal))


@builtin(F.relu6, family="piecewise", pointwise=True)
def relu6(x: Jet, *_, **__) -> Jet:
    return _masked(x, (x.primal > 0) & (x.primal < 6), F.relu6(x.primal))


@builtin(F.leaky_relu, family="piecewise", pointwise=True)
def leaky_relu(x: Jet, negative_slope=0.01, *_, **__) -> Jet:
    factor = torch.where(x.primal > 0, 1.0, negative_slope).to(x.primal.dtype)
    return _masked(x, factor, F.leaky_relu(x.primal, negative_slope))


builtin(nn.ReLU, family="piecewise", pointwise=True)(lambda m, x: relu(x))
builtin(nn.ReLU6, family="piecewise", pointwise=True)(lambda m, x: relu6(x))
builtin(nn.LeakyReLU, family="piecewise", pointwise=True)(lambda m, x: leaky_relu(x, m.negative_slope))

PIECEWISE_MODULES = (nn.ReLU, nn.ReLU6, nn.LeakyReLU, nn.MaxPool1d, nn.MaxPool2d, nn.MaxPool3d,
                     nn.Hardtanh, nn.PReLU)
PIECEWISE_FUNCTIONS = {F.relu, torch.relu, F.relu6, F.leaky_relu, F.max_pool1d, F.max_pool2d,
                       F.hardtanh, torch.max_pool2d}
PIECEWISE_METHODS = {"relu", "relu_"}

__all__ = ["PIECEWISE_FUNCTIONS", "PIECEWISE_METHODS", "PIECEWISE_MODULES", "gelu",
           "is_polynomial_module", "polynomial_module", "relu", "silu", "softplus"]
