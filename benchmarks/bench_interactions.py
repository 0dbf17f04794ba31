"""Exact interactions against the sampling peers (issue 14), and how much of df is interactive.

1. Integrated Hessians on a 64-32-32-1 sigmoid MLP: ``ta.integrated_hessians`` (closed form on
   the order-K polynomial) vs ``path_explain``'s ``PathExplainerTorch.interactions`` (Riemann
   sums, float32), both against a float64 Gauss-Legendre double quadrature of the true Hessian
   (48 x 48 nodes). Time to reach 1% relative (Frobenius) error, and error at equal time.
2. Pair interactions of the same MLP (64 players) vs ``shapiq`` k-SII (order 2) at model-
   evaluation budgets of 2,080 (= G + G(G-1)/2, the pairs route) and 10,000: seed-to-seed
   difference of shapiq, and its distance to our exact order-K pairs of the removal game
   ``v(T) = f(x) - f(x with T at the baseline)`` (the same game is given to shapiq).
3. A C-sg-sized CNN with 7x7 patches (16 players, 2^16 coalitions): shapiq's exact k-SII of
   the true model by enumeration, against its approximators and our pairs.
4. Share of ``df`` that is interactive, per order, on M-sg and C-sg (untrained, and trained
   quickly on the bundled digits) for 4 digits: pixel level ``P_k - sum_i P_k(delta_i e_i)`` and
   the part carried by pairs of 4x4 patches, ``sum_{A<B} J^k(A, B)``, both over ``|df|``.

path_explain's package ``__init__`` imports TensorFlow; its torch explainer is loaded from its
file directly. Allocator: the default glibc malloc for every peer. Run:
``python benchmarks/bench_interactions.py`` (needs the ``bench`` extra).
"""
from __future__ import annotations

import sys
import tempfile
from pathlib import Path

import numpy as np
import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).parent))
from _peers import path_explainer
from _timing import print_table, timed

import taylorattr as ta
from taylorattr import models

DT = torch.float64


def mlp(seed: int = 0) -> nn.Sequential:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(64, 32), nn.Sigmoid(), nn.Linear(32, 32), nn.Sigmoid(),
                         nn.Linear(32, 1)).eval()


def quadrature_ih(model, x, base, nodes=48):
    from torch.func import grad, hessian, vmap

    t, w = np.polynomial.legendre.leggauss(nodes)
    t, w = torch.tensor((t + 1) / 2, dtype=DT), torch.tensor(w / 2, dtype=DT)
    g = (t[:, None] * t[None, :]).reshape(-1)
    weight = (w[:, None] * w[None, :]).reshape(-1)
    out = []
    for xi, bi in zip(x, base):
        d = xi - bi
        f = lambda z: model(z[None]).reshape(-1)[0]
        pts = bi[None] + g[:, None] * d[None]
        H, G = vmap(hessian(f))(pts), vmap(grad(f))(pts)
        gamma = d[:, None] * d[None, :] * (weight[:, None, None] * g[:, None, None] * H).sum(0)
        out.append(gamma + torch.diag(d * (weight[:, None] * G).sum(0)))
    return torch.stack(out).detach()


def rel(a, b) -> float:
    return float((a.double() - b).norm() / b.norm())


