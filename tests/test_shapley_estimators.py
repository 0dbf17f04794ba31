"""KernelSHAP (paired sampler), standard errors, Captum's mask conventions, pairwise Shapley
interactions and network Integrated Hessians (issue 29).

Independent routes: Shapley values and interaction indices by a slow loop over
``itertools.combinations`` with the factorial weights (the model called once per coalition);
shapiq's ``ExactComputer`` on the same game; a float64 Gauss-Legendre double quadrature with
``torch.func.hessian`` (``tests/test_integrated_hessians.py``); Integrated Gradients; the Taylor
pair interactions of a quadratic network.
"""
from __future__ import annotations

import itertools
import math
import warnings

import numpy as np
import pytest
import shapiq
import torch
from _builders import DT, mlp, normal
from _polynomial import poly_net
from test_integrated_hessians import _quadrature_ih
from torch import nn

import taylorattr as ta
from taylorattr.methods import IntegratedGradients, KernelShap, ShapleyValues


def _mlp(n=8, out=2, seed=0):  # n -> 10 -> 6 -> out, tanh then softplus
    return mlp(n, 10, 6, out, acts=(nn.Tanh, nn.Softplus), seed=seed)


def _data(n=8, batch=2, seed=1):
    """Inputs ``2 N(0, 1)`` and baselines ``N(0, 1)``, ``[batch, n]``."""
    x, base = normal((batch, n), seed=seed, n=2)
    return 2 * x, base


def _value(model, x, base, target, groups):
    """``v(S)`` of one sample, groups ``[n]`` of its features."""
    def v(S):
        keep = torch.isin(groups, torch.tensor(sorted(S), dtype=torch.long))
        with torch.no_grad():
            return float(model(torch.where(keep, x, base)[None])[0, target])
    return v


def _slow_shapley(model, x, base, target, groups):
    G = int(groups.max()) + 1
    v = _value(model, x, base, target, groups)
    phi = torch.zeros(G, dtype=DT)
    for i in range(G):
        others = [j for j in range(G) if j != i]
        for size in range(G):
            w = math.factorial(size) * math.factorial(G - size - 1) / math.factorial(G)
            for S in itertools.combinations(others, size):
                phi[i] += w * (v(S + (i,)) - v(S))
    return phi


def _slow_sii(model, x, base, target, G):
    v = _value(model, x, base, target, torch.arange(G))
    out = torch.zeros(G, G, dtype=DT)
    for i, j in itertools.combinations(range(G), 2):
        others = [k for k in range(G) if k not in (i, j)]
        for size in range(G - 1):
            w = math.factorial(size) * math.factorial(G - size - 2) / math.factorial(G - 1)
            for S in itertools.combinations(others, size):
                out[i, j] += w * (v(S + (i, j)) - v(S + (i,)) - v(S + (j,)) + v(S))
        out[j, i] = out[i, j]
    return out


# ---------------------------------------------------------------- KernelSHAP (paired sampler)

def test_kernel_shap_sums_to_df_and_converges_to_exact_shapley():
    model = _mlp()
    x, base = _data()
    exact = torch.stack([_slow_shapley(model, x[b], base[b], 1, torch.arange(8))
                         for b in range(2)])
    errors = {}
    for n in (24, 64, 160, 255):  # 255 = 2^8 - 1: every coalition
        err = []
        for seed in range(4):
            a, delta = KernelShap(model).attribute(x, base, target=1, n_samples=n, seed=seed,
                                                   return_convergence_delta=True)
            df = a.sum(1)
            assert float((delta.abs() / df.abs()).max()) < 1e-6  # exact completeness
            err.append(float((a - exact).norm() / exact.norm()))
        errors[n] = float(np.mean(err))
    assert errors[255] < 1e-10  # full enumeration is exact Shapley
    assert errors[24] > errors[64] > errors[160] > errors[255], errors
    assert errors[160] < 0.05, errors


def test_unranked_coalitions_are_the_lexicographic_combinations():
    from taylorattr.methods.kernel_design import _unrank

    for G, s in ((6, 2), (9, 4), (12, 1)):
        combos = list(itertools.combinations(range(G), s))
        expected = torch.zeros(len(combos), G, dtype=torch.bool)
        for r, c in enumerate(combos):
            expected[r, list(c)] = True
        assert torch.equal(_unrank(G, s, torch.arange(len(combos))), expected)


def test_kernel_shap_default_budget_and_warning():
    model = _mlp(n=12)
    x, base = _data(n=12, batch=1)
    assert ta.methods.kernel_shap.default_n_samples(12) == 2 * 12 + 2048
    assert ta.methods.kernel_shap.default_n_samples(8) == 255
    with pytest.warns(UserWarning, match="fewer than the G \\+ 1 = 13"):
        KernelShap(model).attribute(x, base, target=0, n_samples=10)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        KernelShap(model).attribute(x, base, target=0, n_samples=13)
    rows = KernelShap(model).cost(x, n_samples=300).forward_rows - 1  # minus f(x)
    assert rows <= 300


