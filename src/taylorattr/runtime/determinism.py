"""Bitwise repeatability on CUDA: cuDNN restricted to its deterministic algorithms.

On the CPU the same call twice gives the same bits. On CUDA, cuDNN's fastest convolution
backward passes may add partial sums with atomics, in an order that varies from run to run,
so ``f(x)``'s gradient can differ in its last bits between two equal calls. Within
:func:`cudnn_deterministic` cuDNN picks only deterministic algorithms
(``torch.backends.cudnn.deterministic = True``, ``benchmark = False``). Other CUDA atomics
(``index_add_``, adaptive pooling's backward) are not covered; ``torch.use_deterministic_algorithms``
would refuse the operations that have no deterministic kernel, so it is not set here.
"""
from __future__ import annotations

import contextlib

import torch

__all__ = ["cudnn_deterministic"]


@contextlib.contextmanager
def cudnn_deterministic():
    """Within the block cuDNN runs only its deterministic algorithms (the two flags are
    restored after, also on an error). Changes nothing on the CPU."""
    cudnn = torch.backends.cudnn
    saved = cudnn.deterministic, cudnn.benchmark
    cudnn.deterministic, cudnn.benchmark = True, False
    try:
        yield
    finally:
        cudnn.deterministic, cudnn.benchmark = saved
