"""Estimated vs measured seconds for stages of different kinds (issue 20).

Each stage's rows are counted from its plan (:mod:`taylorattr.runtime.cost`, no model run), turned
into seconds from a timed probe batch on the same model and device
(:func:`taylorattr.runtime.cost.measure_rates`), then the stage runs once and is timed. Stages:

* forward rows: Occlusion (patch 4) on torchvision's ResNet-18 (random weights), 2 images
  of 3x64x64, and infidelity (1x1 square removal) on 2 images of 3x32x32;
* backward rows: Integrated Gradients (32 steps) on ResNet-18, 2 images of 3x64x64;
* Taylor-mode rows: ``taylor_terms`` of order 2 on a Softplus CNN, 2 samples of 3x16x16.

Goal: measured / estimated within a factor of 2. ``--json PATH`` writes the rows.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).parent))
from _timing import dump_json, print_table

from taylorattr.methods import IntegratedGradients, Occlusion
from taylorattr.metrics import infidelity, infidelity_cost
from taylorattr.runtime.cost import estimate
from taylorattr.taylor.mode import timing_pass
from taylorattr.taylor.terms import taylor_terms, taylor_terms_cost


def resnet18():
    from torchvision.models import resnet18 as build

    torch.manual_seed(0)
    return build(num_classes=10).eval()


def softplus_cnn():
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.Softplus(), nn.AvgPool2d(2),
                         nn.Conv2d(8, 16, 3, padding=1), nn.Softplus(), nn.Flatten(),
                         nn.Linear(16 * 8 * 8, 10)).eval()


def run_stage(label, cost, model, x, fn):
    est = estimate(cost.labelled(label), model, x,
                   taylor_pass=timing_pass(model) if cost.taylor_rows else None)
    start = time.perf_counter()
    fn()
    measured = time.perf_counter() - start
    return {"stage": label, "rows": est.rows, "estimated_s": round(est.seconds, 2),
            "measured_s": round(measured, 2), "ratio": round(measured / est.seconds, 2),
            "message": est.describe()}


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    torch.manual_seed(0)
    rows = []
    net = resnet18()
    x = torch.rand(2, 3, 64, 64)
    occ = Occlusion(net)
    rows.append(run_stage("Occlusion-4x4 resnet18", occ.cost(x, patch=4), net, x,
                          lambda: occ.attribute(x, patch=4)))
    ig = IntegratedGradients(net)
    rows.append(run_stage("IG-32 resnet18", ig.cost(x, n_steps=32), net, x,
                          lambda: ig.attribute(x, n_steps=32)))
    xi = torch.rand(2, 3, 32, 32)
    a = torch.randn_like(xi)
    rows.append(run_stage("infidelity 1x1 squares resnet18", infidelity_cost(xi, max_side=1),
                          net, xi, lambda: infidelity(net, xi, a, max_side=1)))
    cnn = softplus_cnn()
    xs = torch.rand(2, 3, 16, 16)
    rows.append(run_stage("taylor_terms order 2 cnn", taylor_terms_cost(xs, 0.0, 2), cnn, xs,
                          lambda: taylor_terms(cnn, xs, 0.0, order=2)))
    keys = ("stage", "rows", "estimated_s", "measured_s", "ratio")
    print_table(f"estimate vs measured ({torch.get_num_threads()} threads, cpu)",
                [tuple(r[k] for k in keys) for r in rows], keys)
    for r in rows:
        print(r["message"])
    dump_json(args.json, {"rows": rows})


if __name__ == "__main__":
    main()
