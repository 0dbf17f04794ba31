"""Taylor engine: order-2 terms vs per-sample autograd Hessians, and order 6 vs order 2.

Batch 32 of 1x28x28 inputs on an M-sg-sized sigmoid MLP and a C-sg-sized sigmoid CNN.
The Hessian route (``torch.autograd.functional.hessian`` + gradient per sample) is timed
with its default (``vectorize=False``: one backward pass per Hessian row) and with
``vectorize=True`` (vmap over the rows, the stronger peer), each after a warm-up call, on a
few samples scaled to the batch, since it costs up to seconds per sample.
"""
from __future__ import annotations

import functools
import sys
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).parent))
from _timing import median_time, print_table

import taylorattr as ta


def m_sg():
    return nn.Sequential(nn.Flatten(), nn.Linear(784, 256), nn.Sigmoid(), nn.Linear(256, 256),
                         nn.Sigmoid(), nn.Linear(256, 10)).eval()


def c_sg():
    return nn.Sequential(nn.Conv2d(1, 16, 5), nn.Sigmoid(), nn.AvgPool2d(2), nn.Conv2d(16, 32, 5),
                         nn.Sigmoid(), nn.AvgPool2d(2), nn.Flatten(), nn.Linear(512, 10)).eval()


def hessian_route(model, x, target, vectorize):
    """Order-2 fields of one sample the obvious way (full Hessian)."""
    f = lambda z: model(z.view(1, 1, 28, 28))[0, target]
    flat = x.flatten()
    g = torch.autograd.functional.jacobian(f, flat)
    H = torch.autograd.functional.hessian(f, flat, vectorize=vectorize)
    ind = -0.5 * H.diag() * flat**2
    return g * flat, ind, -0.5 * flat * (H @ flat) - ind


def hessian_batch(model, x, vectorize):
    return [hessian_route(model, row, 0, vectorize) for row in x]


def main(batch: int = 32, hessian_samples: int = 2) -> list[tuple]:
    torch.manual_seed(0)
    x = torch.rand(batch, 1, 28, 28)
    rows = []
    for name, build in (("M-sg", m_sg), ("C-sg", c_sg)):
        model = build()
        t2 = median_time(functools.partial(ta.taylor_terms, model, x, 0.0, order=2, target=0),
                         repeats=3)
        t6 = median_time(functools.partial(ta.taylor_terms, model, x, 0.0, order=6, target=0),
                         repeats=2)
        th = {}
        for v, n, repeats in ((False, 1, 1), (True, hessian_samples, 3)):
            hessian_batch(model, x[:1], v)  # warm-up: vmap's first call costs far more
            th[v] = median_time(functools.partial(hessian_batch, model, x[:n], v),
                                repeats=repeats, warmup=0) * batch / n
        rows.append((name, f"{t2:.2f}", f"{th[False]:.1f}", f"{th[False] / t2:.0f}x",
                     f"{th[True]:.1f}", f"{th[True] / t2:.1f}x", f"{t6:.2f}", f"{t6 / t2:.2f}"))
    print_table(f"Taylor engine, batch {batch} of 28x28 (seconds)", rows,
                ("model", "order-2 ours", "hessian (default)", "speed-up", "hessian (vectorize)",
                 "speed-up", "order-6 ours", "order6/order2"))
    return rows


if __name__ == "__main__":
    main()
