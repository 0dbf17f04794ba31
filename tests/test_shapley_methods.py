"""Shapley values, KernelSHAP and Prediction Difference (issue 15, part 2).

Independent routes: Shapley values by an enumeration of coalitions written here (a loop over
``itertools.combinations`` with the factorial weights); Captum's ``ShapleyValueSampling`` and
``KernelShap`` on the same inputs and draws (``torch.manual_seed(seed)`` before Captum's
call reproduces our seeded generator); the order-K polynomial's removal game enumerated by
``tests/_polynomial.py`` (repeated autograd along each coalition); a slow double loop over
references and features for Prediction Difference.
"""
from __future__ import annotations

import itertools
import math

import pytest
import torch
from _builders import DT, mlp, normal
from _polynomial import poly_net, polynomial_game, shapley_by_enumeration, subset_masks
from captum.attr import KernelShap as CaptumKernelShap
from captum.attr import ShapleyValueSampling
from torch import nn

import taylorattr as ta
from taylorattr import paper_methods
from taylorattr.baselines import ReferenceSet
from taylorattr.methods import KernelShap, PredictionDifference, ShapleyValues

TIGHT = {"rtol": 1e-10, "atol": 1e-10}


def _mlp(n=6, out=3, seed=0):
    return mlp(n, 8, 8, out, acts=(nn.Tanh, nn.Softplus), seed=seed)


def _data(n=6, batch=3, seed=1):
    return normal((batch, n), seed, n=2)


def _slow_shapley(model, x, base, target, groups):
    """phi_i = sum over coalitions S without i of |S|!(G-|S|-1)!/G! (v(S+i) - v(S)), one
    sample, coalitions by itertools, the model called once per coalition."""
    G = int(groups.max()) + 1

    def v(S):
        keep = torch.isin(groups, torch.tensor(sorted(S), dtype=torch.long))
        with torch.no_grad():
            return float(model(torch.where(keep, x, base)[None])[0, target])

    phi = torch.zeros(G, dtype=DT)
    for i in range(G):
        others = [j for j in range(G) if j != i]
        for size in range(G):
            w = math.factorial(size) * math.factorial(G - size - 1) / math.factorial(G)
            for S in itertools.combinations(others, size):
                phi[i] += w * (v(S + (i,)) - v(S))
    return phi[groups]


@pytest.mark.parametrize("grouped", [False, True])
def test_exact_shapley_equals_enumeration(grouped):
    model = _mlp()
    x, base = _data()
    mask = torch.tensor([0, 0, 1, 2, 2, 3]) if grouped else None
    groups = mask if grouped else torch.arange(6)
    a, delta = ShapleyValues(model).attribute(x, base, target=1, feature_mask=mask,
                                              return_convergence_delta=True)
    for b in range(x.shape[0]):
        torch.testing.assert_close(a[b], _slow_shapley(model, x[b], base[b], 1, groups), **TIGHT)
    if not grouped:  # efficiency (grouped: every feature carries its group's value)
        torch.testing.assert_close(delta, torch.zeros_like(delta), **TIGHT)


def _global_generator() -> torch.Generator:
    """The global generator Captum's draws come from: the default device's (its factories
    name no device), CUDA's under ``TAYLORATTR_DEVICE=cuda``, which draws other numbers
    from the same seed than the CPU's."""
    d = torch.get_default_device()
    if d.type == "cuda":
        return torch.cuda.default_generators[torch.cuda.current_device() if d.index is None
                                             else d.index]
    return torch.default_generator


