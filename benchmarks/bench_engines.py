"""The capture engines against their peers, warm (issue 43): one table.

Per model, each engine's warm call (median of interleaved repeats after one warm-up call,
so a change of machine load hits every row alike) and its peak memory (the bytes of the
live tensors at every operator, counted by ``taylorattr.runtime.batching``'s accounting
mode on the CPU; ``torch.cuda.max_memory_allocated`` on CUDA), beside the peer measured in
the same run on the same inputs, and beside the floor, one forward plus one backward pass
of the model (a gradient):

============  ===========================================  =============================
row           ours                                         peer
============  ===========================================  =============================
DeepLIFT      ``taylorattr.captum.attr.DeepLift``          Captum's ``DeepLift``
DeepLiftShap  ``taylorattr.captum.attr.DeepLiftShap`` (4)  Captum's ``DeepLiftShap``
IG            ``taylorattr.captum.attr.IntegratedGradients``  Captum's (same ``n_steps``)
Saliency      ``taylorattr.captum.attr.Saliency``          Captum's ``Saliency``
eps-LRP       ``EpsilonLRP`` (AttnLRP on the Llama)        Zennit ``Epsilon`` / lxt AttnLRP
EpsilonPlus   ``LRP(model, "epsilon_plus")``               Zennit ``EpsilonPlus``
Taylor 2      ``taylor.mode.propagate`` order 2, 4 dirs    forward-equivalents (below)
============  ===========================================  =============================

Taylor mode's row is its cost in forward passes per direction and order,
``t(order-2 pass, m directions) / (t(forward of m samples) * 2)`` (goal: 3), on the
model smoothed by ``ta.smooth(model, 10)``. lxt patches the transformers classes it
explains, so its rows run in a subprocess of their own (``--lxt-child``); the patch of
Llama's attention goes through the eager attention function (lxt 2.1's own wrapper),
since transformers 5 looks attention functions up through an interface lxt does not
patch.

Models: timm ResNet-18, ResNet-50, ViT-B/16 (128x128) and Swin-T (128x128, window 4),
random weights, batch 2, float32, and a Hugging Face Llama (hidden 256, 4 layers, 4
heads, eager attention) on input embeddings at L = 16, 64, 256, explaining the last
position's top logit (baselines: token 0's embedding at every position). ``--quick``: ResNet-18 and ViT-Tiny at 64x64 and the Llama at
L = 16 and 64 (a few minutes on 2 busy cores). ``--device cuda``: the same table on a GPU
(``bench_gpu.py`` runs it with its own rows). One torch thread on the CPU.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).parent))
from _timing import dump_json, interleaved_medians, print_table

GOALS = {"DeepLIFT": 1.0, "eps-LRP": 1.0, "EpsilonPlus": 1.0, "Saliency": 1.0, "IG": 1.0,
         "DeepLiftShap": 1.0, "AttnLRP": 1.0}
TAYLOR_GOAL = 3.0  # forward-equivalents per direction and order


# ----------------------------------------------------------------------------- models
def vision(name: str, size: int, device, batch: int = 2):
    import timm

    torch.manual_seed(0)
    kw = {"img_size": size} if "vit" in name or "swin" in name else {}
    if "swin" in name:
        kw["window_size"] = 4
    model = timm.create_model(name, pretrained=False, num_classes=10, **kw).eval().to(device)
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(batch, 3, size, size, generator=gen).to(device)
    with torch.no_grad():
        target = model(x).argmax(1)
    return model, x, target


class LastLogits(nn.Module):
    """A causal LM on its input embeddings ``[B, L, d]``: the last position's logits."""

    def __init__(self, lm):
        super().__init__()
        self.lm = lm

    def forward(self, embeds):
        return self.lm(inputs_embeds=embeds, use_cache=False).logits[:, -1]


