"""Reference sets drawn from data: the training digits as a lazy
:class:`~taylorattr.baselines.ReferenceSet`, for methods that draw their baselines from the
data distribution (Expected Gradients after Erion et al.)."""
from __future__ import annotations

from pathlib import Path

import torch

from .._validation import check_positive_int
from ..baselines import ReferenceSet
from .mnist import load_mnist, mnist_split

__all__ = ["N_REFERENCE_DIGITS", "TrainingDigits"]

#: Training digits a :class:`TrainingDigits` reference set holds by default.
N_REFERENCE_DIGITS = 1000


class TrainingDigits(ReferenceSet):
    """The first ``n`` training digits of the fixed MNIST split, ``[n, 1, 28, 28]``, as a
    :class:`~taylorattr.baselines.ReferenceSet` loaded on first use (the bundled digits
    when ``mnist_dir`` is None). Expected Gradients with this distribution draws its
    baselines from the data, as Erion et al. do."""

    def __init__(self, n: int = N_REFERENCE_DIGITS, mnist_dir=None):
        check_positive_int(n, "n")
        object.__setattr__(self, "n", n)
        object.__setattr__(self, "mnist_dir", None if mnist_dir is None else Path(mnist_dir))
        object.__setattr__(self, "_rows", None)

    @property
    def samples(self) -> torch.Tensor:
        if self._rows is None:
            train = mnist_split(*load_mnist(self.mnist_dir), seed=0).train_images
            object.__setattr__(self, "_rows", train[:self.n])
        return self._rows

    def __repr__(self) -> str:
        source = "bundled digits" if self.mnist_dir is None else str(self.mnist_dir)
        return f"TrainingDigits(n={self.n}, {source})"
