"""The scores of the three principles (see :mod:`taylorattr.principles` for the definitions).

Every function takes the model, the inputs ``x`` ``[B, ...]``, the attributions ``a`` and
``used``, the references the method explained the change against ``[B, n, ...]``.
"""
from __future__ import annotations

import math

import torch

from .. import _validation as V
from ..methods._passes import target_gradient
from ..metrics.statistics import pearson
from .probes import _REFERENCES


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
    idx = torch.as_tensor(features, device=x.device)
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
    in_group = torch.zeros(d, dtype=torch.bool, device=x.device)
    for g in groups:
        in_group[list(g)] = True
    single = ~in_group

    mass = gd_k.abs().mean(1).sum()
    single_err = (af[:, single] - t[:, single]).abs().sum()
    mis = single_err
    inter_mass = torch.zeros((), dtype=x.dtype, device=x.device)
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
    corr = {c: pearson(mag, (x.flatten() - c).abs(), undefined=0.0) for c in _REFERENCES}
    c_best = max(corr, key=corr.get)
    r = max(0.0, corr[c_best])
    return {"corr_black": pearson(mag, (x - baselines).abs().flatten(), undefined=0.0),
            "max_corr": corr[c_best], "max_corr_reference": c_best, "score": 1.0 - min(1.0, r)}