def bench_ih(rows_out):
    net = mlp()
    net64 = mlp().to(DT)
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(4, 64, dtype=DT, generator=gen)
    base = torch.zeros_like(x)
    truth = quadrature_ih(net64, x, base)
    rows = []
    ours = {}
    for dtype, model in (("float64", net64), ("float32", net)):
        xx = x.to(next(model.parameters()).dtype)
        for K in (2, 3, 4, 6, 8):
            ta.integrated_hessians(model, xx, 0.0, order=K)  # warm-up
            out, t = timed(ta.integrated_hessians, model, xx, 0.0, order=K)
            err = rel(out, truth)
            ours[(dtype, K)] = (t, err)
            rows.append((f"taylorattr K={K} ({dtype})", f"{t:.3f}", f"{100 * err:.4f}%"))
    try:
        Explainer = path_explainer()
    except (ImportError, OSError, AttributeError) as exc:  # report, do not hide
        rows.append(("path_explain", "n/a", f"could not load: {type(exc).__name__}: {exc}"))
        print_table("1. Integrated Hessians, 64-32-32-1 sigmoid MLP, batch 4", rows,
                    ("method", "seconds", "rel. error"))
        return
    explainer = Explainer(net)
    x32 = x.float().requires_grad_(True)  # path_explain differentiates w.r.t. its input
    peer = {}
    for samples in (49, 400, 1600, 4900):
        out, t = timed(explainer.interactions, x32, base[:1].float(), num_samples=samples,
                       use_expectation=False, verbose=False)
        err = rel(out.detach(), truth)
        peer[samples] = (t, err)
        rows.append((f"path_explain num_samples={samples}", f"{t:.3f}", f"{100 * err:.3f}%"))
        if t > 120:
            break
    print_table("1. Integrated Hessians, 64-32-32-1 sigmoid MLP, batch 4 (error vs float64 "
                "Gauss-Legendre quadrature, 48x48)", rows, ("method", "seconds", "rel. error"))
    first = lambda table: min((v[0] for v in table.values() if v[1] < 0.01), default=None)
    t_ours = first({k: v for k, v in ours.items() if k[0] == "float32"})
    t_peer = first(peer)
    summary = [("taylorattr (float32)", "n/a" if t_ours is None else f"{t_ours:.3f}"),
               ("path_explain", "not reached" if t_peer is None else f"{t_peer:.3f}")]
    print_table("time to 1% error (seconds)", summary, ("method", "seconds"))
    if t_ours is not None:
        cheapest = min(peer.items(), key=lambda kv: kv[1][0])
        rows_out.append(("IH time ratio", t_peer / t_ours if t_peer else None))
        print(f"error at equal time: taylorattr {100 * ours[('float32', 2)][1]:.4f}% in "
              f"{ours[('float32', 2)][0]:.3f} s (K=2); path_explain's cheapest run "
              f"(num_samples={cheapest[0]}) {100 * cheapest[1][1]:.3f}% in {cheapest[1][0]:.3f} s")


def removal_game(model, x, base, masks):
    """``v(T) = f(x) - f(x with T at the baseline)`` for boolean coalitions ``[M, G]``."""
    member = masks.to(x.dtype)
    with torch.no_grad():
        return model(x[None]).reshape(-1) - model(x[None] - member @ torch.diag(x - base)).reshape(-1)


def _pair_matrix(values, n):
    out = np.zeros((n, n))
    for (i, j), value in ((k, v) for k, v in values.dict_values.items() if len(k) == 2):
        out[i, j] = out[j, i] = value
    return out


def bench_shapiq_mlp():
    import shapiq

    net = mlp().to(DT)
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(64, dtype=DT, generator=gen)
    base = torch.zeros_like(x)
    game = lambda c: removal_game(net, x, base, torch.as_tensor(c)).numpy()
    rows = []
    exact = {}
    for K, route in ((3, "gradient"), (4, "pairs")):
        res, t = timed(ta.interactions, net, x[None], 0.0, groups=torch.arange(64), order=K,
                       route=route)
        exact[K] = res.total()[0].numpy()
        rows.append((f"taylorattr J_{K} ({route})", "-", f"{t:.2f}", "0 (exact)", "-"))
    for name in ("KernelSHAPIQ", "SHAPIQ"):
        for budget in (2080, 10_000):
            mats, times = [], []
            for seed in (0, 1):
                approx = getattr(shapiq, name)(n=64, max_order=2, index="k-SII", random_state=seed)
                values, t = timed(approx.approximate, budget, game)
                mats.append(_pair_matrix(values, 64))
                times.append(t)
            spread = np.linalg.norm(mats[0] - mats[1]) / np.linalg.norm(mats[0])
            dist = np.linalg.norm(mats[0] - exact[4]) / np.linalg.norm(exact[4])
            rows.append((f"shapiq {name} k-SII", budget, f"{np.mean(times):.2f}",
                         f"{100 * spread:.1f}%", f"{100 * dist:.1f}%"))
    print_table("2. Pair interactions, 64-32-32-1 sigmoid MLP, 64 players, one sample", rows,
                ("method", "budget", "seconds", "seed-to-seed diff", "diff to our J_4"))
    print(f"J_3 vs J_4 (our truncation): "
          f"{100 * np.linalg.norm(exact[3] - exact[4]) / np.linalg.norm(exact[4]):.2e}%")


