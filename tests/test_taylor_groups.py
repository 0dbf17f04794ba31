"""Group-level Taylor terms: ``taylor_terms(..., groups=)`` against independent routes.

* closed-form monomials of a polynomial network (``_polynomial``): a group's independent
  term is every monomial of degree >= 2 inside the group, ``interactive`` every monomial
  touching two or more groups;
* ``group_expansions`` and float64 autograd of ``t -> f(x - t delta_g)`` at ``t = 0``;
* singleton groups: exactly the per-feature fields, flattened.
"""
import math

import pytest
import torch
from _polynomial import DT, poly_net, terms_at_x
from conftest import device_tolerance
from torch import nn

import taylorattr as ta
import taylorattr.taylor.terms as T

GROUPS = torch.tensor([0, 2, 1, 1, 2])  # 5 features in 3 groups


def _closed_form(net, x, base, order):
    """``first``, ``independent``, IG share per group ``[B, G]`` and the between-group
    interaction ``[B]`` from the monomials of degree <= ``order``."""
    B, G = x.shape[0], int(GROUPS.max()) + 1
    first, indep, share = (torch.zeros(B, G, dtype=DT) for _ in range(3))
    between = torch.zeros(B, dtype=DT)
    for b in range(B):
        for kappa, phi in terms_at_x(net, x[b], base[b]).items():
            k = sum(kappa)
            if k > order:
                continue
            touched = {int(GROUPS[j]) for j, e in enumerate(kappa) if e}
            for j, e in enumerate(kappa):  # the IG share: kappa_j / k of the monomial
                share[b, GROUPS[j]] += e / k * phi
            if k == 1:
                first[b, touched.pop()] += phi
            elif len(touched) == 1:
                indep[b, touched.pop()] += phi
            else:
                between[b] += phi
    return first, indep, share, between


@pytest.mark.parametrize("order", [1, 2, 3, 4])
def test_polynomial_network_group_fields_equal_closed_form(order):
    net = poly_net(5, (0.1, 0.8, -0.6, 0.5), hidden=4, seed=order)  # cubic
    gen = torch.Generator().manual_seed(3)
    x, base = torch.randn(2, 5, dtype=DT, generator=gen), torch.randn(2, 5, dtype=DT, generator=gen)
    terms = ta.taylor_terms(net, x, base, order=order, groups=GROUPS)
    first, indep, share, between = _closed_form(net, x, base, order)
    tol = {"rtol": 0, "atol": 1e-12}
    assert terms.first.shape == terms.independent.shape == terms.interactive_ig.shape == (2, 3)
    torch.testing.assert_close(terms.first, first, **tol)
    torch.testing.assert_close(terms.independent, indep, **tol)
    torch.testing.assert_close(terms.interactive_ig, share - first - indep, **tol)
    torch.testing.assert_close(terms.interactive, between, **tol)
    torch.testing.assert_close(terms.attribution().sum(1), terms.total, **tol)
    if order >= 3:  # exact at the network's degree
        torch.testing.assert_close(terms.total, terms.output_change, **tol)


def _cnn():
    torch.manual_seed(4)
    return nn.Sequential(nn.Conv2d(1, 3, 3), nn.Softplus(), nn.AvgPool2d(2), nn.Conv2d(3, 4, 2),
                         nn.Tanh(), nn.Flatten(), nn.Linear(16, 5), nn.Sigmoid(),
                         nn.Linear(5, 3)).to(DT).eval()


