"""Exact pair interactions against closed-form cross terms, group expansions of unions, and
the interaction-map figure."""
import pytest
import torch
from _polynomial import DT, poly_net, terms_at_x
from torch import nn

from taylorattr.reporting.interaction_plot import interaction_map, strongest_pairs
from taylorattr.taylor.pair_interactions import interactions
from taylorattr.taylor.terms import group_expansions

GROUPS = torch.tensor([0, 2, 1, 1, 2])  # 5 features in 3 groups
G = 3


def _closed_form(net, x, base, order):
    """``J^k(A, B)`` and ``P_k(delta_A)`` from the monomials: ``[B, K, G, G]``, ``[B, K, G]``."""
    pairs = torch.zeros(x.shape[0], order, G, G, dtype=DT)
    own = torch.zeros(x.shape[0], order, G, dtype=DT)
    for b in range(x.shape[0]):
        for kappa, phi in terms_at_x(net, x[b], base[b]).items():
            touched = sorted({int(GROUPS[j]) for j, e in enumerate(kappa) if e})
            k = sum(kappa)
            if len(touched) == 1:
                own[b, k - 1, touched[0]] += phi
            elif len(touched) == 2:
                A, B = touched
                pairs[b, k - 1, A, B] += phi
                pairs[b, k - 1, B, A] += phi
    return pairs, own


@pytest.mark.parametrize("degree,route", [(2, "gradient"), (3, "gradient"), (3, "pairs"),
                                          (4, "pairs")])
def test_polynomial_network_equals_closed_form_cross_terms(degree, route):
    coeffs = (0.1, 0.8, -0.6, 0.5, 0.3)[:degree + 1]
    net = poly_net(5, coeffs, hidden=4, seed=degree)
    gen = torch.Generator().manual_seed(1)
    x, base = torch.randn(2, 5, dtype=DT, generator=gen), torch.randn(2, 5, dtype=DT, generator=gen)
    result = interactions(net, x, base, groups=GROUPS, order=degree, route=route)
    pairs, own = _closed_form(net, x, base, degree)
    torch.testing.assert_close(result.pairs, pairs, rtol=0, atol=1e-12)
    torch.testing.assert_close(result.own, own, rtol=0, atol=1e-12)
    if degree <= 2:  # a quadratic's monomials touch at most two groups: own + pairs = df
        with torch.no_grad():
            df = net(x) - net(base)
        total = result.own_total().sum(1) + result.total().triu(1).sum((1, 2))
        torch.testing.assert_close(total, df, rtol=0, atol=1e-12)


def _sigmoid_net():
    torch.manual_seed(5)
    return nn.Sequential(nn.Linear(5, 6), nn.Sigmoid(), nn.Linear(6, 6), nn.Tanh(),
                         nn.Linear(6, 3)).to(DT).eval()


def test_sigmoid_network_equals_union_expansions():
    net = _sigmoid_net()
    gen = torch.Generator().manual_seed(2)
    x, base = torch.randn(2, 5, dtype=DT, generator=gen), torch.randn(2, 5, dtype=DT, generator=gen)
    order = 4
    result = interactions(net, x, base, target=1, groups=GROUPS, order=order)
    alone = group_expansions(net, x, base, 1, order, GROUPS)  # [B, G, K]
    torch.testing.assert_close(result.own, alone.transpose(1, 2), rtol=0, atol=1e-13)
    for A, B in [(0, 1), (0, 2), (1, 2)]:
        union = torch.where(GROUPS == B, A, GROUPS)
        union = torch.unique(union, return_inverse=True)[1]  # ids 0..1, A u B at id(A)
        joint = group_expansions(net, x, base, 1, order, union)[:, int(union[GROUPS == A][0])]
        expected = joint - alone[:, A] - alone[:, B]
        torch.testing.assert_close(result.pairs[:, :, A, B], expected, rtol=0, atol=1e-13)
        torch.testing.assert_close(result.pairs[:, :, B, A], expected, rtol=0, atol=1e-13)