def test_sampling_equals_captum_shapley_value_sampling():
    """``seed=s`` draws the orders of the CPU's global generator after
    ``torch.manual_seed(s)`` (Captum's, on the CPU default device); given Captum's orders
    (drawn here as Captum draws them, one ``torch.randperm`` per sample from the default
    device's generator) the estimate equals Captum's on every device."""
    model = _mlp()
    x, base = _data()
    mask = torch.tensor([[0, 1, 1, 2, 3, 4]])
    ours = ShapleyValues(model).attribute(x, base, target=2, feature_mask=mask,
                                          method="sampling", n_samples=7, seed=11)
    torch.manual_seed(11)
    cpu_orders = torch.stack([torch.randperm(5, device="cpu") for _ in range(7)])
    assert torch.equal(ours, ShapleyValues(model).attribute(
        x, base, target=2, feature_mask=mask, permutations=cpu_orders))
    torch.manual_seed(11)
    orders = torch.stack([torch.randperm(5, generator=_global_generator(),
                                         device=torch.get_default_device()) for _ in range(7)])
    torch.manual_seed(11)
    theirs = ShapleyValueSampling(model).attribute(x, base, target=2, feature_mask=mask,
                                                   n_samples=7)
    with_theirs = ShapleyValues(model).attribute(x, base, target=2, feature_mask=mask,
                                                 permutations=orders)
    torch.testing.assert_close(with_theirs, theirs.to(DT), rtol=1e-5, atol=1e-5)  # Captum sums in float32
    # the same orders given explicitly
    perms = torch.stack([torch.randperm(5, generator=torch.Generator().manual_seed(3))
                         for _ in range(2)])
    explicit = ShapleyValues(model).attribute(x, base, target=2, feature_mask=mask,
                                              permutations=perms)
    assert not torch.allclose(explicit, ours)  # other orders, other estimate
    exact = ShapleyValues(model).attribute(x, base, target=2, feature_mask=mask)
    many = ShapleyValues(model).attribute(x, base, target=2, feature_mask=mask,
                                          method="sampling", n_samples=4000, seed=0)
    assert float((many - exact).abs().max()) < 0.02 * float(exact.abs().max())


@pytest.mark.parametrize("grouped", [False, True])
def test_kernel_shap_equals_captum(grouped):
    model = _mlp()
    x, base = _data(batch=2)
    mask = torch.tensor([[0, 0, 1, 2, 3, 3]]) if grouped else None
    ours = KernelShap(model).attribute(x, base, target=0, feature_mask=mask, n_samples=40,
                                       seed=5, sampler="captum")
    # seed=5 draws the CPU's global generator's coalitions after torch.manual_seed(5) ...
    torch.manual_seed(5)
    assert torch.equal(ours, KernelShap(model).attribute(
        x, base, target=0, feature_mask=mask, n_samples=40, seed=torch.default_generator,
        sampler="captum"))
    # ... and drawing from Captum's generator (the default device's: CUDA's under
    # TAYLORATTR_DEVICE=cuda) gives Captum's estimate on every device
    torch.manual_seed(5)
    with_theirs = KernelShap(model).attribute(x, base, target=0, feature_mask=mask,
                                              n_samples=40, seed=_global_generator(),
                                              sampler="captum")
    torch.manual_seed(5)
    theirs = CaptumKernelShap(model).attribute(x, base, target=0, feature_mask=mask,
                                               n_samples=40)
    torch.testing.assert_close(with_theirs, theirs.to(DT), rtol=1e-5, atol=1e-5)


def test_shapley_reformulation_is_exact_on_polynomial_networks():
    """Degree-3 polynomial network: the order-3 polynomial is the network, so the Shapley
    rule, the exact method and the enumerated polynomial game all agree."""
    n = 4
    model = poly_net(n, (0.1, 1.0, 0.5, 0.3), seed=2)
    g = torch.Generator().manual_seed(4)
    x = torch.randn(2, n, generator=g, dtype=DT)
    base = torch.randn(2, n, generator=g, dtype=DT)
    reform = ta.reformulate("shapley", model, x, base, order=3)
    masks = subset_masks(n)
    enum = torch.stack([shapley_by_enumeration(
        polynomial_game(model, x[b], (x[b] - base[b]) * masks, 3), n) for b in range(2)])
    torch.testing.assert_close(reform, enum, **TIGHT)
    torch.testing.assert_close(ShapleyValues(model).attribute(x, base), enum, **TIGHT)


