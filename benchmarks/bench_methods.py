"""Speed of the seven attribution methods against Captum and against their real floors.

Same inputs, same process: a batch of ``--batch`` (32) random 1x28x28 images (``--occlusion-
batch``, 8, for the occlusion rows, whose 1x1 patches mean 784 copies per image) and a
C-sg-sized sigmoid CNN (Conv2d(1,16,5)-Sigmoid-AvgPool2d(2)-Conv2d(16,32,5)-Sigmoid-
AvgPool2d(2)-flatten-Linear(512,10)), float32. Every time is the median of ``--repeats``
calls, timed round-robin across the candidates of a row after two warm-up calls each (ours
measures its chunk size on the first call and times a few sizes in the first calls); a call
includes building the method object, for Captum and for us. The allocator is whatever the
process was started with: ``run_all.py`` runs this script once with glibc's default and
once with ``MALLOC_MMAP_THRESHOLD_``/``MALLOC_TRIM_THRESHOLD_`` raised, for every peer alike.

Columns:
* ``ours/captum``: our time over Captum's best time among the configurations tried (its
  default, and its chunking arguments at several sizes). Goal <= 1.0.
* ``ours/floor``: the passes a method cannot avoid, at the best chunk size of a fine sweep
  (``_timing.floor_sweep``: 2^1 grid, then 2^(1/8) around the best): IG/EG ``n * B``
  forward+backward rows (gradient w.r.t. the rows only); Occlusion a no-grad forward of
  every occluded copy (copies pre-built); GI, DeepLIFT and LRP one forward+backward of the
  ``B`` inputs. Goals: IG/EG <= 1.15x, Occlusion <= 1.1x.

Run: ``python benchmarks/bench_methods.py [--threads 1] [--quick] [--json out.json]``.
The default clock is process CPU time at one thread (stable on a shared machine; it counts
page faults, which are system time) and wall time otherwise.
"""
from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path

import numpy as np
import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).parent))
from _timing import CLOCKS, allocator_label, dump_json, floor_sweep, interleaved_medians


class CSg(nn.Module):
    """C-sg-sized sigmoid CNN (functional flatten, so Captum's LRP accepts it)."""

    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 16, 5), nn.Sigmoid(), nn.AvgPool2d(2),
            nn.Conv2d(16, 32, 5), nn.Sigmoid(), nn.AvgPool2d(2))
        self.fc = nn.Linear(512, 10)

    def forward(self, x):
        return self.fc(torch.flatten(self.features(x), 1))


def grad_floor(model, rows, target):
    """The whole forward+backward pass over ``rows`` in chunks of ``c`` (gradient w.r.t.
    the rows only), as a maker ``c -> callable``."""
    def run(c):
        def f():
            for a in range(0, rows.shape[0], c):
                r = rows[a:a + c].detach().requires_grad_(True)
                out = model(r).gather(1, target[a:a + c, None]).sum()
                torch.autograd.grad(out, r)
        return f
    return run


def forward_floor(model, rows):
    """The whole no-grad forward over ``rows`` in chunks of ``c``, as a maker."""
    def run(c):
        def f():
            with torch.no_grad():
                for a in range(0, rows.shape[0], c):
                    model(rows[a:a + c])
        return f
    return run


def chosen_chunks(model) -> list[dict]:
    """The chunk sizes taylorattr.runtime.batching chose for ``model`` (one per row shape/pass)."""
    from taylorattr.runtime import batching

    return [{"row": list(key[0]), "backward": key[4], "rows": plan.rows,
             "candidates": list(plan.candidates), "settled": plan.settled,
             "bytes_per_row": plan.bytes_per_row}
            for key, plan in batching._table(model).items()]


