"""The paper's Theorems 1-5 and its corollary for sampled baselines, as code (docs/design.md).

Each reformulation rebuilds a method's attribution from exact Taylor terms of order K,
with ``delta = x - x~`` and ``P_k`` as in :mod:`taylorattr.taylor.terms`; the registry
(:mod:`taylorattr.registry`) gives each method its reformulation:

=======================  ============================================================
GRADIENT_INPUT           Thm 1: ``T^a_i`` with ``x~ = 0`` (order 1, whatever K)
OCCLUSION_1              Thm 2: ``T^a_i + T^gd_i``: ``g_K`` of moving feature (pixel) i alone
OCCLUSION_PATCH          Thm 3 (corrected): ``g_K(delta restricted to p)``, every term
                         inside the patch once, given to every feature of the patch
DEEPLIFT                 Thm 4, per layer: ``(z_ji - z~_ji)/(y_j - y~_j) * g_K(sigma; y_j -> y~_j)``
EPSILON_LRP              supplement, per layer: ``z_ji/(y_j + eps s) * g_K(sigma; y_j -> b_j)``
INTEGRATED_GRADIENTS     Thm 5: ``T^a_i + T^gd_i + a^gt_i`` (each order's IG share)
averaged_over_draws(d)   the Theorem 5 reformulation averaged over the drawn references
SHAPLEY_RULE             each monomial shared equally by its support (K <= 4)
=======================  ============================================================

Each reformulation also counts its own rows (``cost``, :meth:`Reformulation.cost_of`):
the rows the model sees when it runs (:mod:`taylorattr.runtime.cost`), so that a run's estimate
needs no list of methods; a reformulation registered without one is named as not counted.

The layer-wise originals replace the neuron's change ``x_j^(l+1) - x~_j^(l+1)`` in the
ratio by its order-K Taylor expansion in ``y``, so per layer the original and the
reformulation share the ratio and differ by the truncation of one activation.

Why one module: every reformulation is a few lines over the same Taylor entry points and
the same :class:`Reformulation` object; split per method they would repeat its contract.
"""
from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch
from torch import nn

from .. import _validation as V
from ..baselines import Baseline
from ..groups import window_ids
from ..metrics import percentage_change
from ..runtime.cost import Cost, summed
from ..taylor.mode import propagate, trace
from ..taylor.shapley_rule import shapley_attribution, shapley_attribution_cost
from ..taylor.terms import (
    group_expansions,
    group_expansions_cost,
    taylor_attribution,
    taylor_attribution_cost,
)
from . import gradient_shap, noise_tunnel
from .deeplift import DeepLift
from .layerwise import denominator as rec_denominator
from .layerwise import edge_terms, local_relevance
from .lrp import EpsilonLRP

__all__ = ["DEEPLIFT", "EPSILON_LRP", "GRADIENT_INPUT", "INTEGRATED_GRADIENTS", "OCCLUSION_1",
           "OCCLUSION_PATCH", "SHAPLEY_RULE", "LayerReformulation", "Reformulation", "averaged_over_draws",
           "drawn_rows_cost", "gradient_shap_reformulation", "noisy_copies_cost", "smoothed"]


