"""Experiments 1 and 2: infidelity of every method, and of first- vs second-order Taylor
attribution (paper Figure 3 and its Taylor-order comparison).

The removal set (every square of side 1..10 at every position, set to the baseline 0)
does not depend on the method, so ``f(x) - f(x with square k removed)`` is computed once
per (model, batch) and every method's predicted changes (the sums of its attribution over
each square, from an integral image) are scored against them with the formula of
:func:`taylorattr.metrics.infidelity`:

    infidelity = mean_k (beta * pred_k - change_k)^2,   beta = E[pred change] / E[pred^2]
"""
from __future__ import annotations

import itertools

import torch

from ..._validation import broadcast_baselines, check_bool, select_output
from ...baselines import Point
from ...methods import TaylorAttribution
from ...metrics import square_removal
from ...metrics.perturbation import optimal_beta_score, square_removed_rows, square_sums
from ...metrics.statistics import compare_paired, mean_sem, wilcoxon_signed_rank
from ...registry import of_class
from .. import paper
from .._units import fingerprint
from .stage import Stage, collect, timed

__all__ = ["infidelity_from_changes", "run_infidelity", "run_taylor_order",
           "square_output_changes", "square_predictions", "taylor_order_methods"]


def square_output_changes(model, inputs: torch.Tensor, target: torch.Tensor, baselines=0.0,
                          max_side: int = 10, batch_size: int = 1024, *,
                          show_progress: bool = False, desc: str = "square removals",
                          scale: int = 1) -> torch.Tensor:
    """``f(x) - f(x with square k set to the baseline)`` for every square of
    :func:`taylorattr.metrics.square_removal` ``(H, W, max_side, scale)``, ``[B, N]``
    float64.

    ``f`` is the logit of ``target`` (``[B]``). These are the true changes of
    :func:`taylorattr.metrics.infidelity`'s square removal; they do not depend on the
    attribution, so one set serves every method. ``show_progress``: a tqdm bar
    (``leave=False``, described by ``desc``) over the removed rows, one update per chunk.
    """
    from tqdm.auto import tqdm

    check_bool(show_progress, "show_progress")
    x = inputs.detach()
    b, _, h, w = x.shape
    t = target.to(torch.long)
    base = broadcast_baselines(baselines, x)
    squares = square_removal(h, w, max_side, scale)
    changes = []
    with torch.no_grad(), tqdm(total=b * squares.shape[0], desc=desc, unit="row", leave=False,
                               disable=not show_progress) as bar:
        fx = select_output(model(x), t).to(torch.float64)
        for rows in square_removed_rows(x, base, squares, max(1, batch_size // b)):
            m = rows.shape[1]
            f = select_output(model(rows.reshape((b * m,) + tuple(x.shape[1:]))),
                              t.repeat_interleave(m))
            changes.append(fx[:, None] - f.to(torch.float64).view(b, m))
            bar.update(b * m)
    return torch.cat(changes, 1)


def square_predictions(attributions: torch.Tensor, max_side: int = 10,
                       scale: int = 1) -> torch.Tensor:
    """The sum of the (channel-summed) attribution over every square of
    :func:`taylorattr.metrics.square_removal`, ``[B, N]`` float64, from an integral image."""
    _, _, h, w = attributions.shape
    return square_sums(attributions.detach(), square_removal(h, w, max_side, scale))


def infidelity_from_changes(predictions: torch.Tensor, changes: torch.Tensor,
                            normalize: bool = True) -> torch.Tensor:
    """``mean_k (beta * pred_k - change_k)^2`` per sample, ``[B]`` float64, with the optimal
    ``beta`` of :func:`taylorattr.metrics.infidelity` (or ``beta = 1``)."""
    return optimal_beta_score(predictions.to(torch.float64), changes.to(torch.float64), normalize)


def _changes(model, x, show_progress: bool = False, desc: str = "square removals"):
    with torch.no_grad():
        target = model(x).argmax(1)
    return {"target": target, "changes": square_output_changes(
        model, x, target, 0.0, show_progress=show_progress, desc=desc)}


def _score(stage: Stage, method, model, xb, ch, desc: str) -> dict:
    # the removal unit ``ch`` is stored (and returned) on the CPU: its tensors go to xb's device
    target, changes = ch["target"].to(xb.device), ch["changes"].to(xb.device)
    attr = stage.attribute(method, model, xb, target, Point(0.0), stage.ws.progress, desc)
    if isinstance(attr, str):
        return {"error": attr}
    return {"infidelity": infidelity_from_changes(square_predictions(attr), changes)}


def _units(stage: Stage, models, x: torch.Tensor, methods, desc: str) -> dict:
    """Scores per (model, label, batch start) and the removal sets per (model, batch): the
    removal sets first (they serve every method), then the scores, each round a list of
    units (:meth:`~taylorattr.experiments.workspace.Workspace.run_units`)."""
    cells = []  # (model name, model, its fingerprint, batch start, batch, batch fingerprint)
    for m in models:
        model, mfp = stage.model(m)
        for i0, i1 in stage.spans(x):
            xb = x[i0:i1].to(stage.dtype)
            cells.append((m, model, mfp, i0, xb, fingerprint([("x", xb)])))
    progress = stage.ws.progress
    changes = stage.ws.run_units(stage.store, [
        (f"changes-{m}-{mfp}-{xfp}", lambda model=model, xb=xb, m=m: timed(
            lambda: _changes(model, xb, progress, f"{desc} {m}: square removals")))
        for m, model, mfp, _, xb, xfp in cells], f"{desc} (removals)")
    keys, items = [], []
    for (m, model, mfp, i0, xb, xfp), ch in zip(cells, changes):
        for method in methods:
            keys.append((m, method.label, i0))
            items.append((
                f"infidelity-{m}-{method.name}-{method.tag()}-seed{stage.ws.seed}-{mfp}-{xfp}",
                lambda method=method, model=model, xb=xb, ch=ch, m=m: timed(
                    lambda: _score(stage, method, model, xb, ch, f"{desc} {m}"))))
    out = dict(zip(keys, stage.ws.run_units(stage.store, items, desc)))
    out.update({(m, "changes", i0): ch for (m, _, _, i0, _, _), ch in zip(cells, changes)})
    return out


def run_infidelity(stage: Stage, models, n: int, counts, result) -> None:
    """Experiment 1: one row per (model, method) in ``result.infidelity``."""
    x = stage.ws.held_out_digits(n)
    units = _units(stage, models, x, stage.methods, "infidelity")
    starts = [i0 for i0, _ in stage.spans(x)]
    for m in models:
        for method in stage.methods:
            v, seconds, note = collect(units, m, method.label, starts, "infidelity")
            mean, sem = mean_sem(v) if v is not None else (None, None)
            result.infidelity.append({
                "model": paper.model_label(m), "method": method.label,
                "principles": counts.get(method.label),
                "principles_paper": stage.paper_count(method),
                "infidelity": mean, "infidelity_sem": sem, "n": 0 if v is None else v.numel(),
                "seconds": round(seconds, 3), "note": note})
        ch = sum(float(units[(m, "changes", i0)].get("seconds", 0.0)) for i0 in starts)
        result.timings[f"infidelity removal forwards {paper.model_label(m)} (s)"] = round(ch, 3)


def taylor_order_methods(orders) -> list:
    """The bound methods of experiment 2: the Taylor attribution at each order."""
    return [of_class(TaylorAttribution).bind(order=k) for k in orders]


def run_taylor_order(stage: Stage, models, n: int, orders, result) -> None:
    """Experiment 2: infidelity of the order-K Taylor attribution, one row per (model, K)."""
    x = stage.ws.held_out_digits(n)
    taylor = taylor_order_methods(orders)
    units = _units(stage, models, x, taylor, "taylor order")
    starts = [i0 for i0, _ in stage.spans(x)]
    for m in models:
        mlabel = paper.model_label(m)
        per_order = {}
        for k, method in zip(orders, taylor):
            v, seconds, note = collect(units, m, method.label, starts, "infidelity")
            per_order[k] = v
            mean, sem = mean_sem(v) if v is not None else (None, None)
            result.taylor_order.append({
                "model": mlabel, "order": k, "infidelity": mean, "infidelity_sem": sem,
                "paper": paper.TAYLOR_ORDER.get(mlabel, {}).get(k),
                "n": 0 if v is None else v.numel(), "seconds": round(seconds, 3), "note": note})
        for low, high in itertools.pairwise(orders):  # each order against the one before
            a, b = per_order[high], per_order[low]
            if a is None or b is None:
                continue
            test = wilcoxon_signed_rank(a, b)
            result.taylor_tests.append({
                "model": mlabel, "order": high, "against": low, "p_value": test.p_value,
                "n": test.n, "test": test.method, "statement": compare_paired(a, b)})
