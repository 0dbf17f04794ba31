"""The three principles of a good attribution (paper Table 2), measured.

The paper states three principles and asserts which of its seven methods follow them:

1. **low approximation error** (completeness): the attributions sum to the output change
   ``df = f(x) - f(x~)``;
2. **correct assignment**: the first-order and independent terms of feature ``i`` go to
   ``a_i`` only, and the interactive terms of a feature set ``A`` only to features in ``A``
   (any split inside ``A`` is allowed);
3. **an unbiased baseline**: the baseline does not decide which features get attribution.

:func:`audit` measures them for any attribution method on *probes*: small networks
whose answer is known in closed form, plus, for principle 1, any models you pass.
Nothing is hard-coded: a verdict comes only from the numbers in ``report.details``.

Probes (all built in float64 from ``seed``; inputs ``x`` with ``|x_i|`` in [0.5, 1.5])
-------------------------------------------------------------------------------------

=================  ==========================================================  ==========
probe              function (realised as a network)                            principles
=================  ==========================================================  ==========
``independent``    ``sum_i a_i x_i + b_i x_i^2 + e_i x_i^3`` (independent terms)  1, 2
``pairwise``       ``c x_0 x_1 + c' x_3 x_4``; features 2, 5 unused (order 2)   1, 2
``triple``         ``d x_1 x_2 x_3``; features 0, 4, 5 unused (order 3)         1, 2
``deep``           ``x_0^3`` computed as ``F(z) = z_1^3 + 3 z_1 (z_3 - z_2^2)`` of   1, 2
                   hidden features ``z = (x_0, x_1, x_1^2)``: two nonlinear
                   layers whose units mix ``x_0`` with ``x_1`` (which cancels)
``sigmoid_mlp``    random ``6-16-16-1`` sigmoid MLP                            1
``sigmoid_cnn``    random ``Conv(1,4,3), sigmoid, AvgPool2, Linear`` on 1x8x8     1
``polarity``       ``sigmoid(w . x)`` with ``w = 1`` on a disc, ``0.1`` outside,    3
                   the disc dark on light and light on dark (1x16x16)
``equal_weights``  ``sigmoid(4 mean(x) - 2)``: every pixel weighs the same, on   3
                   random textures in [0, 1] (2 x 1x32x32)
=================  ==========================================================  ==========

The first four have 6 input features; their hidden units (activations ``y + y^2`` and
``y + y^2 + y^3``) see *all* features, with random weights and biases, and the
read-out layers are solved for so that the network computes the stated polynomial
exactly (checked to 1e-8): the *function* has the stated monomials while the units mix
features the way trained networks do.

Scores (each probe scores in [0, 1], 1 = the principle holds exactly)
----------------------------------------------------------------------
Every method uses its own baseline: the audit passes ``baselines = 0`` (the black image),
which Gradient*Input and epsilon-LRP use implicitly; Expected Gradients draws its own,
``x~ ~ N(x, EG_NOISE_STD^2)`` (``EG_SAMPLES`` draws). Targets are averaged over the
baselines a method used (one for a deterministic method); masses and ``|df|`` average
their absolute values per baseline, so terms that cancel in expectation over random
baselines (interactions under isotropic noise) still count.

* Principle 1, per probe: ``gap = sum_b |sum_i a_bi - df_b| / sum_b E_k |df_bk|`` over the
  probe's samples ``b`` (and baselines ``k``); score ``1 - min(1, gap)``.
* Principle 2, per probe. The function of each probe is additively separable over known
  blocks (singletons and interaction sets), so the correct attributions form the set
  ``C = {a : a_i = t_i for singletons i, sum_{i in A} a_i = t_A for sets A}`` with
  ``t_i = f(x) - f(x with x_i := x~_i) = T^a_i + T^gd_i`` (Thm 2: first plus independent
  terms, all orders) and ``t_A = f(x) - f(x with x_A := x~_A)``. The misassigned mass is
  the L1 distance from ``a`` to ``C``; it is divided by the mass of the terms the
  principle is about, ``sum_i |T^gd_i| + sum_A |T^gt_A|`` (``T^gd_i = t_i - d_i f(x)
  delta_i``, ``T^gt_A = t_A - sum_{i in A} t_i``); score ``1 - min(1, ratio)``. Details
  also give (a) the share of the independent terms that reaches its own feature and
  (b) the share of the interactive terms that reaches its set and the share landing
  outside it.
* Principle 3: ``polarity`` scores ``1 - |s_dark - s_light|`` with ``s`` the share of
  ``sum |a_i|`` on the object; ``equal_weights`` scores ``1 - max(0, r)`` with ``r`` the
  largest Pearson correlation, over references ``c`` in {0, 0.1, ..., 1}, between
  ``|a_i|`` and ``|x_i - c|`` (attribution driven by the distance to *some* constant
  baseline; ``c = 0`` is ``|delta_i|`` for the black baseline, reported as
  ``corr_black``).

A probe is **passed** when its score is at least :data:`PASS_SCORE`. The verdict of a
principle is ``"follows"`` when every probe of that principle is passed, ``"partially"``
when some are, and ``"does not"`` when none is. ``report.scores[p]`` is the mean probe
score.
"""
from __future__ import annotations