@dataclass(frozen=True)
class Reformulation:
    """A method's Taylor reformulation: ``{K: result}`` for a sweep of orders ``K``.

    ``compute(model, inputs, baselines, target, orders, **options)`` returns one result per
    order: an attribution shaped like ``inputs``, or, when ``layerwise``, a list of
    :class:`LayerReformulation` (one per layer followed by a nonlinearity). ``options``
    names the keyword arguments it takes (anything else is refused); a method's settings
    outside them (``n_steps``, say) do not change the reformulation. ``exact`` says what
    the reformulation claims (``docs/design.md``): the theorem it implements.

    ``cost(inputs, baselines, orders, **options)`` counts, without running the model, the
    rows ``compute`` runs on one-tensor inputs (a :class:`taylorattr.runtime.cost.Cost`, whatever
    the target); None means the reformulation does not count its rows (an estimate names
    it as not counted).
    """

    compute: Callable
    options: frozenset = frozenset()
    layerwise: bool = False
    claim: str = ""
    cost: Callable | None = None

    def cost_of(self, inputs: torch.Tensor, baselines, orders, settings: Mapping | None = None):
        """The rows of ``orders(model, inputs, baselines, target, orders, **options)`` with
        ``options`` the entries of a method's ``settings`` this reformulation takes
        (:meth:`own_options`): a :class:`taylorattr.runtime.cost.Cost` labelled ``"reformulation"``,
        or None when it does not count them (``cost`` is None). Runs no model."""
        if self.cost is None:
            return None
        orders = tuple(orders)
        if not orders:
            raise ValueError("orders must hold at least one order, got an empty sequence")
        inputs = V.check_inputs(inputs)
        cost = self.cost(inputs, baselines, orders, **self.own_options(settings or {}))
        return cost.labelled("reformulation", int(inputs.shape[0]))

    def check_options(self, method: str, options: Mapping) -> None:
        unknown = sorted(set(options) - self.options)
        if unknown:
            allowed = ", ".join(sorted(self.options)) or "none"
            raise TypeError(f"reformulate('{method}') got unexpected keyword argument(s) "
                            f"{', '.join(map(repr, unknown))} (accepted: {allowed})")

    def own_options(self, settings: Mapping) -> dict:
        """The entries of a method's ``settings`` this reformulation takes."""
        return {k: v for k, v in settings.items() if k in self.options}

    def orders(self, model, inputs, baselines, target, orders, **options) -> dict:
        """``{K: reformulation at order K for K in orders}``."""
        return self.compute(model, inputs, baselines, target, tuple(orders), **options)

    def __call__(self, model, inputs, baselines, target, order: int, **options):
        return self.orders(model, inputs, baselines, target, (order,), **options)[order]

    def percentage_change(self, original: Callable[[], torch.Tensor], reformulated
                          ) -> torch.Tensor:
        """Per-sample ``||a_o - a_r||^2 / ||a_o||^2 * 100%`` (Table 3's metric).

        ``original()`` computes the method's attributions (not called for layer-wise
        reformulations, which compare the local relevances of each layer and average over
        the layers, as the paper does)."""
        if self.layerwise:
            return torch.stack([percentage_change(l.original.flatten(1), l.reformulated.flatten(1))
                                for l in reformulated]).mean(0)
        return percentage_change(original(), reformulated)


def _per_order(single: Callable) -> Callable:
    """A sweep from a function computing one order at a time."""
    def compute(model, inputs, baselines, target, orders, **kw):
        return {K: single(model, inputs, baselines, target, K, **kw) for K in orders}
    return compute


def _per_order_cost(single: Callable) -> Callable:
    """The cost of a :func:`_per_order` sweep from the cost of one order,
    ``single(inputs, baselines, order, **options)``."""
    def cost(inputs, baselines, orders, **kw):
        return summed(single(inputs, baselines, K, **kw) for K in orders)
    return cost


def _forwards(rows: int):
    return Cost(forward_rows=rows)


@dataclass(frozen=True)
class LayerReformulation:
    """Local relevances ``a_ij^(l)`` of one layer, original and reformulated.

    Both have the edge layout of :func:`taylorattr.methods.layerwise.edge_terms`
    (``[B, out, in]`` for Linear, ``[B, C_out, L, K]`` for convolutions).
    """

    name: str
    original: torch.Tensor
    reformulated: torch.Tensor


def _occlusion_windows(inputs, patch, stride) -> torch.Tensor:
    """The tiling windows of the occlusion reformulation (stride = patch) as group ids."""
    if stride is not None and stride != patch:
        raise ValueError(f"stride must equal patch for the Taylor reformulation of occlusion "
                         f"(tiling windows), got stride={stride!r}, patch={patch!r}")
    V.check_inputs(inputs)
    return window_ids(tuple(inputs.shape[1:]), patch)


def _occlusion_orders(model, inputs, baselines, target, orders, patch=2, stride=None, **kw):
    """``{K: occlusion reformulation at order K}`` from one expansion at ``max(orders)``.

    ``P_k`` of a group does not depend on where the series is cut, so the order-K
    reformulation is the partial sum ``sum_{k<=K} P_k`` of the order-``max(orders)`` terms.
    """
    groups = _occlusion_windows(inputs, patch, stride)
    partial = group_expansions(model, inputs, baselines, target, max(orders), groups,
                               **kw).cumsum(-1)
    features = groups.reshape(-1)
    return {K: partial[:, features, K - 1].view_as(inputs) for K in orders}


def _occlusion_cost(inputs, baselines, orders, patch=2, stride=None, chunk_size=None,
                    show_progress=False):
    """One :func:`~taylorattr.taylor.terms.group_expansions` at ``max(orders)`` over the windows."""
    groups = _occlusion_windows(inputs, patch, stride)
    return group_expansions_cost(inputs, baselines, max(orders), groups, chunk_size)