def llama(length: int, device):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=1000, hidden_size=256, intermediate_size=512,
                         num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=4,
                         max_position_embeddings=512, attn_implementation="eager")
    lm = LlamaForCausalLM(config).eval().to(device)
    ids = torch.randint(0, 1000, (1, length), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        embeds = lm.get_input_embeddings()(ids.to(device))
        target = lm(inputs_embeds=embeds, use_cache=False).logits[:, -1].argmax(1)
    return lm, embeds, target


# ------------------------------------------------------------------------- measurement
def peak_mib(fn, device) -> float:
    """Peak MiB of live tensors during ``fn()`` above those alive before it."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        before = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        fn()
        torch.cuda.synchronize(device)
        return (torch.cuda.max_memory_allocated(device) - before) / 2**20
    from taylorattr.runtime.batching import _TensorBytes

    with _TensorBytes() as acct:
        fn()
    return acct.peak / 2**20


def floor(model, x, target):
    """One forward and one backward pass: the gradient of the explained outputs."""
    def run():
        xg = x.detach().requires_grad_(True)
        out = model(xg)
        torch.autograd.grad(out.gather(1, target[:, None]).sum(), xg)
    return run


def _sync(device):
    if device.type == "cuda":
        return lambda: torch.cuda.synchronize(device)
    return lambda: None


def _synced(fn, sync):
    def run():
        fn()
        sync()
    return run


def measure(cases: dict, device, repeats: int) -> dict:
    """``{label: (seconds, peak MiB or None, error or None)}`` for ``{label: fn}``."""
    sync = _sync(device)
    ok, out = {}, {}
    for label, fn in cases.items():
        try:
            fn()  # warm-up (captures, plans, probes)
            sync()
            ok[label] = _synced(fn, sync)
        except Exception as exc:  # noqa: BLE001 - a refusal is a row of the table
            out[label] = (None, None, f"{type(exc).__name__}: {str(exc).splitlines()[0][:90]}")
    times = interleaved_medians(ok, repeats, warmup=0)
    for label, fn in ok.items():
        out[label] = (times[label], peak_mib(fn, device), None)
    return out


# ----------------------------------------------------------------------------- cases
def vision_cases(model, x, target, steps: int):
    import captum.attr as C
    import zennit.composites as zc
    from zennit.attribution import Gradient as ZGradient

    import taylorattr.captum.attr as T
    from taylorattr.methods import EpsilonLRP
    from taylorattr.methods.lrp_rules import LRP

    zero = torch.zeros_like(x)
    refs = torch.randn(4, *x.shape[1:], generator=torch.Generator().manual_seed(2)).to(x)
    onehot = torch.nn.functional.one_hot(target, model(x[:1]).shape[1]).to(x.dtype)

    def zennit(composite):
        def run():
            with ZGradient(model=model, composite=composite) as attributor:
                return attributor(x, onehot)[1]
        return run

    return {
        ("DeepLIFT", "ours"): lambda: T.DeepLift(model).attribute(x, zero, target=target),
        ("DeepLIFT", "Captum"): lambda: C.DeepLift(model).attribute(x, zero, target=target),
        ("DeepLiftShap", "ours"): lambda: T.DeepLiftShap(model).attribute(x, refs,
                                                                          target=target),
        ("DeepLiftShap", "Captum"): lambda: C.DeepLiftShap(model).attribute(x, refs,
                                                                            target=target),
        ("IG", "ours"): lambda: T.IntegratedGradients(model).attribute(
            x, zero, target=target, n_steps=steps),
        ("IG", "Captum"): lambda: C.IntegratedGradients(model).attribute(
            x, zero, target=target, n_steps=steps),
        ("Saliency", "ours"): lambda: T.Saliency(model).attribute(x, target=target),
        ("Saliency", "Captum"): lambda: C.Saliency(model).attribute(x, target=target),
        ("eps-LRP", "ours"): lambda: EpsilonLRP(model, 1e-6).attribute(x, target=target),
        ("eps-LRP", "Zennit Epsilon"): zennit(_zennit_epsilon()),
        ("EpsilonPlus", "ours"): lambda: LRP(model, "epsilon_plus").attribute(x, target=target),
        ("EpsilonPlus", "Zennit EpsilonPlus"): zennit(zc.EpsilonPlus()),
        ("floor", "fwd+bwd"): floor(model, x, target),
    }


def _zennit_epsilon():
    """Zennit's epsilon rule on every Linear/Conv layer (its ``LayerMapComposite``)."""
    from zennit.composites import LayerMapComposite
    from zennit.rules import Epsilon, Pass
    from zennit.types import Activation, Convolution, Linear

    return LayerMapComposite([(Activation, Pass()), (Convolution, Epsilon(1e-6)),
                              (Linear, Epsilon(1e-6))])


def llama_cases(lm, embeds, target, steps: int):
    import captum.attr as C

    import taylorattr.captum.attr as T
    from taylorattr.methods import EpsilonLRP

    model = LastLogits(lm).eval()
    # the baseline: token 0's embedding at every position (a zero embedding would put
    # RMSNorm at rms(0) = sqrt(eps), where DeepLIFT's multipliers cancel to no digits)
    zero = lm.get_input_embeddings()(torch.zeros(embeds.shape[:2], dtype=torch.long,
                                                 device=embeds.device)).detach()
    return {
        ("AttnLRP", "ours"): lambda: EpsilonLRP(model, 1e-6).attribute(embeds, target=target),
        ("DeepLIFT", "ours"): lambda: T.DeepLift(model).attribute(embeds, zero, target=target),
        ("DeepLIFT", "Captum"): lambda: C.DeepLift(model).attribute(embeds, zero,
                                                                    target=target),
        ("IG", "ours"): lambda: T.IntegratedGradients(model).attribute(
            embeds, zero, target=target, n_steps=steps),
        ("IG", "Captum"): lambda: C.IntegratedGradients(model).attribute(
            embeds, zero, target=target, n_steps=steps),
        ("Saliency", "ours"): lambda: T.Saliency(model).attribute(embeds, target=target),
        ("Saliency", "Captum"): lambda: C.Saliency(model).attribute(embeds, target=target),
        ("floor", "fwd+bwd"): floor(model, embeds, target),
    }


def taylor_cost(model, x, device, repeats: int, directions: int = 4, order: int = 2):
    """Forward-equivalents per direction and order of one Taylor-mode pass (module
    docstring), with the seconds of both."""
    import taylorattr as ta
    from taylorattr.taylor.mode import propagate

    smoothed = ta.smooth(model, 10.0)
    x1 = x[:1]
    v = torch.randn(1, directions, *x.shape[1:], generator=torch.Generator().manual_seed(3))
    v = v.to(x)
    batch = x1.expand(directions, *x.shape[1:]).contiguous()
    sync = _sync(device)
    with torch.no_grad():
        times = measure({"taylor": lambda: propagate(smoothed, x1, v, order),
                         "forward": lambda: smoothed(batch)}, device, repeats)
    t, f = times["taylor"][0], times["forward"][0]
    sync()
    return t, times["taylor"][1], f, (None if t is None or f is None else t / f / order)


# --------------------------------------------------------------------------------- lxt
LXT_CHILD = r"""
import importlib.util, json, pathlib, sys, types, torch
sys.path.insert(0, {here!r})
torch.set_num_threads({threads})
import lxt
stub = types.ModuleType("lxt.efficient.models"); stub.get_default_map = None
sys.modules["lxt.efficient.models"] = stub  # lxt's model table imports its BERT patch (transformers 5 breaks it)
from lxt.efficient import monkey_patch
from lxt.efficient.patches import wrap_attention_forward
from transformers.models.llama import modeling_llama
spec = importlib.util.spec_from_file_location(
    "lxt_llama", pathlib.Path(lxt.__file__).parent / "efficient" / "models" / "llama.py")
table = importlib.util.module_from_spec(spec); spec.loader.exec_module(table)
monkey_patch(modeling_llama, {{k: v for k, v in table.attnLRP.items() if k is not modeling_llama}})
modeling_llama.eager_attention_forward = wrap_attention_forward(modeling_llama.eager_attention_forward)
import bench_engines as B
device = torch.device({device!r})
out = {{}}
for length in {lengths}:
    lm, embeds, target = B.llama(length, device)
    for p in lm.parameters():
        p.requires_grad_(False)
    def run():
        e = embeds.detach().requires_grad_(True)
        logits = lm(inputs_embeds=e, use_cache=False).logits[:, -1]
        (g,) = torch.autograd.grad(logits.gather(1, target[:, None]).sum(), e)
        return e * g
    res = B.measure({{"lxt": run}}, device, {repeats})["lxt"]
    out[length] = list(res) + [run().detach().cpu().tolist()]
print(json.dumps(out))
"""


def lxt_rows(lengths, device, repeats: int) -> dict:
    """``{L: (seconds, peak MiB, error, relevance)}`` of lxt's AttnLRP, in a subprocess."""
    code = LXT_CHILD.format(here=str(Path(__file__).parent), threads=torch.get_num_threads(),
                            device=str(device), lengths=list(lengths), repeats=repeats)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).parents[1] / "src")]
                                        + [p for p in [env.get("PYTHONPATH")] if p])
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=env, check=False)
    if run.returncode != 0:
        err = (run.stderr.strip().splitlines() or ["lxt failed"])[-1][:90]
        return {L: (None, None, err, None) for L in lengths}
    return {int(k): tuple(v) for k, v in json.loads(run.stdout.strip().splitlines()[-1]).items()}


