"""Paper Table 3: how far each method lies from its Taylor reformulation.

For every model (Poly, M-sg, C-sg), held-out sample ``i`` and method,

    d = mean_i ||a_o(i) - a_r(i)||^2 / ||a_o(i)||^2 * 100%

with ``a_o`` the method and ``a_r`` its order-K reformulation (baseline 0, target the
predicted class). DeepLIFT's ``d`` is computed per layer on the local relevances and
averaged over the layers followed by a nonlinearity, as in the paper. Also reported:
the approximation error ``|eps| / |df|`` of the order-K expansion (``eps = df - g_K``,
``g_K`` = the sum of the IG reformulation), and on C-sg the per-sample correlation
between IG's percentage change and that error. Beside every approximation error: its
median over the digits and the RMS pre-activation movement of each nonlinear layer
between ``x`` and the baseline (:mod:`.diagnostics`), which explains it. Every (model,
method, order, batch) is a resumable unit under ``out/validation/units``.

:func:`run_validation` is one training (the workspace's recipe and seed);
:func:`run_validation_study` runs it for several recipes (presets) and training seeds and
reports every cell as mean ± spread (sample standard deviation) over the seeds, the
correlations as Pearson's r and Spearman's rho averaged over seeds with a 95% bootstrap
interval over the digits, and the figure "eps_bar vs pre-activation movement".
:class:`ValidationStage` counts the rows of both before they run.

Why one module: the single run, the multi-seed study and their tables read the same
units and keys; split, the study would re-derive the run's unit keys.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, field

import torch

from .. import _io, data
from ..baselines import Point
from ..methods import IntegratedGradients
from ..metrics.statistics import bootstrap_correlation_ci, pearson
from ..models.training import resolve_training
from ..paper_methods import TABLE3, variants
from ..reporting.report import markdown_table
from ..taylor.terms import taylor_attribution, taylor_attribution_cost
from . import paper
from ._units import fingerprint
from .diagnostics import nonlinear_layers, plot_error_vs_movement, preactivation_movement
from .plans import TRAINING_NOTE, StageCost, architecture, forwards
from .workspace import Workspace

__all__ = ["ValidationResult", "ValidationStage", "ValidationStudy", "format_study",
           "format_validation", "reformulation_cost", "run_validation", "run_validation_study",
           "validation_methods"]


def validation_methods(ig_steps: int = 50) -> list:
    """The bound methods of Table 3 (every registered variant with a reformulation that
    takes part in the validation), with ``n_steps = ig_steps`` for path methods."""
    return [spec.bind(v, context={"n_steps": ig_steps}) for spec, v in variants("validation")]


def reformulation_cost(method, x: torch.Tensor, orders):
    """The rows of ``method``'s Taylor reformulation at ``orders`` as the validation runs
    it (baseline 0, the method's settings), or None where the reformulation does not count
    them (:meth:`taylorattr.methods.reformulations.Reformulation.cost_of`)."""
    return method.spec.reformulation.cost_of(x, 0.0, orders, method.settings)


@dataclass(frozen=True)
class ValidationStage:
    """The validation's settings (those of :func:`run_validation`; ``runs``: trainings,
    recipes x seeds, of :func:`run_validation_study`) and its rows (:meth:`cost`)."""

    models: tuple = ("poly", "m_sg", "c_sg")
    orders: tuple = (2,)
    n_samples: int = 100
    batch_size: int = 25
    ig_steps: int = 50
    runs: int = 1
    seed: int = 0
    mnist_dir: object = None

    def unit_costs(self, model, x: torch.Tensor) -> tuple[list, list]:
        """``(costs, skipped)`` of one batch: every method against its reformulation (a
        target forward, the method, the reformulation; a method whose reformulation does
        not count its rows is skipped) and the approximation unit (``f(x) - f(0)``, the
        Taylor attribution per order, the pre-activation movement)."""
        b, orders = x.shape[0], tuple(self.orders)
        costs, skipped = [], []
        for m in validation_methods(self.ig_steps):
            reform = reformulation_cost(m, x, orders)
            if reform is None:
                skipped.append(m.label)
                continue
            original = [] if m.spec.reformulation.layerwise else [m.cost(model, x)]
            costs += [forwards(b), *original, reform]
        costs += [forwards(2 * b), *(taylor_attribution_cost(x, 0.0, k) for k in orders)]
        if nonlinear_layers(model):
            costs.append(forwards(2 * b))
        return costs, skipped

    def cost(self) -> list[StageCost]:
        """One :class:`~.plans.StageCost` per model (untrained copies, float64, as run)."""

        held = data.held_out_digits(self.mnist_dir)[0]  # read on the CPU; the models are
        held = held[:self.n_samples].to(torch.get_default_device(), torch.float64)  # here
        scope = f" ({self.runs} trainings)" if self.runs > 1 else ""
        out = []
        for name in self.models:
            model = architecture(name, self.seed).double()
            costs, skipped = [], []
            for i in range(0, held.shape[0], self.batch_size):
                c, s = self.unit_costs(model, held[i:i + self.batch_size])
                costs += c
                skipped += s
            out.append(StageCost(f"validation on {paper.model_label(name)}{scope}",
                                 ((costs * self.runs, model, held),), int(held.shape[0]),
                                 tuple(skipped), (TRAINING_NOTE,)))
        return out


@dataclass
class ValidationResult:
    """Tables of the validation experiment (data only; see :func:`format_validation`)."""

    rows: list[dict] = field(default_factory=list)  # model, method, order, percentage_change, paper
    approximation: list[dict] = field(default_factory=list)  # model, order, mean |eps|/|df|, paper
    correlation: list[dict] = field(default_factory=list)  # order, pearson r (C-sg), paper
    models: list[dict] = field(default_factory=list)  # model, held-out accuracy, epochs, ...
    n_samples: int = 0
    # model, order, median abs(eps)/abs(df), movement {layer: RMS} (diagnostics.json)
    diagnostics: list[dict] = field(default_factory=list)
    # (model label, order) -> {"error": [n], "ig_pct": [n] or absent} per digit (not saved)
    per_sample: dict = field(default_factory=dict, repr=False)
    # model label -> {optimizer, lr, weight_decay, preset, seed} (diagnostics.json)
    training: dict = field(default_factory=dict)

    def to_json(self) -> dict:
        return {"rows": self.rows, "approximation": self.approximation,
                "correlation": self.correlation, "models": self.models, "n_samples": self.n_samples}


def _percentages(method, model, x: torch.Tensor, orders: tuple[int, ...],
                 progress: bool = False) -> dict:
    """Per-sample percentage change of one method at each order (``pct{K}``); with
    ``progress`` per-chunk bars of the method and of reformulations that show one."""
    with torch.no_grad():
        target = model(x).argmax(1)
    reform = method.spec.reformulation
    options = reform.own_options(method.settings)
    if progress and "show_progress" in reform.options:
        options["show_progress"] = True
    reforms = reform.orders(model, x, 0.0, target, orders, **options)
    original = functools.cache(lambda: method(model, x, Point(0.0), target,
                                              show_progress=progress, desc="validation"))
    return {f"pct{K}": reform.percentage_change(original, r) for K, r in reforms.items()}


def _layer_label(name: str, module) -> str:
    return f"{type(module).__name__}@{name}"


def predicted_drop(model, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(target, df)``: the predicted class and ``f(x) - f(0)`` of its logit (one forward of
    ``x`` and one of the black image)."""
    with torch.no_grad():
        out = model(x)
        target = out.argmax(1)
        df = out.gather(1, target[:, None])[:, 0] - model(torch.zeros_like(x)).gather(
            1, target[:, None])[:, 0]
    return target, df