def _fixed_patch(run: Callable) -> Callable:
    """``run`` with ``patch=1`` (Occlusion-1), refusing any other patch."""
    def single_pixel(*args, patch=1, **kw):
        if patch != 1:
            raise ValueError(f"occlusion_1 fixes patch=1, got patch={patch!r} (use occlusion_patch)")
        return run(*args, patch=1, **kw)
    return single_pixel


def _expansion_slope(activation: Callable | None, pre: torch.Tensor, change: torch.Tensor,
                     order: int) -> torch.Tensor:
    """``g_K / change`` for ``g_K`` the order-K expansion at ``pre`` of ``sigma(pre) - sigma(pre - change)``.

    With ``c_k = sigma^(k)(pre) (-1)^k / k!`` (one Taylor-mode pass along ``-1``),
    ``g_K / change = -sum_{k=1..K} c_k change^(k-1)``: no division, so a neuron whose
    input does not move gets ``sigma'(pre)``, as DeepLIFT's multiplier does.
    """
    if activation is None:
        return torch.ones_like(change)
    jet = propagate(trace(_Apply(activation)), pre, -torch.ones_like(pre).unsqueeze(1), order)
    c = jet.series[:, :, 0]  # [K, B, ...]
    powers = change.unsqueeze(0) ** torch.arange(order, dtype=change.dtype, device=change.device).view(-1, *[1] * change.dim())
    return -(c * powers).sum(0)


class _Apply(nn.Module):
    """``x -> fn(x)`` as a module, so that a bare activation (module or function) can be traced."""

    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, x):
        return self.fn(x)


@dataclass(frozen=True)
class _LayerwiseRule:
    """What a layer-wise reformulation needs of its method: ``records(model, inputs,
    baselines, target, **kw)`` (the method's per-layer records), whether it runs reference
    rows (DeepLIFT's baseline pass), and whether each edge's share is taken of the layer's
    stabilised output (epsilon-LRP: ``z_ji / (y_j + eps s)``) rather than of its change."""

    records: Callable
    reference_rows: bool
    of_output: bool


_DEEPLIFT_RULE = _LayerwiseRule(
    lambda model, inputs, baselines, target, **kw:
    DeepLift(model).layer_records(inputs, baselines, target), reference_rows=True, of_output=False)
_EPSILON_LRP_RULE = _LayerwiseRule(
    lambda model, inputs, baselines, target, **kw:
    EpsilonLRP(model, **kw).layer_records(inputs, target), reference_rows=False, of_output=True)


def _layerwise(rule: _LayerwiseRule):
    def run(model, inputs, baselines, target, order, **kw) -> list[LayerReformulation]:
        records = rule.records(model, inputs, baselines, target, **kw)
        out = []
        for rec in records:
            if rec.activation is None:
                continue  # no nonlinearity: original and reformulation coincide
            slope = _expansion_slope(rec.activation, rec.pre, rec.pre - rec.ref_pre, order)
            edges = edge_terms(rec)
            factor = slope.reshape(edges.shape[:-1])  # DeepLIFT: (z_ji - z~_ji) * g_K / (y_j - y~_j)
            if rule.of_output:  # z_ji / (y_j + eps s) * g_K,  g_K = slope * (y_j - b_j)
                factor = factor * (rec.pre - rec.ref_pre).reshape(factor.shape) / rec_denominator(rec)
            out.append(LayerReformulation(rec.name, local_relevance(rec), edges * factor.unsqueeze(-1)))
        return out
    return run


#: What the layer-wise reformulations' counts leave out.
_LAYERWISE_NOTE = "per-layer expansions of the activations (no model rows) not counted"


def _layerwise_cost(rule: _LayerwiseRule) -> Callable:
    """Per order, the layer records' one pass through the model's plan: ``B`` rows forward
    and swept back, and for DeepLIFT ``B`` baseline rows forward. The per-layer Taylor-mode
    passes through each activation alone run no model rows (noted, not counted)."""
    def single(inputs, baselines, order, **kw):
        V.check_positive_int(order, "order")
        B = inputs.shape[0]
        return Cost(forward_rows=(2 if rule.reference_rows else 1) * B, backward_rows=B,
                    notes=(_LAYERWISE_NOTE,))
    return _per_order_cost(single)


