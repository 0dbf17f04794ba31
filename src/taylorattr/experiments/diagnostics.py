"""Why the order-K expansion is good or bad on a model: how far its nonlinearities move.

The expansion at the input ``x`` is exact for a polynomial network and converges for a
smooth one only while every nonlinear unit's pre-activation ``z`` stays within the radius
of convergence of its Taylor series around ``z(x)`` (the sigmoid's: ``sqrt(z^2 + pi^2)``,
its poles at ``+-i pi``). Along the path ``x -> x~`` a unit moves by
``z(x) - z(x~)``; the diagnostic of a nonlinear layer ``l`` with ``m_l`` units is the RMS
movement over its units and the samples

    move_l = sqrt( 1/(B m_l) sum_b sum_u (z_lu(x_b) - z_lu(x~_b))^2 ),

measured with forward hooks on the layer's input (the pre-activation). A nonlinear layer
is any leaf module that is not affine or a reshaping (Linear, Conv, average pooling,
Flatten, batch norm, Dropout, Identity): Sigmoid, Softplus, ReLU, x^2, ... . The
approximation error ``eps_bar = mean_b |eps_K| / |df|`` follows ``move`` of the first
nonlinear layer closely across training recipes (issue 19: rank correlation 0.98 on
M-sg, 0.89 on C-sg); :func:`plot_error_vs_movement` draws that relation across presets.
"""
from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch
from torch import nn

from .._validation import broadcast_baselines, check_inputs
from ..reporting.plotting import _new_figure, _save

__all__ = ["AFFINE_LAYERS", "nonlinear_layers", "plot_error_vs_movement",
           "preactivation_movement"]

#: Leaf modules that are affine (in eval mode) or only reshape: not diagnosed.
AFFINE_LAYERS: tuple[type, ...] = (
    nn.Linear, nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.AvgPool1d, nn.AvgPool2d, nn.AvgPool3d,
    nn.AdaptiveAvgPool1d, nn.AdaptiveAvgPool2d, nn.AdaptiveAvgPool3d, nn.Flatten, nn.Unflatten,
    nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d, nn.Dropout, nn.Identity,
)


def nonlinear_layers(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """``(name, module)`` of every leaf module of ``model`` that is not in
    :data:`AFFINE_LAYERS`, in registration order (for ``nn.Sequential`` nets: forward order)."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    return [(name, m) for name, m in model.named_modules()
            if name and not list(m.children()) and not isinstance(m, AFFINE_LAYERS)]


@torch.no_grad()
def _preactivations(model: nn.Module, layers, x: torch.Tensor) -> list[torch.Tensor]:
    seen: dict[int, list[torch.Tensor]] = {i: [] for i in range(len(layers))}
    hooks = [m.register_forward_hook(
        lambda mod, inp, out, i=i: seen[i].append(inp[0].detach().flatten(1)))
        for i, (_, m) in enumerate(layers)]
    try:
        model(x)
    finally:
        for h in hooks:
            h.remove()
    # a module applied several times (a shared activation) contributes every call's units
    return [torch.cat(seen[i], 1) for i in range(len(layers))]


def preactivation_movement(model: nn.Module, inputs: torch.Tensor, baselines=0.0,
                           per_sample: bool = False) -> dict[str, float | torch.Tensor]:
    """RMS pre-activation movement ``move_l`` of every nonlinear layer between ``inputs``
    and ``baselines`` (a scalar or a tensor broadcastable to ``inputs``); see the module
    docstring. Returns ``{layer name: move_l}`` in forward order, or with
    ``per_sample=True`` the RMS over units per sample, ``{name: [B] tensor}``.
    Raises ``ValueError`` when the model has no nonlinear layer."""
    x = check_inputs(inputs).detach()
    base = broadcast_baselines(baselines, x)
    layers = nonlinear_layers(model)
    if not layers:
        raise ValueError("model has no nonlinear layer to diagnose (every leaf module is affine)")
    zx = _preactivations(model, layers, x)
    zb = _preactivations(model, layers, base)
    out = {}
    for (name, _), a, b in zip(layers, zx, zb):
        sq = (a.double() - b.double()).pow(2)
        out[name] = sq.mean(1).sqrt() if per_sample else float(sq.mean().sqrt())
    return out


def plot_error_vs_movement(points: Sequence[dict], path: str | Path,
                           title: str = "Approximation error vs pre-activation movement") -> Path:
    """The figure "eps_bar vs pre-activation movement": one marker per point
    ``{"label", "movement", "error"}`` (optionally ``"error_spread"``, ``"movement_spread"``,
    ``"group"``: points of a group share a colour), movement on the x-axis (first
    nonlinear layer), ``eps_bar`` on the y-axis. Returns the path written (PNG)."""

    if not points:
        raise ValueError("points must hold at least one {label, movement, error} row")
    for p in points:
        missing = {"label", "movement", "error"} - set(p)
        if missing:
            raise ValueError(f"points: a row lacks {sorted(missing)}: {p}")
    groups = list(dict.fromkeys(p.get("group", "") for p in points))
    fig = _new_figure((5.5, 4))
    ax = fig.add_subplot()
    for gi, g in enumerate(groups):
        rows = [p for p in points if p.get("group", "") == g]
        ax.errorbar([p["movement"] for p in rows], [p["error"] for p in rows],
                    xerr=[p.get("movement_spread") or 0.0 for p in rows],
                    yerr=[p.get("error_spread") or 0.0 for p in rows],
                    fmt="os^Dv*"[gi % 6], capsize=3, label=g or None, linestyle="none")
        for p in rows:
            ax.annotate(p["label"], (p["movement"], p["error"]), textcoords="offset points",
                        xytext=(4, 4), fontsize=7)
    ax.set_xlabel("RMS pre-activation movement, first nonlinear layer (x -> baseline)")
    ax.set_ylabel("mean |eps_K| / |df|")
    ax.set_title(title, fontsize=9)
    if any(groups):
        ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
    return _save(fig, path, dpi=110)
