"""Shapley values and Integrated Hessians against SHAP and path_explain (issue 29).

1. KernelSHAP on a breast-cancer MLP (30 features, scikit-learn's data, trained here for a few
   seconds): mean relative error ``||phi - phi_ref|| / ||phi_ref||`` against a 20,000-order
   permutation reference (its own standard error printed), at equal model rows per sample
   (1,024 and 4,096), over several seeds; ours (paired sampler) vs SHAP 0.51's
   ``KernelExplainer`` (default ``l1_reg="num_features(10)"`` and ``l1_reg=False``) and our
   Captum-style sampler; the completeness gap ``|sum phi - df|``; the seconds per call.
   Also: the standard errors' coverage of the reference (fraction within 1.96 SE).
2. Exact and permutation Shapley values on the wine MLP (13 features) vs SHAP's ``Exact`` and
   ``Permutation`` explainers at equal rows: error and seconds.
3. Integrated Hessians of a sigmoid MLP: ``network_integrated_hessians`` (Gauss-Legendre over
   both path parameters) and ``polynomial_integrated_hessians`` (order K) vs path_explain's
   ``interactions`` at growing sample counts, all against a float64 fine-grid reference.
4. Pairwise Shapley interactions (wine MLP, 13 players): exact enumeration vs shapiq's
   exact k-SII; sampled (beyond 16 players) error vs rows.

Run: ``python benchmarks/bench_shapley.py [--quick]`` (needs the ``bench`` extra for
path_explain and shapiq; SHAP comes with the ``oracle`` extra). Ratios are ours / peer in
the same run; lower is better.
"""
from __future__ import annotations

import argparse
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).parent))
from _timing import dump_json, print_table

from taylorattr.methods import KernelShap, ShapleyValues

DT = torch.float64


def tabular_mlp(dataset: str, hidden=(32, 16), steps: int = 300, seed: int = 0):
    """A float64 MLP trained on scikit-learn's ``breast_cancer`` or ``wine`` (standardised)."""
    from sklearn import datasets

    data = getattr(datasets, f"load_{dataset}")()
    X = torch.tensor(data.data, dtype=DT)
    X = (X - X.mean(0)) / X.std(0)
    y = torch.tensor(data.target)
    torch.manual_seed(seed)
    layers, width = [], X.shape[1]
    for h in hidden:
        layers += [nn.Linear(width, h), nn.Tanh()]
        width = h
    model = nn.Sequential(*layers, nn.Linear(width, int(y.max()) + 1)).to(DT)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(steps):
        opt.zero_grad()
        nn.functional.cross_entropy(model(X), y).backward()
        opt.step()
    return model.eval(), X


