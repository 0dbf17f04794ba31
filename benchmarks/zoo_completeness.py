"""DeepLIFT's real completeness on the 32-model zoo (issue 35's acceptance): per model, in
float64, at batch 1 and batch 2, random inputs and a zero baseline (``--nonzero``: a
random one), the miss

    miss = | sum_i a_i - (f(x) - f(x~)) |,   f the model's own forward (not the capture),

against the bound ``1e-8 max(1, |f(x) - f(x~)|)`` (issue 35's acceptance), also where
the captured graph casts below float64 (:func:`~taylorattr.runtime.completeness.downcasts`:
timm ``efficientvit_b0``'s float32 linear attention; the table names the lowest dtype, and
the call's warning names the cast). A call beyond the bound must have warned
(``ta.CompletenessWarning``). ``python benchmarks/zoo_completeness.py [names...]`` prints
one row per model and batch: |df|, miss, miss / max(1, |df|), the lowest dtype the graph
computes at and miss / bound, whether the call warned,
the returned delta's distance from the measured one, ``sum_i |a_i| / |df|`` (above
``1 / sqrt(eps)`` the attributions cancel to fewer than half the digits), and the seconds (the build's CPU
seconds; the call's wall and CPU seconds: the first capture included at batch 1, the
capture reused at batch 2), on one thread. ``tests/test_zoo_completeness.py`` runs a subset.

The zoo: the 22 architectures of ``tests/_zoo.py`` (issue 25), the bundled
EfficientNet-Lite0 and RegNet-X (issue 26's layer-wise zoo) and the models issue 35 found
wrong or refused (XCiT, EfficientViT-B0, EdgeNeXt, Swin-V2, MaxViT) with ResNet-50,
MobileNetV2 and VGG-11-BN; random weights prepared as ``tests/_zoo.prepare`` does, each at
the smallest input size it accepts.

**The expanded function** (issue 45): on every model and batch the table also holds the
function Taylor mode expands to the model's own (``benchmarks/_expanded.py``): the
captured graph's ``f(x)`` against the model's forward (``graph/bd``) and the order-1
expansion's first order, by its Taylor-mode series (``P1/bd``) and by its reverse sweep
(``first/bd``), against the model's forward-mode derivative at the batch and at batch 2
(central differences deciding where those disagree), each over ``1e-8 max(1, |ref|)``;
``Tw``: ``taylor_terms`` warned. Beyond a bound without a warning is a silent miss too
(``SILENT MISS (expanded)``); the exit status is 1 on any silent miss.
"""
from __future__ import annotations

import sys
import time
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parents[1] / "tests"))
from _expanded import expanded_function
from _expanded import silent as expanded_silent
from _zoo import prepare

