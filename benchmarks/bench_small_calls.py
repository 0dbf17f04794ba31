"""Small calls (issue 43/47): Saliency, Integrated Gradients, Input x Gradient and Guided
Backprop at batch 1 on a small MLP and a small CNN, taylorattr against Captum, timed
interleaved call by call in one process (a change of load hits both alike), so what shows
is each library's per-call work beyond the model's own forward and backward.

Ratio: ours / Captum of the median wall time. The per-call work of a call (argument checks,
the one forward, conventions, the result value) is paid on every call; what depends only on
the model and shapes is cached on the method (``methods/_pipeline.py: _once``).
History (2 shared cores, load 5-7, 400 calls each): before the explicit contract (issue
47) ours/Captum was 1.45 / 1.31 / 1.42 (MLP: Saliency / IG / InputXGradient) and 1.31 /
1.31 / 1.30 (CNN); after it 1.30 / 1.23 / 1.27 and 1.21 / 1.25 / 1.20. What remains is
mostly value checks Captum does not make: three finiteness checks (inputs, output,
attributions: about 5 us each) and, for IG, its completeness check. Guided Backprop (load
5.3-5.5, two runs each, 400 calls): 0.89-0.91 (MLP) and 0.91-0.94 (CNN) before its ReLU
list was cached per model and in-place-free ReLUs took one hook instead of two, 0.91-0.93
and 0.92-0.93 after: the saving (about 2 us of lookup and 5 us of hooks for the CNN's two
ReLUs) is within the noise of a 200-430 us call; the other rows are unchanged (1.21-1.31).
``--json PATH`` writes the rows; ``--quick``: 100 interleaved calls instead of 400.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
import warnings
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).parent))
from _timing import dump_json, print_table


def _models():
    torch.manual_seed(0)
    mlp = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 10)).eval()
    cnn = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                        nn.Conv2d(8, 8, 3, padding=1), nn.ReLU(), nn.Flatten(),
                        nn.Linear(8 * 8 * 8, 10)).eval()
    return {"mlp": (mlp, torch.randn(1, 32)), "cnn": (cnn, torch.randn(1, 3, 16, 16))}


def _pairs(model, x):
    import captum.attr as ca

    import taylorattr.methods as M

    ig = {"n_steps": 20, "method": "riemann_trapezoid"}
    ours = {"saliency": M.Saliency(model), "ig": M.IntegratedGradients(model),
            "input_x_gradient": M.GradientInput(model),
            "guided_backprop": M.GuidedBackprop(model)}
    theirs = {"saliency": ca.Saliency(model), "ig": ca.IntegratedGradients(model),
              "input_x_gradient": ca.InputXGradient(model),
              "guided_backprop": ca.GuidedBackprop(model)}
    return {
        "saliency": (lambda: ours["saliency"].attribute(x, target=3),
                     lambda: theirs["saliency"].attribute(x, target=3)),
        "ig": (lambda: ours["ig"].attribute(x, 0.0, target=3, **ig),
               lambda: theirs["ig"].attribute(x, 0.0 * x, target=3, **ig)),
        "input_x_gradient": (lambda: ours["input_x_gradient"].attribute(x, target=3),
                             lambda: theirs["input_x_gradient"].attribute(x, target=3)),
        "guided_backprop": (lambda: ours["guided_backprop"].attribute(x, target=3),
                            lambda: theirs["guided_backprop"].attribute(x, target=3)),
    }


def main(argv=None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--json", default=None)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    repeats = 100 if args.quick else 400
    rows = []
    warnings.simplefilter("ignore")  # Captum's note on inputs without requires_grad
    for label, (model, x) in _models().items():
        for name, (ours, theirs) in _pairs(model, x).items():
            for _ in range(20):
                ours(), theirs()
            t_ours, t_theirs = [], []
            for _ in range(repeats):
                t0 = time.perf_counter()
                ours()
                t1 = time.perf_counter()
                theirs()
                t2 = time.perf_counter()
                t_ours.append(t1 - t0)
                t_theirs.append(t2 - t1)
            a, b = statistics.median(t_ours), statistics.median(t_theirs)
            rows.append({"model": label, "method": name, "ours_us": a * 1e6,
                         "captum_us": b * 1e6, "ratio": a / b})
    print_table("Batch-1 calls, ours / Captum (interleaved, 1 thread)",
                [(r["model"], r["method"], f"{r['ours_us']:.0f}", f"{r['captum_us']:.0f}",
                  f"{r['ratio']:.2f}") for r in rows],
                ("model", "method", "ours us", "Captum us", "ratio"))
    dump_json(args.json, {"rows": rows})
    return rows


if __name__ == "__main__":
    main()
