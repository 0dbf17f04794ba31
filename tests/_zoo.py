"""The model zoo of issue 25, shared by tests/test_taylor_zoo.py (the smallest models) and
benchmarks/bench_taylor_zoo.py (all of them): random weights, BatchNorm statistics
calibrated on random images, tiny or zero-initialised gains (layer scale, zero-init
BatchNorm) drawn again, float64; ``check`` compares the order-2 group terms (16 patches)
of ``ta.smooth(model)`` with float64 double backward (math SDPA kernel)."""
from __future__ import annotations

import time

import torch
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel

import taylorattr as ta
from taylorattr.taylor.terms import group_expansions

#: (name, builder) of the acceptance list; "tv:" torchvision, "timm:" timm (64x64 inputs).
ZOO = ["tv:resnet18", "tv:mobilenet_v3_small", "tv:efficientnet_b0", "tv:convnext_tiny",
       "tv:vit_b_16", "tv:swin_t", "tv:regnet_y_400mf", "tv:densenet121", "tv:squeezenet1_0",
       "tv:shufflenet_v2_x0_5", "timm:vit_tiny_patch16_224", "timm:deit_tiny_patch16_224",
       "timm:convnext_atto", "timm:efficientformerv2_s0", "timm:mobilevit_xxs",
       "timm:resnet18d", "timm:levit_128s", "timm:poolformer_s12", "timm:coat_lite_tiny",
       "timm:mixer_s16_224", "timm:regnety_002", "timm:ghostnet_050"]


def build(name: str, size: int = 64) -> nn.Module:
    """The named model with random weights, prepared as the module docstring says."""
    if name.startswith("tv:"):
        import torchvision.models as tv  # heavy; only the zoo needs it

        kwargs = {"image_size": size} if name[3:].startswith("vit_") else {}
        model = getattr(tv, name[3:])(weights=None, **kwargs)
    else:
        import timm  # heavy; only the zoo needs it

        try:
            model = timm.create_model(name[5:], pretrained=False, img_size=size)
        except TypeError:  # a family without an img_size argument
            model = timm.create_model(name[5:], pretrained=False)
    return prepare(model, size)


def prepare(model: nn.Module, size: int = 64, seed: int = 0) -> nn.Module:
    g = torch.Generator().manual_seed(seed)

    def drawn(p):  # drawn on the CPU (g's device), copied to p's: the same numbers anywhere
        return torch.empty(p.shape, dtype=p.dtype, device="cpu")

    with torch.no_grad():
        for name, p in model.named_parameters():
            flat = p.flatten()
            tiny_constant = bool((flat == flat[0]).all()) and float(flat[0].abs()) < 1e-3
            if p.dim() <= 1 and "bias" not in name and (tiny_constant or "gamma" in name):
                # layer scale, zero-init BatchNorm gains
                p.copy_(drawn(p).uniform_(0.5, 1.5, generator=g))
            elif p.dim() > 1 and tiny_constant:  # a zero-init head or projection
                p.copy_(drawn(p).normal_(0.0, p[0].numel() ** -0.5, generator=g))
    for m in model.modules():
        if isinstance(m, nn.modules.batchnorm._BatchNorm):
            m.reset_running_stats()
            m.momentum = None  # a cumulative average over the calibration batch
    model.train()
    with torch.no_grad():
        model(torch.randn(4, 3, size, size, generator=g))
    return model.double().eval()


def patches(size: int = 64, grid: int = 4) -> torch.Tensor:
    """Group ids of ``grid x grid`` square patches, shared by the three channels."""
    idx = torch.arange(grid * grid).view(grid, grid)
    ids = idx.repeat_interleave(size // grid, 0).repeat_interleave(size // grid, 1)
    return ids.expand(3, size, size).contiguous()


#: Models whose reference is nested forward mode (``torch.func.jvp`` twice) instead of double
#: backward: torch 2.14's reverse mode disagrees with forward mode and with central finite
#: differences on timm's LeViT at batch 1 (its first derivative: 142,975.8 by Taylor mode,
#: forward mode and differences, -172,965.0 by reverse mode); LeViT has no LayerNorm, whose
#: nested forward derivatives are wrong.
FORWARD_REFERENCE = {"timm:levit_128s"}


def _nested_forward(f, x, directions):
    """``[D f[d], -D^2 f[d, d] / 2]`` per direction by nested ``torch.func.jvp``."""
    from torch.func import jvp

    rows = []
    for d in directions:
        first = jvp(f, (x,), (d,))[1]
        second = jvp(lambda z, d=d: jvp(f, (z,), (d,))[1], (x,), (d,))[1]
        rows.append(torch.stack([first, -second / 2]))
    return torch.stack(rows).detach()


def check(model: nn.Module, size: int = 64, seed: int = 1, beta: float = 10.0,
          forward_reference: bool = False):
    """Relative errors (``max |got - ref| / max |ref|``) of the per-group first order, the
    per-group order-1 and order-2 expansions and the order-2 total of ``ta.smooth(model,
    beta)`` against float64 double backward (``forward_reference``: nested forward mode),
    and the Taylor-mode seconds."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(1, 3, size, size, generator=g, dtype=torch.float64)
    base = 0.5 * torch.randn(1, 3, size, size, generator=g, dtype=torch.float64)
    smoothed = ta.smooth(model, beta)
    target = int(model(x).argmax())
    groups = patches(size)
    start = time.perf_counter()
    terms = ta.taylor_terms(smoothed, x, base, target=target, order=2, groups=groups)
    per_group = group_expansions(smoothed, x, base, target=target, order=2, groups=groups)
    seconds = time.perf_counter() - start
    delta = (x - base)[0]
    if forward_reference:
        directions = [delta * (groups == k) for k in range(16)] + [delta]
        refs = _nested_forward(lambda z: smoothed(z[None])[0, target], x[0], directions)
        first = refs[:16, 0]
    else:
        first, refs = _double_backward(smoothed, x, delta, groups, target)

    def err(a, b):
        return float((a - b).abs().max() / b.abs().max())
    return {"first": err(terms.first[0], first), "group_P1": err(per_group[0, :, 0], refs[:16, 0]),
            "group_P2": err(per_group[0, :, 1], refs[:16, 1]),
            "total_P2": err(terms.orders[0, 1], refs[16, 1])}, seconds


def _double_backward(smoothed, x, delta, groups, target):
    """Per-group first order, and ``[D f[d], -D^2 f[d, d] / 2]`` per group and for the
    whole ``delta``, by float64 double backward (math SDPA kernel)."""
    with sdpa_kernel(SDPBackend.MATH):
        z = x.clone().requires_grad_(True)
        (grad,) = torch.autograd.grad(smoothed(z)[0, target], z, create_graph=True)
        first = torch.zeros(16, dtype=torch.float64).index_add_(
            0, groups.flatten(), (grad[0] * delta).flatten().detach())
        refs = []
        for d in [delta * (groups == k) for k in range(16)] + [delta]:
            d1 = (grad[0] * d).sum()
            (h,) = torch.autograd.grad(d1, z, retain_graph=True)
            refs.append(torch.stack([d1.detach(), -(h[0] * d).sum() / 2]))
        return first, torch.stack(refs)
