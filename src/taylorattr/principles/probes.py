"""Probe networks whose Taylor terms are known exactly (see :mod:`taylorattr.principles`).

The first four compute stated polynomials of 6 features through hidden units that mix
all features (read-out layers solved for exactly); the others are random sigmoid
networks (principle 1) and images built to expose a baseline's bias (principle 3).
"""
from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass
from types import MappingProxyType

import torch
from torch import nn

from .._validation import check_seed as _check_seed
from .._validation import cpu_generator
from ..models import PolyActivation

__all__ = ["Probe", "probe_suite"]

_DT = torch.float64
_N_FEATURES = 6
_N_SAMPLES = 16
_REFERENCES = tuple(k / 10 for k in range(11))
_FIT_TOL = 1e-8
# Probe activations: generic polynomials with sigma(0) = 0. Pure powers y^p would make
# epsilon-LRP exactly Gradient*Input / p (its ratio sigma(y)/y is sigma'(y)/p), a
# coincidence that would let it pass the probes homogeneous of degree p.
_QUADRATIC = (0.0, 1.0, 1.0)
_CUBIC = (0.0, 1.0, 1.0, 1.0)


@dataclass(frozen=True)
class Probe:
    """A probe network, its inputs and the block structure of its function.

    ``groups``: the interaction sets (feature indices of the flattened input); every other
    feature is a singleton block. ``principles``: which principles it measures.
    """

    name: str
    model: nn.Module
    inputs: torch.Tensor
    principles: tuple[int, ...]
    groups: tuple[tuple[int, ...], ...] = ()
    target: int | torch.Tensor | None = 0
    mask: torch.Tensor | None = None  # the object (polarity probe), shaped like one sample
    description: str = ""


def _linear(weight: torch.Tensor, bias: torch.Tensor) -> nn.Linear:
    layer = nn.Linear(weight.shape[1], weight.shape[0]).to(_DT)
    with torch.no_grad():
        layer.weight.copy_(weight)
        layer.bias.copy_(bias)
    return layer


