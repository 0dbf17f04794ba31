"""Model and data builders the test modules share, seeded: every call builds the same values.

``DT`` is the tests' dtype (float64: the independent routes are compared at float64
rounding). :func:`mlp` is a seeded multilayer perceptron of any widths, :func:`normal`
seeded standard normal draws. The common checks' CNN, images and references are
:mod:`taylorattr.testing`'s (``conv_model``, ``image_batch``, ``reference_images``).
"""
from __future__ import annotations

import itertools

import torch
from torch import nn

DT = torch.float64


def mlp(*widths: int, acts=(nn.Tanh,), seed: int = 0, flatten: bool = False,
        dtype=DT) -> nn.Sequential:
    """``Linear(widths[0], widths[1])``, an activation, ..., ``Linear(widths[-2],
    widths[-1])``: the ``k``-th activation is ``acts[k % len(acts)]()``; an ``nn.Flatten``
    first with ``flatten``. Built after ``torch.manual_seed(seed)``, in ``dtype``, eval mode."""
    torch.manual_seed(seed)
    layers: list[nn.Module] = [nn.Flatten()] if flatten else []
    for k, (n_in, n_out) in enumerate(itertools.pairwise(widths)):
        if k:
            layers.append(acts[(k - 1) % len(acts)]())
        layers.append(nn.Linear(n_in, n_out))
    return nn.Sequential(*layers).to(dtype).eval()


def normal(shape, seed: int = 1, n: int = 1, dtype=DT):
    """``n`` standard normal tensors of ``shape`` drawn in turn from one generator seeded
    ``seed`` (the tensor itself when ``n == 1``, else a tuple)."""
    gen = torch.Generator().manual_seed(seed)
    draws = tuple(torch.randn(shape, generator=gen, dtype=dtype) for _ in range(n))
    return draws[0] if n == 1 else draws