import functools
import inspect
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import torch
from torch import nn

from . import _validation as V
from ._validation import check_seed as _check_seed
from .methods._base import target_gradient
from .models import PolyActivation

__all__ = [
    "EG_NOISE_STD",
    "EG_SAMPLES",
    "PAPER_VERDICTS",
    "PASS_SCORE",
    "VERDICTS",
    "AuditReport",
    "Probe",
    "audit",
    "captum_adapter",
    "format_table",
    "principles_table",
    "probe_suite",
]

#: A probe is passed when its score (1 = exact) is at least this: at most 10% of the
#: mass in question (the output change for principle 1, the higher-order terms for 2,
#: a polarity gap or correlation for 3) is wrong.
PASS_SCORE = 0.9
#: Noise scale of Expected Gradients' baselines ``N(x, s^2)`` in the audit.
EG_NOISE_STD = 0.2
#: Baseline draws of Expected Gradients in the audit (its Monte-Carlo error at the
#: library default of 50 draws is about 10% of the higher-order mass; see the docs).
EG_SAMPLES = 256
#: The verdict strings, best first.
VERDICTS = ("follows", "partially", "does not")

_F, _P, _N = VERDICTS
#: The paper's Table 2 (DESIGN.md section 3), by registry name.
PAPER_VERDICTS: Mapping[str, Mapping[int, str]] = MappingProxyType({
    "gradient_input": {1: _N, 2: _N, 3: _N},
    "occlusion_1": {1: _N, 2: _P, 3: _N},
    "occlusion_patch": {1: _N, 2: _P, 3: _N},
    "deeplift": {1: _F, 2: _N, 3: _N},
    "epsilon_lrp": {1: _F, 2: _N, 3: _N},
    "integrated_gradients": {1: _F, 2: _F, 3: _N},
    "expected_gradients": {1: _F, 2: _F, 3: _F},
})

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


# =======================================================================================
# Probe networks
# =======================================================================================
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
    design = torch.cat([h, torch.ones(h.shape[0], 1, dtype=_DT)], 1)
    sol = torch.linalg.lstsq(design, y, driver="gelsd").solution
    err = (design @ sol - y).abs().max() / y.abs().max().clamp_min(1.0)
    if not err < _FIT_TOL:
        raise RuntimeError(f"probe read-out fit is not exact (relative error {float(err):.1e}); "
                           "try another seed")
    return sol[:-1], sol[-1]


def _signed_inputs(gen: torch.Generator, n: int = _N_SAMPLES, d: int = _N_FEATURES):
    mag = 0.5 + torch.rand(n, d, generator=gen, dtype=_DT)
    sign = torch.where(torch.rand(n, d, generator=gen, dtype=_DT) < 0.5, -1.0, 1.0)
    return (mag * sign).to(_DT)


def _fit_points(gen: torch.Generator, n: int, d: int) -> torch.Tensor:
    return 3.0 * (2 * torch.rand(n, d, generator=gen, dtype=_DT) - 1)


def _cube_network(gen, target, width: int) -> nn.Sequential:
    """``Linear(6, width) -> y^3 -> Linear(width, 1)`` computing the polynomial ``target``
    (degree <= 3) exactly; hidden units see every feature, with random weights and biases."""
    w = torch.randn(width, _N_FEATURES, generator=gen, dtype=_DT) / math.sqrt(_N_FEATURES)
    b = torch.randn(width, generator=gen, dtype=_DT)
    act = PolyActivation(_CUBIC)
    pts = _fit_points(gen, 4 * width, _N_FEATURES)
    u, c = _fit_readout(lambda p: act(p @ w.T + b), target, pts)
    return nn.Sequential(_linear(w, b), act, _linear(u.T, c))


