"""The paper's Theorems 1-5 and the Expected Gradients corollary, as code (DESIGN.md section 2).

Each reformulation rebuilds a method's attribution from exact Taylor terms of order K,
with ``delta = x - x~`` and ``P_k`` as in :mod:`taylorattr.taylor`:

=====================  ==============================================================
gradient_input         Thm 1: ``T^a_i`` with ``x~ = 0`` (order 1, whatever K)
occlusion_1            Thm 2: ``T^a_i + T^gd_i``: ``g_K`` of moving feature (pixel) i alone
occlusion_patch        Thm 3 (corrected): ``g_K(delta restricted to p)``, every term
                       inside the patch once, given to every feature of the patch
deeplift               Thm 4, per layer: ``(z_ji - z~_ji)/(y_j - y~_j) * g_K(sigma; y_j -> y~_j)``
epsilon_lrp            supplement, per layer: ``z_ji/(y_j + eps s) * g_K(sigma; y_j -> b_j)``
integrated_gradients   Thm 5: ``T^a_i + T^gd_i + a^gt_i`` (each order's IG share)
expected_gradients     the IG reformulation averaged over the same baseline draws
=====================  ==============================================================

The layer-wise originals replace the neuron's change ``x_j^(l+1) - x~_j^(l+1)`` in the
ratio by its order-K Taylor expansion in ``y``, so per layer the original and the
reformulation share the ratio and differ by the truncation of one activation.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from . import _validation as V
from .taylor import group_expansions, taylor_attribution
from .taylor_mode import propagate, trace

__all__ = ["REFORMULATIONS", "LayerReformulation", "occlusion_groups", "reformulate",
           "reformulate_orders"]


@dataclass(frozen=True)
class LayerReformulation:
    """Local relevances ``a_ij^(l)`` of one layer, original and reformulated.

    Both have the edge layout of :func:`taylorattr.methods.layerwise.edge_terms`
    (``[B, out, in]`` for Linear, ``[B, C_out, L, K]`` for convolutions).
    """

    name: str
    original: torch.Tensor
    reformulated: torch.Tensor


def occlusion_groups(sample_shape: tuple[int, ...], patch) -> torch.Tensor:
    """Window id of every feature when windows of ``patch`` tile a sample (stride = patch).

    Same layout as :class:`taylorattr.methods.Occlusion`: an int patch occludes the last
    two dimensions of ``[C, H, W]`` samples (all channels together) and the last one
    otherwise; windows that run past the edge are cut there.
    """
    from .methods.occlusion import window_masks, window_shape

    patch = window_shape(patch, len(sample_shape))
    sizes = sample_shape[len(sample_shape) - len(patch):]
    if any(p > n for p, n in zip(patch, sizes)):
        raise ValueError(f"patch {patch} exceeds the occluded dimensions {tuple(sizes)} of samples "
                         f"of shape {tuple(sample_shape)}")
    ids = torch.zeros((), dtype=torch.long)
    for mask in window_masks(sizes, patch, patch):
        ids = ids.unsqueeze(-1) * mask.shape[0] + mask.long().argmax(0)
    return ids.expand(sample_shape).contiguous()


def _occlusion_orders(model, inputs, baselines, target, orders, patch=1, stride=None, **kw):
    """``{K: occlusion reformulation at order K}`` from one expansion at ``max(orders)``.

    ``P_k`` of a group does not depend on where the series is cut, so the order-K
    reformulation is the partial sum ``sum_{k<=K} P_k`` of the order-``max(orders)`` terms.
    """
    if stride is not None and stride != patch:
        raise ValueError(f"stride must equal patch for the Taylor reformulation of occlusion "
                         f"(tiling windows), got stride={stride!r}, patch={patch!r}")
    V.check_inputs(inputs)
    groups = occlusion_groups(tuple(inputs.shape[1:]), patch)
    partial = group_expansions(model, inputs, baselines, target, max(orders), groups,
                               **kw).cumsum(-1)
    features = groups.reshape(-1)
    return {K: partial[:, features, K - 1].view_as(inputs) for K in orders}


def _occlusion_1_orders(*args, patch=1, **kw):
    if patch != 1:
        raise ValueError(f"occlusion_1 fixes patch=1, got patch={patch!r} (use occlusion_patch)")
    return _occlusion_orders(*args, patch=1, **kw)


def _occlusion_patch_orders(*args, patch=2, **kw):
    return _occlusion_orders(*args, patch=patch, **kw)


def _one_order(all_orders: Callable) -> Callable:
    """The single-order form of a reformulation that computes several orders at once."""
    def run(model, inputs, baselines, target, order, **kw):
        return all_orders(model, inputs, baselines, target, (order,), **kw)[order]
    return run


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
    powers = change.unsqueeze(0) ** torch.arange(order, dtype=change.dtype).view(-1, *[1] * change.dim())
    return -(c * powers).sum(0)


class _Apply(nn.Module):
    """``x -> fn(x)`` as a module, so that a bare activation (module or function) can be traced."""

    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, x):
        return self.fn(x)


def _layerwise(rule: str):
    def run(model, inputs, baselines, target, order, **kw) -> list[LayerReformulation]:
        from .methods import DeepLift, EpsilonLRP
        from .methods.layerwise import denominator as rec_denominator
        from .methods.layerwise import edge_terms, local_relevance

        if rule == "deeplift":
            records = DeepLift(model).layer_records(inputs, baselines, target)
        else:
            records = EpsilonLRP(model, **kw).layer_records(inputs, target)
        out = []
        for rec in records:
            if rec.activation is None:
                continue  # no nonlinearity: original and reformulation coincide
            slope = _expansion_slope(rec.activation, rec.pre, rec.pre - rec.ref_pre, order)
            edges = edge_terms(rec)
            factor = slope.reshape(edges.shape[:-1])  # DeepLIFT: (z_ji - z~_ji) * g_K / (y_j - y~_j)
            if rule == "epsilon_lrp":  # z_ji / (y_j + eps s) * g_K,  g_K = slope * (y_j - b_j)
                factor = factor * (rec.pre - rec.ref_pre).reshape(factor.shape) / rec_denominator(rec)
            out.append(LayerReformulation(rec.name, local_relevance(rec), edges * factor.unsqueeze(-1)))
        return out
    return run


def _expected_gradients(model, inputs, baselines, target, order, n_samples=50, noise_std=None,
                        seed=0, **kw):
    from .methods.expected_gradients import draw

    V.check_model(model)
    draws = draw(inputs, baselines, n_samples=n_samples, noise_std=noise_std, seed=seed)
    with torch.no_grad():
        target = V.resolve_target(target, V.model_output(model, inputs))
    total = torch.zeros_like(inputs)
    for k in range(draws.n_samples):
        total += taylor_attribution(model, inputs, draws.baselines[:, k], target, order)
    return total / draws.n_samples


#: Extra keyword arguments each reformulation accepts (anything else is a TypeError).
_EXTRA_ARGS: dict[str, frozenset] = {
    "gradient_input": frozenset(),
    "occlusion_1": frozenset({"patch", "stride", "chunk_size", "show_progress"}),
    "occlusion_patch": frozenset({"patch", "stride", "chunk_size", "show_progress"}),
    "deeplift": frozenset(),
    "epsilon_lrp": frozenset({"epsilon"}),
    "integrated_gradients": frozenset(),
    "expected_gradients": frozenset({"n_samples", "noise_std", "seed"}),
}

REFORMULATIONS: dict[str, Callable] = {
    "gradient_input": lambda model, inputs, baselines, target, order, **kw:
        taylor_attribution(model, inputs, 0.0, target, 1),
    "occlusion_1": _one_order(_occlusion_1_orders),
    "occlusion_patch": _one_order(_occlusion_patch_orders),
    "deeplift": _layerwise("deeplift"),
    "epsilon_lrp": _layerwise("epsilon_lrp"),
    "integrated_gradients": lambda model, inputs, baselines, target, order, **kw:
        taylor_attribution(model, inputs, baselines, target, order),
    "expected_gradients": _expected_gradients,
}


#: Reformulations computed for several orders from one expansion at the highest.
_ALL_ORDERS_AT_ONCE: dict[str, Callable] = {
    "occlusion_1": _occlusion_1_orders,
    "occlusion_patch": _occlusion_patch_orders,
}


def _checked(method, baselines, kwargs):
    if not isinstance(method, str):
        raise TypeError(f"method must be a method name (str), got {type(method).__name__}")
    if method not in REFORMULATIONS:
        raise ValueError(f"method must be one of {sorted(REFORMULATIONS)}, got {method!r}")
    unknown = sorted(set(kwargs) - _EXTRA_ARGS[method])
    if unknown:
        allowed = ", ".join(sorted(_EXTRA_ARGS[method])) or "none"
        raise TypeError(f"reformulate('{method}') got unexpected keyword argument(s) "
                        f"{', '.join(map(repr, unknown))} (accepted: {allowed})")
    if method == "expected_gradients" and isinstance(baselines, float) and baselines == 0.0:
        return None
    return baselines


def reformulate(method: str, model, inputs: torch.Tensor, baselines=0.0, target=None,
                order: int = 2, **kwargs):
    """The Taylor reformulation of ``method`` at order ``order``.

    Returns an attribution shaped like ``inputs``, except for the layer-wise methods
    (``deeplift``, ``epsilon_lrp``), which return one :class:`LayerReformulation` per
    layer followed by a nonlinearity. Extra keyword arguments: ``patch`` (occlusion_patch),
    ``n_samples``/``noise_std``/``seed`` (expected_gradients, where ``baselines`` is the
    reference tensor or None), ``epsilon`` (epsilon_lrp), ``chunk_size`` and
    ``show_progress`` (occlusion).
    """
    baselines = _checked(method, baselines, kwargs)
    V.check_positive_int(order, "order")
    return REFORMULATIONS[method](model, inputs, baselines, target, order, **kwargs)


def reformulate_orders(method: str, model, inputs: torch.Tensor, baselines=0.0, target=None,
                       orders=(2,), **kwargs) -> dict:
    """``{K: reformulate(method, ..., order=K) for K in orders}``, sharing work across orders.

    The occlusion reformulations expand once at ``max(orders)`` and cut the series at each
    K (``P_k`` does not depend on the truncation), so a sweep costs about one expansion at
    the highest order; the other methods run once per order.
    """
    baselines = _checked(method, baselines, kwargs)
    if isinstance(orders, (str, bytes)) or not hasattr(orders, "__iter__"):
        raise TypeError(f"orders must be a sequence of positive ints, got {type(orders).__name__}")
    orders = tuple(orders)
    if not orders:
        raise ValueError("orders must hold at least one order, got an empty sequence")
    for K in orders:
        V.check_positive_int(K, "orders")
    if method in _ALL_ORDERS_AT_ONCE:
        return _ALL_ORDERS_AT_ONCE[method](model, inputs, baselines, target, orders, **kwargs)
    return {K: REFORMULATIONS[method](model, inputs, baselines, target, K, **kwargs)
            for K in orders}
