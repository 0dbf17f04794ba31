"""The networks of the paper's experiments: name -> builder of a fresh untrained model.

MNIST models (input ``[B, 1, 28, 28]`` in [0, 1], output logits ``[B, 10]``):

* ``poly``  Poly: ``Flatten, Linear(784, 100), x^2, Linear(100, 10)``, a polynomial of
  degree 2 in the input, so its second-order Taylor expansion is exact.
* ``m_sg``  M-sg: ``784-100-100-10`` MLP with sigmoid activations.
* ``c_sg``  C-sg: ``Conv(1,16,5), sigmoid, AvgPool2, Conv(16,32,5), sigmoid, AvgPool2,
  Flatten, Linear(512, 10)``.
* ``c_sp``  C-sp: C-sg with softplus.

Localisation models (input ``[B, 1, 64, 64]`` cluttered-MNIST canvases, logits ``[B, 10]``):
``loc_c_sg`` and ``loc_c_sp`` (three conv layers with sigmoid / softplus and average
pooling, global average pooling, Linear), ``loc_vgg`` (VGG-style 3x3 conv blocks with
average pooling) and ``loc_resnet`` (ResNet-style residual blocks ``act(x + body(x))``);
all four use batch norm after each convolution (an affine map in eval mode). VGG- and
ResNet-style use softplus by default (smooth, so every Taylor term exists;
``activation="relu"`` gives the ReLU originals' piecewise-linear behaviour).

Every model except ``loc_resnet`` is an ``nn.Sequential`` of Linear, Conv2d, AvgPool2d,
AdaptiveAvgPool2d, Flatten, BatchNorm2d, Sigmoid, Softplus, ReLU and
:class:`PolyActivation` with no functional calls, so the layer-wise DeepLIFT/LRP rules
apply. ``loc_resnet`` is a
Sequential holding :class:`ResidualBlock` modules, which layer-wise rules do not support.

:data:`MODELS` maps each name to its builder (no arguments needed).
"""
from __future__ import annotations

from collections.abc import Callable

from torch import nn

from .layers import ResidualBlock, Square, _act

__all__ = ["MODELS", "c_sg", "c_sp", "loc_c_sg", "loc_c_sp", "loc_resnet", "loc_vgg", "m_sg",
           "poly"]


# --------------------------------------------------------------------------- MNIST models


def poly(hidden: int = 100) -> nn.Sequential:
    """Poly: ``Flatten, Linear(784, hidden), x^2, Linear(hidden, 10)``; degree 2 in x."""
    return nn.Sequential(nn.Flatten(), nn.Linear(784, hidden), Square(), nn.Linear(hidden, 10))


def m_sg(hidden: int = 100) -> nn.Sequential:
    """M-sg: three-layer sigmoid MLP ``784-hidden-hidden-10``."""
    return nn.Sequential(
        nn.Flatten(),
        nn.Linear(784, hidden), nn.Sigmoid(),
        nn.Linear(hidden, hidden), nn.Sigmoid(),
        nn.Linear(hidden, 10),
    )


def _small_cnn(activation: str) -> nn.Sequential:
    return nn.Sequential(
        nn.Conv2d(1, 16, 5), _act(activation), nn.AvgPool2d(2),    # 16 x 12 x 12
        nn.Conv2d(16, 32, 5), _act(activation), nn.AvgPool2d(2),   # 32 x 4 x 4
        nn.Flatten(),
        nn.Linear(512, 10),
    )


def c_sg() -> nn.Sequential:
    """C-sg: ``Conv(1,16,5), sigmoid, AvgPool2, Conv(16,32,5), sigmoid, AvgPool2,
    Flatten, Linear(512, 10)``."""
    return _small_cnn("sigmoid")


def c_sp() -> nn.Sequential:
    """C-sp: C-sg with softplus activations."""
    return _small_cnn("softplus")


# --------------------------------------------------------------------------- localisation models


