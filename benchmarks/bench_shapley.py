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
   exact SII; the sampled estimator's error vs rows.
5. Truncation error of the Shapley rule and the polynomial Integrated Hessians against the
   exact values (``ta.shapley_rule_error``, ``ta.integrated_hessians_error``).
6. KernelSHAP with 2x2 patch players of a digits CNN (16 players, exact reference) vs SHAP.

Run: ``python benchmarks/bench_shapley.py [--quick]`` (needs the ``bench`` extra for
path_explain and shapiq; SHAP comes with the ``oracle`` extra). Ratios are ours / peer in
the same run; lower is better.
"""
from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path

import numpy as np
import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).parent))
from _peers import path_explainer
from _timing import dump_json, print_table, timed

from taylorattr.methods import KernelShap, ShapleyValues

DT = torch.float64


def _fit(model: nn.Module, X, y, steps: int) -> nn.Module:
    """``steps`` full-batch Adam steps on the cross-entropy; the model in eval mode."""
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(steps):
        opt.zero_grad()
        nn.functional.cross_entropy(model(X), y).backward()
        opt.step()
    return model.eval()


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
    return _fit(model, X, y, steps), X


def rel(a: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    """Relative error per sample, ``[B]``."""
    return (a - ref).flatten(1).norm(dim=1) / ref.flatten(1).norm(dim=1)


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
    logit = lambda a: model(torch.tensor(a, dtype=DT))[:, target].detach().numpy()
    seeds = range(3 if quick else 5)
    rows, results = [], {}
    for budget in (1024, 4096):
        errs = {k: [] for k in ("ours", "captum-style", "shap default", "shap l1=False")}
        secs = {k: [] for k in errs}
        gaps, cover = [], []
        for seed in seeds:
            ks = KernelShap(model)
            (a, delta), t = timed(lambda ks=ks, n=budget, s=seed: ks.attribute(
                x, base, target=target, n_samples=n, seed=s, return_convergence_delta=True))
            errs["ours"].append(rel(a, ref))
            secs["ours"].append(t)
            gaps.append(float((delta.abs() / (a.sum(1).abs())).max()))
            se = (ks.standard_error ** 2 + ref_se ** 2).sqrt()
            cover.append(float(((a - ref).abs() <= 1.96 * se).double().mean()))
            a, t = timed(lambda n=budget, s=seed: KernelShap(model).attribute(
                x, base, target=target, n_samples=n, seed=s, sampler="captum"))
            errs["captum-style"].append(rel(a, ref))
            secs["captum-style"].append(t)
            explainer = shap.KernelExplainer(logit, base[:1].numpy())
            for label, l1 in (("shap default", "num_features(10)"), ("shap l1=False", False)):
                np.random.seed(seed)
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    out, t = timed(lambda e=explainer, n=budget, l1=l1: e.shap_values(
                        x.numpy(), nsamples=n - 1, l1_reg=l1, silent=True))
                errs[label].append(rel(torch.tensor(np.asarray(out)), ref))
                secs[label].append(t)
        mean = {k: float(torch.stack(v).mean()) for k, v in errs.items()}
        sec = {k: float(np.median(v)) for k, v in secs.items()}
        for k in errs:
            # rows the peer would need for our error, if its error falls as 1/sqrt(rows)
            equal = (mean["ours"] / mean[k]) ** 2
            rows.append((budget, k, f"{mean[k]:.4f}", f"{mean['ours'] / mean[k]:.2f}",
                         f"{equal:.2f}", f"{sec[k]:.3f}", f"{sec['ours'] / sec[k]:.2f}"))
        rows.append((budget, "ours: max |sum - df| / |sum|", f"{max(gaps):.1e}", "", "", "", ""))
        rows.append((budget, "ours: 95% SE coverage", f"{np.mean(cover):.3f}", "", "", "", ""))
        results[budget] = {"error": mean, "seconds": sec, "completeness": max(gaps),
                           "coverage": float(np.mean(cover))}
    print_table(f"1. KernelSHAP, breast-cancer MLP (30 features), {len(x)} samples, "
                f"{len(seeds)} seeds; rows per sample = budget", rows,
                ("rows", "method", "mean rel. error", "ours/peer err",
                 "ours/peer rows at equal err", "s/call", "ours/peer s"))
    payload["kernel"] = results


def digits_cnn(steps: int = 150):
    """A small float64 CNN trained on scikit-learn's 8x8 digits."""
    from sklearn.datasets import load_digits

    data = load_digits()
    X = torch.tensor(data.images, dtype=DT)[:, None] / 16.0
    y = torch.tensor(data.target)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.Softplus(), nn.Conv2d(8, 8, 3),
                          nn.Softplus(), nn.Flatten(), nn.Linear(8 * 36, 10)).to(DT)
    return _fit(model, X, y, steps), X