def averaged_over_draws(draw: Callable, claim: str = "") -> Reformulation:
    """The Theorem 5 reformulation averaged over the references a sampling method draws.

    ``draw(inputs, baselines, **options)`` returns draws with ``.baselines`` ``[B, n, ...]``
    (e.g. :meth:`taylorattr.methods.ExpectedGradients.draw`); the reformulation is
    ``1/n sum_k taylor_attribution(x, x~_k)``, each term expanded at ``x`` towards its own
    reference. Its options are those of ``draw`` after the inputs and baselines.
    """
    params = list(inspect.signature(draw).parameters)
    options = frozenset(params[2:])

    def single(model, inputs, baselines, target, order, **kw):
        V.check_model(model)
        draws = draw(inputs, baselines, **kw)
        with torch.no_grad():
            target = V.resolve_target(target, V.model_output(model, inputs))
        refs = draws.baselines
        total = torch.zeros_like(inputs)
        for k in range(refs.shape[1]):
            total += taylor_attribution(model, inputs, refs[:, k], target, order)
        return total / refs.shape[1]

    def single_cost(inputs, baselines, order, **kw):
        # the target's forward, then the Theorem 5 reformulation once per drawn reference
        n = draw(inputs, baselines, **kw).baselines.shape[1]
        return summed([_forwards(inputs.shape[0]),
                        *[taylor_attribution_cost(inputs, 0.0, order)] * n])
    return Reformulation(_per_order(single), options,
                         claim=claim or "the IG reformulation averaged over the same draws",
                         cost=_per_order_cost(single_cost))


def drawn_rows_cost(draw: Callable) -> Callable:
    """The ``cost`` of a reformulation that resolves the target on the inputs (``B``
    forwards) and runs, per order, the Theorem 5 reformulation once on the ``B x n`` rows
    of its ``n`` draws per sample (GradientShap's: ``draw(inputs, baselines, **options)``
    returns draws with ``.baselines`` ``[B, n, ...]``)."""
    def cost(inputs, baselines, orders, **kw):
        n = draw(inputs, baselines, **kw).baselines.shape[1]
        rows = inputs[:1].expand((inputs.shape[0] * n,) + tuple(inputs.shape[1:]))
        return summed([_forwards(inputs.shape[0]),
                        *(taylor_attribution_cost(rows, 0.0, K) for K in orders)])
    return cost


def noisy_copies_cost(inner: Reformulation) -> Callable:
    """The ``cost`` of :func:`smoothed` around ``inner``:
    the target's forward on the inputs (``B`` rows), then ``inner``'s rows on the
    ``B x nt_samples`` noisy copies (drawn here as the reformulation draws them, so an
    inner count that depends on which features move is exact)."""
    if inner.cost is None:
        raise ValueError("inner must count its rows (its cost is None)")

    def cost(inputs, baselines, orders, nt_type="smoothgrad", nt_samples=5, stdevs=1.0, seed=0,
             **kw):
        noise = noise_tunnel.draw_noise(inputs, nt_samples, stdevs, seed)
        rows = (inputs.unsqueeze(1) + noise).reshape((-1,) + tuple(inputs.shape[1:]))
        if not isinstance(baselines, Baseline) and baselines is not None:
            baselines = V.broadcast_baselines(baselines, inputs).repeat_interleave(nt_samples, 0)
        return _forwards(inputs.shape[0]) + inner.cost(rows, baselines, orders, **kw)
    return cost


_OCCLUSION_OPTIONS = frozenset({"patch", "stride", "chunk_size", "show_progress"})

def _shapley_rule(model, inputs, baselines, target, orders, feature_mask=None, chunk_size=None,
                  show_progress=False):
    return {K: shapley_attribution(model, inputs, baselines, target, K, groups=feature_mask,
                                   chunk_size=chunk_size, show_progress=show_progress)
            for K in orders}


def _shapley_rule_cost(inputs, baselines, order, feature_mask=None, chunk_size=None,
                       show_progress=False):
    return shapley_attribution_cost(inputs, baselines, order, feature_mask, chunk_size=chunk_size)


GRADIENT_INPUT = Reformulation(
    _per_order(lambda model, inputs, baselines, target, order:
               taylor_attribution(model, inputs, 0.0, target, 1)),
    claim="Thm 1: the first-order term with the zero baseline, whatever K",
    cost=_per_order_cost(lambda inputs, baselines, order: taylor_attribution_cost(inputs, 0.0, 1)))
OCCLUSION_1 = Reformulation(_fixed_patch(_occlusion_orders), _OCCLUSION_OPTIONS,
                            claim="Thm 2: g_K of moving feature (pixel) i alone",
                            cost=_fixed_patch(_occlusion_cost))
OCCLUSION_PATCH = Reformulation(_occlusion_orders, _OCCLUSION_OPTIONS,
                                claim="Thm 3 (corrected): g_K of moving the patch alone",
                                cost=_occlusion_cost)
