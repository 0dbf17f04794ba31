"""Infidelity with square removal: ours vs Captum on the same perturbation set.

Batch 8 of 1x28x28 inputs on a C-sg-sized sigmoid CNN, float32, all 5,605 squares of
side 1..10 (Yeh et al.). Captum gets the same squares, in the same order, through a
vectorised ``perturb_func`` whose indicator bank is built before timing (in its
favour), and the same number of perturbed copies per forward pass as ours
(``max_examples_per_batch`` = ``batch_size``). The floor is the model alone on all
``5,605 * B`` perturbed copies, pre-built, in chunks of the same size. The three routes
are interleaved round by round so that load on the machine hits them alike; the table
gives medians. Goal: ours / captum <= 1.
"""
from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

import torch
from captum.metrics import infidelity as captum_infidelity
from torch import nn

sys.path.insert(0, str(Path(__file__).parent))
from _timing import print_table

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


def main(batch: int = 8, chunk: int = 1024, rounds: int = 3) -> list[tuple]:
    torch.manual_seed(0)
    model = c_sg()
    x = torch.rand(batch, 1, 28, 28)
    attr = torch.randn(batch, 1, 28, 28) * 1e-2
    target = torch.arange(batch) % 10
    bank = square_bank(28, 28, 10)
    n = bank.shape[0]
    copies = (x[:, None] * (1 - bank[None])).reshape(batch * n, 1, 28, 28)

    def floor():
        with torch.no_grad():
            for i in range(0, copies.shape[0], chunk):
                model(copies[i:i + chunk])

    routes = {
        "ours": lambda: infidelity(model, x, attr, target=target, batch_size=chunk),
        "captum": lambda: captum_route(model, x, attr, target, bank, chunk),
        "floor": floor,
    }
    ours, ref = routes["ours"](), routes["captum"]()  # warm-up, and the agreement check
    rel = ((ours.double() - ref.double()).abs() / ref.double().abs()).max().item()
    times = {k: [] for k in routes}
    for _ in range(rounds):
        for name, fn in routes.items():
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    med = {k: statistics.median(v) for k, v in times.items()}
    rows = [(
        f"{batch}x1x28x28", str(n), f"{med['ours']:.2f}", f"{med['captum']:.2f}",
        f"{med['floor']:.2f}", f"{med['ours'] / med['captum']:.2f}",
        f"{med['ours'] / med['floor']:.2f}", f"{rel:.1e}",
    )]
    print_table(
        f"infidelity, square removal, {torch.get_num_threads()} threads, chunk {chunk} "
        f"(median seconds of {rounds} interleaved rounds)", rows,
        ("inputs", "squares", "ours", "captum", "floor", "ours/captum", "ours/floor",
         "max rel diff"),
    )
    return rows


if __name__ == "__main__":
    main()
