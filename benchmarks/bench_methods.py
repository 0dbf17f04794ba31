"""Speed of the seven attribution methods against Captum and against their floors.

Same inputs, same run: a batch of 32 random 1x28x28 images and a C-sg-sized sigmoid CNN
(Conv2d(1,16,5)-Sigmoid-AvgPool2d(2)-Conv2d(16,32,5)-Sigmoid-AvgPool2d(2)-flatten-
Linear(512,10)), float32, ``torch.set_num_threads`` left at its default. Every time is
the median of ``--repeats`` calls, timed round-robin across the candidates of a row after
one warm-up call each; a call includes building the
method object (``Method(model).attribute(...)``), for Captum and for us.

Columns:
* ``ours/captum``: our time over Captum's best time among the configurations tried
  (its default, and its chunking arguments set to sizes we tried for it); goal <= 1.0.
* ``floor``: the passes a method cannot avoid, run in the best chunk size found by a
  sweep: IG/EG ``n * B`` forward+backward rows (gradient w.r.t. the rows only);
  Occlusion a no-grad forward of every occluded copy (copies pre-built, so building them
  is not in the floor); GI, DeepLIFT and LRP one forward+backward of the ``B`` inputs
  (DeepLIFT also needs a baseline forward, which this floor leaves out).
  Goals: IG/EG <= 1.2x floor, Occlusion <= 1.1x.

Run: ``python benchmarks/bench_methods.py`` (a few minutes on 2 CPU cores). On a busy
machine wall times measure the neighbours as much as us; ``--threads 1 --clock cpu``
then gives stable ratios (process CPU time of one thread).
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
import warnings

import numpy as np
import torch
from torch import nn


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


CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}


def interleaved_medians(fns: dict, repeats: int, clock: str = "wall") -> dict:
    """Median seconds per callable, timing the callables round-robin (one warm-up each),
    so that a change of machine load during the run hits all of them alike."""
    now = CLOCKS[clock]
    for fn in fns.values():
        fn()
    times = {label: [] for label in fns}
    for _ in range(repeats):
        for label, fn in fns.items():
            t0 = now()
            fn()
            times[label].append(now() - t0)
    return {label: statistics.median(ts) for label, ts in times.items()}


def grad_floor_fns(model, rows, target, chunks) -> dict:
    def run(c):
        def f():
            for a in range(0, rows.shape[0], c):
                r = rows[a:a + c].detach().requires_grad_(True)
                out = model(r).gather(1, target[a:a + c, None]).sum()
                torch.autograd.grad(out, r)
        return f
    return {f"floor: chunk {c}": run(c) for c in chunks}


def forward_floor_fns(model, rows, chunks) -> dict:
    def run(c):
        def f():
            with torch.no_grad():
                for a in range(0, rows.shape[0], c):
                    model(rows[a:a + c])
        return f
    return {f"floor: chunk {c}": run(c) for c in chunks}


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


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--only", nargs="*", default=None, help="names of rows to run")
    p.add_argument("--threads", type=int, default=None,
                   help="torch.set_num_threads (default: leave torch's default)")
    p.add_argument("--clock", choices=sorted(CLOCKS), default="wall",
                   help="wall: perf_counter; cpu: process CPU time, which on a busy "
                        "machine with --threads 1 measures our work, not the neighbours'")
    args = p.parse_args(argv)
    if args.threads is not None:
        torch.set_num_threads(args.threads)

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
    ref = torch.rand(100, 1, 28, 28)
    B, n, R = args.batch, args.steps, args.repeats
    grad_chunks = [128, 192, 256, 320, 400]
    fwd_chunks = [192, 320, 384, 640, 1280]
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}, batch {B}x1x28x28, "
          f"C-sg-sized sigmoid CNN, median of {R} interleaved repeats, {args.clock} clock",
          flush=True)

    one_pass = grad_floor_fns(model, x, target, [B])
    path_rows = torch.cat([a * x for a in torch.rand(n).tolist()])
    path_floor = grad_floor_fns(model, path_rows, target.repeat(n), grad_chunks)

    def captum_ig(c=None):
        return lambda: ca.IntegratedGradients(model).attribute(
            x, target=target, n_steps=n, method="gausslegendre", internal_batch_size=c)

    def occlusion_row(patch, ppes):
        window = (1, patch, patch)
        fns = {"ours": lambda: ta.Occlusion(model).attribute(x, 0.0, target=target,
                                                             patch=patch)}
        for k in ppes:
            fns[f"captum: perturbations_per_eval={k}"] = (
                lambda k=k: ca.Occlusion(model).attribute(
                    x, sliding_window_shapes=window, strides=window, baselines=0.0,
                    target=target, perturbations_per_eval=k))
        fns.update(forward_floor_fns(model, occluded_copies(x, patch), fwd_chunks))
        return fns

    rows = {
        "gradient_input": {
            "ours": lambda: ta.GradientInput(model).attribute(x, target=target),
            "captum: InputXGradient": lambda: ca.InputXGradient(model).attribute(
                x, target=target),
            **one_pass},
        "deeplift": {
            "ours": lambda: ta.DeepLift(model).attribute(x, 0.0, target=target),
            "captum: DeepLift": lambda: ca.DeepLift(model).attribute(x, 0.0 * x,
                                                                     target=target),
            **one_pass},
        "epsilon_lrp": {
            "ours": lambda: ta.EpsilonLRP(model).attribute(x, target=target),
            "captum: LRP": lambda: ca.LRP(model).attribute(x, target=target),
            **one_pass},
        f"integrated_gradients n={n}": {
            "ours": lambda: ta.IntegratedGradients(model).attribute(
                x, 0.0, target=target, n_steps=n),
            "captum: default": captum_ig(),
            "captum: internal_batch_size=160": captum_ig(160),
            "captum: internal_batch_size=400": captum_ig(400),
            **path_floor},
        f"expected_gradients n={n}": {
            "ours": lambda: ta.ExpectedGradients(model).attribute(
                x, ref, target=target, n_samples=n),
            "captum: GradientShap default": lambda: _gradient_shap_chunked(
                ca, model, x, ref, target, n, None),
            "captum: nt_samples_batch_size=5": lambda: _gradient_shap_chunked(
                ca, model, x, ref, target, n, 5),
            **path_floor},
        "occlusion 1x1": occlusion_row(1, (8, 16)),
        "occlusion 2x2": occlusion_row(2, (8, 16)),
        "occlusion 4x4": occlusion_row(4, (10, 49)),
    }

    table = []
    for name, fns in rows.items():
        if args.only and name.split()[0] not in args.only and name not in args.only:
            continue
        med = interleaved_medians(fns, R, args.clock)
        ours = med["ours"]
        cap_label = min((k for k in med if k.startswith("captum")), key=med.get)
        fl_label = min((k for k in med if k.startswith("floor")), key=med.get)
        table.append((name, ours, med[cap_label], med[fl_label]))
        detail = ", ".join(f"{k} {v * 1e3:.1f}" for k, v in med.items() if k != "ours")
        print(f"  {name}: ours {ours * 1e3:.1f} ms; {detail}", flush=True)

    print()
    print(f"{'method':<28}{'ours ms':>9}{'captum ms':>11}{'ours/captum':>13}"
          f"{'floor ms':>10}{'ours/floor':>12}")
    for name, ours, cap, fl in table:
        print(f"{name:<28}{ours * 1e3:9.1f}{cap * 1e3:11.1f}{ours / cap:13.2f}"
              f"{fl * 1e3:10.1f}{ours / fl:12.2f}")
    return 0


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
    sys.exit(main())
