"""taylorattr against Captum on a GPU: ``make bench-gpu`` (issue 34).

Every Captum method that applies to an image classifier, called through
``taylorattr.captum.attr`` and ``captum.attr`` with the same arguments, on torchvision
ResNet-50 and ViT-B/16 with random weights (the ViT head re-initialised: torchvision
zero-initialises it), batch 16 at 3x224x224; then the native DeepLIFT (complete where
Captum's is not), EpsilonLRP and Taylor mode (order-2 terms over 16 patches). Float32 and
bfloat16. Then the engine table of ``benchmarks/bench_engines.py`` on the same device
(DeepLIFT, DeepLiftShap, LRP, AttnLRP against lxt, Taylor mode, IG, Saliency on ResNet-18/50,
ViT-B/16, Swin-T and a Llama config; ``--no-engines`` leaves it out). Per row: median seconds (after one warm-up), peak CUDA memory above the start
(``torch.cuda.max_memory_allocated``), the ratio to Captum, and the largest difference
``max |a - a_captum| / max |a_captum|``.

Both libraries run in the same process with the same allocator (``PYTORCH_CUDA_ALLOC_CONF``
as printed; the default caching allocator when unset) and the same TF32 settings (PyTorch's
defaults: cuDNN convolutions in TF32, matmuls not), printed at the top. Sized to finish in
under 5 minutes on one H100/H200 (``--repeats 2``); the perturbation methods use 16x16
patches and few samples so that they stay within that.

usage: python benchmarks/bench_gpu.py [--dtypes float32,bfloat16] [--json out.json]
       python benchmarks/bench_gpu.py --device cpu --quick   (a check that the script runs)
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import traceback
import warnings

import torch


def _args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--quick", action="store_true",
                   help="tiny sizes (32x32, batch 2, few steps): checks the script, no timings")
    p.add_argument("--size", type=int, default=None)
    p.add_argument("--batch", type=int, default=None)
    p.add_argument("--repeats", type=int, default=None)
    p.add_argument("--models", default="resnet50,vit_b_16")
    p.add_argument("--dtypes", default="float32,bfloat16")
    p.add_argument("--only", default="", help="comma-separated case names (first word)")
    p.add_argument("--json", default=None)
    p.add_argument("--no-engines", action="store_true",
                   help="leave out the engine table (bench_engines.py on this device)")
    a = p.parse_args(argv)
    a.size = a.size or (32 if a.quick else 224)
    a.batch = a.batch or (2 if a.quick else 16)
    a.repeats = a.repeats or (1 if a.quick else 2)
    return a


class Bench:
    def __init__(self, args):
        self.args = args
        self.dev = torch.device(args.device)
        self.cuda = self.dev.type == "cuda"
        self.rows: list[dict] = []

    def sync(self):
        if self.cuda:
            torch.cuda.synchronize(self.dev)

    def timed(self, fn0):
        """(median seconds, peak MiB above the start, last result) after one warm-up. The
        global generators are reseeded before every call, so both libraries draw the same
        numbers (Captum draws from them; the drop-in draws as Captum does)."""
        import numpy as np

        def fn():
            torch.manual_seed(0)
            np.random.seed(0)
            return fn0()

        out = fn()
        self.sync()
        times, peak = [], 0.0
        for _ in range(self.args.repeats):
            if self.cuda:
                torch.cuda.reset_peak_memory_stats(self.dev)
                base = torch.cuda.memory_allocated(self.dev)
            start = time.perf_counter()
            out = fn()
            self.sync()
            times.append(time.perf_counter() - start)
            if self.cuda:
                peak = max(peak, (torch.cuda.max_memory_allocated(self.dev) - base) / 2**20)
        return statistics.median(times), peak, out

    def wanted(self, label):
        return not self.args.only or label.split()[0] in self.args.only.split(",")

    def record(self, row):
        self.rows.append(row)
        print(json.dumps(row), flush=True)

    def pair(self, model, dtype, label, make):
        """``make(lib)`` -> zero-argument call; lib is captum.attr or taylorattr.captum.attr."""
        if not self.wanted(label):
            return
        import captum.attr as C

        import taylorattr.captum.attr as T

        row = {"model": model, "dtype": dtype, "case": label}
        res = {}
        for key, lib in (("captum", C), ("ours", T)):
            try:
                row[f"{key}_s"], row[f"{key}_MiB"], res[key] = self.timed(make(lib))
            except Exception as exc:  # noqa: BLE001 - a refusal is a row of the table
                row[f"{key}_err"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:120]}"
            if self.cuda:
                torch.cuda.empty_cache()
        if "ours_s" in row and "captum_s" in row:
            row["ratio"] = row["ours_s"] / row["captum_s"]
            a, b = (_first(res[k]).double() for k in ("ours", "captum"))
            row["rel_diff"] = float((a - b).abs().max() / b.abs().max().clamp_min(1e-30))
        self.record(row)

    def native(self, model, dtype, label, fn):
        if not self.wanted(label):
            return
        row = {"model": model, "dtype": dtype, "case": label}
        try:
            row["ours_s"], row["ours_MiB"], extra = self.timed(fn)
            row.update(extra or {})
        except Exception as exc:  # noqa: BLE001
            row["ours_err"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}"
            traceback.print_exc(limit=2)
        if self.cuda:
            torch.cuda.empty_cache()
        self.record(row)


def _first(out):
    return out[0] if isinstance(out, tuple) else out


def build(name, args, dev, dtype):
    import torchvision

    torch.manual_seed(0)
    kw = {"image_size": args.size} if name.startswith("vit") else {}
    m = getattr(torchvision.models, name)(weights=None, **kw).eval()
    if hasattr(m, "heads"):  # torchvision zero-initialises the ViT head: outputs all 0
        torch.nn.init.normal_(m.heads.head.weight, std=0.02)
    m = m.to(dev, dtype)
    x = torch.randn(args.batch, 3, args.size, args.size, device=dev, dtype=dtype,
                    generator=torch.Generator(device=dev).manual_seed(1))
    with torch.no_grad():
        t = m(x).argmax(1)
    return m, x, t


def run_model(bench, name, dtype_name):
    import taylorattr as ta

    args, dev = bench.args, bench.dev
    dtype = getattr(torch, dtype_name)
    m, x, t = build(name, args, dev, dtype)
    zero = torch.zeros_like(x)
    steps = 4 if args.quick else 50
    ibs = 8 * args.batch  # Captum's rows per call as a user would set them
    patch = max(1, args.size // 14)  # 16x16 at 224
    mask = (torch.arange(args.size // patch, device=dev).repeat_interleave(patch)
            [:, None] * (args.size // patch)
            + torch.arange(args.size // patch, device=dev).repeat_interleave(patch)[None])
    mask = mask.repeat(1, 3, 1, 1)  # [1, 3, H, W]: one player per patch, all channels
    refs = torch.randn(4, *x.shape[1:], device=dev, dtype=dtype,
                       generator=torch.Generator(device=dev).manual_seed(2))
    P = bench.pair
    P(name, dtype_name, "Saliency", lambda L: lambda: L.Saliency(m).attribute(x, target=t))
    P(name, dtype_name, "InputXGradient",
      lambda L: lambda: L.InputXGradient(m).attribute(x, target=t))
    P(name, dtype_name, f"IntegratedGradients n={steps} ibs={ibs}",
      lambda L: lambda: L.IntegratedGradients(m).attribute(
          x, zero, target=t, n_steps=steps, internal_batch_size=ibs))
    P(name, dtype_name, f"IntegratedGradients n={steps} (ours: default chunks)",
      lambda L: lambda: L.IntegratedGradients(m).attribute(
          x, zero, target=t, n_steps=steps,
          **({"internal_batch_size": ibs} if L.__name__.startswith("captum") else {})))
    P(name, dtype_name, "GradientShap n=20", lambda L: lambda: L.GradientShap(m).attribute(
        x, refs, target=t, n_samples=4 if args.quick else 20))
    P(name, dtype_name, "DeepLift", lambda L: lambda: L.DeepLift(m).attribute(
        x, zero, target=t))
    P(name, dtype_name, "DeepLiftShap", lambda L: lambda: L.DeepLiftShap(m).attribute(
        x, refs, target=t))
    P(name, dtype_name, "GuidedBackprop",
      lambda L: lambda: L.GuidedBackprop(m).attribute(x, target=t))
    P(name, dtype_name, "Deconvolution",
      lambda L: lambda: L.Deconvolution(m).attribute(x, target=t))
    P(name, dtype_name, "LRP", lambda L: lambda: L.LRP(m).attribute(x, target=t))
    P(name, dtype_name, f"Occlusion {patch}x{patch}", lambda L: lambda: L.Occlusion(m).attribute(
        x, sliding_window_shapes=(3, patch, patch), strides=(3, patch, patch), target=t,
        perturbations_per_eval=64))
    P(name, dtype_name, f"FeatureAblation {patch}x{patch}",
      lambda L: lambda: L.FeatureAblation(m).attribute(
          x, target=t, feature_mask=mask, perturbations_per_eval=64))
    P(name, dtype_name, "ShapleyValueSampling n=2",
      lambda L: lambda: L.ShapleyValueSampling(m).attribute(
          x, target=t, feature_mask=mask, n_samples=2, perturbations_per_eval=64))
    P(name, dtype_name, "KernelShap n=64", lambda L: lambda: L.KernelShap(m).attribute(
        x[:2], target=t[:2], feature_mask=mask, n_samples=64, perturbations_per_eval=64))
    P(name, dtype_name, "Lime n=64", lambda L: lambda: L.Lime(m).attribute(
        x[:2], target=t[:2], feature_mask=mask, n_samples=64, perturbations_per_eval=64))
    P(name, dtype_name, "NoiseTunnel(Saliency) n=10",
      lambda L: lambda: L.NoiseTunnel(L.Saliency(m)).attribute(
          x, nt_type="smoothgrad", nt_samples=10, stdevs=0.1, target=t))

    def deeplift():
        _, d = ta.DeepLift(m).attribute(x, zero, target=t, return_convergence_delta=True)
        with torch.no_grad():
            df = (m(x) - m(zero)).gather(1, t[:, None])[:, 0].double()
        return {"delta_over_df": float(d.double().abs().max() / df.abs().max())}

    bench.native(name, dtype_name, "native DeepLift (complete)", deeplift)
    bench.native(name, dtype_name, "native EpsilonLRP",
                 lambda: (ta.EpsilonLRP(m).attribute(x, target=t), {})[1])
    sm = ta.smooth(m, 10.0)
    side = args.size // 4
    ids = (torch.arange(16, device=dev).view(4, 4).repeat_interleave(side, 0)
           .repeat_interleave(side, 1).expand(3, args.size, args.size))

    def taylor():
        tt = ta.taylor_terms(sm, x[:4], baselines=0.0, target=t[:4], order=2, groups=ids)
        return {"err_share": float((tt.error.abs() / tt.output_change.abs()
                                    .clamp_min(1e-12)).median())}

    bench.native(name, dtype_name, "native taylor_terms order=2 16 groups B=4", taylor)

    def forward():
        with torch.no_grad():
            m(x)

    bench.native(name, dtype_name, f"forward B={args.batch} (for scale)",
                 lambda: (forward(), {})[1])


def table(rows):
    print("\n| model | dtype | case | ours s | Captum s | ratio | peak MiB ours / Captum | "
          "max rel. diff |\n|---|---|---|---|---|---|---|---|")
    for r in rows:
        ours = f"{r['ours_s']:.4f}" if "ours_s" in r else f"refused ({r.get('ours_err', '')[:60]})"
        cap = (f"{r['captum_s']:.4f}" if "captum_s" in r else
               (f"refused ({r['captum_err'][:60]})" if "captum_err" in r else "-"))
        ratio = f"{r['ratio']:.2f}" if "ratio" in r else "-"
        mem = f"{r.get('ours_MiB', 0):,.0f} / " + (f"{r['captum_MiB']:,.0f}"
                                                   if "captum_MiB" in r else "-")
        diff = (f"{r['rel_diff']:.1e}" if "rel_diff" in r else
                ", ".join(f"{k} {v:.2g}" for k, v in r.items()
                          if k in ("delta_over_df", "err_share")))
        print(f"| {r['model']} | {r['dtype']} | {r['case']} | {ours} | {cap} | {ratio} | "
              f"{mem} | {diff} |")


def main(argv=None) -> int:
    args = _args(argv)
    if torch.device(args.device).type == "cuda" and not torch.cuda.is_available():
        print("bench-gpu: CUDA is not available on this machine (torch.cuda.is_available() is "
              "False); run it on a machine with an NVIDIA GPU, or check the script here with "
              "`python benchmarks/bench_gpu.py --device cpu --quick`", file=sys.stderr)
        return 2
    try:
        import captum.attr  # noqa: F401
    except ImportError:
        print("bench-gpu: captum is not installed: pip install -e '.[oracle]'", file=sys.stderr)
        return 2
    warnings.filterwarnings("ignore")
    bench = Bench(args)
    device = (torch.cuda.get_device_name(bench.dev) if bench.cuda else "cpu")
    print(f"# taylorattr vs Captum on {device}, torch {torch.__version__}; batch {args.batch} at "
          f"3x{args.size}x{args.size}; median of {args.repeats} after one warm-up")
    print(f"# allocator: PYTORCH_CUDA_ALLOC_CONF="
          f"{os.environ.get('PYTORCH_CUDA_ALLOC_CONF', '(unset: the default caching allocator)')}"
          f" for both libraries; TF32: cudnn {torch.backends.cudnn.allow_tf32}, matmul "
          f"{torch.backends.cuda.matmul.allow_tf32}", flush=True)
    start = time.perf_counter()
    for dtype in args.dtypes.split(","):
        for name in args.models.split(","):
            run_model(bench, name, dtype)
    table(bench.rows)
    engines = []
    if not args.no_engines:  # the engine rows of `make bench` (issue 43), on this device
        sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
        import tempfile

        import bench_engines

        with tempfile.TemporaryDirectory() as tmp:
            out = os.path.join(tmp, "engines.json")
            bench_engines.main(["--device", args.device, "--json", out]
                               + (["--quick"] if args.quick else []))
            with open(out) as fh:
                engines = json.load(fh)["rows"]
    print(f"\n# {len(bench.rows) + len(engines)} rows in {time.perf_counter() - start:.0f} s")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"device": device, "torch": torch.__version__, "rows": bench.rows,
                       "engine_rows": engines}, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