def bench_patches(quick: bool, payload: dict) -> None:
    """KernelSHAP on 2x2 patch players of an 8x8 digit (16 players, exact reference by
    enumeration): ours vs SHAP's KernelExplainer on the same game (a function of the
    players' on/off vector)."""
    import shap

    from taylorattr.groups import window_ids

    model, X = digits_cnn()
    x = X[:4 if quick else 8]
    base = torch.zeros_like(x)
    target = 3
    exact = ShapleyValues(model).attribute(x, base, target=target, patch=2)
    ids = window_ids((1, 8, 8), 2).reshape(-1)
    rows = []
    for budget in (256, 1024):
        ours, theirs = [], []
        for seed in range(3 if quick else 5):
            a = KernelShap(model).attribute(x, base, target=target, patch=2, n_samples=budget,
                                            seed=seed)
            ours.append(rel(a, exact))
            errs = []
            for b in range(x.shape[0]):
                def game(masks, b=b):
                    keep = torch.tensor(masks, dtype=torch.bool)[:, ids].view(-1, 1, 8, 8)
                    with torch.no_grad():
                        return model(torch.where(keep, x[b], base[b]))[:, target].numpy()
                np.random.seed(seed)
                explainer = shap.KernelExplainer(game, np.zeros((1, 16)))
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    phi = explainer.shap_values(np.ones((1, 16)), nsamples=budget - 1,
                                                l1_reg=False, silent=True)
                player = torch.tensor(np.asarray(phi)).reshape(-1)
                errs.append(rel(player[ids].view(1, 1, 8, 8), exact[b:b + 1]))
            theirs.append(torch.cat(errs))
        e_ours, e_shap = float(torch.stack(ours).mean()), float(torch.stack(theirs).mean())
        rows.append((budget, f"{e_ours:.4f}", f"{e_shap:.4f}", f"{e_ours / e_shap:.2f}"))
    print_table("6. KernelSHAP, digits CNN, 2x2 patch players (16), exact reference", rows,
                ("rows", "ours rel. error", "shap (l1=False) rel. error", "ours/shap"))
    payload["patches"] = rows


def bench_permutation(quick: bool, payload: dict) -> None:
    import shap

    model, X = tabular_mlp("wine")
    x = X[:4 if quick else 8]
    base = X.mean(0, keepdim=True)
    target = 0
    ours_exact = lambda: ShapleyValues(model).attribute(x, base.expand_as(x), target=target)
    logit = lambda a: model(torch.tensor(a, dtype=DT))[:, target].detach().numpy()
    masker = shap.maskers.Independent(base.numpy(), max_samples=1)
    shap_exact = shap.explainers.Exact(logit, masker)
    ours_exact(), shap_exact(x[:1].numpy(), silent=True)  # warm-up (SHAP builds its tables once)
    exact, t_ours = timed(ours_exact)
    out, t_shap = timed(lambda: shap_exact(x.numpy(), silent=True).values)
    rows = [("exact", f"{float(rel(exact, torch.tensor(out)).max()):.1e}", f"{t_ours:.3f}",
             f"{t_shap:.3f}", f"{t_ours / t_shap:.2f}")]
    seeds = range(3 if quick else 5)
    for orders in (10, 100):
        rows_per = orders * x.shape[1] + 1
        err = {"plain": [], "antithetic": [], "shap": []}
        sec = {k: [] for k in err}
        for seed in seeds:
            a, t = timed(lambda k=orders, s=seed: ShapleyValues(model).attribute(
                x, base.expand_as(x), target=target, method="sampling", n_samples=k, seed=s))
            err["plain"].append(rel(a, exact))
            sec["plain"].append(t)
            a, t = timed(lambda k=orders, s=seed: ShapleyValues(model).attribute(
                x, base.expand_as(x), target=target, method="sampling", n_samples=k // 2,
                seed=s, antithetic=True))
            err["antithetic"].append(rel(a, exact))
            sec["antithetic"].append(t)
            out, t = timed(lambda r=rows_per, s=seed: shap.explainers.Permutation(
                logit, masker, seed=s)(x.numpy(), max_evals=r, silent=True).values)
            err["shap"].append(rel(torch.tensor(out), exact))
            sec["shap"].append(t)
        e = {k: float(torch.stack(v).mean()) for k, v in err.items()}
        t = {k: float(np.median(v)) for k, v in sec.items()}
        for k in ("plain", "antithetic"):
            rows.append((f"{orders} orders ({rows_per} rows), {k}: ours / shap",
                         f"{e[k]:.4f} / {e['shap']:.4f} = {e[k] / e['shap']:.2f}",
                         f"{t[k]:.3f}", f"{t['shap']:.3f}", f"{t[k] / t['shap']:.2f}"))
    print_table(f"2. Shapley values, wine MLP (13 features), {len(x)} samples, mean over "
                f"{len(seeds)} seeds", rows,
                ("case", "error (vs exact)", "ours s", "shap s", "ours/shap s"))
    payload["permutation"] = rows


