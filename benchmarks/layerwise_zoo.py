"""The layer-wise zoo: torchvision and timm architectures with random weights and
calibrated BatchNorm statistics, in float64, at small inputs (issue 26).

``python benchmarks/layerwise_zoo.py [names...]`` prints, per model and engine
(DeepLIFT, epsilon-LRP, LRP epsilon-plus-flat), whether it runs, DeepLIFT's convergence
delta relative to ``max(1, |f(x) - f(x~)|)`` and the seconds of one call (capture
included on the first). ``tests/test_layerwise_zoo.py`` runs a fast subset.
"""
from __future__ import annotations

import sys
import time

import torch
from torch import nn

#: name -> (builder, input shape of one row)
ZOO = {
    "resnet18": ("torchvision", "resnet18", {}, (3, 32, 32)),
    "mobilenet_v3_small": ("torchvision", "mobilenet_v3_small", {}, (3, 32, 32)),
    "efficientnet_b0": ("torchvision", "efficientnet_b0", {}, (3, 32, 32)),
    "convnext_tiny": ("torchvision", "convnext_tiny", {}, (3, 32, 32)),
    "vit_b_16": ("torchvision", "vit_b_16", {"image_size": 32}, (3, 32, 32)),
    "swin_t": ("torchvision", "swin_t", {}, (3, 64, 64)),
    "regnet_x_400mf": ("torchvision", "regnet_x_400mf", {}, (3, 32, 32)),
    "densenet121": ("torchvision", "densenet121", {}, (3, 32, 32)),
    "squeezenet1_0": ("torchvision", "squeezenet1_0", {}, (3, 48, 48)),
    "shufflenet_v2_x0_5": ("torchvision", "shufflenet_v2_x0_5", {}, (3, 32, 32)),
    "timm_vit_tiny": ("timm", "vit_tiny_patch16_224", {"img_size": 32}, (3, 32, 32)),
    "timm_deit_tiny": ("timm", "deit_tiny_patch16_224", {"img_size": 32}, (3, 32, 32)),
    "timm_convnext_atto": ("timm", "convnext_atto", {}, (3, 32, 32)),
    "timm_efficientformerv2_s0": ("timm", "efficientformerv2_s0", {"img_size": 64},
                                  (3, 64, 64)),
    "timm_mobilevit_xxs": ("timm", "mobilevit_xxs", {}, (3, 64, 64)),
    "timm_resnet18d": ("timm", "resnet18d", {}, (3, 32, 32)),
    "timm_levit_128s": ("timm", "levit_128s", {"img_size": 64}, (3, 64, 64)),
    "timm_poolformer_s12": ("timm", "poolformer_s12", {}, (3, 32, 32)),
    "timm_coat_lite_tiny": ("timm", "coat_lite_tiny", {"img_size": 32}, (3, 32, 32)),
    "timm_mixer_s16": ("timm", "mixer_s16_224", {"img_size": 32}, (3, 32, 32)),
    "timm_regnety_002": ("timm", "regnety_002", {}, (3, 32, 32)),
    "timm_ghostnet_100": ("timm", "ghostnet_100", {}, (3, 32, 32)),
    "efficientnet_lite0": ("taylorattr", "efficientnet_lite0", {}, (3, 32, 32)),
}