def _coverage(estimates, errors, truth):
    z = (torch.stack(estimates) - truth).abs() / torch.stack(errors)
    return float((z <= 1.96).double().mean())


@pytest.mark.parametrize("method", ["kernel", "permutation", "antithetic"])
def test_standard_errors_cover_the_exact_value(method):
    """95% intervals from the standard errors hold the exact Shapley value in about 95% of
    the (seed, sample, player) cases."""
    model = _mlp(n=10)
    x, base = _data(n=10, batch=2, seed=3)
    exact = ShapleyValues(model).attribute(x, base, target=0)  # enumeration (tested elsewhere)
    est, err = [], []
    for seed in range(60):
        m = KernelShap(model) if method == "kernel" else ShapleyValues(model)
        options = ({"n_samples": 200} if method == "kernel"
                   else {"method": "sampling", "n_samples": 40,
                         "antithetic": method == "antithetic"})
        est.append(m.attribute(x, base, target=0, seed=seed, **options))
        err.append(m.standard_error)
        assert m.standard_error.shape == x.shape and bool((m.standard_error > 0).all())
    cover = _coverage(est, err, exact)
    assert 0.9 <= cover <= 0.985, cover


def test_paired_draws_are_exact_on_a_quadratic_network():
    """Without interactions of three or more players, an order and its reverse (and a
    coalition and its complement) average to the Shapley value: one antithetic pair of
    orders, and KernelSHAP with a determined budget, equal the enumeration."""
    net = poly_net(9, (0.3, 1.0, -0.7), hidden=4, seed=5)  # degree 2
    g = torch.Generator().manual_seed(6)
    x, base = torch.randn(2, 9, generator=g, dtype=DT), torch.randn(2, 9, generator=g, dtype=DT)
    exact = ShapleyValues(net).attribute(x, base)
    one_pair = ShapleyValues(net).attribute(x, base, method="sampling", n_samples=1,
                                            antithetic=True, seed=3)
    torch.testing.assert_close(one_pair, exact, rtol=0, atol=1e-12)
    rows = []
    hook = net.register_forward_hook(lambda m, args, out: rows.append(args[0].shape[0]))
    ShapleyValues(net).attribute(x, base, method="sampling", n_samples=3, antithetic=True)
    hook.remove()
    planned = ShapleyValues(net).cost(x, method="sampling", n_samples=3, antithetic=True)
    assert sum(rows) == planned.forward_rows == 2 + 2 * 3 * 2 * 9 + 2  # f(x), orders, f(x~)
    plain = ShapleyValues(net).attribute(x, base, method="sampling", n_samples=2, seed=3)
    assert float((plain - exact).abs().max()) > 1e-3  # without the reverse it is not exact
    kernel = KernelShap(net).attribute(x, base, n_samples=40, seed=2)  # of 511 coalitions
    torch.testing.assert_close(kernel, exact, rtol=0, atol=1e-10)


def test_num_features_keeps_k_players_and_completeness():
    model = _mlp(n=10)
    x, base = _data(n=10)
    a, delta = KernelShap(model).attribute(x, base, target=0, n_samples=300, num_features=4,
                                           return_convergence_delta=True)
    assert ((a != 0).sum(1) == 4).all()
    assert float(delta.abs().max()) < 1e-10
    full = KernelShap(model).attribute(x, base, target=0, n_samples=300)
    top = full.abs().topk(4, 1).indices.sort(1).values
    assert torch.equal((a != 0).nonzero()[:, 1].view(2, 4), top)


# ---------------------------------------------------------------- Captum's mask conventions

