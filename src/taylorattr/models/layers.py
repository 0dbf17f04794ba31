"""Layers the model zoo is built from, and the one layer rewrite attribution needs.

* :class:`PolyActivation` ``y = sum_k c_k x^k`` (elementwise, fixed coefficients) and its
  special case :class:`Square` ``y = x^2``;
* :class:`ResidualBlock` ``y = act(x + body(x))``;
* :func:`fold_batchnorm` merges an eval-mode batch norm into the Conv/Linear before it:
  ``BN(W x + b) = (s W) x + s (b - mu) + beta`` with ``s = gamma / sqrt(var + eps)``.

``_act(name)`` builds an activation by name (the zoo's ``activation=`` argument);
:func:`model_device` is where a model's parameters live (its data goes there).
"""
from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence

import torch
from torch import nn

__all__ = ["PolyActivation", "ResidualBlock", "Square", "fold_batchnorm", "model_device"]


class PolyActivation(nn.Module):
    """Elementwise polynomial activation with fixed coefficients.

    ``y = sum_k coeffs[k] * x**k``, evaluated by Horner's rule. ``coeffs`` is a tuple of
    floats (constant term first) and is not a parameter; ``elementwise = True`` tells the
    Taylor engine and layer-wise rules that output ``j`` depends on input ``j`` only.
    """

    elementwise = True

    def __init__(self, coeffs: Sequence[float] = (0.0, 0.0, 1.0)):
        super().__init__()
        coeffs = tuple(float(c) for c in coeffs)
        if not coeffs:
            raise ValueError("coeffs must hold at least one coefficient")
        if not all(math.isfinite(c) for c in coeffs):
            raise ValueError(f"coeffs must be finite, got {coeffs}")
        self.coeffs = coeffs

    @property
    def degree(self) -> int:
        """The index of the last nonzero coefficient (0 for a constant)."""
        nz = [k for k, c in enumerate(self.coeffs) if c != 0.0]
        return nz[-1] if nz else 0

    def derivative_coeffs(self, order: int = 1) -> tuple[float, ...]:
        """Coefficients of the ``order``-th derivative polynomial."""
        c = list(self.coeffs)
        for _ in range(order):
            c = [k * c[k] for k in range(1, len(c))] or [0.0]
        return tuple(float(v) for v in c)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.full_like(x, self.coeffs[-1])
        for c in reversed(self.coeffs[:-1]):
            out = out * x + c
        return out

    def extra_repr(self) -> str:
        return f"coeffs={self.coeffs}"


class Square(PolyActivation):
    """``y = x**2`` (a :class:`PolyActivation` with coefficients ``(0, 0, 1)``)."""

    def __init__(self):
        super().__init__((0.0, 0.0, 1.0))


class ResidualBlock(nn.Module):
    """``y = act(x + body(x))``: a residual block with identity shortcut.

    ``body`` must keep the shape of ``x``. Layer-wise DeepLIFT/LRP rules do not support
    this module (the sum of two paths); gradient-based methods and the Taylor engine do.
    """

    def __init__(self, body: nn.Module, act: nn.Module):
        super().__init__()
        self.body = body
        self.act = act

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.act(x + self.body(x))


_ACTIVATIONS: dict[str, Callable[[], nn.Module]] = {
    "sigmoid": nn.Sigmoid,
    "softplus": nn.Softplus,
    "tanh": nn.Tanh,
    "relu": nn.ReLU,
    "square": Square,
}


def model_device(model: nn.Module) -> torch.device:
    """The device of ``model``'s first parameter (else its first buffer; else the CPU): where
    the data fed to it must be. Data read from files or made with numpy is on the CPU, so
    a model on CUDA gets its batches moved there (``x.to(model_device(model))``)."""
    for t in itertools.chain(model.parameters(), model.buffers()):
        return t.device
    return torch.device("cpu")


def _act(name: str) -> nn.Module:
    if name not in _ACTIVATIONS:
        raise ValueError(f"activation must be one of {sorted(_ACTIVATIONS)}, got {name!r}")
    return _ACTIVATIONS[name]()


def fold_batchnorm(model: nn.Module) -> nn.Module:
    """Merge every eval-mode ``BatchNorm`` that directly follows a ``Conv``/``Linear`` inside an
    ``nn.Sequential`` into that layer (in place; returns ``model``).

    ``BN(W x + b) = s * (W x + b - mu) + beta`` with ``s = gamma / sqrt(var + eps)``, so the
    merged layer has ``W' = s W`` and ``b' = s (b - mu) + beta``: the same function, but
    one the layer-wise DeepLIFT/LRP rules can propagate through.
    """
    for module in list(model.modules()):
        if not isinstance(module, nn.Sequential):
            continue
        children = list(module.named_children())
        for (_, layer), (name, bn) in itertools.pairwise(children):
            if not (isinstance(bn, nn.modules.batchnorm._BatchNorm) and bn.running_var is not None
                    and isinstance(layer, (nn.Conv1d, nn.Conv2d, nn.Linear))
                    and bn.num_features == layer.weight.shape[0]):
                continue
            with torch.no_grad():
                scale = torch.rsqrt(bn.running_var + bn.eps)
                if bn.weight is not None:
                    scale = scale * bn.weight
                shift = -bn.running_mean * scale + (bn.bias if bn.bias is not None else 0.0)
                if layer.bias is None:
                    layer.bias = nn.Parameter(torch.zeros_like(shift))
                layer.bias.copy_(layer.bias * scale + shift)
                layer.weight.mul_(scale.view(-1, *[1] * (layer.weight.dim() - 1)))
            setattr(module, name, nn.Identity())
    return model.eval()
