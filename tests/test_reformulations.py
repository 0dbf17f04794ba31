"""Theorems 1-5 as code: each reformulation against its method and against slow routes."""
import itertools
import math

import pytest
import torch
from _builders import DT
from torch import nn

import taylorattr as ta
from taylorattr.groups import window_ids
from taylorattr.methods import IntegratedGradients
from taylorattr.registry import METHODS


@pytest.fixture(autouse=True)
def _seed():
    """Each test builds its models from the same seed, whatever ran before it."""
    torch.manual_seed(0)


class Square(nn.Module):
    elementwise = True
    coeffs = (0.0, 0.0, 1.0)

    def forward(self, x):
        return x * x


def poly_net():
    return nn.Sequential(nn.Flatten(), nn.Linear(64, 12), Square(), nn.Linear(12, 4)).to(DT).eval()


def sigmoid_net():
    return nn.Sequential(nn.Conv2d(1, 4, 3), nn.Sigmoid(), nn.AvgPool2d(2), nn.Flatten(),
                         nn.Linear(36, 10), nn.Sigmoid(), nn.Linear(10, 4)).to(DT).eval()


def pct(a, b):
    return (((a - b) ** 2).flatten(1).sum(1) / (a**2).flatten(1).sum(1)).max().item()


_GEN = torch.Generator().manual_seed(1)
X = torch.rand(3, 1, 8, 8, dtype=DT, generator=_GEN)
BASE = torch.rand(1, 8, 8, dtype=DT, generator=_GEN) * 0.3

CASES = [
    ("gradient_input", {}),
    ("occlusion_1", {}),
    ("occlusion_patch", {"patch": 2}),
    ("occlusion_patch", {"patch": (3, 3)}),  # cut windows at the edge
    ("integrated_gradients", {}),
]


@pytest.mark.parametrize("method,kw", CASES, ids=[c[0] + str(c[1].get("patch", "")) for c in CASES])
def test_every_reformulation_is_exact_on_the_polynomial_network(method, kw):
    model = poly_net()
    spec = METHODS[method]
    base = 0.0 if method == "gradient_input" else BASE
    original = spec(model, X, **kw) if not spec.uses_baselines else spec(model, X, baselines=base, **kw)
    reform = ta.reformulate(method, model, X, base, order=2, **kw)
    assert reform.shape == X.shape
    assert pct(original, reform) < 1e-20


@pytest.mark.parametrize("method", ["deeplift", "epsilon_lrp"])
def test_layerwise_reformulations_are_exact_on_the_polynomial_network(method):
    layers = ta.reformulate(method, poly_net(), X, BASE, order=2)
    assert len(layers) == 1
    torch.testing.assert_close(layers[0].reformulated, layers[0].original, rtol=1e-10, atol=1e-12)


def test_gradient_input_reformulation_is_exact_on_any_smooth_model():
    model = sigmoid_net()
    assert pct(METHODS["gradient_input"](model, X), ta.reformulate("gradient_input", model, X, order=4)) < 1e-25


@pytest.mark.parametrize("method,kw", CASES[1:4], ids=["occ1", "occ2", "occ3"])
def test_occlusion_reformulation_converges_with_order_on_a_sigmoid_model(method, kw):
    model = sigmoid_net()
    original = METHODS[method](model, X, baselines=BASE, **kw)
    gaps = [pct(original, ta.reformulate(method, model, X, BASE, order=K, **kw)) for K in (1, 2, 4, 8)]
    assert gaps[0] > 1e-8
    assert all(b < a for a, b in itertools.pairwise(gaps)), gaps
    assert gaps[-1] < 1e-10


def test_ig_reformulation_converges_to_gauss_legendre_ig():
    model = sigmoid_net()
    ig = IntegratedGradients(model).attribute(X, BASE, n_steps=64)
    gaps = [pct(ig, ta.reformulate("integrated_gradients", model, X, BASE, order=K)) for K in (1, 2, 4, 8)]
    assert all(b < a for a, b in itertools.pairwise(gaps)), gaps
    assert gaps[-1] < 1e-10