def bench_hessians(quick: bool, payload: dict) -> None:
    import taylorattr as ta

    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(30, 32), nn.Sigmoid(), nn.Linear(32, 16), nn.Sigmoid(),
                        nn.Linear(16, 1), nn.Flatten(0)).to(DT).eval()
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(2, 30, dtype=DT, generator=gen)
    base = torch.zeros_like(x)
    truth = ta.network_integrated_hessians(net, x, base, n_steps=48)
    err = lambda g: float((g.double() - truth).norm() / truth.norm())
    rows, ours = [], {}
    for n in (4, 8, 12, 16):
        (g, e), t = timed(lambda n=n: ta.network_integrated_hessians(net, x, base, n_steps=n,
                                                                     return_error=True))
        ours[n] = (t, err(g))
        rows.append((f"network IH, {n}x{n} Gauss-Legendre", f"{t:.3f}", f"{err(g):.2e}",
                     f"{float(e.norm() / truth.norm()):.1e}"))
    for K in (2, 4, 8):
        g, t = timed(lambda K=K: ta.polynomial_integrated_hessians(net, x, base, order=K))
        rows.append((f"polynomial IH, K={K}", f"{t:.3f}", f"{err(g):.2e}", ""))
    Explainer = path_explainer()
    import copy

    net32 = nn.Sequential(*copy.deepcopy(list(net)[:-1])).float()  # [B, 1] outputs, float32
    explainer = Explainer(net32)
    x32 = x.float().requires_grad_(True)
    for samples in ((49, 400) if quick else (49, 400, 1600, 4900)):
        out, t = timed(lambda k=samples: explainer.interactions(
            x32, base[:1].float(), num_samples=k, use_expectation=False, verbose=False))
        rows.append((f"path_explain num_samples={samples}", f"{t:.3f}",
                     f"{err(out.detach()):.2e}", ""))
    print_table("3. Integrated Hessians, 30-32-16-1 sigmoid MLP, batch 2 (reference: 48x48 "
                "nodes, float64)", rows, ("route", "seconds", "rel. error", "error estimate"))
    payload["hessians"] = rows


def bench_interactions(quick: bool, payload: dict) -> None:
    import shapiq

    import taylorattr as ta

    model, X = tabular_mlp("wine")
    x, base = X[:2], X.mean(0, keepdim=True).expand(2, -1)
    exact, t_ours = timed(lambda: ta.shapley_interactions(model, x, base, target=0))
    rows = []
    for b in range(2):
        def game(c, b=b):
            keep = torch.tensor(c, dtype=torch.bool)
            with torch.no_grad():
                return model(torch.where(keep, x[b], base[b]))[:, 0].numpy()
        theirs, t_shapiq = timed(lambda g=game: shapiq.ExactComputer(
            n_players=13, game=g)("SII", order=2).get_n_order_values(2))
        diff = float(np.abs(exact[b].numpy() - theirs).max())
        rows.append((f"exact SII, sample {b}: max |ours - shapiq|", f"{diff:.1e}",
                     f"{t_ours / 2:.3f}", f"{t_shapiq:.3f}"))
    for orders in (50, 500):
        s, t = timed(lambda k=orders: ta.shapley_interactions(model, x, base, target=0,
                                                              method="sampling", n_samples=k))
        e = float((s - exact).norm() / exact.norm())
        rows.append((f"sampled SII, {orders} orders ({orders * 24 + 1} rows)", f"{e:.3f}",
                     f"{t:.3f}", ""))
    print_table("4. Pairwise Shapley interactions, wine MLP (13 players)", rows,
                ("case", "difference / rel. error", "ours s", "shapiq s"))
    payload["interactions"] = rows


def bench_truncation(quick: bool, payload: dict) -> None:
    import taylorattr as ta

    model, X = tabular_mlp("wine")
    x, base = X[:4], X.mean(0, keepdim=True).expand(4, -1)
    rows = []
    for K in (1, 2, 3, 4):
        r, t = timed(lambda K=K: ta.shapley_rule_error(model, x, base, target=0, order=K))
        rows.append((f"Shapley rule, K={K}", f"{float(r.relative.mean()):.3f}", f"{t:.2f}"))
    for K in (2, 4, 8):
        r, t = timed(lambda K=K: ta.integrated_hessians_error(model, x, base, target=0, order=K))
        rows.append((f"polynomial IH, K={K}", f"{float(r.relative.mean()):.3f}", f"{t:.2f}"))
    print_table("5. Truncation error of the Taylor routes, wine MLP (13 features, mean "
                "baseline), 4 samples", rows, ("route", "rel. error vs exact", "seconds"))
    payload["truncation"] = rows


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--json")
    p.add_argument("--only", choices=("kernel", "permutation", "hessians", "interactions",
                                      "truncation", "patches"))
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    payload: dict = {}
    parts = {"kernel": bench_kernel, "permutation": bench_permutation,
             "hessians": bench_hessians, "interactions": bench_interactions,
             "truncation": bench_truncation, "patches": bench_patches}
    for name, fn in parts.items():
        if args.only in (None, name):
            fn(args.quick, payload)
    dump_json(args.json, payload)


if __name__ == "__main__":
    main()