def _independent_probe(gen) -> Probe:
    a, bq, e = (torch.randn(3, _N_FEATURES, generator=gen, dtype=_DT).sign()
                * (0.5 + torch.rand(3, _N_FEATURES, generator=gen, dtype=_DT)))

    def target(x):
        return (a * x + bq * x**2 + e * x**3).sum(1)

    model = _cube_network(gen, target, width=120)
    return Probe("independent", model, _signed_inputs(gen), (1, 2),
                 description="sum_i a_i x_i + b_i x_i^2 + e_i x_i^3 (independent terms only)")


def _pairwise_probe(gen) -> Probe:
    c = (torch.rand(2, generator=gen, dtype=_DT) + 0.5) * torch.tensor([1.0, -1.0], dtype=_DT)

    def target(x):
        return c[0] * x[:, 0] * x[:, 1] + c[1] * x[:, 3] * x[:, 4]

    model = _cube_network(gen, target, width=120)
    return Probe("pairwise", model, _signed_inputs(gen), (1, 2), groups=((0, 1), (3, 4)),
                 description="c x0 x1 + c' x3 x4, features 2 and 5 unused (order-2 interactions)")


def _triple_probe(gen) -> Probe:
    d = torch.rand((), generator=gen, dtype=_DT) + 0.5

    def target(x):
        return d * x[:, 1] * x[:, 2] * x[:, 3]

    model = _cube_network(gen, target, width=120)
    return Probe("triple", model, _signed_inputs(gen), (1, 2), groups=((1, 2, 3),),
                 description="d x1 x2 x3, features 0, 4 and 5 unused (order-3 interaction)")


def _deep_probe(gen) -> Probe:
    """``x_0^3`` through ``z = (x_0, x_1, x_1^2)`` and cube units of ``z``: the function
    ``F(z) = z_1^3 + 3 z_1 (z_3 - z_2^2)`` equals ``x_0^3`` on the hidden manifold only."""
    n1, n2 = 40, 40
    w1 = torch.randn(n1, _N_FEATURES, generator=gen, dtype=_DT) / math.sqrt(_N_FEATURES)
    b1 = torch.randn(n1, generator=gen, dtype=_DT)
    square = PolyActivation(_QUADRATIC)
    pts = _fit_points(gen, 200, _N_FEATURES)

    def z_of(x):
        return torch.stack([x[:, 0], x[:, 1], x[:, 1] ** 2], 1)

    a1, c1 = _fit_readout(lambda p: square(p @ w1.T + b1), z_of, pts)  # z = h a1 + c1
    v = torch.randn(n2, 3, generator=gen, dtype=_DT) / math.sqrt(3)
    dv = torch.randn(n2, generator=gen, dtype=_DT)
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
        return _linear(gain * torch.randn(o, i, generator=gen, dtype=_DT) / math.sqrt(i),
                       torch.randn(o, generator=gen, dtype=_DT))

    model = nn.Sequential(layer(_N_FEATURES, 16, 3.0), nn.Sigmoid(), layer(16, 16, 6.0),
                          nn.Sigmoid(), layer(16, 1, 6.0))
    return Probe("sigmoid_mlp", model, _signed_inputs(gen), (1,),
                 description="random 6-16-16-1 sigmoid MLP")


def _sigmoid_cnn_probe(gen) -> Probe:
    conv = nn.Conv2d(1, 4, 3).to(_DT)
    lin = nn.Linear(4 * 3 * 3, 1).to(_DT)
    with torch.no_grad():
        conv.weight.copy_(torch.randn(conv.weight.shape, generator=gen, dtype=_DT))
        conv.bias.copy_(torch.randn(4, generator=gen, dtype=_DT))
        lin.weight.copy_(torch.randn(lin.weight.shape, generator=gen, dtype=_DT))
        lin.bias.copy_(torch.randn(1, generator=gen, dtype=_DT))
    model = nn.Sequential(conv, nn.Sigmoid(), nn.AvgPool2d(2), nn.Flatten(), lin)
    x = torch.rand(8, 1, 8, 8, generator=gen, dtype=_DT)
    return Probe("sigmoid_cnn", model, x, (1,),
                 description="random Conv(1,4,3)-sigmoid-AvgPool2-Linear on 1x8x8")


def _single_index(weights: torch.Tensor, low: float, high: float) -> nn.Sequential:
    """``sigmoid(4 (w . x - low) / (high - low) - 2)`` on images shaped like ``weights``."""
    w = weights.reshape(1, -1).to(_DT)
    scale = 4.0 / (high - low)
    return nn.Sequential(nn.Flatten(), _linear(scale * w, torch.tensor([-scale * low - 2.0],
                                                                     dtype=_DT)), nn.Sigmoid())