#: name -> (source, architecture, constructor arguments, input side in pixels)
ZOO = {
    "tv:resnet18": ("tv", "resnet18", {}, 32),
    "tv:resnet50": ("tv", "resnet50", {}, 32),
    "tv:mobilenet_v2": ("tv", "mobilenet_v2", {}, 32),
    "tv:mobilenet_v3_small": ("tv", "mobilenet_v3_small", {}, 32),
    "tv:efficientnet_b0": ("tv", "efficientnet_b0", {}, 32),
    "tv:convnext_tiny": ("tv", "convnext_tiny", {}, 32),
    "tv:vit_b_16": ("tv", "vit_b_16", {"image_size": 32}, 32),
    "tv:swin_t": ("tv", "swin_t", {}, 64),
    "tv:swin_v2_t": ("tv", "swin_v2_t", {}, 64),
    # MaxViT-T's blocks with 2x2 windows and grids (its 7x7 ones need 224 pixels)
    "tv:maxvit_t": ("tv", "maxvit.MaxVit", {
        "input_size": (64, 64), "partition_size": 2, "stem_channels": 64, "head_dim": 32,
        "block_channels": [64, 128, 256, 512], "block_layers": [2, 2, 5, 2],
        "stochastic_depth_prob": 0.2}, 64),
    "tv:regnet_y_400mf": ("tv", "regnet_y_400mf", {}, 32),
    "tv:regnet_x_400mf": ("tv", "regnet_x_400mf", {}, 32),
    "tv:densenet121": ("tv", "densenet121", {}, 32),
    "tv:squeezenet1_0": ("tv", "squeezenet1_0", {}, 48),
    "tv:shufflenet_v2_x0_5": ("tv", "shufflenet_v2_x0_5", {}, 32),
    "tv:vgg11_bn": ("tv", "vgg11_bn", {}, 32),
    "timm:vit_tiny_patch16_224": ("timm", "vit_tiny_patch16_224", {"img_size": 32}, 32),
    "timm:deit_tiny_patch16_224": ("timm", "deit_tiny_patch16_224", {"img_size": 32}, 32),
    "timm:convnext_atto": ("timm", "convnext_atto", {}, 32),
    "timm:efficientformerv2_s0": ("timm", "efficientformerv2_s0", {"img_size": 64}, 64),
    "timm:mobilevit_xxs": ("timm", "mobilevit_xxs", {}, 64),
    "timm:resnet18d": ("timm", "resnet18d", {}, 32),
    "timm:levit_128s": ("timm", "levit_128s", {"img_size": 64}, 64),
    "timm:poolformer_s12": ("timm", "poolformer_s12", {}, 32),
    "timm:coat_lite_tiny": ("timm", "coat_lite_tiny", {"img_size": 32}, 32),
    "timm:mixer_s16_224": ("timm", "mixer_s16_224", {"img_size": 32}, 32),
    "timm:regnety_002": ("timm", "regnety_002", {}, 32),
    "timm:ghostnet_050": ("timm", "ghostnet_050", {}, 32),
    "timm:xcit_nano_12_p16_224": ("timm", "xcit_nano_12_p16_224", {"img_size": 32}, 32),
    "timm:efficientvit_b0": ("timm", "efficientvit_b0", {}, 32),
    "timm:edgenext_xx_small": ("timm", "edgenext_xx_small", {}, 32),
    "lite0": ("taylorattr", "efficientnet_lite0", {}, 32),
}

#: The bound of the acceptance: ``miss <= BOUND * max(1, |df|)`` or the call warns.
BOUND = 1e-8


def build(name: str):
    """``(model, side)``: the zoo model ``name`` with random weights, prepared as
    ``tests/_zoo.prepare`` prepares them (float64, eval)."""
    source, arch, kwargs, side = ZOO[name]
    torch.manual_seed(0)
    if source == "tv":
        import torchvision  # heavy; only the zoo needs it

        make = torchvision.models
        for part in arch.split("."):
            make = getattr(make, part)
        model = make(**kwargs) if "." in arch else make(weights=None, **kwargs)
    elif source == "timm":
        import timm  # heavy; only the zoo needs it

        model = timm.create_model(arch, pretrained=False, **kwargs)
    else:
        from taylorattr.models.pretrained import efficientnet_lite0

        model = efficientnet_lite0().net
    return prepare(model.float(), side), side


