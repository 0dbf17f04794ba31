"""Taylor mode on the issue-25 zoo: every model of ``tests/_zoo.py`` (torchvision and timm,
random weights, BatchNorm calibrated on random images, 64x64, float64), ``ta.smooth(model,
beta=10)``, order-2 group terms over 16 patches against float64 double backward (math SDPA
kernel). Prints one row per model: whether it runs, the largest relative error of the
per-group first order, the per-group order-1/2 expansions and the order-2 total, the
Taylor-mode seconds, and the cost of one order-2 pass in forward-pass equivalents per
direction per order (issue 25 aims at <= 3):

    forward_equivalents = t(order-2 pass, m directions) / (t(forward, batch m) * 2)

both timed in the same run on the same model (best of three after a warm-up).
``--models a,b``: a subset (names as in tests/_zoo.py, e.g. ``tv:resnet50``);
``--cost-only``: only the forward-equivalents of ViT-B/16, ResNet-50 and ConvNeXt-T.

**The expanded function** (issue 45), at batch 1 and 2 on every model
(``benchmarks/_expanded.py``): ``sm = ta.smooth(model, 10, inputs=x)`` as the user holds
it; the captured graph's ``f(x)`` against ``sm(x)``, the order-1 first order (series and
reverse sweep) against ``sm``'s forward-mode derivative (batch 2 and central differences
deciding), and ``sm.output_gap`` against ``|sm(x) - model(x)|`` measured here, each over
``1e-8`` relative; ``expanded_b1``/``expanded_b2``: the largest of them over its bound.
Beyond it without a ``ta.CompletenessWarning`` is a silent miss: the row says FAIL and the
exit status is 1.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parents[1] / "tests"))
from _expanded import expanded_function, silent, worst
from _timing import best_time, dump_json, print_table
from _zoo import FORWARD_REFERENCE, ZOO, build, check

import taylorattr as ta
from taylorattr.taylor.mode import propagate

COST_MODELS = ["tv:vit_b_16", "tv:resnet50", "tv:convnext_tiny"]




def forward_equivalents(model, size: int = 64, directions: int = 16, order: int = 2) -> float:
    """Seconds of one order-``order`` pass with ``directions`` directions over the seconds
    of a forward pass of ``directions`` samples, per order."""
    smoothed = ta.smooth(model, 10.0)
    x = torch.randn(1, 3, size, size, dtype=torch.float64)
    v = torch.randn(1, directions, 3, size, size, dtype=torch.float64)
    batch = x.expand(directions, -1, -1, -1).contiguous()
    with torch.no_grad():
        taylor = best_time(lambda: propagate(smoothed, x, v, order))
        forward = best_time(lambda: smoothed(batch))
    return taylor / forward / order


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=None)
    parser.add_argument("--cost-only", action="store_true")
    parser.add_argument("--json", default=None, help="write the rows to this file")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    names = COST_MODELS if args.cost_only else (args.models.split(",") if args.models else ZOO)
    rows = []
    for name in names:
        row = {"model": name}
        start = time.perf_counter()
        try:
            model = build(name)
            if not args.cost_only:
                errors, seconds = check(model, forward_reference=name in FORWARD_REFERENCE)
                row.update(runs="yes", max_rel_error=f"{max(errors.values()):.1e}",
                           taylor_s=f"{seconds:.1f}")
                for batch in (1, 2):
                    row.update(expanded(model, batch))
            if name in COST_MODELS:
                row["fwd_equiv_per_dir_per_order"] = f"{forward_equivalents(model):.2f}"
        except Exception as exc:  # noqa: BLE001 - a row says why a model does not run
            row.update(runs="no", why=f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}")
        row["total_s"] = f"{time.perf_counter() - start:.1f}"
        print(row, flush=True)
        rows.append(row)
    header = ("model", "runs", "max_rel_error", "taylor_s", "expanded_b1", "expanded_b2",
              "fwd_equiv_per_dir_per_order", "total_s", "why")
    print_table("Taylor mode on the zoo (order 2, 16 patches, float64)",
                [tuple(r.get(k, "") for k in header) for r in rows], header)
    dump_json(args.json, {"rows": rows})
    failed = [r["model"] for r in rows if "FAIL" in r.get("expanded_b1", "") + r.get("expanded_b2", "")]
    print(f"silent misses of the expanded function: {len(failed)} {failed}")
    return 1 if failed else 0


def expanded(model, batch: int, size: int = 64) -> dict:
    """The expanded-function check (module docstring) at ``batch``: one table cell."""
    g = torch.Generator().manual_seed(7)
    x = torch.randn(batch, 3, size, size, generator=g, dtype=torch.float64)
    base = 0.5 * torch.randn(x.shape, generator=g, dtype=torch.float64)
    sm = ta.smooth(model, 10.0, inputs=x)
    with torch.no_grad():
        target = sm(x).argmax(1)
    r = expanded_function(model, x, base, target, smoothed=sm)
    cell = f"{worst(r):.1e}" + (" warned" if r["warned"] else "") + (" FAIL" if silent(r) else "")
    return {f"expanded_b{batch}": cell}


if __name__ == "__main__":
    sys.exit(main())