def test_deeplift_layer_reformulation_matches_hand_expansion_of_sigmoid():
    """Second order by hand: ratio * (s'(y) dy - s''(y)/2 dy^2) on the Linear layer."""
    model = nn.Sequential(nn.Linear(5, 6), nn.Sigmoid(), nn.Linear(6, 2)).to(DT).eval()
    x, base = torch.randn(4, 5, dtype=DT), torch.randn(4, 5, dtype=DT)
    (layer,) = ta.reformulate("deeplift", model, x, base, order=2)
    W, b = model[0].weight, model[0].bias
    y, y_ref = x @ W.T + b, base @ W.T + b
    dy = y - y_ref
    s = torch.sigmoid(y)
    d1, d2 = s * (1 - s), s * (1 - s) * (1 - 2 * s)
    ratio = W[None] * (x - base)[:, None, :] / dy[:, :, None]
    expected = ratio * (d1 * dy - d2 / 2 * dy**2)[:, :, None]
    original = ratio * (s - torch.sigmoid(y_ref))[:, :, None]
    torch.testing.assert_close(layer.reformulated, expected.detach())
    torch.testing.assert_close(layer.original, original.detach())


def test_layerwise_reformulation_converges_with_order():
    model = sigmoid_net()
    for method in ("deeplift", "epsilon_lrp"):
        gaps = [max(pct(l.original.flatten(1), l.reformulated.flatten(1))
                    for l in ta.reformulate(method, model, X, BASE, order=K)) for K in (1, 3, 9)]
        assert gaps[0] > gaps[1] > gaps[2] and gaps[2] < 1e-10, (method, gaps)


def test_expected_gradients_reformulation_averages_exact_ig_over_the_same_draws():
    """On the polynomial net, IG with Gauss-Legendre is exact: average it per draw by hand."""
    from taylorattr.methods.expected_gradients import draw

    model = poly_net()
    reform = ta.reformulate("expected_gradients", model, X, None, order=2, noise_std=0.2,
                            n_samples=5, seed=3)
    draws = draw(X, None, n_samples=5, noise_std=0.2, seed=3)
    ig = IntegratedGradients(model)
    target = model(X).argmax(1)
    by_hand = sum(ig.attribute(X, draws.baselines[:, k], target, n_steps=4) for k in range(5)) / 5
    torch.testing.assert_close(reform, by_hand, rtol=1e-10, atol=1e-12)


def test_window_ids_match_a_slow_loop():
    groups = window_ids((3, 7, 5), (3, 2))
    n_cols = math.ceil(5 / 2)
    for c in range(3):
        for i in range(7):
            for j in range(5):
                assert groups[c, i, j] == (i // 3) * n_cols + j // 2
    # a layout, built on the CPU whatever the default device (its users move it to the inputs')
    torch.testing.assert_close(window_ids((10,), 4),
                               torch.tensor([0] * 4 + [1] * 4 + [2] * 2, device="cpu"))


def test_bad_arguments():
    with pytest.raises(ValueError, match="method"):
        ta.reformulate("smoothgrad", poly_net(), X)
    with pytest.raises(TypeError, match="method"):
        ta.reformulate(3, poly_net(), X)
    with pytest.raises(ValueError, match="stride"):
        ta.reformulate("occlusion_patch", poly_net(), X, patch=2, stride=1)
    with pytest.raises(ValueError, match="order"):
        ta.reformulate("integrated_gradients", poly_net(), X, order=0)
    with pytest.raises(ValueError, match="orders"):
        ta.reformulate_orders("occlusion_1", poly_net(), X, orders=())
    with pytest.raises(ValueError, match="orders"):
        ta.reformulate_orders("occlusion_1", poly_net(), X, orders=(2, 0))
    with pytest.raises(TypeError, match="orders"):
        ta.reformulate_orders("occlusion_1", poly_net(), X, orders=2)


@pytest.mark.parametrize("method,kw", CASES, ids=[c[0] + str(c[1].get("patch", "")) for c in CASES])
def test_an_order_sweep_equals_one_reformulation_per_order(method, kw):
    """Occlusion expands once at the highest order and cuts the series at each K; a
    separate expansion at each K must give the same attributions."""
    model = sigmoid_net()
    sweep = ta.reformulate_orders(method, model, X, BASE, orders=(1, 3, 2), **kw)
    assert list(sweep) == [1, 3, 2]
    for K, attribution in sweep.items():
        alone = ta.reformulate(method, model, X, BASE, order=K, **kw)
        torch.testing.assert_close(attribution, alone, rtol=1e-12, atol=1e-14)
    assert pct(sweep[3], sweep[1]) > 1e-8 or method == "gradient_input"  # the orders differ
