"""Integrated Hessians of the order-K polynomial: completeness against the IG reformulation,
and a float64 Gauss-Legendre double quadrature of the true Hessian (polynomial and sigmoid)."""
import itertools

import numpy as np
import pytest
import torch
from _polynomial import DT, poly_net
from torch import nn
from torch.func import grad, hessian, vmap

from taylorattr.taylor.path_hessians import integrated_hessians
from taylorattr.taylor.terms import taylor_attribution


def _quadrature_ih(model, x, base, nodes=40):
    """``Gamma_ij`` by Gauss-Legendre in both path variables, with the true (autograd) Hessian."""
    t, w = np.polynomial.legendre.leggauss(nodes)
    t, w = torch.tensor((t + 1) / 2, dtype=DT), torch.tensor(w / 2, dtype=DT)
    g = (t[:, None] * t[None, :]).reshape(-1)
    weight = (w[:, None] * w[None, :]).reshape(-1)
    out = []
    for xi, bi in zip(x, base):
        d = xi - bi
        f = lambda z: model(z[None]).reshape(-1)[0]
        points = bi[None] + g[:, None] * d[None]
        H = vmap(hessian(f))(points)
        gradients = vmap(grad(f))(points)
        gamma = d[:, None] * d[None, :] * (weight[:, None, None] * g[:, None, None] * H).sum(0)
        out.append(gamma + torch.diag(d * (weight[:, None] * gradients).sum(0)))
    return torch.stack(out).detach()


def _data(n, seed, scale=1.0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(2, n, dtype=DT, generator=gen)
    return x, x - scale * torch.randn(2, n, dtype=DT, generator=gen)


@pytest.mark.parametrize("order", [1, 2, 3, 5])
def test_rows_sum_to_the_ig_reformulation(order):
    net = poly_net(6, (0.2, 0.9, -0.4, 0.3, 0.1, -0.2), hidden=5, seed=order)
    x, base = _data(6, order)
    gamma = integrated_hessians(net, x, base, order=order)
    torch.testing.assert_close(gamma.sum(-1), taylor_attribution(net, x, base, order=order),
                               rtol=0, atol=1e-10)
    torch.testing.assert_close(gamma, gamma.transpose(1, 2), rtol=0, atol=1e-12)


def test_polynomial_network_equals_quadrature():
    net = poly_net(5, (0.1, 0.8, -0.6, 0.5), hidden=4, seed=2)  # cubic: exact at K = 3
    x, base = _data(5, 3)
    torch.testing.assert_close(integrated_hessians(net, x, base, order=3),
                               _quadrature_ih(net, x, base, nodes=6), rtol=0, atol=1e-10)


def test_sigmoid_network_error_shrinks_with_order():
    torch.manual_seed(4)
    net = nn.Sequential(nn.Linear(5, 6), nn.Sigmoid(), nn.Linear(6, 6), nn.Tanh(),
                        nn.Linear(6, 1), nn.Flatten(0)).to(DT).eval()
    x, base = _data(5, 5, scale=0.5)
    truth = _quadrature_ih(net, x, base)
    errors = [float((integrated_hessians(net, x, base, order=K) - truth).abs().max())
              for K in (2, 4, 6, 8)]
    assert all(b < a / 3 for a, b in itertools.pairwise(errors)), errors
    assert errors[-1] < 1e-6 * float(truth.abs().max()), errors


def test_groups_sum_the_feature_matrix():
    torch.manual_seed(6)
    net = nn.Sequential(nn.Conv2d(1, 2, 3), nn.Softplus(), nn.Flatten(), nn.Linear(32, 3)).to(DT).eval()
    x = torch.rand(2, 1, 6, 6, dtype=DT)
    groups = torch.arange(36).view(1, 6, 6) % 4  # 4 interleaved groups, broadcast over channels
    grouped = integrated_hessians(net, x, 0.5, target=2, order=3, groups=groups)
    full = integrated_hessians(net, x, 0.5, target=2, order=3)
    member = (groups.reshape(-1)[None, :] == torch.arange(4)[:, None]).to(DT)
    torch.testing.assert_close(grouped, member @ full @ member.T, rtol=0, atol=1e-12)


def test_bad_groups_raise():
    net = poly_net(5, (0.0, 1.0, 1.0))
    x, base = _data(5, 0)
    with pytest.raises(ValueError, match="groups"):
        integrated_hessians(net, x, base, groups=torch.zeros(4, dtype=torch.long))
    with pytest.raises(TypeError, match="groups"):
        integrated_hessians(net, x, base, groups=[0, 1, 2, 3, 4])
    with pytest.raises(ValueError, match="order"):
        integrated_hessians(net, x, base, order=0)
