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
from pathlib import Path

import torch
from tqdm.auto import tqdm

from .. import _io
from ..methods import METHODS
from ..metrics import percentage_change
from ..reformulations import reformulate_orders
from ._units import UnitStore, fingerprint, model_fingerprint

__all__ = [
    "PAPER_APPROX_ERROR",
    "PAPER_TABLE3",
    "VALIDATION_METHODS",
    "ValidationResult",
    "run_validation",
]

# method label -> (registry name, extra arguments)
VALIDATION_METHODS: dict[str, tuple[str, dict]] = {
    "GI": ("gradient_input", {}),
    "Occ-1": ("occlusion_1", {}),
    "Occ-2x2": ("occlusion_patch", {"patch": 2}),
    "Occ-4x4": ("occlusion_patch", {"patch": 4}),
    "DL": ("deeplift", {}),
    "IG": ("integrated_gradients", {}),
}
MODEL_LABELS = {"poly": "Poly", "m_sg": "M-sg", "c_sg": "C-sg"}
PAPER_TABLE3 = {  # percentage change, paper Table 3
    "GI": {"Poly": 0.0, "M-sg": 0.0, "C-sg": 0.0},
    "Occ-1": {"Poly": 0.0, "M-sg": 0.05, "C-sg": 13.17},
    "Occ-2x2": {"Poly": 0.0, "M-sg": 0.35, "C-sg": 21.22},
    "Occ-4x4": {"Poly": 0.0, "M-sg": 2.00, "C-sg": 35.93},
    "DL": {"Poly": 0.0, "M-sg": 2.35, "C-sg": 32.76},
    "IG": {"Poly": 0.12, "M-sg": 3.50, "C-sg": 40.29},
}
PAPER_APPROX_ERROR = {"Poly": 0.0, "M-sg": 0.084, "C-sg": 0.420}
PAPER_IG_ERROR_CORRELATION = 0.72


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


def _percentages(label: str, model, x: torch.Tensor, orders: tuple[int, ...],
                 ig_steps: int) -> dict:
    """Per-sample percentage change of one method at each order (``pct{K}``), plus IG's
    relative approximation error (``rel_error{K}``)."""
    name, kw = VALIDATION_METHODS[label]
    with torch.no_grad():
        target = model(x).argmax(1)
    reforms = reformulate_orders(name, model, x, 0.0, target, orders, **kw)
    out = {}
    if name == "deeplift":
        for K, layers in reforms.items():
            out[f"pct{K}"] = torch.stack([
                percentage_change(l.original.flatten(1), l.reformulated.flatten(1))
                for l in layers]).mean(0)
        return out
    spec = METHODS[name]
    if spec.uses_baselines:
        extra = {"n_steps": ig_steps} if name == "integrated_gradients" else {}
        original = spec(model, x, baselines=0.0, target=target, **kw, **extra)
    else:
        original = spec(model, x, target=target, **kw)
    for K, reform in reforms.items():
        out[f"pct{K}"] = percentage_change(original, reform)
    if name == "integrated_gradients":
        with torch.no_grad():
            df = model(x).gather(1, target[:, None])[:, 0] - model(torch.zeros_like(x)).gather(
                1, target[:, None])[:, 0]
        for K, reform in reforms.items():
            out[f"rel_error{K}"] = (df - reform.flatten(1).sum(1)).abs() / df.abs()
    return out


