"""Taylor engine: order-2 terms vs per-sample autograd Hessians, and order 6 vs order 2.

Batch 32 of 1x28x28 inputs on an M-sg-sized sigmoid MLP and a C-sg-sized sigmoid CNN.
The Hessian route (``torch.autograd.functional.hessian`` + gradient per sample) is timed
with its default (``vectorize=False``: one backward pass per Hessian row) and with
``vectorize=True`` (vmap over the rows, the stronger peer), each after a warm-up call, on a
few samples scaled to the batch, since it costs up to seconds per sample. Goals (issue 16):
order 2 at least 20x the default Hessian route and 5x the vectorized one on C-sg.

Large inputs (issue 16): one 3x224x224 image on a smooth five-layer CNN of about one
million parameters (four strided Softplus convolutions and a linear head), order 2 with
``groups=`` 16x16-pixel patches (196 groups); goal: under a minute on the CPU, first call
(tracing included). Also timed apart: the IG-share pass with its backward
(``taylor_attribution``) and the 196 group expansions (``group_expansions``).
``--quick``: C-sg only, no order 6, one Hessian sample per route; ``--large-only``: only
the large-input case.
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


def smooth_cnn():
    """Five layers, 1,004,502 parameters: 3x224x224 -> 256x14x14 -> 4x4 pool -> 150 logits."""
    return nn.Sequential(
        nn.Conv2d(3, 32, 5, stride=2, padding=2), nn.Softplus(),
        nn.Conv2d(32, 64, 3, stride=2, padding=1), nn.Softplus(),
        nn.Conv2d(64, 128, 3, stride=2, padding=1), nn.Softplus(),
        nn.Conv2d(128, 256, 3, stride=2, padding=1), nn.Softplus(),
        nn.AdaptiveAvgPool2d(4), nn.Flatten(), nn.Linear(256 * 16, 150)).eval()


def patch_groups(side: int = 224, patch: int = 16, channels: int = 3) -> torch.Tensor:
    """Ids of ``patch x patch`` pixel patches (all channels of a pixel in one group)."""
    r = torch.arange(side) // patch
    return (r[:, None] * (side // patch) + r[None, :]).expand(channels, side, side)


def large_input() -> dict:
    """Order 2 on one 3x224x224 image with 196 patch groups: the whole call, then its parts."""
    torch.manual_seed(0)
    model, x, groups = smooth_cnn(), torch.rand(1, 3, 224, 224), patch_groups()
    params = sum(p.numel() for p in model.parameters())
    cost = ta.taylor.taylor_terms_cost(x, 0.0, 2, groups=groups, model=model)
    call = functools.partial(ta.taylor_terms, model, x, 0.0, target=0, order=2, groups=groups)
    total = median_time(call, repeats=1, warmup=0)  # the first call, tracing included
    shares = median_time(functools.partial(ta.taylor.taylor_attribution, model, x, 0.0, 0, 2),
                         repeats=1, warmup=0)
    expansions = median_time(functools.partial(ta.taylor.group_expansions, model, x, 0.0, 0, 2,
                                               groups), repeats=1, warmup=0)
    print_table(f"Large input: order 2, 3x224x224, {int(groups.max()) + 1} patch groups, "
                f"smooth CNN of {params:,} parameters ({torch.get_num_threads()} threads, "
                f"allocator {allocator_label()}; goal under 60 s)",
                [(f"{total:.1f}", f"{shares:.1f}", f"{expansions:.1f}", cost.taylor_rows,
                  cost.taylor_passes, "ok" if total < 60 else "MISSED")],
                ("taylor_terms s", "IG pass + backward s", "group expansions s",
                 "Taylor rows", "passes", "goal"))
    return {"params": params, "seconds": total, "ig_pass": shares, "expansions": expansions,
            "taylor_rows": cost.taylor_rows, "taylor_passes": cost.taylor_passes}


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
    p.add_argument("--large-only", action="store_true", help="only the 3x224x224 case")
    args = p.parse_args(argv)
    if args.large_only:
        result = {"threads": torch.get_num_threads(), "allocator": allocator_label(),
                  "large_input": large_input()}
        dump_json(args.json, result)
        return result
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
    result = {"threads": torch.get_num_threads(), "allocator": allocator_label(), "rows": out,
              "large_input": large_input()}
    dump_json(args.json, result)
    return result


if __name__ == "__main__":
    main()