def _disc(size: int, radius: float) -> torch.Tensor:
    r = torch.arange(size, dtype=_DT) - (size - 1) / 2
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
    x = torch.rand(2, 1, 32, 32, generator=gen, dtype=_DT)
    w = torch.ones(1, 32, 32, dtype=_DT)
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
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        probes = [_independent_probe(gen), _pairwise_probe(gen), _triple_probe(gen),
                  _deep_probe(gen),
                  _sigmoid_mlp_probe(gen), _sigmoid_cnn_probe(gen), _polarity_probe(gen),
                  _equal_weights_probe(gen)]
    for p in probes:
        p.model.eval()
    return {p.name: p for p in probes}


# =======================================================================================
# Methods: ours, Captum's, or any callable (model, inputs, baselines, target)
# =======================================================================================
@dataclass(frozen=True)
class _Attributor:
    """A method made uniform: ``run(model, x, baselines, target) -> (a, used)`` where
    ``used`` holds the baselines the method actually used, ``[B, n, ...]``."""

    name: str
    fn: Callable
    draws: Callable | None = None  # inputs -> EGDraws (Expected Gradients only)
    settings: Mapping[str, Any] = field(default_factory=dict)

    def run(self, model, x, baselines, target):
        if self.draws is not None:
            d = self.draws(x)
            a = self.fn(model, x, d, target)
            used = d.baselines
        else:
            a = self.fn(model, x, baselines, target)
            used = baselines.unsqueeze(1)
        if not isinstance(a, torch.Tensor):
            raise TypeError(f"method {self.name!r} must return a torch.Tensor of attributions, "
                            f"got {type(a).__name__}")
        if a.shape != x.shape:
            raise ValueError(f"method {self.name!r} returned attributions of shape "
                             f"{tuple(a.shape)} for inputs of shape {tuple(x.shape)}")
        a = a.detach().to(x.dtype)
        if not torch.isfinite(a).all():
            raise ValueError(f"method {self.name!r} returned NaN or inf attributions")
        return a, used.to(x.dtype)


def _registry():
    from .methods import METHODS, AttributionMethod, ExpectedGradients, MethodSpec

    return METHODS, AttributionMethod, ExpectedGradients, MethodSpec


def _spec_for_class(cls):
    METHODS, *_ = _registry()
    for spec in METHODS.values():
        if spec.cls is cls and not spec.fixed and not spec.defaults:
            return spec
    for spec in METHODS.values():  # e.g. Occlusion: occlusion_1 (its class default patch=1)
        if spec.cls is cls:
            return spec
    return None


def _our_attributor(spec, init_kwargs: dict, kwargs: dict, seed: int, name: str) -> _Attributor:
    _, _, ExpectedGradients, _ = _registry()
    if issubclass(spec.cls, ExpectedGradients):
        from .methods.expected_gradients import draw

        kw = dict(kwargs)
        ref = kw.pop("baselines", None)
        noise = kw.pop("noise_std", None if ref is not None else EG_NOISE_STD)
        n = kw.pop("n_samples", EG_SAMPLES)
        s = kw.pop("seed", seed)

        def eg(model, x, draws, target):
            return spec.build(model, **init_kwargs).attribute(x, target=target, draws=draws, **kw)

        settings = {**init_kwargs, **kw, "noise_std": noise, "n_samples": n, "seed": s}
        if ref is not None:
            settings["baselines"] = f"reference tensor {tuple(ref.shape)}"
        return _Attributor(name, eg, draws=lambda x: draw(x, ref, n, noise, s),
                           settings=settings)
    attr_kwargs = spec.attribute_kwargs(**kwargs)

    def run(model, x, baselines, target):
        method = spec.build(model, **init_kwargs)
        if spec.uses_baselines:
            return method.attribute(x, baselines=baselines, target=target, **attr_kwargs)
        return method.attribute(x, target=target, **attr_kwargs)

    return _Attributor(name, run, settings={**init_kwargs, **attr_kwargs})