def _pearson(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double() - a.double().mean(), b.double() - b.double().mean()
    return float((a * b).sum() / (a.norm() * b.norm()))


def run_validation(out_dir: str | Path, models=("poly", "m_sg", "c_sg"), orders=(2,),
                   n_samples: int = 100, batch_size: int = 25, mnist_dir=None, seed: int = 0,
                   quick: bool = False, ig_steps: int = 50, show_progress: bool = True,
                   epochs: int | None = None) -> ValidationResult:
    """Run the validation table; returns the tables and writes them to ``out_dir/validation``.

    ``n_samples`` held-out digits (the paper: 3,000), ``orders`` the Taylor orders swept.
    Models are trained once and cached under ``out_dir`` (:func:`taylorattr.models.get_trained`;
    ``epochs`` overrides its default, 0 keeps the initial weights).
    """
    from .. import data
    from .. import models as M

    out = Path(out_dir)
    store = UnitStore(out / "validation" / "units")
    _io.remove_stale_temporaries(out / "validation")  # a table write killed mid-way
    images, labels = data.load_mnist(mnist_dir)
    held = data.mnist_split(images, labels, seed=0).held_images[:n_samples].double()
    result = ValidationResult(n_samples=int(held.shape[0]))
    batches = [held[i:i + batch_size] for i in range(0, held.shape[0], batch_size)]
    units = [(m, label, i) for m in models for label in VALIDATION_METHODS
             for i in range(len(batches))]
    trained, weights = {}, {}
    for m in models:
        model, info = M.get_trained(m, out, seed=seed, quick=quick, mnist_dir=mnist_dir,
                                    epochs=epochs, show_progress=show_progress)
        trained[m] = model.double().eval()
        weights[m] = model_fingerprint(trained[m])
        result.models.append({"model": MODEL_LABELS.get(m, m),
                              "held_out_accuracy": info["held_out_accuracy"],
                              "epochs": info["epochs"], "n_train": info["n_train"],
                              "n_held_out": info["n_held_out"], "data": info["data"]})
    inputs = [fingerprint([("x", b)]) for b in batches]
    per_unit = {}
    order_tag = "-".join(map(str, orders))
    for m, label, i in tqdm(units, desc="validation", disable=not show_progress):
        key = f"{m}-{weights[m]}-{label}-orders{order_tag}-x{inputs[i]}-steps{ig_steps}"
        per_unit[(m, label, i)] = store.get(
            key, functools.partial(_percentages, label, trained[m], batches[i], orders, ig_steps))

    def joined(m, label, field):
        return torch.cat([per_unit[(m, label, i)][field] for i in range(len(batches))])

    for m in models:
        mlabel = MODEL_LABELS.get(m, m)
        for K in orders:
            for label in VALIDATION_METHODS:
                result.rows.append({"model": mlabel, "method": label, "order": K,
                                    "percentage_change": float(joined(m, label, f"pct{K}").mean()),
                                    "paper": PAPER_TABLE3[label].get(mlabel) if K == 2 else None})
            err = joined(m, "IG", f"rel_error{K}")
            result.approximation.append({"model": mlabel, "order": K,
                                         "approximation_error": float(err.mean()),
                                         "paper": PAPER_APPROX_ERROR.get(mlabel) if K == 2 else None})
            if m == "c_sg":
                result.correlation.append({"model": mlabel, "order": K,
                                           "pearson_ig_pct_vs_error": _pearson(
                                               joined(m, "IG", f"pct{K}"), err),
                                           "paper": PAPER_IG_ERROR_CORRELATION if K == 2 else None})
    folder = out / "validation"
    _io.save_json(result.to_json(), folder / "validation.json")
    _io.save_csv(result.rows, folder / "validation.csv")
    return result


def format_validation(result: ValidationResult) -> str:
    """Markdown tables: ours beside the paper's, one column per model and order."""
    lines = []
    orders = sorted({r["order"] for r in result.rows})
    models = list(dict.fromkeys(r["model"] for r in result.rows))
    lookup = {(r["model"], r["method"], r["order"]): r for r in result.rows}
    header = ["method"] + [f"{m} K={K}" for K in orders for m in models] + [f"{m} paper" for m in models]
    lines.append("| " + " | ".join(header) + " |")
    lines.append("|" + "---|" * len(header))
    for label in VALIDATION_METHODS:
        cells = [label] + [f"{lookup[(m, label, K)]['percentage_change']:.3g}%" for K in orders
                           for m in models]
        cells += [f"{PAPER_TABLE3[label][m]}%" if m in PAPER_TABLE3[label] else "" for m in models]
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
