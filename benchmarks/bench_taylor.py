"""Taylor engine: order-2 terms vs per-sample autograd Hessians, and order 6 vs order 2.

Batch 32 of 1x28x28 inputs on an M-sg-sized sigmoid MLP and a C-sg-sized sigmoid CNN.
The Hessian route (``torch.autograd.functional.hessian`` + gradient per sample) is timed
with its default (``vectorize=False``: one backward pass per Hessian row) and with
``vectorize=True`` (vmap over the rows, the stronger peer), each after a warm-up call, on a
few samples scaled to the batch, since it costs up to seconds per sample. Goals (issue 16):
order 2 at least 20x the default Hessian route and 5x the vectorized one on C-sg.
``--quick``: C-sg only, no order 6, one Hessian sample per route.
"""
from __future__ import annotations

import argparse
import functools
import sys
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).parent))
from _timing import allocator_label, dump_json, median_time, print_table

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


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    batch, quick = args.batch, args.quick
    hessian_samples = 1 if quick else 2
    torch.manual_seed(0)
    x = torch.rand(batch, 1, 28, 28)
    rows, out = [], []
    for name, build in ((("C-sg", c_sg),) if quick else (("M-sg", m_sg), ("C-sg", c_sg))):
        model = build()
        t2 = median_time(functools.partial(ta.taylor_terms, model, x, 0.0, order=2, target=0),
                         repeats=2 if quick else 3)
        t6 = None if quick else median_time(
            functools.partial(ta.taylor_terms, model, x, 0.0, order=6, target=0), repeats=2)
        th = {}
        for v, n, repeats in ((False, 1, 1), (True, hessian_samples, 1 if quick else 3)):
            hessian_batch(model, x[:1], v)  # warm-up: vmap's first call costs far more
            th[v] = median_time(functools.partial(hessian_batch, model, x[:n], v),
                                repeats=repeats, warmup=0) * batch / n
        out.append({"model": name, "order2": t2, "hessian": th[False], "hessian_vmap": th[True],
                    "order6": t6})
        rows.append((name, f"{t2:.2f}", f"{th[False]:.1f}", f"{th[False] / t2:.0f}x",
                     f"{th[True]:.1f}", f"{th[True] / t2:.1f}x",
                     "-" if t6 is None else f"{t6:.2f}", "-" if t6 is None else f"{t6 / t2:.2f}"))
    print_table(f"Taylor engine, batch {batch} of 28x28 (seconds), {torch.get_num_threads()} "
                f"threads, allocator {allocator_label()}", rows,
                ("model", "order-2 ours", "hessian (default)", "speed-up", "hessian (vectorize)",
                 "speed-up", "order-6 ours", "order6/order2"))
    result = {"threads": torch.get_num_threads(), "allocator": allocator_label(), "rows": out}
    dump_json(args.json, result)
    return result


if __name__ == "__main__":
    main()