def inputs(side: int, batch: int, nonzero: bool = False, seed: int = 5):
    """Random inputs ``[batch, 3, side, side]`` and the baseline (zero, or ``0.5 N(0, 1)``)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, 3, side, side, generator=g, dtype=torch.float64)
    base = 0.5 * torch.randn(x.shape, generator=g, dtype=torch.float64) if nonzero \
        else torch.zeros_like(x)
    return x, base


def measure(model, x, base) -> dict:
    """DeepLIFT on ``(x, base)`` at the model's top class per sample, measured against the
    model's own forward: ``df`` ``[B]``, ``miss`` ``[B]`` (``|sum(a) - df|``), ``low`` (the
    lowest dtype the captured graph computes at), ``bound`` ``[B]`` (the module
    docstring's), ``warned``
    (a :class:`taylorattr.CompletenessWarning` was raised; ``messages``: theirs), ``size``
    ``[B]`` (``sum_i |a_i|``), ``delta_gap`` ``[B]`` (the
    returned delta's distance from ``sum(a) - df``) and the call's wall and CPU seconds
    (one thread: the CPU seconds are what a quiet machine would take)."""
    import taylorattr as ta
    from taylorattr.methods.layerwise import get_plan
    from taylorattr.runtime import completeness

    with torch.no_grad():
        fx = model(x)
        target = fx.argmax(1)
        f_x = fx.gather(1, target[:, None])[:, 0]
        f_ref = model(base).gather(1, target[:, None])[:, 0]
        df = f_x - f_ref
    method = ta.DeepLift(model)
    start, cpu = time.perf_counter(), time.process_time()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        a, delta = method.attribute(x, base, target=target, return_convergence_delta=True)
    seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
    own = a.detach().flatten(1).sum(1) - df
    # the precision the model computes at: its captured graph's casts (the plan is cached
    # by the call above: no capture here)
    casts = completeness.downcasts(get_plan(model, method._rules, x).core, x.dtype)
    low = completeness.lowest_dtype(x.dtype, casts)
    bound = BOUND * df.abs().clamp(min=1.0)
    messages = [str(w.message) for w in caught if issubclass(w.category, ta.CompletenessWarning)]
    return {"df": df, "miss": own.abs(), "low": low, "bound": bound,
            "warned": bool(messages), "messages": messages,
            "size": a.detach().flatten(1).abs().sum(1),
            "delta_gap": (delta.detach() - own).abs(), "seconds": seconds,
            "cpu": cpu}


def fails(r: dict) -> bool:
    """A silent miss: beyond the bound without a warning."""
    return bool((r["miss"] > r["bound"]).any()) and not r["warned"]


def bound_label(r: dict) -> str:
    """The table's bound column: ``1e-8``, with the lowest dtype the graph computes at."""
    return f"1e-8 ({str(r['low']).replace('torch.', '')})"


def main(names, nonzero: bool = False) -> int:
    torch.set_num_threads(1)
    print(f"{'model':28s} {'B':>2s} {'|df|':>9s} {'miss':>9s} {'miss/max(1,|df|)':>17s} "
          f"{'bound':>13s} {'miss/bound':>10s} {'warned':>6s} {'|delta-own|':>11s} {'sum|a|/|df|':>11s} {'build s':>8s} "
          f"{'call s':>7s} {'cpu s':>6s} {'graph/bd':>9s} {'P1/bd':>9s} {'first/bd':>9s} "
          f"{'Tw':>3s}")
    silent = 0
    for name in names or list(ZOO):
        start = time.process_time()
        try:
            model, side = build(name)
        except Exception as exc:  # noqa: BLE001 (the table reports every failure)
            print(f"{name:28s} build failed: {type(exc).__name__}: {str(exc)[:200]}")
            continue
        built = time.process_time() - start
        for batch in (1, 2):
            x, base = inputs(side, batch, nonzero)
            try:
                r = measure(model, x, base)
                with torch.no_grad():
                    target = model(x).argmax(1)
                e = expanded_function(model, x, base, target)
            except Exception as exc:  # noqa: BLE001
                print(f"{name:28s} {batch:2d} failed: {type(exc).__name__}: {str(exc)[:200]}")
                continue
            i = int((r["miss"] / r["df"].abs().clamp(min=1.0)).argmax())
            rel = float(r["miss"][i] / r["df"][i].abs().clamp(min=1.0))
            silent += fails(r) + expanded_silent(e)
            print(f"{name:28s} {batch:2d} {float(r['df'][i].abs()):9.3g} "
                  f"{float(r['miss'][i]):9.2e} {rel:17.2e} {bound_label(r):>13s} "
                  f"{float((r['miss'] / r['bound']).max()):10.2e} "
                  f"{'yes' if r['warned'] else 'no':>6s} "
                  f"{float(r['delta_gap'].max()):11.1e} "
                  f"{float(r['size'][i] / r['df'][i].abs()):11.1e} {built:8.1f} {r['seconds']:7.1f} "
                  f"{r['cpu']:6.1f} {float(e['value_miss'].max()):9.1e} "
                  f"{float(e['series_miss'].max()):9.1e} {float(e['reverse_miss'].max()):9.1e} "
                  f"{'yes' if e['warned'] else 'no':>3s}"
                  + ("  SILENT MISS" if fails(r) else "")
                  + ("  SILENT MISS (expanded)" if expanded_silent(e) else ""), flush=True)
            built = 0.0
    print(f"silent misses: {silent}")
    return 1 if silent else 0


if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if a != "--nonzero"]
    sys.exit(main(args, "--nonzero" in sys.argv[1:]))
