"""Infidelity with square removal: ours vs Captum on the same perturbation set.

Batch 8 of 1x28x28 inputs on a C-sg-sized sigmoid CNN, float32, all 5,605 squares of
side 1..10 (Yeh et al.). Captum gets the same squares, in the same order, through a
vectorised ``perturb_func`` whose indicator bank is built before timing (in its favour),
at several ``max_examples_per_batch`` (its best is reported). Ours runs at its automatic
batch size (measured by ``taylorattr.runtime.batching``). The floor is the model alone on all
``5,605 * B`` perturbed copies, pre-built, at the best chunk size of a fine sweep. The
routes are interleaved round by round; the table gives medians. Goal: ours / captum <= 1.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
from captum.metrics import infidelity as captum_infidelity
from torch import nn

sys.path.insert(0, str(Path(__file__).parent))
from _timing import allocator_label, dump_json, floor_sweep, interleaved_medians, print_table

from taylorattr.metrics import infidelity, square_removal


def c_sg():
    return nn.Sequential(nn.Conv2d(1, 16, 5), nn.Sigmoid(), nn.AvgPool2d(2), nn.Conv2d(16, 32, 5),
                         nn.Sigmoid(), nn.AvgPool2d(2), nn.Flatten(), nn.Linear(512, 10)).eval()


def square_bank(h, w, max_side):
    squares = square_removal(h, w, max_side).tolist()
    bank = torch.zeros(len(squares), 1, h, w)
    for k, (s, t, l) in enumerate(squares):
        bank[k, :, t:t + s, l:l + s] = 1.0
    return bank


def captum_route(model, x, attr, target, bank, chunk):
    b = x.shape[0]
    state = {"pos": 0}

    def perturb(inputs):  # rows are sample-major: repeat_interleave of the batch
        m = inputs.shape[0] // b
        ind = bank[state["pos"]:state["pos"] + m].repeat(b, 1, 1, 1)
        state["pos"] += m
        return ind, inputs * (1 - ind)  # baseline 0

    return captum_infidelity(model, perturb, x, attr, target=target,
                             n_perturb_samples=bank.shape[0], max_examples_per_batch=chunk,
                             normalize=True)


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    rounds = 2 if args.quick else 3
    torch.manual_seed(0)
    model = c_sg()
    b = args.batch
    x = torch.rand(b, 1, 28, 28)
    attr = torch.randn(b, 1, 28, 28) * 1e-2
    target = torch.arange(b) % 10
    bank = square_bank(28, 28, 10)
    n = bank.shape[0]
    copies = (x[:, None] * (1 - bank[None])).reshape(b * n, 1, 28, 28)

    def floor(c):
        def f():
            with torch.no_grad():
                for i in range(0, copies.shape[0], c):
                    model(copies[i:i + c])
        return f

    routes = {"ours": lambda: infidelity(model, x, attr, target=target)}
    for c in (512, 1024, 4096):
        routes[f"captum: max_examples_per_batch={c}"] = (
            lambda c=c: captum_route(model, x, attr, target, bank, c))
    ours, ref = routes["ours"](), routes["captum: max_examples_per_batch=1024"]()
    rel = ((ours.double() - ref.double()).abs() / ref.double().abs()).max().item()
    finalists, _ = floor_sweep(floor, copies.shape[0], rounds, "wall", args.quick, lo=128)
    med = interleaved_medians({**routes, **finalists}, rounds, "wall")
    cap = min((k for k in med if k.startswith("captum")), key=med.get)
    fl = min((k for k in med if k.startswith("floor")), key=med.get)
    row = {"inputs": f"{b}x1x28x28", "squares": n, "ours": med["ours"], "captum": med[cap],
           "captum_setting": cap, "floor": med[fl], "floor_chunk": fl, "max_rel_diff": rel,
           "threads": torch.get_num_threads(), "allocator": allocator_label()}
    print_table(
        f"infidelity, square removal, {row['threads']} threads, allocator {row['allocator']} "
        f"(median seconds of {rounds} interleaved rounds)",
        [(row["inputs"], str(n), f"{med['ours']:.2f}", f"{med[cap]:.2f} ({cap[8:]})",
          f"{med[fl]:.2f} ({fl[7:]})", f"{med['ours'] / med[cap]:.2f}",
          f"{med['ours'] / med[fl]:.2f}", f"{rel:.1e}")],
        ("inputs", "squares", "ours", "captum (best)", "floor (best)", "ours/captum",
         "ours/floor", "max rel diff"))
    dump_json(args.json, row)
    return row


if __name__ == "__main__":
    main()