def _calibrate(model: nn.Module, shape, seed: int) -> None:
    """BatchNorm running statistics from four random batches (cumulative average)."""
    bns = [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    if not bns:
        return
    for m in bns:
        m.reset_running_stats()
        m.momentum = None
    g = torch.Generator().manual_seed(seed + 1)
    model.train()
    with torch.no_grad():
        for _ in range(4):
            model(torch.randn((8,) + tuple(shape), generator=g, dtype=torch.float64))


def build_torchvision(arch: str, shape, seed: int = 0, **kwargs) -> tuple[nn.Module, tuple]:
    """A torchvision model by name, prepared as :func:`build` prepares the zoo's."""
    return build(("torchvision", arch, kwargs, shape), seed)


def build(name, seed: int = 0) -> tuple[nn.Module, tuple]:
    """The model ``name`` of :data:`ZOO` (or a ``(source, arch, kwargs, shape)`` entry):
    random weights, float64, BatchNorm calibrated, eval; and its row shape."""
    source, arch, kwargs, shape = ZOO[name] if isinstance(name, str) else name
    torch.manual_seed(seed)
    if source == "torchvision":
        import torchvision  # heavy; only the zoo needs it

        model = getattr(torchvision.models, arch)(weights=None, **kwargs)
    elif source == "timm":
        import timm  # heavy; only the zoo needs it

        model = timm.create_model(arch, pretrained=False, **kwargs)
    else:
        from taylorattr.models.pretrained import efficientnet_lite0

        model = efficientnet_lite0().net
    model = model.to(torch.float64)
    with torch.no_grad():  # zero-initialised classifier heads (ViT, Mixer) explain nothing
        for m in model.modules():
            if isinstance(m, nn.Linear) and not m.weight.any():
                m.weight.normal_(0.0, 0.02)
    _calibrate(model, shape, seed)
    return model.eval(), shape


def inputs(shape, seed: int = 3, batch: int = 2):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn((batch,) + tuple(shape), generator=g, dtype=torch.float64)
    return x, 0.3 * torch.randn((batch,) + tuple(shape), generator=g, dtype=torch.float64)


def run(name: str) -> dict:
    """One row of the zoo table: per engine ``(runs, relative delta or None, seconds)``."""
    from taylorattr.methods import DeepLift, EpsilonLRP
    from taylorattr.methods.lrp_rules import LRP

    model, shape = build(name)
    x, base = inputs(shape)
    row = {}
    for label, make in (("deeplift", lambda: DeepLift(model)),
                        ("epsilon_lrp", lambda: EpsilonLRP(model)),
                        ("lrp_epsilon_plus_flat", lambda: LRP(model))):
        start = time.perf_counter()
        try:
            method = make()
            if label == "deeplift":
                a, delta = method.attribute(x, base, target=0, return_convergence_delta=True)
                with torch.no_grad():
                    df = model(x)[:, 0] - model(base)[:, 0]
                rel = float((delta.abs() / df.abs().clamp(min=1.0)).max())
            else:
                a = method.attribute(x, target=0)
                rel = None
            ok = bool(torch.isfinite(a).all())
            row[label] = (ok, rel, time.perf_counter() - start, "")
        except Exception as exc:  # noqa: BLE001 (the table reports every failure)
            row[label] = (False, None, time.perf_counter() - start,
                          f"{type(exc).__name__}: {str(exc)[:300]}")
    return row


def zennit_checks() -> None:
    """LRP EpsilonPlusFlat against Zennit with its canonizers on ResNet-18 and VGG-16
    (batch-norm eps 1e-300, float64's eps 0, which torch 2.11 refuses: Zennit's merge keeps
    it in the identity it leaves behind)."""
    from zennit.composites import EpsilonPlusFlat
    from zennit.torchvision import ResNetCanonizer, VGGCanonizer

    from taylorattr.methods.lrp_rules import LRP

    for arch, canonizer in (("resnet18", ResNetCanonizer), ("vgg16", VGGCanonizer)):
        model, shape = build(("torchvision", arch, {}, (3, 32, 32)))
        for m in model.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.eps = 1e-300
        x, _ = inputs(shape)
        ours = LRP(model, rule="epsilon_plus_flat").attribute(x, target=1)
        with EpsilonPlusFlat(canonizers=[canonizer()]).context(model) as modified:
            xg = x.clone().requires_grad_(True)
            out = modified(xg)
            (theirs,) = torch.autograd.grad(out[:, 1].sum(), xg)
            theirs = theirs * out[:, 1].detach().view(-1, 1, 1, 1)
        gap = float((ours - theirs).abs().max() / theirs.abs().max())
        print(f"zennit {arch:10s} EpsilonPlusFlat max|ours - zennit| / max|zennit| = {gap:.1e}",
              flush=True)


def main(names) -> None:
    torch.set_num_threads(1)
    if not names:
        zennit_checks()
    print(f"{'model':28s} {'engine':22s} runs  delta/max(1,|df|)  seconds")
    for name in names or list(ZOO):
        for engine, (ok, rel, secs, err) in run(name).items():
            d = "-" if rel is None else f"{rel:.1e}"
            print(f"{name:28s} {engine:22s} {'yes' if ok else 'NO ':4s} {d:>17s} {secs:8.1f}"
                  + (f"  {err}" if err else ""), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
