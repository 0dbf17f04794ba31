"""Paper Table 3: how far each method lies from its Taylor reformulation.

For every model (Poly, M-sg, C-sg), held-out sample ``i`` and method,

    d = mean_i ||a_o(i) - a_r(i)||^2 / ||a_o(i)||^2 * 100%

with ``a_o`` the method and ``a_r`` its order-K reformulation (baseline 0, target the
predicted class). DeepLIFT's ``d`` is computed per layer on the local relevances and
averaged over the layers followed by a nonlinearity, as in the paper. Also reported:
the approximation error ``|eps| / |df|`` of the order-K expansion (``eps = df - g_K``,
``g_K`` = the sum of the IG reformulation), and on C-sg the per-sample correlation
between IG's percentage change and that error. Every (model, method, order, batch) is a
resumable unit under ``out/validation/units``.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, field

import torch
from tqdm.auto import tqdm

from .. import _io
from ..baselines import Point
from ..registry import variants
from ..statistics import pearson
from ..taylor import taylor_attribution
from . import paper
from ._units import fingerprint
from .workspace import Workspace

__all__ = ["ValidationResult", "format_validation", "run_validation", "validation_methods"]


def validation_methods(ig_steps: int = 50) -> list:
    """The bound methods of Table 3 (every registered variant with a reformulation that
    takes part in the validation), with ``n_steps = ig_steps`` for path methods."""
    return [spec.bind(v, context={"n_steps": ig_steps}) for spec, v in variants("validation")]


@dataclass
class ValidationResult:
    """Tables of the validation experiment (data only; see :func:`format_validation`)."""

    rows: list[dict] = field(default_factory=list)  # model, method, order, percentage_change, paper
    approximation: list[dict] = field(default_factory=list)  # model, order, mean |eps|/|df|, paper
    correlation: list[dict] = field(default_factory=list)  # order, pearson r (C-sg), paper
    models: list[dict] = field(default_factory=list)  # model, held-out accuracy, epochs, ...
    n_samples: int = 0

    def to_json(self) -> dict:
        return {"rows": self.rows, "approximation": self.approximation,
                "correlation": self.correlation, "models": self.models, "n_samples": self.n_samples}


def _percentages(method, model, x: torch.Tensor, orders: tuple[int, ...]) -> dict:
    """Per-sample percentage change of one method at each order (``pct{K}``)."""
    with torch.no_grad():
        target = model(x).argmax(1)
    reform = method.spec.reformulation
    reforms = reform.orders(model, x, 0.0, target, orders, **reform.own_options(method.settings))
    original = functools.cache(lambda: method(model, x, Point(0.0), target))
    return {f"pct{K}": reform.percentage_change(original, r) for K, r in reforms.items()}


def _approximation(model, x: torch.Tensor, orders: tuple[int, ...]) -> dict:
    """``|eps_K| / |df|`` per sample at each order (``rel_error{K}``): ``df = f(x) - f(0)``,
    ``eps_K = df - g_K`` with ``g_K`` the sum of the order-K Taylor attribution."""
    with torch.no_grad():
        target = model(x).argmax(1)
        df = model(x).gather(1, target[:, None])[:, 0] - model(torch.zeros_like(x)).gather(
            1, target[:, None])[:, 0]
    out = {}
    for K in orders:
        g = taylor_attribution(model, x, 0.0, target, K).flatten(1).sum(1)
        out[f"rel_error{K}"] = (df - g).abs() / df.abs()
    return out


def run_validation(ws: Workspace, models=("poly", "m_sg", "c_sg"), orders=(2,),
                   n_samples: int = 100, batch_size: int = 25, ig_steps: int = 50
                   ) -> ValidationResult:
    """Run the validation table; returns the tables and writes them to ``ws.out/validation``.

    ``n_samples`` held-out digits (the paper: 3,000), ``orders`` the Taylor orders swept,
    ``ig_steps`` the quadrature nodes of path methods. Models come from ``ws.trained``.
    """
    store = ws.units("validation")
    _io.remove_stale_temporaries(ws.out / "validation")  # a table write killed mid-way
    held = ws.held_out_digits(n_samples).double()
    result = ValidationResult(n_samples=int(held.shape[0]))
    batches = [held[i:i + batch_size] for i in range(0, held.shape[0], batch_size)]
    methods = validation_methods(ig_steps)
    trained, weights = {}, {}
    for m in models:
        model, info = ws.trained(m, torch.float64)
        trained[m], weights[m] = model, ws.fingerprint(model)
        result.models.append({"model": paper.model_label(m),
                              "held_out_accuracy": info["held_out_accuracy"],
                              "epochs": info["epochs"], "n_train": info["n_train"],
                              "n_held_out": info["n_held_out"], "data": info["data"]})
    inputs = [fingerprint([("x", b)]) for b in batches]
    order_tag = "-".join(map(str, orders))
    units = [(m, k, i) for m in models for k in range(len(methods) + 1) for i in range(len(batches))]
    per_unit = {}
    for m, k, i in tqdm(units, desc="validation", disable=not ws.progress):
        x = batches[i]
        if k < len(methods):  # a method against its reformulation
            method = methods[k]
            key = f"{m}-{weights[m]}-{method.name}-{method.tag()}-orders{order_tag}-x{inputs[i]}"
            compute = functools.partial(_percentages, method, trained[m], x, orders)
        else:  # the approximation error of the expansion itself
            key = f"{m}-{weights[m]}-approximation-orders{order_tag}-x{inputs[i]}"
            compute = functools.partial(_approximation, trained[m], x, orders)
        per_unit[(m, k, i)] = store.get(key, compute)

    def joined(m, k, name):
        return torch.cat([per_unit[(m, k, i)][name] for i in range(len(batches))])

    approx = len(methods)
    ig = next((k for k, mt in enumerate(methods) if mt.label == "IG"), None)
    for m in models:
        mlabel = paper.model_label(m)
        for K in orders:
            for k, method in enumerate(methods):
                table3 = method.variant.table3 or {}
                result.rows.append({"model": mlabel, "method": method.label, "order": K,
                                    "percentage_change": float(joined(m, k, f"pct{K}").mean()),
                                    "paper": table3.get(mlabel) if K == 2 else None})
            err = joined(m, approx, f"rel_error{K}")
            result.approximation.append({"model": mlabel, "order": K,
                                         "approximation_error": float(err.mean()),
                                         "paper": paper.APPROX_ERROR.get(mlabel) if K == 2 else None})
            if m == "c_sg" and ig is not None:
                result.correlation.append({"model": mlabel, "order": K,
                                           "pearson_ig_pct_vs_error": pearson(
                                               joined(m, ig, f"pct{K}"), err),
                                           "paper": paper.IG_ERROR_CORRELATION if K == 2 else None})
    folder = ws.out / "validation"
    _io.save_json(result.to_json(), folder / "validation.json")
    _io.save_csv(result.rows, folder / "validation.csv")
    return result


def format_validation(result: ValidationResult) -> str:
    """Markdown tables: ours beside the paper's, one column per model and order."""
    lines = []
    orders = sorted({r["order"] for r in result.rows})
    models = list(dict.fromkeys(r["model"] for r in result.rows))
    lookup = {(r["model"], r["method"], r["order"]): r for r in result.rows}
    paper_of = {(r["model"], r["method"]): r["paper"] for r in result.rows if r["paper"] is not None}
    labels = list(dict.fromkeys(r["method"] for r in result.rows))
    header = ["method"] + [f"{m} K={K}" for K in orders for m in models] + [f"{m} paper" for m in models]
    lines.append("| " + " | ".join(header) + " |")
    lines.append("|" + "---|" * len(header))
    for label in labels:
        cells = [label] + [f"{lookup[(m, label, K)]['percentage_change']:.3g}%" for K in orders
                           for m in models]
        cells += [f"{paper_of[(m, label)]}%" if (m, label) in paper_of else "n/a" for m in models]
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    lines.append("| model | order | mean abs(eps)/abs(df) | paper (K=2) |")
    lines.append("|---|---|---|---|")
    for r in result.approximation:
        paper = "" if r["paper"] is None else r["paper"]
        lines.append(f"| {r['model']} | {r['order']} | {r['approximation_error']:.4g} | {paper} |")
    for r in result.correlation:
        paper = "" if r["paper"] is None else r["paper"]
        lines.append(f"\nC-sg, order {r['order']}: correlation of IG's percentage change with the "
                     f"approximation error r = {r['pearson_ig_pct_vs_error']:.3f} (paper: {paper})")
    acc = ", ".join(f"{m['model']} {100 * m['held_out_accuracy']:.1f}%" for m in result.models)
    lines.append(f"\nHeld-out accuracy: {acc}; {result.n_samples} held-out samples.")
    return "\n".join(lines)