def bench_shapiq_cnn():
    import shapiq

    torch.manual_seed(0)
    net = models.c_sg().to(DT).eval()
    x = torch.rand(1, 28, 28, dtype=DT, generator=torch.Generator().manual_seed(2))
    base = torch.zeros_like(x)
    groups = torch.arange(784).view(28, 28)
    groups = (groups // 28 // 7) * 4 + (groups % 28) // 7  # 16 patches of 7x7
    member = (groups.reshape(-1)[None] == torch.arange(16)[:, None]).to(DT)  # [16, 784]
    head = lambda z: net(z.view(-1, 1, 28, 28))[:, int(net(x[None]).argmax())]

    def game(coalitions):
        masks = torch.as_tensor(coalitions).to(DT) @ member
        d = (x - base).reshape(-1)
        with torch.no_grad():
            return (head(x.reshape(1, -1)) - head(x.reshape(1, -1) - masks * d)).numpy()

    truth, t_exact = timed(lambda: shapiq.ExactComputer(n_players=16, game=game)("k-SII", 2))
    truth = _pair_matrix(truth, 16)
    rows = [("shapiq ExactComputer k-SII", 2**16, f"{t_exact:.2f}", "0 (truth)")]
    for K in (2, 3, 4, 6):
        res, t = timed(ta.interactions, net, x[None], 0.0, groups=groups[None], order=K)
        mat = res.total()[0].numpy()
        rows.append((f"taylorattr J_{K}", "-", f"{t:.2f}",
                     f"{100 * np.linalg.norm(mat - truth) / np.linalg.norm(truth):.2f}%"))
    for name in ("KernelSHAPIQ", "SHAPIQ"):
        for budget in (136, 1000, 5000):
            approx = getattr(shapiq, name)(n=16, max_order=2, index="k-SII", random_state=0)
            values, t = timed(approx.approximate, budget, game)
            mat = _pair_matrix(values, 16)
            rows.append((f"shapiq {name}", budget, f"{t:.2f}",
                         f"{100 * np.linalg.norm(mat - truth) / np.linalg.norm(truth):.2f}%"))
    print_table("3. C-sg-sized CNN (untrained), 16 patches of 7x7, one sample: distance to the "
                "exact k-SII of the true model", rows, ("method", "budget", "seconds", "diff"))


def interactive_share(model, x, order=4):
    """Per order k: pixel-level interactive part and 4x4-patch pair part, over |df|."""
    terms = ta.taylor_terms(model, x, 0.0, order=order)
    single = ta.taylor.group_expansions(model, x, 0.0, order=order)  # [B, n, K]
    pixel = terms.orders - single.sum(1)  # P_k minus its single-pixel monomials
    pairs = ta.interactions(model, x, 0.0, order=order)  # default 4x4 patches, 49 groups
    pair_part = pairs.pairs.triu(1).sum((-1, -2))  # [B, K]
    scale = terms.output_change.abs()[:, None]
    return (pixel / scale).mean(0), (pair_part / scale).mean(0), terms.relative_error().mean()


def bench_share(rows_out):
    from taylorattr.data import load_mnist

    images, _ = load_mnist()
    x = images[[0, 1000, 2000, 3000]].to(DT)
    rows = []
    cache = Path(tempfile.gettempdir()) / "taylorattr-bench-cache"
    for name, build in (("m_sg", models.m_sg), ("c_sg", models.c_sg)):
        torch.manual_seed(0)
        variants = [("untrained", build().to(DT).eval())]
        try:
            trained, info = models.get_trained(name, cache, quick=True, show_progress=False)
            variants.append((f"trained (quick, acc {info['held_out_accuracy']:.2f})",
                             trained.to(DT).eval()))
        except (ImportError, OSError, RuntimeError, ValueError) as exc:  # report, do not hide
            print(f"{name}: no trained model ({type(exc).__name__}: {exc})")
        for label, model in variants:
            pixel, pair, eps = interactive_share(model, x)
            for k in range(4):
                rows.append((name, label, k + 1, f"{100 * float(pixel[k]):+.3f}%",
                             f"{100 * float(pair[k]):+.3f}%"))
            rows.append((name, label, "eps_4", f"{100 * float(eps):.3f}%", ""))
    print_table("4. Interactive share of df per order (mean over 4 digits, baseline 0)", rows,
                ("model", "weights", "order", "pixel-level interactive", "4x4-patch pairs"))


def main():
    torch.set_num_threads(max(1, torch.get_num_threads()))
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    summary = []
    bench_ih(summary)
    bench_shapiq_mlp()
    bench_shapiq_cnn()
    bench_share(summary)


if __name__ == "__main__":
    main()