def occluded_copies(x, patch):
    """All occluded copies (zero baseline, stride = patch), sample-major."""
    _, _, h, w = x.shape
    copies = []
    for i in range(0, h, patch):
        for j in range(0, w, patch):
            c = x.clone()
            c[:, :, i:i + patch, j:j + patch] = 0
            copies.append(c)
    return torch.stack(copies, 1).reshape(-1, *x.shape[1:])


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=None, help="default 5 (3 with --quick)")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--occlusion-batch", type=int, default=8)
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--only", nargs="*", default=None, help="names of rows to run")
    p.add_argument("--threads", type=int, default=None,
                   help="torch.set_num_threads (default: leave torch's default)")
    p.add_argument("--clock", choices=sorted(CLOCKS), default=None,
                   help="default: cpu at one thread, wall otherwise")
    p.add_argument("--quick", action="store_true", help="3 repeats, 2^(1/4) floor sweep")
    p.add_argument("--json", default=None, help="write the results here")
    args = p.parse_args(argv)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    threads = torch.get_num_threads()
    clock = args.clock or ("cpu" if threads == 1 else "wall")
    R = args.repeats or (3 if args.quick else 5)

    import captum.attr as ca
    import captum.attr._core.lrp as captum_lrp

    import taylorattr as ta

    warnings.filterwarnings("ignore")
    # Captum's LRP passes relevance through ReLU/Tanh/Dropout only; Sigmoid is treated
    # the same way (identity for relevance) by adding it to that list.
    if nn.Sigmoid not in captum_lrp.SUPPORTED_NON_LINEAR_LAYERS:
        captum_lrp.SUPPORTED_NON_LINEAR_LAYERS.append(nn.Sigmoid)

    torch.manual_seed(0)
    model = CSg().eval()
    for prm in model.parameters():
        prm.requires_grad_(False)
    x = torch.rand(args.batch, 1, 28, 28)
    with torch.no_grad():
        target = model(x).argmax(1)
    xo, to = x[:args.occlusion_batch], target[:args.occlusion_batch]
    ref = torch.rand(100, 1, 28, 28)
    B, n = args.batch, args.steps
    print(f"torch {torch.__version__}, threads {threads}, allocator {allocator_label()}, batch "
          f"{B}x1x28x28 (occlusion {xo.shape[0]}), C-sg-sized sigmoid CNN, median of {R} "
          f"interleaved repeats, {clock} clock", flush=True)

    def one_pass():
        return {f"floor: chunk {B}": grad_floor(model, x, target)(B)}

    path_rows = torch.cat([a * x for a in torch.rand(n).tolist()])
    path_sweep = {}

    def path_floor():  # shared by IG and EG: the same n * B forward+backward rows
        if not path_sweep:
            path_sweep.update(zip(("finalists", "sweep"), floor_sweep(
                grad_floor(model, path_rows, target.repeat(n)), n * B, R, clock, args.quick)))
        return path_sweep

    def captum_ig(c=None):
        return lambda: ca.IntegratedGradients(model).attribute(
            x, target=target, n_steps=n, method="gausslegendre", internal_batch_size=c)

    def occlusion_row(patch, ppes):
        window = (1, patch, patch)
        fns = {"ours": lambda: ta.Occlusion(model).attribute(xo, 0.0, target=to, patch=patch)}
        for k in ppes:
            fns[f"captum: perturbations_per_eval={k}"] = (
                lambda k=k: ca.Occlusion(model).attribute(
                    xo, sliding_window_shapes=window, strides=window, baselines=0.0,
                    target=to, perturbations_per_eval=k))
        copies = occluded_copies(xo, patch)
        finalists, sweep = floor_sweep(forward_floor(model, copies), copies.shape[0], R,
                                       clock, args.quick)
        return {**fns, **finalists}, sweep

    rows = {
        "gradient_input": lambda: ({
            "ours": lambda: ta.GradientInput(model).attribute(x, target=target),
            "captum: InputXGradient": lambda: ca.InputXGradient(model).attribute(
                x, target=target),
            **one_pass()}, {}),
        "deeplift": lambda: ({
            "ours": lambda: ta.DeepLift(model).attribute(x, 0.0, target=target),
            "captum: DeepLift": lambda: ca.DeepLift(model).attribute(x, 0.0 * x,
                                                                     target=target),
            **one_pass()}, {}),
        "epsilon_lrp": lambda: ({
            "ours": lambda: ta.EpsilonLRP(model).attribute(x, target=target),
            "captum: LRP": lambda: ca.LRP(model).attribute(x, target=target),
            **one_pass()}, {}),
        f"integrated_gradients n={n}": lambda: ({
            "ours": lambda: ta.IntegratedGradients(model).attribute(
                x, 0.0, target=target, n_steps=n),
            "captum: default": captum_ig(),
            **{f"captum: internal_batch_size={c}": captum_ig(c) for c in (160, 400, 800)},
            **path_floor()["finalists"]}, path_floor()["sweep"]),
        f"expected_gradients n={n}": lambda: ({
            "ours": lambda: ta.ExpectedGradients(model).attribute(
                x, ref, target=target, n_samples=n),
            "captum: GradientShap default": lambda: _gradient_shap_chunked(
                ca, model, x, ref, target, n, None),
            **{f"captum: nt_samples_batch_size={k}": (
                lambda k=k: _gradient_shap_chunked(ca, model, x, ref, target, n, k))
               for k in (5, 10, 25)},
            **path_floor()["finalists"]}, path_floor()["sweep"]),
        "occlusion 1x1": lambda: occlusion_row(1, (8, 16, 64)),
        "occlusion 2x2": lambda: occlusion_row(2, (8, 16, 49)),
        "occlusion 4x4": lambda: occlusion_row(4, (10, 49)),
    }

    table = []
    for name, build in rows.items():
        if args.only and name.split()[0] not in args.only and name not in args.only:
            continue
        fns, sweep = build()
        med = interleaved_medians(fns, R, clock, warmup=2)
        cap_label = min((k for k in med if k.startswith("captum")), key=med.get)
        fl_label = min((k for k in med if k.startswith("floor")), key=med.get)
        table.append({"method": name, "ours": med["ours"], "captum": med[cap_label],
                      "captum_setting": cap_label[len("captum: "):], "floor": med[fl_label],
                      "floor_chunk": int(fl_label.rsplit(" ", 1)[1]),
                      "sweep": {str(k): v for k, v in sorted(sweep.items())}})
        detail = ", ".join(f"{k} {v * 1e3:.1f}" for k, v in med.items() if k != "ours")
        print(f"  {name}: ours {med['ours'] * 1e3:.1f} ms; {detail}", flush=True)

    print(f"\n{'method':<28}{'ours ms':>9}{'captum ms':>11}{'ours/captum':>13}"
          f"{'floor ms':>10}{'ours/floor':>12}")
    for r in table:
        print(f"{r['method']:<28}{r['ours'] * 1e3:9.1f}{r['captum'] * 1e3:11.1f}"
              f"{r['ours'] / r['captum']:13.2f}{r['floor'] * 1e3:10.1f}"
              f"{r['ours'] / r['floor']:12.2f}")
    chunks = chosen_chunks(model)
    for c in chunks:
        print(f"  our chunk for rows {tuple(c['row'])}, {'fwd+bwd' if c['backward'] else 'fwd'}: "
              f"{c['rows']} rows (candidates {c['candidates']}, settled {c['settled']}, "
              f"{c['bytes_per_row'] / 1024:.0f} KiB per row)")
    result = {"threads": threads, "allocator": allocator_label(), "clock": clock, "repeats": R,
              "rows": table, "chunks": chunks}
    dump_json(args.json, result)
    return result


def _gradient_shap_chunked(ca, model, x, ref, target, n, k):
    """Captum's GradientShap (``stdevs=0``), its NoiseTunnel chunked to ``k`` draws per
    call (``None``: all ``n`` at once, GradientShap's own default)."""
    from captum.attr._core.gradient_shap import InputBaselineXGradient

    np.random.seed(0)
    if k is None:
        return ca.GradientShap(model).attribute(x, ref, target=target, n_samples=n)
    nt = ca.NoiseTunnel(InputBaselineXGradient(model))
    return nt.attribute.__wrapped__(
        nt, x, nt_type="smoothgrad", nt_samples=n, nt_samples_batch_size=k, stdevs=0.0,
        draw_baseline_from_distrib=True, baselines=ref, target=target)


if __name__ == "__main__":
    main()