def _resolve(method, method_kwargs, seed) -> _Attributor:
    METHODS, AttributionMethod, _, MethodSpec = _registry()
    if method_kwargs is None:
        method_kwargs = {}
    if not isinstance(method_kwargs, Mapping):
        raise TypeError(f"method_kwargs must be a mapping or None, got "
                        f"{type(method_kwargs).__name__}")
    kwargs = dict(method_kwargs)
    if isinstance(method, str):
        if method not in METHODS:
            raise ValueError(f"method must be one of {sorted(METHODS)}, a method class or "
                             f"instance, or a callable (model, inputs, baselines, target); "
                             f"got the unknown name {method!r}")
        spec = METHODS[method]
        init = {k: kwargs.pop(k) for k in spec.init_args if k in kwargs}
        return _our_attributor(spec, init, kwargs, seed, method)
    if isinstance(method, MethodSpec):
        init = {k: kwargs.pop(k) for k in method.init_args if k in kwargs}
        return _our_attributor(method, init, kwargs, seed, method.name)
    if isinstance(method, type):
        if issubclass(method, AttributionMethod):
            spec = _spec_for_class(method)
            if spec is None:
                raise ValueError(f"method: the class {method.__name__} is not in the registry "
                                 "taylorattr.methods.METHODS")
            init = {k: kwargs.pop(k) for k in spec.init_args if k in kwargs}
            return _our_attributor(spec, init, kwargs, seed, spec.name)
        raise TypeError(f"method must be a registry name, one of our method classes or "
                        f"instances, or a callable (model, inputs, baselines, target); got the "
                        f"class {method.__name__} (wrap a Captum class with "
                        "taylorattr.principles.captum_adapter)")
    if isinstance(method, AttributionMethod):
        spec = _spec_for_class(type(method))
        if spec is None:
            raise ValueError(f"method: {type(method).__name__} is not in the registry "
                             "taylorattr.methods.METHODS")
        params = inspect.signature(type(method).__init__).parameters
        init = {k: getattr(method, k) for k in params
                if k not in ("self", "model") and hasattr(method, k)}
        init.update({k: kwargs.pop(k) for k in spec.init_args if k in kwargs})
        return _our_attributor(spec, init, kwargs, seed, spec.name)
    if isinstance(method, nn.Module):
        raise TypeError(f"method must be a method name, a method class or instance, or a callable "
                        f"(model, inputs, baselines, target) -> attributions; got the model "
                        f"{type(method).__name__} itself")
    if callable(method):
        name = getattr(method, "__name__", type(method).__name__)
        if kwargs:
            def fn(model, x, baselines, target):
                return method(model, x, baselines, target, **kwargs)
        else:
            fn = method
        return _Attributor(name, fn, settings=kwargs)
    raise TypeError(f"method must be a registry name (str), one of our method classes or "
                    f"instances, or a callable (model, inputs, baselines, target); got "
                    f"{type(method).__name__}")


def captum_adapter(captum_method_class, **attribute_kwargs) -> Callable:
    """Turn a Captum attribution class into an audit callable.

    ``captum_adapter(captum.attr.IntegratedGradients, n_steps=50)`` returns
    ``fn(model, inputs, baselines, target)`` that builds ``captum_method_class(model)`` and
    calls its ``attribute(inputs, target=target, baselines=baselines, **attribute_kwargs)``
    (``baselines`` only when that ``attribute`` takes them and they are not given here).
    """
    if not isinstance(captum_method_class, type) or not callable(
            getattr(captum_method_class, "attribute", None)):
        raise TypeError("captum_method_class must be an attribution class with an `attribute` "
                        f"method (e.g. captum.attr.IntegratedGradients), got "
                        f"{captum_method_class!r}")
    takes_baselines = "baselines" in inspect.signature(captum_method_class.attribute).parameters

    def attribute(model, inputs, baselines, target):
        kw = dict(attribute_kwargs)
        if takes_baselines:
            kw.setdefault("baselines", baselines)
        return captum_method_class(model).attribute(inputs, target=target, **kw)

    attribute.__name__ = f"captum.{captum_method_class.__name__}"
    attribute.__qualname__ = attribute.__name__
    return attribute


# =======================================================================================
# Measurements
# =======================================================================================
def _explained(model, x, target) -> torch.Tensor:
    with torch.no_grad():
        return V.select_output(V.model_output(model, x), target)


def _target_tensor(model, x, target) -> torch.Tensor | None:
    with torch.no_grad():
        return V.resolve_target(target, V.model_output(model, x))


def _output_changes(model, x, used, target) -> torch.Tensor:
    """``f(x) - f(x~_k)`` for every baseline used: ``[B, n]``."""
    B, n = used.shape[:2]
    fx = _explained(model, x, target)
    t = None if target is None else target.repeat_interleave(n)
    fb = _explained(model, used.reshape(B * n, *x.shape[1:]), t).view(B, n)
    return fx[:, None] - fb


def _completeness(model, x, a, used, target) -> dict:
    df = _output_changes(model, x, used, target)
    total = a.flatten(1).sum(1)
    gap = float((total - df.mean(1)).abs().sum() / df.abs().mean(1).sum().clamp_min(1e-300))
    return {"gap": gap, "score": 1.0 - min(1.0, gap)}