DEEPLIFT = Reformulation(_per_order(_layerwise(_DEEPLIFT_RULE)), layerwise=True,
                         claim="Thm 4, per layer", cost=_layerwise_cost(_DEEPLIFT_RULE))
EPSILON_LRP = Reformulation(_per_order(_layerwise(_EPSILON_LRP_RULE)), frozenset({"epsilon"}),
                            layerwise=True, claim="supplement, per layer",
                            cost=_layerwise_cost(_EPSILON_LRP_RULE))
INTEGRATED_GRADIENTS = Reformulation(
    _per_order(lambda model, inputs, baselines, target, order:
               taylor_attribution(model, inputs, baselines, target, order)),
    claim="Thm 5: first + independent + each order's IG share of the interactions",
    cost=_per_order_cost(taylor_attribution_cost))

#: The Shapley value's reformulation: each monomial shared equally by its support
#: (exact for K <= 4; the players are ``feature_mask``'s groups when given).
SHAPLEY_RULE = Reformulation(
    _shapley_rule, frozenset({"feature_mask", "chunk_size", "show_progress"}),
    claim="Shapley rule: each monomial phi(kappa) shared equally, 1/|S|, by its support S "
          "(expansion at x; exact for K <= 4)",
    cost=_per_order_cost(_shapley_rule_cost))


def smoothed(inner_reformulation):
    """The tunnel's reformulation from the inner method's (a non-layer-wise
    :class:`~taylorattr.methods.reformulations.Reformulation`): the inner reformulation at each
    noisy input (the noise of :func:`taylorattr.methods.noise_tunnel.draw_noise` with the same ``nt_samples``, ``stdevs``,
    ``seed``), combined by ``nt_type``. Targets are resolved on the clean inputs, as the
    method does; a point baseline is repeated for each noisy copy."""
    if inner_reformulation.layerwise:
        raise ValueError("inner_reformulation must give attributions shaped like the inputs, "
                         "not per-layer terms")

    def compute(model, inputs, baselines, target, orders, nt_type="smoothgrad", nt_samples=5,
                stdevs=1.0, seed=0, **kw):
        V.check_model(model)
        noise_tunnel.check_nt_type(nt_type)
        x = V.check_inputs(inputs).detach()
        with torch.no_grad():
            t = V.resolve_target(target, V.model_output(model, x))
        noise = noise_tunnel.draw_noise(x, nt_samples, stdevs, seed)
        rows = (x.unsqueeze(1) + noise).reshape((-1,) + tuple(x.shape[1:]))
        tr = None if t is None else t.repeat_interleave(nt_samples)
        if not isinstance(baselines, Baseline) and baselines is not None:
            baselines = V.broadcast_baselines(baselines, x).repeat_interleave(nt_samples, 0)
        out = inner_reformulation.orders(model, rows, baselines, tr, orders, **kw)
        result = {}
        for K, a in out.items():
            a = a.view(noise.shape)
            result[K] = noise_tunnel.combine(a.sum(1), (a * a).sum(1), nt_samples, nt_type)
        return result

    return Reformulation(compute, frozenset(noise_tunnel.TUNNEL_OPTIONS[:-1]) | inner_reformulation.options,
                         claim=f"the inner reformulation ({inner_reformulation.claim}) at each "
                               "noisy input, combined as the method combines the attributions")


def gradient_shap_reformulation():
    """GradientShap's Taylor reformulation (a
    :class:`~taylorattr.methods.reformulations.Reformulation`): Theorem 5 at each noisy input
    towards its reference, averaged over the draws of :func:`draw` with the same options."""
    def compute(model, inputs, baselines, target, orders, n_samples=50, stdevs=0.0,
                noise_std=None, seed=0):
        V.check_model(model)
        x = V.check_inputs(inputs).detach()
        with torch.no_grad():
            t = V.resolve_target(target, V.model_output(model, x))
        draws = gradient_shap.draw(x, baselines, n_samples, stdevs, noise_std, seed)
        noisy, refs, _ = gradient_shap.noisy_rows(x, draws)
        tr = None if t is None else t.repeat_interleave(draws.n_samples)
        return {K: taylor_attribution(model, noisy, refs, tr, K).view(draws.baselines.shape)
                .mean(1) for K in orders}

    return Reformulation(compute, frozenset({"n_samples", "stdevs", "noise_std", "seed"}),
                         claim="Thm 5 at each noisy input towards its drawn reference, averaged "
                               "over the same draws (the method integrated over alpha)")