@pytest.mark.parametrize("order", [2, 3])
def test_gradient_route_equals_pairs_route_on_a_cnn(order):
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(1, 3, 3), nn.Sigmoid(), nn.AvgPool2d(2), nn.Flatten(),
                        nn.Linear(18, 4), nn.Softplus(), nn.Linear(4, 2)).to(DT).eval()
    x = torch.rand(2, 1, 6, 8, dtype=DT)
    fast = interactions(net, x, 0.0, order=order, route="gradient", max_groups=8)
    slow = interactions(net, x, 0.0, order=order, route="pairs", max_groups=8)
    assert fast.groups.unique().numel() == 6  # default: 3x3 patches (2 x 3 of them, <= 8)
    torch.testing.assert_close(fast.pairs, slow.pairs, rtol=0, atol=1e-13)
    torch.testing.assert_close(fast.own, slow.own, rtol=0, atol=1e-13)


def test_default_groups():
    flat = nn.Sequential(nn.Linear(6, 1), nn.Flatten(0)).to(DT).eval()
    r = interactions(flat, torch.randn(1, 6, dtype=DT), order=1)
    assert torch.equal(r.groups.cpu(), torch.arange(6, device="cpu"))
    image = nn.Sequential(nn.Flatten(), nn.Linear(784, 2)).to(DT).eval()
    r = interactions(image, torch.rand(1, 1, 28, 28, dtype=DT), order=1)
    rows, cols = torch.meshgrid(torch.arange(28, device="cpu"), torch.arange(28, device="cpu"),
                                indexing="ij")
    assert torch.equal(r.groups[0].cpu(), (rows // 4) * 7 + cols // 4)  # 4x4 patches: 49 <= 64
    assert r.pairs.shape == (1, 1, 49, 49) and r.own.shape == (1, 1, 49)


def test_bad_input_raises_named_errors():
    net = _sigmoid_net()
    x = torch.randn(1, 5, dtype=DT)
    with pytest.raises(ValueError, match="groups"):
        interactions(net, x, groups=torch.zeros(3, dtype=torch.long))
    with pytest.raises(TypeError, match="groups"):
        interactions(net, x, groups=torch.zeros(5))
    with pytest.raises(ValueError, match="groups"):
        interactions(net, x, groups=torch.tensor([0, 1, -1, 2, 3]))
    with pytest.raises(ValueError, match=r"max_groups=4.*5 expansions.*max_groups=5"):
        interactions(net, x, groups=torch.arange(5), max_groups=4)
    with pytest.raises(ValueError, match="route"):
        interactions(net, x, groups=GROUPS, order=4, route="gradient")
    big = nn.Sequential(nn.Linear(100, 1), nn.Flatten(0)).to(DT).eval()
    with pytest.raises(ValueError, match="groups is required"):
        interactions(big, torch.randn(1, 100, dtype=DT))
    result = interactions(net, x, groups=GROUPS, order=2)
    with pytest.raises(ValueError, match="order"):
        result.total(3)


def test_interaction_map_figure(tmp_path):
    torch.manual_seed(1)
    net = nn.Sequential(nn.Conv2d(1, 2, 3), nn.Sigmoid(), nn.Flatten(), nn.Linear(72, 2)).to(DT).eval()
    x = torch.rand(1, 1, 8, 8, dtype=DT)
    result = interactions(net, x, order=2, max_groups=16)  # 2x2 patches: 16 groups
    path = tmp_path / "map.png"
    fig = interaction_map(x[0], result, sample=0, top=3, path=path)
    assert path.stat().st_size > 0
    heat = result.total()[0]
    shown = [im for ax in fig.axes for im in ax.get_images() if im.get_array().shape == (16, 16)]
    assert len(shown) == 1
    torch.testing.assert_close(torch.as_tensor(shown[0].get_array().data), heat.float(),
                               rtol=0, atol=1e-6)
    # the strongest pairs, by |J|, read off the matrix by hand
    upper = [(abs(float(heat[a, b])), a, b) for a in range(16) for b in range(a + 1, 16)]
    expected = [(a, b) for _, a, b in sorted(upper, reverse=True)[:3]]
    assert [(a, b) for a, b, _ in strongest_pairs(result, sample=0, top=3)] == expected
    image_ax = next(ax for ax in fig.axes if ax.get_images() and ax.get_images()[0].get_array().shape == (8, 8))
    assert len(image_ax.patches) == 3  # one arc per strongest pair


def test_public_names_are_the_functions():
    import taylorattr as ta
    import taylorattr.taylor.path_hessians
    import taylorattr.taylor.shapley_rule  # submodules imported first must not shadow the functions

    assert ta.interactions is interactions
    assert ta.integrated_hessians is taylorattr.taylor.path_hessians.integrated_hessians
    assert callable(ta.shapley_attribution) and ta.Interactions.__name__ == "Interactions"
