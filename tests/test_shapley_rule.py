"""The Shapley rule against exact Shapley values, enumerated over all 2^n coalitions of the
order-K polynomial's removal game (n <= 10)."""
import pytest
import torch
from _builders import normal
from _polynomial import DT, poly_net, polynomial_game, shapley_by_enumeration, subset_masks
from torch import nn

from taylorattr.taylor.shapley_rule import shapley_attribution
from taylorattr.taylor.terms import taylor_attribution


def test_degree_4_network_equals_enumeration_of_the_model():
    n = 8
    net = poly_net(n, (0.3, 1.0, -0.5, 0.7, 0.2), hidden=5, seed=1)
    x, base = normal((2, n), seed=1, n=2)
    masks = subset_masks(n)
    got = shapley_attribution(net, x, base, order=4)
    for b in range(2):
        with torch.no_grad():  # v(T) = f(x) - f(x with T at the baseline): exact for degree 4
            values = net(x[b:b + 1]) - net(x[b] - masks * (x[b] - base[b]))
        torch.testing.assert_close(got[b], shapley_by_enumeration(values, n), rtol=0, atol=1e-10)


def _sigmoid_net(n):
    torch.manual_seed(7)
    return nn.Sequential(nn.Linear(n, 6), nn.Sigmoid(), nn.Linear(6, 5), nn.Tanh(),
                         nn.Linear(5, 1), nn.Flatten(0)).to(DT).eval()


@pytest.mark.parametrize("order", [2, 3, 4])
def test_sigmoid_network_equals_enumeration_of_the_polynomial(order):
    n = 6
    net = _sigmoid_net(n)
    x, base = normal((2, n), seed=2, n=2)
    masks = subset_masks(n)
    got = shapley_attribution(net, x, base, order=order)
    for b in range(2):
        values = polynomial_game(net, x[b], masks * (x[b] - base[b]), order)
        torch.testing.assert_close(got[b], shapley_by_enumeration(values, n), rtol=0, atol=1e-10)
    ig = taylor_attribution(net, x, base, order=order)
    if order <= 2:
        torch.testing.assert_close(got, ig, rtol=0, atol=1e-12)
    else:
        assert (got - ig).abs().max() > 1e-4  # the rules part from order 3


@pytest.mark.parametrize("order", [3, 4])
def test_groups_equal_enumeration_over_groups(order):
    torch.manual_seed(3)
    net = nn.Sequential(nn.Conv2d(1, 2, 2), nn.Sigmoid(), nn.Flatten(), nn.Linear(18, 2)).to(DT).eval()
    x, base = torch.rand(1, 1, 4, 4, dtype=DT), torch.rand(1, 1, 4, 4, dtype=DT)
    groups = (torch.arange(16).view(4, 4) // 4 + torch.arange(16).view(4, 4) % 2) % 5  # 5 groups
    got = shapley_attribution(net, x, base, target=1, order=order, groups=groups)
    member = (groups.reshape(-1)[None, :] == torch.arange(5)[:, None]).to(DT)
    head = lambda z: net(z)[:, 1]
    values = polynomial_game(head, x[0], (subset_masks(5) @ member) * (x[0] - base[0]).reshape(-1),
                             order)
    expected = shapley_by_enumeration(values, 5)[groups.reshape(-1)].view(1, 1, 4, 4)
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-10)


def test_bad_input_raises_named_errors():
    net = _sigmoid_net(4)
    x, base = normal((2, 4), seed=0, n=2)
    with pytest.raises(ValueError, match=r"order must be <= 4.*order=5"):
        shapley_attribution(net, x, base, order=5)
    with pytest.raises(ValueError, match="groups"):
        shapley_attribution(net, x, base, order=3, groups=torch.zeros(2, 3, dtype=torch.long))
    with pytest.raises(TypeError, match="order"):
        shapley_attribution(net, x, base, order=3.0)