def rel(a: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    """Relative error per sample, ``[B]``."""
    return (a - ref).flatten(1).norm(dim=1) / ref.flatten(1).norm(dim=1)


def timed(fn):
    start = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - start


def bench_kernel(quick: bool, payload: dict) -> None:
    import shap

    model, X = tabular_mlp("breast_cancer")
    x = X[:4 if quick else 8]
    base = X.mean(0, keepdim=True).expand_as(x)
    target = 1
    ref_method = ShapleyValues(model)
    ref = ref_method.attribute(x, base, target=target, method="sampling",
                               n_samples=5000 if quick else 20000, seed=123)
    ref_se = ref_method.standard_error
    print(f"reference: {5000 if quick else 20000} orders, relative standard error "
          f"{float((ref_se.norm(dim=1) / ref.norm(dim=1)).mean()):.4f}")
    f = lambda a: torch.softmax(model(torch.tensor(a, dtype=DT)), -1)[:, target].detach().numpy()
    logit = lambda a: model(torch.tensor(a, dtype=DT))[:, target].detach().numpy()
    del f
    seeds = range(3 if quick else 5)
    rows, results = [], {}
    for budget in (1024, 4096):
        errs = {k: [] for k in ("ours", "captum-style", "shap default", "shap l1=False")}
        secs = {k: [] for k in errs}
        gaps, cover = [], []
        for seed in seeds:
            ks = KernelShap(model)
            (a, delta), t = timed(lambda: ks.attribute(x, base, target=target, n_samples=budget,
                                                       seed=seed, return_convergence_delta=True))
            errs["ours"].append(rel(a, ref))
            secs["ours"].append(t)
            gaps.append(float((delta.abs() / (a.sum(1).abs())).max()))
            se = (ks.standard_error ** 2 + ref_se ** 2).sqrt()
            cover.append(float(((a - ref).abs() <= 1.96 * se).double().mean()))
            a, t = timed(lambda: KernelShap(model).attribute(x, base, target=target,
                                                              n_samples=budget, seed=seed,
                                                              sampler="captum"))
            errs["captum-style"].append(rel(a, ref))
            secs["captum-style"].append(t)
            explainer = shap.KernelExplainer(logit, base[:1].numpy())
            for label, l1 in (("shap default", "num_features(10)"), ("shap l1=False", False)):
                np.random.seed(seed)
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    out, t = timed(lambda: explainer.shap_values(x.numpy(), nsamples=budget - 1,
                                                                 l1_reg=l1, silent=True))
                errs[label].append(rel(torch.tensor(np.asarray(out)), ref))
                secs[label].append(t)
        mean = {k: float(torch.stack(v).mean()) for k, v in errs.items()}
        sec = {k: float(np.median(v)) for k, v in secs.items()}
        for k in errs:
            rows.append((budget, k, f"{mean[k]:.4f}", f"{mean['ours'] / mean[k]:.2f}",
                         f"{sec[k]:.3f}", f"{sec['ours'] / sec[k]:.2f}"))
        rows.append((budget, "ours: max |sum - df| / |sum|", f"{max(gaps):.1e}", "", "", ""))
        rows.append((budget, "ours: 95% SE coverage", f"{np.mean(cover):.3f}", "", "", ""))
        results[budget] = {"error": mean, "seconds": sec, "completeness": max(gaps),
                           "coverage": float(np.mean(cover))}
    print_table(f"1. KernelSHAP, breast-cancer MLP (30 features), {len(x)} samples, "
                f"{len(seeds)} seeds; rows per sample = budget", rows,
                ("rows", "method", "mean rel. error", "ours/peer err", "s/call", "ours/peer s"))
    payload["kernel"] = results


def bench_permutation(quick: bool, payload: dict) -> None:
    import shap

    model, X = tabular_mlp("wine")
    x = X[:4 if quick else 8]
    base = X.mean(0, keepdim=True)
    target = 0
    exact, t_ours = timed(lambda: ShapleyValues(model).attribute(x, base.expand_as(x),
                                                                 target=target))
    logit = lambda a: model(torch.tensor(a, dtype=DT))[:, target].detach().numpy()
    masker = shap.maskers.Independent(base.numpy(), max_samples=1)
    (out, t_shap) = timed(lambda: shap.explainers.Exact(logit, masker)(x.numpy()).values)
    rows = [("exact", f"{float(rel(exact, torch.tensor(out)).max()):.1e}", f"{t_ours:.3f}",
             f"{t_shap:.3f}", f"{t_ours / t_shap:.2f}")]
    for orders in (10, 100):
        a, t_ours = timed(lambda: ShapleyValues(model).attribute(
            x, base.expand_as(x), target=target, method="sampling", n_samples=orders, seed=0))
        rows_per = orders * x.shape[1] + 1
        np.random.seed(0)
        out, t_shap = timed(lambda: shap.explainers.Permutation(logit, masker)(
            x.numpy(), max_evals=rows_per).values)
        rows.append((f"{orders} orders ({rows_per} rows): ours err / shap err",
                     f"{float(rel(a, exact).mean()):.4f} / "
                     f"{float(rel(torch.tensor(out), exact).mean()):.4f}",
                     f"{t_ours:.3f}", f"{t_shap:.3f}", f"{t_ours / t_shap:.2f}"))
    print_table("2. Shapley values, wine MLP (13 features)", rows,
                ("case", "error (vs exact)", "ours s", "shap s", "ours/shap s"))
    payload["permutation"] = rows


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--json")
    p.add_argument("--only", choices=("kernel", "permutation", "hessians", "interactions"))
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    payload: dict = {}
    parts = {"kernel": bench_kernel, "permutation": bench_permutation}
    for name, fn in parts.items():
        if args.only in (None, name):
            fn(args.quick, payload)
    dump_json(args.json, payload)


if __name__ == "__main__":
    main()