def _fit_readout(hidden: Callable[[torch.Tensor], torch.Tensor], target, points: torch.Tensor
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """Least-squares read-out ``(u [m, out], c [out])`` with ``hidden(p) u + c = target(p)``;
    raises when the fit is not exact (the probe's function would not be the stated one)."""
    h = hidden(points)
    y = target(points)
    if y.dim() == 1:
        y = y[:, None]
    design = torch.cat([h, torch.ones(h.shape[0], 1, dtype=_DT, device="cpu")], 1)
    sol = torch.linalg.lstsq(design, y, driver="gelsd").solution
    err = (design @ sol - y).abs().max() / y.abs().max().clamp_min(1.0)
    if not err < _FIT_TOL:
        raise RuntimeError(f"probe read-out fit is not exact (relative error {float(err):.1e}); "
                           "try another seed")
    return sol[:-1], sol[-1]


def _signed_inputs(gen: torch.Generator, n: int = _N_SAMPLES, d: int = _N_FEATURES):
    mag = 0.5 + torch.rand(n, d, generator=gen, dtype=_DT, device="cpu")
    sign = torch.where(torch.rand(n, d, generator=gen, dtype=_DT, device="cpu") < 0.5, -1.0, 1.0)
    return (mag * sign).to(_DT)


def _fit_points(gen: torch.Generator, n: int, d: int) -> torch.Tensor:
    return 3.0 * (2 * torch.rand(n, d, generator=gen, dtype=_DT, device="cpu") - 1)


def _cube_network(gen, target, width: int) -> nn.Sequential:
    """``Linear(6, width) -> y^3 -> Linear(width, 1)`` computing the polynomial ``target``
    (degree <= 3) exactly; hidden units see every feature, with random weights and biases."""
    w = torch.randn(width, _N_FEATURES, generator=gen, dtype=_DT, device="cpu") / math.sqrt(_N_FEATURES)
    b = torch.randn(width, generator=gen, dtype=_DT, device="cpu")
    act = PolyActivation(_CUBIC)
    pts = _fit_points(gen, 4 * width, _N_FEATURES)
    u, c = _fit_readout(lambda p: act(p @ w.T + b), target, pts)
    return nn.Sequential(_linear(w, b), act, _linear(u.T, c))


def _independent_probe(gen) -> Probe:
    a, bq, e = (torch.randn(3, _N_FEATURES, generator=gen, dtype=_DT, device="cpu").sign()
                * (0.5 + torch.rand(3, _N_FEATURES, generator=gen, dtype=_DT, device="cpu")))

    def target(x):
        return (a * x + bq * x**2 + e * x**3).sum(1)

    model = _cube_network(gen, target, width=120)
    return Probe("independent", model, _signed_inputs(gen), (1, 2),
                 description="sum_i a_i x_i + b_i x_i^2 + e_i x_i^3 (independent terms only)")


def _pairwise_probe(gen) -> Probe:
    c = (torch.rand(2, generator=gen, dtype=_DT, device="cpu") + 0.5) * torch.tensor([1.0, -1.0], dtype=_DT, device="cpu")

    def target(x):
        return c[0] * x[:, 0] * x[:, 1] + c[1] * x[:, 3] * x[:, 4]

    model = _cube_network(gen, target, width=120)
    return Probe("pairwise", model, _signed_inputs(gen), (1, 2), groups=((0, 1), (3, 4)),
                 description="c x0 x1 + c' x3 x4, features 2 and 5 unused (order-2 interactions)")


def _triple_probe(gen) -> Probe:
    d = torch.rand((), generator=gen, dtype=_DT, device="cpu") + 0.5

    def target(x):
        return d * x[:, 1] * x[:, 2] * x[:, 3]

    model = _cube_network(gen, target, width=120)
    return Probe("triple", model, _signed_inputs(gen), (1, 2), groups=((1, 2, 3),),
                 description="d x1 x2 x3, features 0, 4 and 5 unused (order-3 interaction)")


def _deep_probe(gen) -> Probe:
    """``x_0^3`` through ``z = (x_0, x_1, x_1^2)`` and cube units of ``z``: the function
    ``F(z) = z_1^3 + 3 z_1 (z_3 - z_2^2)`` equals ``x_0^3`` on the hidden manifold only."""
    n1, n2 = 40, 40
    w1 = torch.randn(n1, _N_FEATURES, generator=gen, dtype=_DT, device="cpu") / math.sqrt(_N_FEATURES)
    b1 = torch.randn(n1, generator=gen, dtype=_DT, device="cpu")
    square = PolyActivation(_QUADRATIC)
    pts = _fit_points(gen, 200, _N_FEATURES)

    def z_of(x):
        return torch.stack([x[:, 0], x[:, 1], x[:, 1] ** 2], 1)

    a1, c1 = _fit_readout(lambda p: square(p @ w1.T + b1), z_of, pts)  # z = h a1 + c1
    v = torch.randn(n2, 3, generator=gen, dtype=_DT, device="cpu") / math.sqrt(3)
    dv = torch.randn(n2, generator=gen, dtype=_DT, device="cpu")
    cube = PolyActivation(_CUBIC)
    zpts = _fit_points(gen, 200, 3)
    u, c2 = _fit_readout(lambda z: cube(z @ v.T + dv),
                         lambda z: z[:, 0] ** 3 + 3 * z[:, 0] * (z[:, 2] - z[:, 1] ** 2), zpts)
    model = nn.Sequential(_linear(w1, b1), square, _linear(v @ a1.T, v @ c1 + dv), cube,
                          _linear(u.T, c2))
    with torch.no_grad():  # the composed network must compute x_0^3
        err = (model(pts)[:, 0] - pts[:, 0] ** 3).abs().max() / 27.0
    if not err < _FIT_TOL:
        raise RuntimeError(f"deep probe is not exact (relative error {float(err):.1e})")
    return Probe("deep", model, _signed_inputs(gen), (1, 2),
                 description="x0^3 through hidden units mixing x0 with x1 (which cancels)")


def _sigmoid_mlp_probe(gen) -> Probe:
    def layer(i, o, gain):
        return _linear(gain * torch.randn(o, i, generator=gen, dtype=_DT, device="cpu") / math.sqrt(i),
                       torch.randn(o, generator=gen, dtype=_DT, device="cpu"))

    model = nn.Sequential(layer(_N_FEATURES, 16, 3.0), nn.Sigmoid(), layer(16, 16, 6.0),
                          nn.Sigmoid(), layer(16, 1, 6.0))
    return Probe("sigmoid_mlp", model, _signed_inputs(gen), (1,),
                 description="random 6-16-16-1 sigmoid MLP")


def _sigmoid_cnn_probe(gen) -> Probe:
    conv = nn.Conv2d(1, 4, 3).to(_DT)
    lin = nn.Linear(4 * 3 * 3, 1).to(_DT)
    with torch.no_grad():
        conv.weight.copy_(torch.randn(conv.weight.shape, generator=gen, dtype=_DT, device="cpu"))
        conv.bias.copy_(torch.randn(4, generator=gen, dtype=_DT, device="cpu"))
        lin.weight.copy_(torch.randn(lin.weight.shape, generator=gen, dtype=_DT, device="cpu"))
        lin.bias.copy_(torch.randn(1, generator=gen, dtype=_DT, device="cpu"))
    model = nn.Sequential(conv, nn.Sigmoid(), nn.AvgPool2d(2), nn.Flatten(), lin)
    x = torch.rand(8, 1, 8, 8, generator=gen, dtype=_DT, device="cpu")
    return Probe("sigmoid_cnn", model, x, (1,),
                 description="random Conv(1,4,3)-sigmoid-AvgPool2-Linear on 1x8x8")


def _single_index(weights: torch.Tensor, low: float, high: float) -> nn.Sequential:
    """``sigmoid(4 (w . x - low) / (high - low) - 2)`` on images shaped like ``weights``."""
    w = weights.reshape(1, -1).to(_DT)
    scale = 4.0 / (high - low)
    return nn.Sequential(nn.Flatten(), _linear(scale * w, torch.tensor([-scale * low - 2.0],
                                                                     dtype=_DT, device="cpu")), nn.Sigmoid())


def _disc(size: int, radius: float) -> torch.Tensor:
    r = torch.arange(size, dtype=_DT, device="cpu") - (size - 1) / 2
    return (r[:, None] ** 2 + r[None, :] ** 2) <= radius**2


def _polarity_probe(gen) -> Probe:
    mask = _disc(16, 4.5)[None]  # 1x16x16, the object
    w = torch.where(mask, 1.0, 0.1).to(_DT)
    dark = torch.where(mask, 0.0, 1.0).to(_DT)  # dark object on a light background
    light = 1.0 - dark
    total = float(w.sum())
    model = _single_index(w, 0.0, total)
    return Probe("polarity", model, torch.stack([dark, light]), (3,), mask=mask,
                 description="sigmoid(w.x), w=1 on a disc and 0.1 elsewhere; the disc dark on "
                             "light (sample 0) and light on dark (sample 1)")


def _equal_weights_probe(gen) -> Probe:
    x = torch.rand(2, 1, 32, 32, generator=gen, dtype=_DT, device="cpu")
    w = torch.ones(1, 32, 32, dtype=_DT, device="cpu")
    model = _single_index(w, 0.0, float(w.sum()))
    return Probe("equal_weights", model, x, (3,),
                 description="sigmoid(4 mean(x) - 2) on random textures: all pixels weigh the same")


def probe_suite(seed: int = 0) -> dict[str, Probe]:
    """The probes of the audit, built deterministically from ``seed`` (see the module doc)."""
    _check_seed(seed)
    return _build_suite(seed)


@functools.lru_cache(maxsize=4)
def _audit_suite(seed: int) -> MappingProxyType:
    """The probes :func:`audit` uses, built once per seed (read-only: never modified)."""
    return MappingProxyType(_build_suite(seed))


def _build_suite(seed: int) -> dict[str, Probe]:
    gen = cpu_generator(seed)
    # the probes (models and inputs) live on the CPU whatever the default device
    with torch.no_grad(), torch.device("cpu"):
        probes = [_independent_probe(gen), _pairwise_probe(gen), _triple_probe(gen),
                  _deep_probe(gen),
                  _sigmoid_mlp_probe(gen), _sigmoid_cnn_probe(gen), _polarity_probe(gen),
                  _equal_weights_probe(gen)]
    for p in probes:
        p.model.eval()
    return {p.name: p for p in probes}