def _approximation(model, x: torch.Tensor, orders: tuple[int, ...]) -> dict:
    """``|eps_K| / |df|`` per sample at each order (``rel_error{K}``): ``df = f(x) - f(0)``,
    ``eps_K = df - g_K`` with ``g_K`` the sum of the order-K Taylor attribution; and per
    sample the mean squared pre-activation movement of each nonlinear layer (``ms:<layer>``)."""
    target, df = predicted_drop(model, x)
    out = {}
    for K in orders:
        g = taylor_attribution(model, x, 0.0, target, K).flatten(1).sum(1)
        out[f"rel_error{K}"] = (df - g).abs() / df.abs()
    names = [_layer_label(n, m) for n, m in nonlinear_layers(model)]
    moves = preactivation_movement(model, x, 0.0, per_sample=True) if names else {}
    for label, rms in zip(names, moves.values()):
        out[f"ms:{label}"] = rms.pow(2)
    return out


def run_validation(ws: Workspace, models=("poly", "m_sg", "c_sg"), orders=(2,),
                   n_samples: int = 100, batch_size: int = 25, ig_steps: int = 50,
                   folder=None) -> ValidationResult:
    """Run the validation table; returns the tables and writes them to ``folder``
    (default ``ws.out/validation``): ``validation.json``/``.csv`` and ``diagnostics.json``.

    ``n_samples`` held-out digits (the paper: 3,000), ``orders`` the Taylor orders swept,
    ``ig_steps`` the quadrature nodes of path methods. Models come from ``ws.trained``
    (the workspace's training recipe and seed).
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
        result.training[paper.model_label(m)] = {
            k: info.get(k) for k in ("optimizer", "lr", "weight_decay", "preset", "seed")}
    inputs = [fingerprint([("x", b)]) for b in batches]
    order_tag = "-".join(map(str, orders))
    units = [(m, k, i) for m in models for k in range(len(methods) + 1) for i in range(len(batches))]
    items = []
    for m, k, i in units:
        x = batches[i]
        if k < len(methods):  # a method against its reformulation
            method = methods[k]
            key = f"{m}-{weights[m]}-{method.name}-{method.tag()}-orders{order_tag}-x{inputs[i]}"
            compute = functools.partial(_percentages, method, trained[m], x, orders,
                                        ws.progress)
        else:  # the approximation error of the expansion itself
            key = f"{m}-{weights[m]}-approximation-movement-orders{order_tag}-x{inputs[i]}"
            compute = functools.partial(_approximation, trained[m], x, orders)
        items.append((key, compute))
    per_unit = dict(zip(units, ws.run_units(store, items, "validation")))

    def joined(m, k, name):
        return torch.cat([per_unit[(m, k, i)][name] for i in range(len(batches))])

    approx = len(methods)
    ig = next((k for k, mt in enumerate(methods) if mt.spec.cls is IntegratedGradients), None)
    for m in models:
        mlabel = paper.model_label(m)
        for K in orders:
            for k, method in enumerate(methods):
                table3 = TABLE3.get(method.label, {})
                result.rows.append({"model": mlabel, "method": method.label, "order": K,
                                    "percentage_change": float(joined(m, k, f"pct{K}").mean()),
                                    "paper": table3.get(mlabel) if K == 2 else None})
            err = joined(m, approx, f"rel_error{K}")
            moves = {k[3:]: float(joined(m, approx, k).mean().sqrt())
                     for k in per_unit[(m, approx, 0)] if k.startswith("ms:")}
            result.diagnostics.append({"model": mlabel, "order": K,
                                       "median_error": float(err.median()),
                                       "movement": moves})
            result.per_sample[(mlabel, K)] = {"error": err} | (
                {"ig_pct": joined(m, ig, f"pct{K}")} if ig is not None else {})
            result.approximation.append({"model": mlabel, "order": K,
                                         "approximation_error": float(err.mean()),
                                         "paper": paper.APPROX_ERROR.get(mlabel) if K == 2 else None})
            if m == "c_sg" and ig is not None:
                result.correlation.append({"model": mlabel, "order": K,
                                           "pearson_ig_pct_vs_error": pearson(
                                               joined(m, ig, f"pct{K}"), err),
                                           "paper": paper.IG_ERROR_CORRELATION if K == 2 else None})
    folder = ws.out / "validation" if folder is None else folder
    if ws.is_main:  # under torchrun every rank has the tables; rank 0 writes them
        _io.save_json(result.to_json(), folder / "validation.json")
        _io.save_csv(result.rows, folder / "validation.csv")
        _io.save_json({"preset": ws.preset, "seed": ws.seed, "training": result.training,
                       "diagnostics": result.diagnostics},
                      folder / "diagnostics.json")
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
    body = [[label] + [f"{lookup[(m, label, K)]['percentage_change']:.3g}%" for K in orders
                       for m in models]
            + [f"{paper_of[(m, label)]}%" if (m, label) in paper_of else None for m in models]
            for label in labels]
    lines.append(markdown_table(header, body))
    lines.append("")
    lines.append(markdown_table(["model", "order", "mean abs(eps)/abs(df)", "paper (K=2)"],
                                [[r["model"], r["order"], f"{r['approximation_error']:.4g}",
                                  r["paper"]] for r in result.approximation]))
    for r in result.correlation:
        paper = "" if r["paper"] is None else f" (paper: {r['paper']})"
        lines.append(f"\nC-sg, order {r['order']}: correlation of IG's percentage change with the "
                     f"approximation error r = {r['pearson_ig_pct_vs_error']:.3f}{paper}")
    acc = ", ".join(f"{m['model']} {100 * m['held_out_accuracy']:.1f}%" for m in result.models)
    lines.append(f"\nHeld-out accuracy: {acc}; {result.n_samples} held-out samples.")
    return "\n".join(lines)


# =======================================================================================
# Several recipes and training seeds
# =======================================================================================
@dataclass
class ValidationStudy:
    """The validation over training recipes (presets) and seeds (see
    :func:`run_validation_study`). Every ``spread`` is the sample standard deviation over
    the seeds (None with one seed)."""

    presets: list[str] = field(default_factory=list)
    seeds: list[int] = field(default_factory=list)
    n_samples: int = 0
    table3: list[dict] = field(default_factory=list)  # preset, model, method, order, mean, spread
    approximation: list[dict] = field(default_factory=list)  # + median, movement per layer
    correlation: list[dict] = field(default_factory=list)  # pearson/spearman, CI, per seed
    models: list[dict] = field(default_factory=list)  # preset, model, accuracy mean/spread
    figures: list[str] = field(default_factory=list)
    runs: dict = field(default_factory=dict, repr=False)  # (preset, seed) -> ValidationResult

    def to_json(self) -> dict:
        return {k: getattr(self, k) for k in ("presets", "seeds", "n_samples", "table3",
                                              "approximation", "correlation", "models",
                                              "figures")}


def _mean_spread(values) -> tuple[float, float | None]:
    v = torch.tensor([float(x) for x in values], dtype=torch.float64, device="cpu")
    return float(v.mean()), (float(v.std()) if v.numel() > 1 else None)


def run_validation_study(ws: Workspace, presets=None, seeds=None,
                         models=("poly", "m_sg", "c_sg"), orders=(2,), n_samples: int = 100,
                         batch_size: int = 25, ig_steps: int = 50, plots: bool = True,
                         primary: bool = True) -> ValidationStudy:
    """:func:`run_validation` for every training recipe in ``presets`` (preset names or
    :class:`~taylorattr.models.training.TrainSettings`; default the workspace's) and
    training seed in ``seeds`` (default ``ws.seeds``), then the tables over seeds.

    The first (recipe, seed) writes ``ws.out/validation/validation.json`` as a single run
    does (unless ``primary=False``: then it too goes under ``runs``); every other run writes under ``ws.out/validation/runs/<preset>-seed<k>``; the
    study writes ``study.json``, ``study_table3.csv`` and the figure
    ``figures/error_vs_movement.png``. Units are keyed by the weights, so runs resume.
    """

    recipes = [resolve_training(p) for p in (presets or (ws.training,))]
    names = [r.name for r in recipes]
    if len(set(names)) != len(names):
        raise ValueError(f"presets must have distinct names, got {names}")
    seeds = tuple(ws.seeds if seeds is None else seeds)
    study = ValidationStudy(presets=names, seeds=list(seeds))
    for recipe in recipes:
        for s in seeds:
            run_ws = ws.for_training(recipe, seed=s)
            first = primary and not study.runs
            folder = None if first else ws.out / "validation" / "runs" / f"{recipe.name}-seed{s}"
            study.runs[(recipe.name, s)] = run_validation(run_ws, models, orders, n_samples,
                                                          batch_size, ig_steps, folder=folder)
    study.n_samples = next(iter(study.runs.values())).n_samples
    for name in names:
        runs = [study.runs[(name, s)] for s in seeds]
        _aggregate(study, name, runs)
    folder = ws.out / "validation"
    if plots and ws.is_main:
        points = [{"label": r["model"], "group": r["preset"], "movement": r["first_movement"],
                   "movement_spread": r["first_movement_spread"], "error": r["mean"],
                   "error_spread": r["spread"]}
                  for r in study.approximation
                  if r["order"] == min(orders) and r["first_movement"] is not None
                  and r["mean"] > 1e-9]
        if points:
            study.figures.append(str(plot_error_vs_movement(
                points, ws.out / "figures" / "error_vs_movement.png",
                title=f"Order-{min(orders)} approximation error vs first-layer pre-activation "
                      "movement (mean ± sd over seeds)")))
    if ws.is_main:
        _io.save_json(study.to_json(), folder / "study.json")
        _io.save_csv(study.table3, folder / "study_table3.csv")
    return study


def _aggregate(study: ValidationStudy, preset: str, runs: list[ValidationResult]) -> None:
    first = runs[0]
    for k, row in enumerate(first.rows):
        mean, spread = _mean_spread(r.rows[k]["percentage_change"] for r in runs)
        study.table3.append({"preset": preset, "model": row["model"], "method": row["method"],
                             "order": row["order"], "mean": mean, "spread": spread,
                             "n_seeds": len(runs), "paper": row["paper"]})
    for k, row in enumerate(first.approximation):
        mean, spread = _mean_spread(r.approximation[k]["approximation_error"] for r in runs)
        med, _ = _mean_spread(r.diagnostics[k]["median_error"] for r in runs)
        layers = list(first.diagnostics[k]["movement"])
        movement = {lay: _mean_spread(r.diagnostics[k]["movement"][lay] for r in runs)
                    for lay in layers}
        head = movement[layers[0]] if layers else (None, None)
        study.approximation.append({
            "preset": preset, "model": row["model"], "order": row["order"], "mean": mean,
            "spread": spread, "median": med, "movement": {k2: v[0] for k2, v in movement.items()},
            "movement_spread": {k2: v[1] for k2, v in movement.items()},
            "first_movement": head[0], "first_movement_spread": head[1],
            "n_seeds": len(runs), "paper": row["paper"]})
    for row in first.correlation:
        key = (row["model"], row["order"])
        xs = [r.per_sample[key]["ig_pct"] for r in runs]
        ys = [r.per_sample[key]["error"] for r in runs]
        ok = torch.stack([torch.isfinite(x) & torch.isfinite(y) for x, y in zip(xs, ys)]).all(0)
        xs, ys = [x[ok] for x in xs], [y[ok] for y in ys]
        out = {"preset": preset, "model": row["model"], "order": row["order"],
               "n_seeds": len(runs), "n_digits": int(ok.sum()), "paper": row["paper"],
               "pearson_per_seed": [pearson(x, y) for x, y in zip(xs, ys)]}
        for method in ("pearson", "spearman"):
            r, lo, hi = bootstrap_correlation_ci(xs, ys, method)
            out |= {method: r, f"{method}_low": lo, f"{method}_high": hi}
        study.correlation.append(out)
    for k, m in enumerate(first.models):
        mean, spread = _mean_spread(r.models[k]["held_out_accuracy"] for r in runs)
        train = first.training[m["model"]]
        study.models.append({"preset": preset, "model": m["model"], "accuracy": mean,
                             "accuracy_spread": spread, "n_seeds": len(runs),
                             "weight_decay": train["weight_decay"], "lr": train["lr"],
                             "optimizer": train["optimizer"], "epochs": m["epochs"]})


def _pm(mean, spread, spec=".3g", unit="") -> str:
    if mean is None:
        return "n/a"
    text = f"{mean:{spec}}{unit}"
    return text if spread is None else f"{text} ± {spread:.2g}"


def format_study(study: ValidationStudy) -> str:
    """Markdown: the recipes side by side, every cell mean ± sd over the training seeds."""
    lines = [(f"Training seeds {', '.join(map(str, study.seeds))} per recipe; cells are mean ± "
             f"sample sd over the seeds; {study.n_samples} held-out digits."), "",
             markdown_table(
                 ["recipe", "model", "held-out accuracy", "optimiser", "lr", "weight decay",
                  "epochs"],
                 [[m["preset"], m["model"],
                   _pm(100 * m["accuracy"], None if m["accuracy_spread"] is None
                       else 100 * m["accuracy_spread"], ".1f", "%"),
                   m["optimizer"], f"{m['lr']:g}", f"{m['weight_decay']:g}", m["epochs"]]
                  for m in study.models])]
    for preset in study.presets:
        rows = [r for r in study.table3 if r["preset"] == preset]
        models = list(dict.fromkeys(r["model"] for r in rows))
        orders = sorted({r["order"] for r in rows})
        look = {(r["model"], r["method"], r["order"]): r for r in rows}
        paper_of = {(r["model"], r["method"]): r["paper"] for r in rows if r["paper"] is not None}
        head = ["method"] + [f"{m} K={K}" for K in orders for m in models] + [
            f"{m} paper" for m in models]
        body = [[label] + [_pm(look[(m, label, K)]["mean"], look[(m, label, K)]["spread"],
                               unit="%") for K in orders for m in models]
                + [f"{paper_of[(m, label)]}%" if (m, label) in paper_of else None
                   for m in models]
                for label in dict.fromkeys(r["method"] for r in rows)]
        lines += ["", f"Percentage change, recipe **{preset}**:", "", markdown_table(head, body)]
    lines += ["", ("Approximation error of the order-K expansion at x (mean and median over "
                   "digits of abs(eps)/abs(df)) beside its diagnostic: the RMS movement of "
                   "each nonlinear layer's pre-activations between x and the baseline 0 "
                   "(first layer first)."), ""]
    head = ["model", "order"]
    for p in study.presets:
        head += [f"{p}: mean", f"{p}: median", f"{p}: movement"]
    head.append("paper (mean, K=2)")
    body = []
    keyed = {(r["preset"], r["model"], r["order"]): r for r in study.approximation}
    for r0 in [r for r in study.approximation if r["preset"] == study.presets[0]]:
        cells = [r0["model"], str(r0["order"])]
        for p in study.presets:
            r = keyed.get((p, r0["model"], r0["order"]))
            if r is None:
                cells += [None, None, None]
                continue
            move = ", ".join(_pm(v, r["movement_spread"][k], ".2f")
                             for k, v in r["movement"].items())
            cells += [_pm(r["mean"], r["spread"], ".3f"), f"{r['median']:.3f}", move]
        cells.append(r0["paper"])
        body.append(cells)
    lines.append(markdown_table(head, body))
    if study.correlation:
        lines += ["", ("Correlation of IG's percentage change with the approximation error over "
                       "digits, averaged over seeds, [95% bootstrap interval over digits]:"), "",
                  markdown_table(
                      ["recipe", "model", "order", "Pearson r", "Spearman rho",
                       "Pearson r per seed", "paper (Pearson)"],
                      [[r["preset"], r["model"], r["order"],
                        *(f"{r[m]:.3f} [{r[m + '_low']:.2f}, {r[m + '_high']:.2f}]"
                          for m in ("pearson", "spearman")),
                        ", ".join(f"{v:.2f}" for v in r["pearson_per_seed"]), r["paper"]]
                       for r in study.correlation])]
    return "\n".join(lines)