# ------------------------------------------------------------------------------- table
def rows_of(model_name: str, results: dict) -> list[dict]:
    """One row per engine: ours, the peer, their ratio and ours over the floor."""
    fl = results.get(("floor", "fwd+bwd"), (None,))[0]
    rows = []
    engines = dict.fromkeys(e for e, _ in results if e != "floor")
    for engine in engines:
        ours = results.get((engine, "ours"), (None, None, "not run"))
        peer_key = next((k for k in results if k[0] == engine and k[1] != "ours"), None)
        peer = results.get(peer_key, (None, None, None))
        row = {"model": model_name, "engine": engine, "ours_s": ours[0], "ours_MiB": ours[1],
               "ours_err": ours[2], "peer": peer_key[1] if peer_key else "",
               "peer_s": peer[0], "peer_MiB": peer[1], "peer_err": peer[2], "floor_s": fl}
        if ours[0] and peer[0]:
            row["ratio"] = ours[0] / peer[0]
        if ours[0] and fl:
            row["over_floor"] = ours[0] / fl
        rows.append(row)
    return rows


def _fmt(v, spec):
    return "-" if v is None else format(v, spec)


def show(rows: list[dict]) -> None:
    header = ("model", "engine", "ours ms", "peer", "peer ms", "ours/peer", "goal",
              "ours/floor", "MiB ours/peer", "note")
    lines = []
    for r in rows:
        goal = TAYLOR_GOAL if r["engine"].startswith("Taylor") else GOALS.get(r["engine"])
        ratio = r.get("ratio", r.get("fwd_equiv"))
        met = "" if goal is None or ratio is None else ("ok" if ratio <= goal else "MISSED")
        note = r.get("ours_err") or r.get("peer_err") or ""
        lines.append((r["model"], r["engine"], _fmt(r["ours_s"] and r["ours_s"] * 1e3, ".1f"),
                      r["peer"], _fmt(r["peer_s"] and r["peer_s"] * 1e3, ".1f"),
                      _fmt(ratio, ".2f"), f"<= {goal:g} {met}" if goal else "",
                      _fmt(r.get("over_floor"), ".1f"),
                      f"{_fmt(r['ours_MiB'], '.0f')} / {_fmt(r['peer_MiB'], '.0f')}",
                      note[:70]))
    print_table("Engines, warm call (median of interleaved repeats), peak MiB of live "
                "tensors", lines, header)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--device", default="cpu")
    p.add_argument("--models", default="", help="comma-separated subset (e.g. resnet18,llama16)")
    p.add_argument("--repeats", type=int, default=None)
    p.add_argument("--json")
    args = p.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("bench_engines: CUDA is not available here; run on a machine with an NVIDIA GPU "
              "or with --device cpu", file=sys.stderr)
        return 2
    if device.type == "cpu":
        torch.set_num_threads(1)
    warnings.filterwarnings("ignore")
    repeats = args.repeats or (3 if args.quick else 5)
    steps = 16 if args.quick else 50
    if args.quick:
        images = [("resnet18", 64), ("vit_tiny_patch16_224", 64)]
        lengths = [16, 64]
    else:
        images = [("resnet18", 128), ("resnet50", 128), ("vit_base_patch16_224", 128),
                  ("swin_tiny_patch4_window7_224", 128)]
        lengths = [16, 64, 256]
    wanted = set(filter(None, args.models.split(",")))
    images = [(n, s) for n, s in images if not wanted or n in wanted]
    lengths = [L for L in lengths if not wanted or f"llama{L}" in wanted]
    print(f"# engines on {device}, torch {torch.__version__}, {torch.get_num_threads()} "
          f"thread(s), float32, repeats {repeats}; load average "
          f"{os.getloadavg()[0]:.1f} at the start", flush=True)
    rows: list[dict] = []
    for name, size in images:
        model, x, target = vision(name, size, device)
        label = f"{name.split('_patch')[0]} {size}px"
        rows += rows_of(label, measure(vision_cases(model, x, target, steps), device, repeats))
        t, mib, f, equiv = taylor_cost(model, x, device, repeats)
        rows.append({"model": label, "engine": "Taylor 2", "ours_s": t, "ours_MiB": mib,
                     "ours_err": None if t else "refused", "peer": "forward (4 samples)",
                     "peer_s": f, "peer_MiB": None, "peer_err": None, "floor_s": None,
                     "fwd_equiv": equiv})
        print(json.dumps(rows[-1]), flush=True)
        del model, x
    lxt = lxt_rows(lengths, device, repeats) if lengths else {}
    for L in lengths:
        lm, embeds, target = llama(L, device)
        results = measure(llama_cases(lm, embeds, target, steps), device, repeats)
        results[("AttnLRP", "lxt")] = tuple(lxt[L][:3])
        new = rows_of(f"llama L={L}", results)
        if lxt[L][3] is not None and results[("AttnLRP", "ours")][0] is not None:
            from taylorattr.methods import EpsilonLRP

            ours = EpsilonLRP(LastLogits(lm).eval(), 1e-6).attribute(embeds, target=target)
            theirs = torch.tensor(lxt[L][3]).to(ours)
            new[0]["rel_diff_lxt"] = float((ours - theirs).abs().max() / theirs.abs().max())
        rows += new
        print(json.dumps(new), flush=True)
    show(rows)
    print(f"# load average {os.getloadavg()[0]:.1f} at the end")
    dump_json(args.json, {"rows": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