def _replaced(model, x, used, features, target) -> torch.Tensor:
    """``f(x) - f(x with x_F := x~_kF)`` for the flat feature indices ``F``: ``[B, n]``."""
    B, n = used.shape[:2]
    xf = x.reshape(B, 1, -1).expand(B, n, -1).clone()
    idx = torch.as_tensor(features)
    xf[:, :, idx] = used.reshape(B, n, -1)[:, :, idx]
    t = None if target is None else target.repeat_interleave(n)
    f_rep = _explained(model, xf.reshape(B * n, *x.shape[1:]), t).view(B, n)
    return _explained(model, x, target)[:, None] - f_rep


def _projection(u: torch.Tensor, v: torch.Tensor) -> float | None:
    """``<u, v> / <v, v>``: how much of ``v`` ``u`` carries (None when ``v`` is zero)."""
    vv = float((v * v).sum())
    if vv <= 1e-20 * max(1.0, float((u * u).sum())):
        return None
    return float((u * v).sum()) / vv


def _assignment(model, x, a, used, target, groups) -> dict:
    """Principle 2 on a probe whose function is separable over ``groups`` + singletons.

    Per baseline ``k``: ``t_ik`` (first + independent terms of ``i``), ``T^gd_ik``, and per
    set ``A`` the total ``t_Ak`` and its interactive terms ``T^gt_Ak``. Targets are averaged
    over ``k``; masses are the average of the per-baseline absolute terms.
    """
    B = x.shape[0]
    d = x[0].numel()
    af = a.reshape(B, d)
    delta = x.reshape(B, 1, d) - used.reshape(B, used.shape[1], d)  # [B, n, d]
    grad = target_gradient(model, x.detach().clone(), target)[0].reshape(B, 1, d)
    first_k = grad * delta
    t_k = torch.stack([_replaced(model, x, used, [i], target) for i in range(d)], 2)
    gd_k = t_k - first_k  # independent terms T^gd, all orders
    t, first, gd = t_k.mean(1), first_k.mean(1), gd_k.mean(1)
    in_group = torch.zeros(d, dtype=torch.bool)
    for g in groups:
        in_group[list(g)] = True
    single = ~in_group

    mass = gd_k.abs().mean(1).sum()
    single_err = (af[:, single] - t[:, single]).abs().sum()
    mis = single_err
    inter_mass = torch.zeros((), dtype=x.dtype)
    in_set, gt = [], []
    for g in groups:
        idx = list(g)
        t_set_k = _replaced(model, x, used, idx, target)
        gt_k = t_set_k - t_k[:, :, idx].sum(2)  # interactive terms T^gt of the set
        inter_mass = inter_mass + gt_k.abs().mean(1).sum()
        mis = mis + (af[:, idx].sum(1) - t_set_k.mean(1)).abs().sum()
        in_set.append(af[:, idx].sum(1) - t[:, idx].sum(1))
        gt.append(gt_k.mean(1))
    mass = float(mass + inter_mass)
    ratio = float(mis) / max(mass, 1e-300)
    out = {"misassigned": ratio, "score": 1.0 - min(1.0, ratio)}
    # (a) how much of the independent terms of the singletons reaches their own feature
    reach = _projection(af[:, single] - first[:, single], gd[:, single])
    if reach is not None:
        out["independent_reach"] = reach
    # (b) how much of the interactive terms reaches its set, and how much lands outside
    if groups:
        share = _projection(torch.stack(in_set), torch.stack(gt))
        if share is not None:
            out["interactive_in_set"] = share
        out["interactive_outside"] = float(single_err) / max(float(inter_mass), 1e-300)
    return out


def _pearson(u: torch.Tensor, v: torch.Tensor) -> float:
    u = u - u.mean()
    v = v - v.mean()
    den = float(u.norm() * v.norm())
    return float((u * v).sum()) / den if den > 0 else 0.0


def _polarity(a, mask) -> dict:
    shares = []
    for b in range(a.shape[0]):
        m = a[b].abs()
        tot = float(m.sum())
        shares.append(float(m[mask].sum()) / tot if tot > 0 else float("nan"))
    dark, light = shares
    gap = abs(dark - light) if not math.isnan(dark + light) else 1.0
    return {"object_share_dark": dark, "object_share_light": light, "gap": gap,
            "score": 1.0 - min(1.0, gap)}