def test_per_sample_scalar_and_tuple_masks_equal_enumeration():
    model = _mlp(n=6, out=3)
    x, base = _data(n=6, batch=2)
    per_sample = torch.tensor([[0, 0, 1, 2, 2, 3], [0, 1, 1, 1, 2, 3]])
    for cls, opts in ((ShapleyValues, {}), (KernelShap, {"n_samples": 15})):  # 15 = 2^4 - 1
        a = cls(model).attribute(x, base, target=2, feature_mask=per_sample, **opts)
        for b in range(2):
            slow = _slow_shapley(model, x[b], base[b], 2, per_sample[b])[per_sample[b]]
            torch.testing.assert_close(a[b], slow, rtol=1e-9, atol=1e-9)
        if cls is KernelShap:  # sampled, ids 0..4 with one unused per sample: still complete
            ragged = torch.tensor([[0, 0, 1, 2, 2, 4], [0, 1, 1, 4, 2, 3]])
            got = cls(model).attribute(x, base, target=2, feature_mask=ragged, n_samples=12)
            per_player = [torch.zeros(5, dtype=DT).index_add_(0, ragged[b], got[b]) /
                          torch.bincount(ragged[b], minlength=5).clamp(min=1) for b in range(2)]
            with torch.no_grad():
                df = model(x)[:, 2] - model(base)[:, 2]
            torch.testing.assert_close(torch.stack(per_player).sum(1), df, rtol=1e-9, atol=1e-9)
        # a 0-d mask: the whole input is one player, worth df
        one = cls(model).attribute(x, base, target=2, feature_mask=torch.tensor(0), **opts)
        with torch.no_grad():
            df = model(x)[:, 2] - model(base)[:, 2]
        torch.testing.assert_close(one, df[:, None].expand(-1, 6), rtol=1e-9, atol=1e-9)

    # tuple inputs with one mask per input (id 1 shared across the inputs: one player)
    class Two(nn.Module):
        def __init__(self):
            super().__init__()
            self.net = model

        def forward(self, a, b):
            return self.net(torch.cat([a, b.flatten(1)], 1))

    masks = (torch.tensor([[0, 1]]), torch.tensor([[[1, 2], [3, 3]]]))
    parts = (x[:, :2], x[:, 2:].reshape(2, 2, 2))
    bases = (base[:, :2], base[:, 2:].reshape(2, 2, 2))
    joined = torch.tensor([0, 1, 1, 2, 3, 3])
    for cls, opts in ((ShapleyValues, {}), (KernelShap, {"n_samples": 15})):
        m = cls(Two())
        a0, a1 = m.attribute(parts, bases, target=0, feature_mask=masks, **opts)
        for b in range(2):
            slow = _slow_shapley(model, x[b], base[b], 0, joined)[joined]
            torch.testing.assert_close(torch.cat([a0[b], a1[b].flatten()]), slow,
                                       rtol=1e-9, atol=1e-9)
        if cls is KernelShap:  # every coalition enumerated: zero error, in the inputs' structure
            assert [tuple(e.shape) for e in m.standard_error] == [(2, 2), (2, 2, 2)]
            assert all(bool((e == 0).all()) for e in m.standard_error)
        else:
            assert m.standard_error is None  # exact enumeration
    with pytest.raises(TypeError, match="tuple of 2"):
        ShapleyValues(Two()).attribute(parts, bases, target=0, feature_mask=masks[0])
    with pytest.raises(ValueError, match="first dimension must be 1"):
        ShapleyValues(model).attribute(x, base, feature_mask=torch.zeros(3, 6, dtype=torch.long))


def test_return_input_shape_false_gives_player_values():
    model = _mlp(n=6)
    x, base = _data(n=6)
    mask = torch.tensor([0, 0, 1, 2, 2, 1])
    players = KernelShap(model).attribute(x, base, target=1, feature_mask=mask, n_samples=7,
                                          return_input_shape=False)
    assert players.shape == (2, 3)
    for b in range(2):
        torch.testing.assert_close(players[b], _slow_shapley(model, x[b], base[b], 1, mask),
                                   rtol=1e-9, atol=1e-9)


# ---------------------------------------------------------------- Shapley interactions

def test_shapley_interactions_equal_enumeration_and_shapiq():
    model = _mlp(n=6, out=2, seed=3)
    x, base = _data(n=6, batch=2, seed=4)
    sii = ta.shapley_interactions(model, x, base, target=1)
    for b in range(2):
        torch.testing.assert_close(sii[b], _slow_sii(model, x[b], base[b], 1, 6),
                                   rtol=0, atol=1e-12)

        def game(coalitions, b=b):
            keep = torch.tensor(coalitions, dtype=torch.bool)
            with torch.no_grad():
                return model(torch.where(keep, x[b], base[b]))[:, 1].cpu().numpy()

        theirs = shapiq.ExactComputer(n_players=6, game=game)("SII", order=2)
        torch.testing.assert_close(
            sii[b], torch.from_numpy(theirs.get_n_order_values(2)).to(sii.device),
            rtol=0, atol=1e-12)


def test_sampled_shapley_interactions_cover_the_exact_index():
    model = _mlp(n=7, seed=5)
    x, base = _data(n=7, batch=1, seed=6)
    exact = ta.shapley_interactions(model, x, base, target=0)
    upper = torch.triu(torch.ones(7, 7, dtype=torch.bool), 1)
    est, err = [], []
    for seed in range(30):
        s, se = ta.shapley_interactions(model, x, base, target=0, method="sampling",
                                        n_samples=150, seed=seed, return_std_error=True)
        est.append(s[0][upper])
        err.append(se[0][upper])
    assert 0.88 <= _coverage(est, err, exact[0][upper]) <= 0.99


