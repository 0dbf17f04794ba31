"""Run every benchmark under both allocator settings (``make bench``).

Each script runs in its own subprocess, once with glibc's default allocator and once with
``MALLOC_MMAP_THRESHOLD_=2000000000 MALLOC_TRIM_THRESHOLD_=4000000000`` (what
``taylorattr.tune_allocator()`` does from inside), so every peer (Captum, the Hessian
routes, the floors) runs under the same setting as ours. The method table runs at 1 and 2
threads. ``--quick`` (about 10 minutes on 2 busy cores) uses fewer repeats, a 2^(1/4)
floor sweep, C-sg only in the Taylor table and the memory check under the default
allocator only. The engine table (``bench_engines.py``: DeepLIFT, DeepLiftShap, LRP,
AttnLRP, Taylor mode, IG and Saliency beside Captum, Zennit, lxt and the floor) runs once,
under the default allocator. At the end: one table of every ratio with its goal; the full run then adds
the interaction peers (path_explain, shapiq; the ``bench`` extra), the cost estimates, the
Shapley peers (SHAP, shapiq, path_explain: bench_shapley.py), the layer-wise zoo
(DeepLIFT/LRP on 23 architectures, ``layerwise_zoo.py``) and DeepLIFT's completeness on
the 32-model zoo (``zoo_completeness.py``: a silent miss fails the run).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).parent
TUNED = {"MALLOC_MMAP_THRESHOLD_": "2000000000", "MALLOC_TRIM_THRESHOLD_": "4000000000"}
GOALS = {"integrated": 1.15, "expected": 1.15, "occlusion": 1.1}


def run(script: str, allocator: str, extra: list[str], quick: bool) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    if allocator == "tuned":
        env.update(TUNED)
    src = str(HERE.parent / "src")
    env["PYTHONPATH"] = os.pathsep.join([src] + [p for p in [env.get("PYTHONPATH")] if p])
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "out.json"
        cmd = [sys.executable, str(HERE / script), *extra, "--json", str(out)]
        cmd += ["--quick"] if quick else []
        print(f"\n# {script} {' '.join(extra)} [allocator {allocator}]", flush=True)
        subprocess.run(cmd, env=env, check=True)
        return json.loads(out.read_text())


def summary(methods: list[dict]) -> None:
    print("\n# Summary: ours vs Captum at its best setting and vs the floor (best of a fine "
          "chunk sweep), same allocator and threads")
    print(f"{'method':<28}{'alloc':>8}{'thr':>4}{'ours ms':>9}{'captum ms':>10}{'o/captum':>9}"
          f"{'floor ms':>9}{'chunk':>6}{'o/floor':>8}  goals")
    for res in methods:
        for r in res["rows"]:
            goal = next((g for k, g in GOALS.items() if r["method"].startswith(k)), None)
            oc, of = r["ours"] / r["captum"], r["ours"] / r["floor"]
            met = [f"captum {'ok' if oc <= 1.0 else 'MISSED'}"]
            if goal:
                met.append(f"floor<={goal} {'ok' if of <= goal else 'MISSED'}")
            print(f"{r['method']:<28}{res['allocator']:>8}{res['threads']:>4}"
                  f"{r['ours'] * 1e3:9.1f}{r['captum'] * 1e3:10.1f}{oc:9.2f}"
                  f"{r['floor'] * 1e3:9.1f}{r['floor_chunk']:>6}{of:8.2f}  {', '.join(met)}")


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true")
    args = p.parse_args(argv)
    start = time.perf_counter()
    methods, others = [], []
    for allocator in ("default", "tuned"):
        for threads in (1, 2):
            methods.append(run("bench_methods.py", allocator, ["--threads", str(threads)],
                               args.quick))
        others.append(run("bench_metrics.py", allocator, [], args.quick))
        others.append(run("bench_taylor.py", allocator, [], args.quick))
        if allocator == "default" or not args.quick:
            others.append(run("bench_memory.py", allocator, [], False))
    summary(methods)
    run("bench_engines.py", "default", [], args.quick)  # the engine table (issue 43)
    if not args.quick:  # the peers of issues 14 and 20, once, under the default allocator
        for script in ("bench_interactions.py", "bench_cost.py", "bench_shapley.py",
                       "bench_cli_start.py", "layerwise_zoo.py", "bench_taylor_zoo.py",
                       "zoo_completeness.py", "bench_llm.py"):
            print(f"\n# {script}", flush=True)
            subprocess.run([sys.executable, str(HERE / script)], check=True,
                           env={**os.environ, "PYTHONPATH": str(HERE.parent / "src")})
    print(f"\nmake bench took {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