def _patches(side, size):
    """Ids of ``size x size`` patches of a ``1 x side x side`` image, row-major."""
    r = torch.arange(side) // size
    return (r[:, None] * (side // size) + r[None, :]).view(1, side, side)


def _autograd_group_orders(model, x, delta, target, order):
    """``P_k`` along ``-delta`` for one sample by nested float64 autograd of the 1-D function
    ``t -> f(x - t delta)`` at ``t = 0``: ``[K]``."""
    t = torch.zeros((), dtype=DT, requires_grad=True)
    cur = model((x - t * delta)[None])[0, target]
    out = []
    for k in range(1, order + 1):
        (cur,) = torch.autograd.grad(cur, t, create_graph=True)
        out.append(-cur.detach() / math.factorial(k))
    return torch.stack(out)


def test_group_independent_equals_group_expansions_and_autograd():
    model = _cnn()
    gen = torch.Generator().manual_seed(5)
    x, base = torch.rand(2, 1, 8, 8, dtype=DT, generator=gen), torch.rand(1, 8, 8, dtype=DT, generator=gen)
    x[1, :, :2, :2] = base[:, :2, :2]  # sample 1 leaves group 0 at the baseline
    groups = _patches(8, 2)  # 16 groups of 2x2 pixels
    terms = ta.taylor_terms(model, x, base, target=2, order=3, groups=groups, chunk_size=3)
    assert terms.independent.shape == (2, 16)
    expansions = T.group_expansions(model, x, base, target=2, order=3, groups=groups)
    torch.testing.assert_close(terms.independent, expansions[..., 1:].sum(-1), rtol=1e-12, atol=1e-15)
    per_feature = ta.taylor_terms(model, x, base, target=2, order=3)
    for b in range(2):
        for g in range(16):
            delta_g = (x[b] - base) * (groups == g)
            ref = _autograd_group_orders(model, x[b], delta_g, 2, 3)
            torch.testing.assert_close(terms.independent[b, g], ref[1:].sum(), rtol=1e-8, atol=1e-14)
            torch.testing.assert_close(terms.first[b, g], ref[0], rtol=1e-8, atol=1e-14)
            mask = (groups == g).expand_as(x[b])
            torch.testing.assert_close(terms.first[b, g], per_feature.first[b][mask].sum(),
                                       rtol=1e-12, atol=1e-15)
            torch.testing.assert_close(terms.attribution()[b, g],
                                       per_feature.attribution()[b][mask].sum(), rtol=1e-12, atol=1e-15)
    assert (terms.independent[1, 0] == 0) and (terms.first[1, 0] == 0)
    torch.testing.assert_close(terms.interactive, terms.total - (terms.first + terms.independent).sum(1),
                               rtol=0, atol=0)
    torch.testing.assert_close(terms.attribution().sum(1), terms.total, rtol=1e-12, atol=1e-14)
    for name in ("total", "output_change", "error", "orders"):  # per-sample fields unchanged
        torch.testing.assert_close(getattr(terms, name), getattr(per_feature, name), rtol=0, atol=0)


@pytest.mark.parametrize("order", [1, 2, 3])
def test_singleton_groups_equal_the_per_feature_fields(order):
    model = _cnn()
    gen = torch.Generator().manual_seed(6)
    x = torch.rand(3, 1, 8, 8, dtype=DT, generator=gen)
    x[0, :, 3:, :] = 0.3  # features at the baseline
    singletons = torch.arange(64).view(1, 8, 8)
    grouped = ta.taylor_terms(model, x, 0.3, target=1, order=order, groups=singletons)
    masked = ta.taylor_terms(model, x, 0.3, target=1, order=order,
                             feature_mask=100 - 2 * singletons[None])  # reversed ids
    plain = ta.taylor_terms(model, x, 0.3, target=1, order=order)
    # bitwise on the CPU; on CUDA the grouped and the plain route run their model passes on
    # other row counts, for which cuDNN/cuBLAS pick other kernels that round differently
    # (measured: 1.8e-14 relative, torch 2.11 on an H200)
    same = device_tolerance(0.0, 0.0)
    for name in ("first", "independent", "interactive_ig"):
        torch.testing.assert_close(getattr(grouped, name), getattr(plain, name).flatten(1),
                                   **same)
        torch.testing.assert_close(getattr(masked, name), getattr(plain, name).flatten(1).flip(1),
                                   **same)
    torch.testing.assert_close(grouped.interactive, plain.interactive, **same)


def test_tuple_inputs_give_one_group_level_tensor():
    """Groups across two inputs: ``[B, G]`` fields equal to the same groups on the inputs
    joined into one tensor by hand."""
    class Two(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Linear(3, 4), nn.Linear(4, 4)

        def forward(self, x, y):
            return torch.tanh(self.a(x)) * torch.sigmoid(self.b(y.flatten(1)))

    class Joined(nn.Module):
        def __init__(self, two):
            super().__init__()
            self.two = two

        def forward(self, z):
            return self.two(z[:, :3], z[:, 3:].view(-1, 2, 2))

    torch.manual_seed(7)
    two = Two().to(DT).eval()
    x, y = torch.randn(2, 3, dtype=DT), torch.randn(2, 2, 2, dtype=DT)
    groups = (torch.tensor([0, 0, 1]), torch.tensor([[1, 2], [2, 0]]))
    terms = ta.taylor_terms(two, (x, y), 0.1, target=3, order=3, groups=groups)
    ref = ta.taylor_terms(Joined(two).eval(), torch.cat([x, y.flatten(1)], 1), 0.1, target=3, order=3,
                          groups=torch.cat([groups[0], groups[1].flatten()]))
    for name in ("first", "independent", "interactive_ig", "interactive", "total"):
        assert isinstance(getattr(terms, name), torch.Tensor)
        torch.testing.assert_close(getattr(terms, name), getattr(ref, name), rtol=1e-12, atol=1e-15)
    assert terms.first.shape == (2, 3)


def test_progress_bar_counts_the_passes_and_names_groups(monkeypatch):
    bars = []

    def fake_tqdm(iterable, **kwargs):
        bars.append(kwargs)
        return iterable

    monkeypatch.setattr(T, "tqdm", fake_tqdm)
    model, x = _cnn(), torch.rand(2, 1, 8, 8, dtype=DT)
    ta.taylor_terms(model, x, 0.0, target=0, order=2, groups=_patches(8, 2), chunk_size=5,
                    show_progress=True)
    ta.taylor_terms(model, x, 0.0, target=0, order=2, chunk_size=5, show_progress=True)
    assert bars[0]["total"] == math.ceil(16 / 5) and "16 groups" in bars[0]["desc"]
    assert bars[1]["total"] == math.ceil(64 / 5) and "64 features" in bars[1]["desc"]
    assert not bars[0]["disable"]


def test_bad_groups_name_themselves():
    model, x = _cnn(), torch.rand(2, 1, 8, 8, dtype=DT)
    good = _patches(8, 4)
    for bad, err in ((good.double(), TypeError), (good.bool(), TypeError),
                     (good.tolist(), TypeError), (good[:, :4], ValueError),
                     (good - 1, ValueError)):
        with pytest.raises(err, match="groups"):
            ta.taylor_terms(model, x, 0.0, target=0, order=2, groups=bad)
        with pytest.raises(err, match="groups"):
            T.taylor_terms_cost(x, 0.0, 2, groups=bad)
    with pytest.raises(ValueError, match="groups"):
        ta.taylor_terms(model, x, 0.0, target=0, order=2, groups=good, feature_mask=good[None])
    with pytest.raises(ValueError, match="feature_mask"):
        ta.taylor_terms(model, x, 0.0, target=0, order=2, feature_mask=good)