def test_shapley_interactions_equal_taylor_pairs_on_a_quadratic_network():
    """No monomial touches three players: SII is minus the Taylor pair interaction (the
    removal game of the expansion at x is the dual of the keep game; module text)."""
    net = poly_net(5, (0.3, 1.0, -0.7), hidden=4, seed=2)  # degree 2
    g = torch.Generator().manual_seed(3)
    x, base = torch.randn(2, 5, generator=g, dtype=DT), torch.randn(2, 5, generator=g, dtype=DT)
    pairs = ta.interactions(net, x, base, order=2, groups=torch.arange(5)).pairs.sum(1)
    torch.testing.assert_close(ta.shapley_interactions(net, x, base), -pairs,
                               rtol=0, atol=1e-10)


# ---------------------------------------------------------------- network Integrated Hessians

def _sigmoid_mlp():
    """Seeded, its weights drawn on the CPU (the same net on every device: a CUDA generator
    draws other numbers from the same seed, and the coarse grid's miss below is the CPU
    net's) and moved to the default device."""
    torch.manual_seed(4)
    with torch.device("cpu"):
        net = nn.Sequential(nn.Linear(5, 6), nn.Sigmoid(), nn.Linear(6, 6), nn.Tanh(),
                            nn.Linear(6, 1), nn.Flatten(0))
    return net.to(torch.get_default_device(), DT).eval()


def test_network_integrated_hessians_equal_a_fine_grid():
    net = _sigmoid_mlp()
    g = torch.Generator().manual_seed(5)
    x = torch.randn(2, 5, dtype=DT, generator=g)
    base = x - 1.5 * torch.randn(2, 5, dtype=DT, generator=g)
    truth = _quadrature_ih(net, x, base, nodes=60)
    gamma, error = ta.network_integrated_hessians(net, x, base, n_steps=12, return_error=True,
                                                  internal_batch_size=37)
    scale = float(truth.abs().max())
    assert float((gamma - truth).abs().max()) < 1e-6 * scale
    assert bool(((gamma - truth).abs() <= error + 1e-14).all())  # the estimate bounds it
    coarse = ta.network_integrated_hessians(net, x, base, n_steps=3)
    assert float((coarse - truth).abs().max()) > 1e-6 * scale  # not trivially converged
    ig = IntegratedGradients(net).attribute(x, base, n_steps=64)
    torch.testing.assert_close(gamma.sum(-1), ig, rtol=0, atol=1e-10)
    groups = torch.tensor([0, 0, 1, 2, 1])
    member = (groups[None] == torch.arange(3)[:, None]).to(DT)
    torch.testing.assert_close(ta.network_integrated_hessians(net, x, base, groups=groups),
                               member @ truth @ member.T, rtol=0, atol=1e-9)
    # the polynomial route under its explicit name; the old name is its alias
    assert ta.integrated_hessians is ta.polynomial_integrated_hessians
    poly = ta.polynomial_integrated_hessians(net, x, base, order=8)
    assert float((poly - truth).abs().max()) < 1e-2 * scale


# ---------------------------------------------------------------- truncation error reports

def test_truncation_reports_against_enumeration_and_quadrature():
    net = _sigmoid_mlp()
    g = torch.Generator().manual_seed(8)
    x = torch.randn(2, 5, dtype=DT, generator=g)
    base = x - 1.5 * torch.randn(2, 5, dtype=DT, generator=g)
    head = nn.Sequential(net, nn.Unflatten(0, (-1, 1)))  # [B, 1]: target 0 for the slow loop
    exact = torch.stack([_slow_shapley(head, x[b], base[b], 0, torch.arange(5))
                         for b in range(2)])
    relative = []
    for K in (1, 2, 3, 4):
        report = ta.shapley_rule_error(net, x, base, order=K)
        torch.testing.assert_close(report.exact, exact, rtol=0, atol=1e-12)
        torch.testing.assert_close(report.approximation,
                                   ta.shapley_attribution(net, x, base, order=K))
        torch.testing.assert_close(report.relative,
                                   (report.approximation - exact).norm(dim=1) / exact.norm(dim=1))
        relative.append(float(report.relative.mean()))
    assert relative[3] < relative[0], relative  # K = 4 closer than K = 1 here
    ih = ta.integrated_hessians_error(net, x, base, order=4)
    truth = _quadrature_ih(net, x, base, nodes=60)
    torch.testing.assert_close(ih.exact, truth, rtol=0, atol=1e-9)
    torch.testing.assert_close(ih.error, ta.polynomial_integrated_hessians(net, x, base, order=4)
                               - truth, rtol=0, atol=1e-9)