def _conv_bn(c_in: int, c_out: int, k: int, activation: str, **kw) -> list[nn.Module]:
    return [nn.Conv2d(c_in, c_out, k, **kw), nn.BatchNorm2d(c_out), _act(activation)]


def _loc_cnn(activation: str) -> nn.Sequential:
    return nn.Sequential(
        *_conv_bn(1, 8, 5, activation), nn.AvgPool2d(2),     # 8 x 30 x 30
        *_conv_bn(8, 16, 5, activation), nn.AvgPool2d(2),    # 16 x 13 x 13
        *_conv_bn(16, 32, 3, activation),                    # 32 x 11 x 11
        nn.AdaptiveAvgPool2d(1), nn.Flatten(),
        nn.Linear(32, 10),
    )


def loc_c_sg() -> nn.Sequential:
    """C-sg for 64x64 canvases: three conv layers (5x5, 5x5, 3x3; 8, 16, 32 channels),
    each followed by batch norm and sigmoid, 2x2 average pooling after the first two,
    global average pooling, ``Linear(32, 10)``. (Batch norm, an affine map in eval mode,
    is what lets a sigmoid CNN learn the sparse, translated digits in a few epochs.)"""
    return _loc_cnn("sigmoid")


def loc_c_sp() -> nn.Sequential:
    """:func:`loc_c_sg` with softplus."""
    return _loc_cnn("softplus")


def loc_vgg(activation: str = "softplus") -> nn.Sequential:
    """VGG-style net for 64x64 (like VGG-BN): blocks of 3x3 convolutions (padding 1) with
    batch norm, closed by 2x2 average pooling (VGG's max pooling is replaced so the net
    stays smooth), global average pooling, ``Linear(32, 10)``: ``[8] P [16] P [32, 32] P``."""
    a = activation
    return nn.Sequential(
        *_conv_bn(1, 8, 3, a, padding=1), nn.AvgPool2d(2),                 # 8 x 32 x 32
        *_conv_bn(8, 16, 3, a, padding=1), nn.AvgPool2d(2),                # 16 x 16 x 16
        *_conv_bn(16, 32, 3, a, padding=1),
        *_conv_bn(32, 32, 3, a, padding=1), nn.AvgPool2d(2),               # 32 x 8 x 8
        nn.AdaptiveAvgPool2d(1), nn.Flatten(),
        nn.Linear(32, 10),
    )


def _res_block(channels: int, activation: str) -> ResidualBlock:
    body = nn.Sequential(
        *_conv_bn(channels, channels, 3, activation, padding=1),
        nn.Conv2d(channels, channels, 3, padding=1), nn.BatchNorm2d(channels),
    )
    return ResidualBlock(body, _act(activation))


def loc_resnet(activation: str = "softplus") -> nn.Sequential:
    """ResNet-style net for 64x64: a stride-2 stem conv, two stages each ending in a
    residual block ``act(x + bn(conv(act(bn(conv(x))))))`` with identity shortcut, average
    pooling between stages, global average pooling, ``Linear(32, 10)``."""
    a = activation
    return nn.Sequential(
        *_conv_bn(1, 16, 4, a, stride=2, padding=1), nn.AvgPool2d(2),      # 16 x 16 x 16
        _res_block(16, a),
        *_conv_bn(16, 32, 3, a, padding=1), nn.AvgPool2d(2),               # 32 x 8 x 8
        _res_block(32, a),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(),
        nn.Linear(32, 10),
    )


MODELS: dict[str, Callable[[], nn.Module]] = {
    "poly": poly,
    "m_sg": m_sg,
    "c_sg": c_sg,
    "c_sp": c_sp,
    "loc_c_sg": loc_c_sg,
    "loc_c_sp": loc_c_sp,
    "loc_vgg": loc_vgg,
    "loc_resnet": loc_resnet,
}
"""Name -> builder (no arguments needed); every builder returns a fresh untrained model."""