def _reference_correlation(x, a, baselines) -> dict:
    mag = a.abs().flatten()
    if float(mag.sum()) == 0:  # no attribution mass: nothing to measure, not a pass
        return {"corr_black": float("nan"), "max_corr": float("nan"),
                "max_corr_reference": float("nan"), "score": 0.0}
    corr = {c: _pearson(mag, (x.flatten() - c).abs()) for c in _REFERENCES}
    c_best = max(corr, key=corr.get)
    r = max(0.0, corr[c_best])
    return {"corr_black": _pearson(mag, (x - baselines).abs().flatten()),
            "max_corr": corr[c_best], "max_corr_reference": c_best, "score": 1.0 - min(1.0, r)}


# =======================================================================================
# The report
# =======================================================================================
def _verdict(probe_scores: Iterable[float]) -> str:
    passed = [s >= PASS_SCORE for s in probe_scores]
    if passed and all(passed):
        return _F
    return _P if any(passed) else _N


@dataclass(frozen=True)
class AuditReport:
    """The measured principles of one method.

    ``scores[p]``: mean probe score in [0, 1] for principle ``p`` (1 = exact);
    ``verdicts[p]``: ``"follows"`` / ``"partially"`` / ``"does not"`` (every / some / no
    probe scores at least :data:`PASS_SCORE`); ``details[p]``: per-probe raw numbers;
    ``paper``: the paper's verdicts when ``method`` is one of its seven, else None;
    ``settings``: the pass score, the method's effective settings (e.g. Expected
    Gradients' ``noise_std`` and ``n_samples``) and the names of extra models.
    """

    method: str
    scores: Mapping[int, float]
    verdicts: Mapping[int, str]
    details: Mapping[int, Mapping[str, Mapping[str, Any]]]
    paper: Mapping[int, str] | None = None
    pass_score: float = PASS_SCORE
    seed: int = 0
    settings: Mapping[str, Any] = field(default_factory=dict)

    def differs_from_paper(self) -> list[int]:
        """Principles whose measured verdict differs from the paper's."""
        if self.paper is None:
            return []
        return [p for p in (1, 2, 3) if self.verdicts[p] != self.paper[p]]

    def __str__(self) -> str:
        names = {1: "1 low approximation error", 2: "2 correct assignment",
                 3: "3 unbiased baseline"}
        title = (f"Principle audit of {self.method} (seed {self.seed}; a probe passes at "
                 f"score >= {self.pass_score})")
        lines = [title]
        head = f"  {'principle':<28}{'score':>7}  {'verdict':<11}"
        if self.paper is not None:
            head += "paper"
        lines.append(head)
        for p in (1, 2, 3):
            row = f"  {names[p]:<28}{self.scores[p]:>7.3f}  {self.verdicts[p]:<11}"
            if self.paper is not None:
                row += self.paper[p] + ("" if self.paper[p] == self.verdicts[p] else "  *")
            lines.append(row)
        lines.append("  probe scores:")
        for p in (1, 2, 3):
            items = ", ".join(f"{k} {v['score']:.3f}" for k, v in self.details[p].items())
            lines.append(f"    {p}: {items}")
        if self.differs_from_paper():
            lines.append("  * measured verdict differs from the paper's (docs/principles.md)")
        return "\n".join(lines)


def _check_models(models) -> list[tuple[str, Any, torch.Tensor]]:
    if models is None:
        return []
    if isinstance(models, Mapping):
        items = list(models.items())
    elif isinstance(models, Iterable) and not isinstance(models, (str, bytes, torch.Tensor)):
        items = [(f"model_{k}", pair) for k, pair in enumerate(models)]
    else:
        raise TypeError("models must be None, a mapping name -> (model, inputs) or a sequence "
                        f"of (model, inputs) pairs, got {type(models).__name__}")
    out = []
    for name, pair in items:
        if not (isinstance(pair, (tuple, list)) and len(pair) == 2):
            raise TypeError(f"models[{name!r}] must be a (model, inputs) pair, got "
                            f"{type(pair).__name__}")
        model, x = pair
        V.check_model(model, f"models[{name!r}] model")
        V.check_inputs(x, f"models[{name!r}] inputs")
        out.append((str(name), model, x.detach()))
    return out