def test_prediction_difference_equals_a_slow_loop():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(2, 3, 3, padding=1), nn.ReLU(), nn.Flatten(),
                          nn.Linear(3 * 16, 4)).to(DT).eval()
    g = torch.Generator().manual_seed(2)
    x = torch.randn(2, 2, 4, 4, generator=g, dtype=DT)
    refs = torch.randn(5, 2, 4, 4, generator=g, dtype=DT)
    ours = PredictionDifference(model).attribute(x, ReferenceSet(refs), target=3, patch=2)
    slow = torch.zeros_like(x)
    with torch.no_grad():
        for b in range(2):
            fx = model(x[b:b + 1])[0, 3]
            for i in range(0, 4, 2):
                for j in range(0, 4, 2):
                    drops = []
                    for r in refs:
                        z = x[b].clone()
                        z[:, i:i + 2, j:j + 2] = r[:, i:i + 2, j:j + 2]
                        drops.append(fx - model(z[None])[0, 3])
                    slow[b, :, i:i + 2, j:j + 2] = torch.stack(drops).mean()
    torch.testing.assert_close(ours, slow, **TIGHT)
    # drawn references: the same rows Expected Gradients draws with that seed
    drawn = PredictionDifference(model).attribute(x, refs, target=3, n_samples=3, seed=4)
    eg = ta.ExpectedGradients.draw(x, refs, n_samples=3, seed=4).baselines
    by_hand = torch.stack([ta.Occlusion(model).attribute(x, eg[:, k], target=3)
                           for k in range(3)]).mean(0)
    torch.testing.assert_close(drawn, by_hand, **TIGHT)


def test_registry_rows_and_bad_arguments():
    model = _mlp()
    x, base = _data()
    for name in ("shapley", "kernel_shap", "prediction_difference"):
        assert name in ta.METHODS and any(s.name == name for s, _ in paper_methods.variants("audit"))
    torch.testing.assert_close(ta.METHODS["shapley"](model, x, baselines=base, target=0),
                               ShapleyValues(model).attribute(x, base, target=0), **TIGHT)
    with pytest.raises(ValueError, match="at most 16 players"):
        ShapleyValues(_mlp(n=17)).attribute(torch.zeros(1, 17, dtype=DT), method="exact")
    with pytest.raises(ValueError, match="feature_mask"):
        ShapleyValues(model).attribute(x, feature_mask=torch.tensor([0, 0, 2, 2, 3, -1]))
    with pytest.raises(ValueError, match="method must be one of"):
        ShapleyValues(model).attribute(x, method="fast")
    with pytest.raises(ValueError, match="permutations"):
        ShapleyValues(model).attribute(x, permutations=torch.zeros(2, 6, dtype=torch.long))
    with pytest.raises(ValueError, match="n_samples must be >= 2"):
        KernelShap(model).attribute(x, n_samples=1, sampler="captum")
    with pytest.raises(ValueError, match="n_samples must be given"):
        PredictionDifference(model).attribute(x, noise_std=0.1)


def test_patch_players_are_the_hand_written_windows():
    """``patch=2`` on 1x4x4 samples: the players are the four 2x2 windows, written by hand
    as a feature_mask (ids row-major over the windows, as Occlusion lays them out)."""
    import taylorattr as ta

    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(16, 6), nn.Tanh(), nn.Linear(6, 3)).double()
    x = torch.rand(2, 1, 4, 4, dtype=torch.float64)
    mask = torch.tensor([[0, 0, 1, 1], [0, 0, 1, 1], [2, 2, 3, 3], [2, 2, 3, 3]])[None]
    for cls in (ta.methods.ShapleyValues, ta.methods.KernelShap):
        by_patch = cls(model).attribute(x, 0.0, target=1, patch=2)
        by_mask = cls(model).attribute(x, 0.0, target=1, feature_mask=mask)
        torch.testing.assert_close(by_patch, by_mask)
    with pytest.raises(ValueError, match="at most one of feature_mask and patch"):
        ta.methods.ShapleyValues(model).attribute(x, 0.0, target=1, patch=2, feature_mask=mask)
