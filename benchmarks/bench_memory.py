"""Peak memory of Integrated Gradients with many steps on 3x224x224: ours vs Captum.

IG with 200 Gauss-Legendre steps on a batch of ``--batch`` (1) random 3x224x224 images,
torchvision's resnet18 with random weights (eval mode, float32), target 0. Each route runs
in a fresh subprocess; its peak resident set size is ``resource.getrusage`` ``ru_maxrss``
of that process, and ``baseline`` is the same process's RSS after building the model and
running one forward (the runtime and weights, common to both routes). Ours runs under an
explicit budget (``taylorattr.runtime.batching.memory_budget``, ``--budget``, default 512 MB: each
chunk's tensors stay under it); Captum runs at its default (``internal_batch_size=None``:
all ``200 * B`` path rows in one forward+backward). Goal: our peak - baseline <= budget,
and below Captum's.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from _timing import allocator_label, dump_json, print_table


def _rss_now_mb() -> float:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def _child(route: str, batch: int, steps: int, budget: str) -> None:
    import torch
    import torchvision

    torch.manual_seed(0)
    model = torchvision.models.resnet18(weights=None).eval()
    for prm in model.parameters():
        prm.requires_grad_(False)
    x = torch.rand(batch, 3, 224, 224)
    with torch.no_grad():
        model(x)
    base = _rss_now_mb()
    start = time.perf_counter()
    if route == "ours":
        import taylorattr as ta
        from taylorattr.runtime.batching import memory_budget

        with memory_budget(budget):
            ta.IntegratedGradients(model).attribute(x, 0.0, target=0, n_steps=steps)
        from taylorattr.runtime import batching
        chunk = [p.rows for p in batching._table(model).values()]
    else:
        from captum.attr import IntegratedGradients

        IntegratedGradients(model).attribute(x, torch.zeros_like(x), target=0, n_steps=steps,
                                             method="gausslegendre")
        chunk = [steps * batch]
    seconds = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
    print(json.dumps({"route": route, "peak_mb": peak, "baseline_mb": base,
                      "seconds": seconds, "chunk_rows": chunk}))


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--budget", default="512MB")
    p.add_argument("--json", default=None)
    p.add_argument("--child", choices=("ours", "captum"), default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        _child(args.child, args.batch, args.steps, args.budget)
        return {}
    from taylorattr.runtime.batching import parse_memory

    res = {}
    for route in ("ours", "captum"):
        out = subprocess.run([sys.executable, __file__, "--child", route, "--batch",
                              str(args.batch), "--steps", str(args.steps), "--budget",
                              args.budget], check=False, capture_output=True, text=True)
        if out.returncode != 0:  # e.g. killed for memory: report it, do not hide it
            res[route] = {"route": route, "error": f"exit {out.returncode}: "
                          f"{out.stderr.strip().splitlines()[-1:]}"}
            continue
        res[route] = json.loads(out.stdout.strip().splitlines()[-1])
    budget_mb = parse_memory(args.budget) / 2**20
    rows = [(r, f"{v['peak_mb']:.0f}", f"{v['peak_mb'] - v['baseline_mb']:.0f}",
             f"{v['seconds']:.1f}", str(v["chunk_rows"])) if "error" not in v
            else (r, v["error"], "", "", "") for r, v in res.items()]
    print_table(f"IG {args.steps} steps, resnet18 (random weights), batch {args.batch}x3x224x224,"
                f" allocator {allocator_label()}; our budget {args.budget} "
                f"({budget_mb:.0f} MiB)", rows,
                ("route", "peak RSS MiB", "peak - baseline MiB", "seconds", "rows per call"))
    result = {"allocator": allocator_label(), "budget_mb": budget_mb, "steps": args.steps,
              "batch": args.batch, **res}
    dump_json(args.json, result)
    return result


if __name__ == "__main__":
    main()