def audit(method, *, seed: int = 0, models=None, method_kwargs=None) -> AuditReport:
    """Measure the three principles for ``method`` (see the module docstring).

    Args:
        method: a registry name (``"integrated_gradients"``, see
            ``taylorattr.methods.METHODS``), one of our method classes or instances, or any
            callable ``(model, inputs, baselines, target) -> attributions`` (attributions
            shaped like ``inputs``; :func:`captum_adapter` makes one from a Captum class).
        seed: builds the probes and seeds Expected Gradients' draws.
        models: extra models for principle 1, e.g. trained MNIST networks: a mapping
            ``name -> (model, inputs)`` or a sequence of ``(model, inputs)`` pairs; each is
            explained for its argmax class against the zero baseline.
        method_kwargs: keyword arguments for the method (constructor or ``attribute``
            arguments for ours, e.g. ``{"n_steps": 64}``; extra keyword arguments for a
            callable). Expected Gradients defaults to ``noise_std=EG_NOISE_STD`` and
            ``n_samples=EG_SAMPLES``.
    """
    _check_seed(seed)
    att = _resolve(method, method_kwargs, seed)
    extra = _check_models(models)
    probes = _audit_suite(seed)
    details: dict[int, dict[str, dict]] = {1: {}, 2: {}, 3: {}}
    for probe in probes.values():
        x = probe.inputs
        target = _target_tensor(probe.model, x, probe.target)
        baselines = torch.zeros_like(x)
        a, used = att.run(probe.model, x, baselines, target)
        if 1 in probe.principles:
            details[1][probe.name] = _completeness(probe.model, x, a, used, target)
        if 2 in probe.principles:
            details[2][probe.name] = _assignment(probe.model, x, a, used, target, probe.groups)
        if 3 in probe.principles:  # an object mask: its share; else |a| against |delta|
            details[3][probe.name] = (_polarity(a, probe.mask) if probe.mask is not None
                                      else _reference_correlation(x, a, baselines))
    for name, model, x in extra:
        target = _target_tensor(model, x, None)
        baselines = torch.zeros_like(x)
        a, used = att.run(model, x, baselines, target)
        details[1][name] = _completeness(model, x, a, used, target)
    scores = {p: sum(v["score"] for v in details[p].values()) / len(details[p]) for p in details}
    verdicts = {p: _verdict(v["score"] for v in details[p].values()) for p in details}
    return AuditReport(
        method=att.name,
        scores=MappingProxyType(scores),
        verdicts=MappingProxyType(verdicts),
        details=MappingProxyType({p: MappingProxyType(d) for p, d in details.items()}),
        paper=PAPER_VERDICTS.get(att.name),
        seed=seed,
        settings=MappingProxyType({"pass_score": PASS_SCORE, "method": dict(att.settings),
                                   "models": [name for name, *_ in extra]}),
    )


# =======================================================================================
# The measured Table 2
# =======================================================================================
def principles_table(methods=None, seed: int = 0) -> list[dict]:
    """The measured Table 2: one row per method (default: the seven registry methods).

    Each row: ``method``, ``score_1..3``, ``verdict_1..3`` and ``paper_1..3`` (the
    paper's verdicts, None for methods outside the paper).
    """
    if methods is None:
        METHODS, *_ = _registry()
        methods = list(METHODS)
    elif isinstance(methods, (str, bytes)) or not isinstance(methods, Iterable):
        raise TypeError(f"methods must be None or a sequence of methods, got "
                        f"{type(methods).__name__}")
    rows = []
    for m in methods:
        r = audit(m, seed=seed)
        row = {"method": r.method}
        for p in (1, 2, 3):
            row[f"score_{p}"] = r.scores[p]
        for p in (1, 2, 3):
            row[f"verdict_{p}"] = r.verdicts[p]
        for p in (1, 2, 3):
            row[f"paper_{p}"] = None if r.paper is None else r.paper[p]
        rows.append(row)
    return rows


def format_table(rows: list[dict]) -> str:
    """A Markdown pipe table of :func:`principles_table` rows (score, verdict and the
    paper's verdict per principle); ``*`` marks a measured verdict that differs from the
    paper's."""
    from .report import markdown_table

    cols = ["1 low error", "2 assignment", "3 unbiased baseline"]
    body, marked = [], False
    for r in rows:
        cells = [r["method"]]
        for p in (1, 2, 3):
            paper = r.get(f"paper_{p}")
            text = f"{r[f'score_{p}']:.2f} {r[f'verdict_{p}']}"
            if paper is not None:
                mark = "" if paper == r[f"verdict_{p}"] else " *"
                marked |= bool(mark)
                text += f" ({paper}){mark}"
            cells.append(text)
        body.append(cells)
    out = [markdown_table(["method"] + [f"{c}: score verdict (paper)" for c in cols], body), "",
           (f"A probe passes at score >= {PASS_SCORE}; follows = every probe passes, "
            "partially = some do, does not = none.")]
    if marked:
        out.append("Verdicts marked * differ from the paper's Table 2 (see docs/principles.md).")
    return "\n".join(out)
