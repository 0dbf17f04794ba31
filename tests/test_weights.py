"""docs/weights.md, row by row: each method's weight w_i(kappa) on the monomials of the
expansion at x, applied to closed-form monomials of a polynomial network, equals the method."""
import numpy as np
import pytest
import torch
from _polynomial import DT, monomials, poly_net, terms_at_x

import taylorattr as ta
from taylorattr.taylor.path_hessians import integrated_hessians, path_weights
from taylorattr.taylor.shapley_rule import shapley_attribution

N = 4
COEFFS = (0.2, -0.7, 0.9, 0.6)  # cubic activation: monomials of degree 1..3


@pytest.fixture(scope="module")
def case():
    net = poly_net(N, COEFFS, hidden=5, seed=3)
    gen = torch.Generator().manual_seed(4)
    x = torch.randn(3, N, dtype=DT, generator=gen)
    base = torch.randn(3, N, dtype=DT, generator=gen)
    return net, x, base


def _apply(rule, net, x, base, inside_support=True):
    """``sum_kappa w_i(kappa) phi(kappa)`` per sample and feature, ``phi`` expanded at x, over
    the monomials whose support holds i (all monomials when ``inside_support`` is False)."""
    out = torch.zeros_like(x)
    for b in range(x.shape[0]):
        for kappa, phi in terms_at_x(net, x[b], base[b]).items():
            for i in range(N):
                if kappa[i] or not inside_support:
                    out[b, i] += rule(kappa, i) * phi
    return out


def _support(kappa):
    return {j for j, e in enumerate(kappa) if e}


def _gauss_legendre_2d(a_power, one_minus_power, nodes=12):
    """``int_0^1 int_0^1 g^p (1 - g)^q da db`` at ``g = a b`` by Gauss-Legendre (exact here)."""
    t, w = np.polynomial.legendre.leggauss(nodes)
    t, w = (t + 1) / 2, w / 2
    g = t[:, None] * t[None, :]
    return float((w[:, None] * w[None, :] * g**a_power * (1 - g) ** one_minus_power).sum())


def test_polynomial_network_is_its_monomials(case):
    net, x, base = case
    expected = torch.stack([sum(terms_at_x(net, x[b], base[b]).values()) for b in range(3)])
    with torch.no_grad():
        torch.testing.assert_close(expected, net(x) - net(base), rtol=0, atol=1e-12)


def test_gradient_input_weight_one_on_degree_one(case):
    net, x, _ = case
    zero = torch.zeros_like(x)
    expected = _apply(lambda kappa, i: float(sum(kappa) == 1), net, x, zero)
    torch.testing.assert_close(ta.GradientInput(net).attribute(x), expected, rtol=0, atol=1e-12)


def test_occlusion_1_weight_one_on_own_monomials(case):
    net, x, base = case
    expected = _apply(lambda kappa, i: float(_support(kappa) == {i}), net, x, base)
    got = ta.Occlusion(net).attribute(x, base, patch=1)
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-12)


def test_occlusion_patch_weight_one_inside_the_patch(case):
    net, x, base = case
    patch_of = {0: {0, 1}, 1: {0, 1}, 2: {2, 3}, 3: {2, 3}}  # windows of 2 on a flat input
    # every feature of the patch gets the patch's drop, also from monomials it is not part of
    expected = _apply(lambda kappa, i: float(_support(kappa) <= patch_of[i]), net, x, base,
                      inside_support=False)
    got = ta.Occlusion(net).attribute(x, base, patch=2)
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-12)


def test_integrated_gradients_weight_kappa_i_over_degree(case):
    net, x, base = case
    expected = _apply(lambda kappa, i: kappa[i] / sum(kappa), net, x, base)
    # the integrand of a cubic is quadratic on the path: 4 Gauss-Legendre nodes are exact
    got = ta.IntegratedGradients(net).attribute(x, base, n_steps=4, method="gausslegendre")
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-12)


def test_shapley_weight_one_over_support(case):
    net, x, base = case
    expected = _apply(lambda kappa, i: 1.0 / len(_support(kappa)), net, x, base)
    torch.testing.assert_close(shapley_attribution(net, x, base, order=3), expected,
                               rtol=0, atol=1e-12)
    ig_rule = _apply(lambda kappa, i: kappa[i] / sum(kappa), net, x, base)
    assert (expected - ig_rule).abs().max() > 1e-3  # the rules differ from order 3


def test_path_weights_are_the_double_integrals():
    hess, grad = path_weights(7)
    for k in range(1, 8):
        assert grad[k] == pytest.approx(_gauss_legendre_2d(0, k - 1), abs=1e-14)
        if k >= 2:
            assert hess[k] == pytest.approx(
                _gauss_legendre_2d(1, k - 2), abs=1e-14)


def _ih_table(net, x, base, at_baseline):
    """Integrated Hessians from the table, ``[B, N, N]``."""
    out = torch.zeros(x.shape[0], N, N, dtype=DT)
    for b in range(x.shape[0]):
        if at_baseline:  # monomials in delta expanded at x~: value at x minus value at x~ (= 0)
            terms = monomials(net, base[b], x[b] - base[b])
        else:
            terms = terms_at_x(net, x[b], base[b])
        for kappa, phi in terms.items():
            k = sum(kappa)
            I_k = _gauss_legendre_2d(1, k - 2) if k >= 2 else 0.0
            J_k = _gauss_legendre_2d(0, k - 1)
            for i in range(N):
                for j in range(N):
                    if at_baseline:
                        w = kappa[i] * kappa[j] / k**2
                    elif i == j:
                        w = kappa[i] * J_k - kappa[i] * (kappa[i] - 1) * I_k
                    else:
                        w = -kappa[i] * kappa[j] * I_k
                    out[b, i, j] += w * phi
    return out


@pytest.mark.parametrize("at_baseline", [False, True], ids=["expanded_at_x", "expanded_at_baseline"])
def test_integrated_hessians_pair_weights(case, at_baseline):
    net, x, base = case
    got = integrated_hessians(net, x, base, order=3)
    torch.testing.assert_close(got, _ih_table(net, x, base, at_baseline), rtol=0, atol=1e-12)
