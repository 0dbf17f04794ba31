"""The order-K engine against closed forms (polynomials) and float64 autograd."""
import math
import warnings

import pytest
import torch
from _builders import DT
from torch import nn

import taylorattr as ta
from taylorattr.taylor.mode import UnsupportedOperation

torch.manual_seed(0)


class Power(nn.Module):
    """x ** p, declared elementwise with polynomial coefficients (a probe activation)."""

    elementwise = True

    def __init__(self, p):
        super().__init__()
        self.coeffs = tuple([0.0] * p + [1.0])

    def forward(self, x):
        return sum(c * x**k for k, c in enumerate(self.coeffs) if c)


def _autograd_orders(f, x, delta, K):
    """P_k = -h^(k)(0)/k! for h(t) = f(x - t delta), by repeated autograd in t."""
    t = torch.zeros((), dtype=DT, requires_grad=True)
    cur = f(x - t * delta)
    out = []
    for k in range(1, K + 1):
        (cur,) = torch.autograd.grad(cur, t, create_graph=True)
        out.append(-cur.item() / math.factorial(k))
    return torch.tensor(out, dtype=DT)


def _hessian_fields(f, x, delta):
    """Order-2 per-feature fields from torch.autograd.functional.hessian."""
    shape = x.shape
    g = torch.autograd.functional.jacobian(lambda z: f(z.view(shape)), x.flatten())
    H = torch.autograd.functional.hessian(lambda z: f(z.view(shape)), x.flatten())
    d = delta.flatten()
    ind = -0.5 * H.diag() * d * d
    return {
        "first": (g * d).view(shape),
        "independent": ind.view(shape),
        "interactive_ig": (-0.5 * d * (H @ d) - ind).view(shape),
        "interactive": -0.5 * (d @ H @ d) - ind.sum(),
    }


def _sigmoid_cnn():
    return nn.Sequential(
        nn.Conv2d(1, 3, 3), nn.Sigmoid(), nn.AvgPool2d(2), nn.BatchNorm2d(3),
        nn.Conv2d(3, 4, 2, padding=1), nn.Tanh(), nn.AdaptiveAvgPool2d(3), nn.Flatten(),
        nn.Linear(36, 5), nn.Softplus(), nn.Linear(5, 4),
    ).to(DT).eval()


def _mlp(act):
    return nn.Sequential(nn.Linear(7, 6), act, nn.Linear(6, 6), act, nn.Linear(6, 3)).to(DT).eval()


# ---------------------------------------------------------------- polynomial closed forms

def test_quadratic_network_matches_closed_form():
    W1, b1 = torch.randn(5, 6, dtype=DT), torch.randn(5, dtype=DT)
    w2, b2 = torch.randn(5, dtype=DT), torch.randn((), dtype=DT)
    model = nn.Sequential(nn.Linear(6, 5), Power(2), nn.Linear(5, 1), nn.Flatten(0)).to(DT).eval()
    with torch.no_grad():
        model[0].weight.copy_(W1), model[0].bias.copy_(b1)
        model[2].weight.copy_(w2[None]), model[2].bias.copy_(b2[None])
    x, base = torch.randn(4, 6, dtype=DT), torch.randn(4, 6, dtype=DT)
    terms = ta.taylor_terms(model, x, base, order=2)

    # f(x) = w2 . (W1 x + b1)^2 + b2: gradient 2 W1^T (w2 * h), Hessian 2 W1^T diag(w2) W1
    H = 2 * W1.T @ torch.diag(w2) @ W1
    d = x - base
    grad = 2 * (w2 * (x @ W1.T + b1)) @ W1
    indep = -0.5 * torch.diagonal(H) * d**2
    torch.testing.assert_close(terms.first, grad * d, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(terms.independent, indep, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(terms.interactive_ig, -0.5 * d * (d @ H) - indep, rtol=1e-12, atol=1e-12)
    quad = -0.5 * ((d @ H) * d).sum(1)
    torch.testing.assert_close(terms.interactive, quad - indep.sum(1), rtol=1e-12, atol=1e-12)
    f = lambda z: ((z @ W1.T + b1) ** 2 @ w2) + b2
    torch.testing.assert_close(terms.output_change, f(x) - f(base), rtol=1e-12, atol=1e-12)
    assert terms.error.abs().max() < 1e-12
    torch.testing.assert_close(terms.attribution().sum(1), terms.total, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("degree", [2, 3, 4])
def test_polynomial_network_is_exact_at_its_degree(degree):
    model = nn.Sequential(nn.Linear(5, 4), Power(degree), nn.Linear(4, 3)).to(DT).eval()
    x = torch.randn(3, 5, dtype=DT)
    for K in range(1, degree + 2):
        terms = ta.taylor_terms(model, x, 0.0, order=K, target=1)
        if K >= degree:
            assert terms.error.abs().max() < 1e-10 * terms.output_change.abs().max()
            # the IG reformulation of a polynomial is IG itself: complete
            torch.testing.assert_close(terms.attribution().sum(1), terms.output_change)
        else:
            assert terms.error.abs().max() > 1e-6


def test_cubic_separable_function_terms():
    """f(x) = sum_i x_i^3: no interactions; independent terms are the closed form."""
    model = nn.Sequential(Power(3), nn.Linear(4, 1, bias=False), nn.Flatten(0)).to(DT).eval()
    with torch.no_grad():
        model[1].weight.fill_(1.0)
    x, base = torch.randn(2, 4, dtype=DT), torch.randn(2, 4, dtype=DT)
    terms = ta.taylor_terms(model, x, base, order=3)
    d = x - base
    # (-1)^(k+1)/k! f^(k)(x) d^k:  k=2: -3 x d^2,  k=3: + d^3
    torch.testing.assert_close(terms.first, 3 * x**2 * d)
    torch.testing.assert_close(terms.independent, -3 * x * d**2 + d**3)
    assert terms.interactive_ig.abs().max() < 1e-12
    assert terms.interactive.abs().max() < 1e-12


# ---------------------------------------------------------------- smooth networks vs autograd

@pytest.mark.parametrize("act", [nn.Sigmoid(), nn.Tanh(), nn.Softplus()], ids=["sigmoid", "tanh", "softplus"])
def test_mlp_order2_fields_equal_autograd_hessian(act):
    model = _mlp(act)
    x, base = torch.randn(3, 7, dtype=DT), torch.randn(7, dtype=DT)
    terms = ta.taylor_terms(model, x, base, order=2, target=torch.tensor([0, 2, 1]))
    for b, tgt in enumerate([0, 2, 1]):
        ref = _hessian_fields(lambda z, tgt=tgt: model(z[None])[0, tgt], x[b], x[b] - base)
        for name in ("first", "independent", "interactive_ig"):
            torch.testing.assert_close(getattr(terms, name)[b], ref[name], rtol=1e-8, atol=1e-12)
        torch.testing.assert_close(terms.interactive[b], ref["interactive"], rtol=1e-8, atol=1e-12)


def test_cnn_order2_fields_equal_autograd_hessian():
    model = _sigmoid_cnn()
    with torch.no_grad():  # non-trivial running statistics
        model[3].running_mean.uniform_(-0.5, 0.5)
        model[3].running_var.uniform_(0.5, 2.0)
    x = torch.rand(2, 1, 8, 8, dtype=DT)
    terms = ta.taylor_terms(model, x, 0.0, order=2, target=3, chunk_size=7)
    for b in range(2):
        ref = _hessian_fields(lambda z: model(z[None])[0, 3], x[b], x[b])
        for name in ("first", "independent", "interactive_ig"):
            torch.testing.assert_close(getattr(terms, name)[b], ref[name], rtol=1e-8, atol=1e-12)


@pytest.mark.parametrize("K", [1, 3, 6])
def test_per_order_totals_equal_repeated_autograd(K):
    model = _sigmoid_cnn()
    x, base = torch.rand(2, 1, 8, 8, dtype=DT), torch.rand(2, 1, 8, 8, dtype=DT)
    terms = ta.taylor_terms(model, x, base, order=K, target=1)
    for b in range(2):
        ref = _autograd_orders(lambda z: model(z[None])[0, 1], x[b], x[b] - base[b], K)
        torch.testing.assert_close(terms.orders[b], ref, rtol=1e-8, atol=1e-14)
    torch.testing.assert_close(terms.total, terms.orders.sum(1))


def test_higher_order_independent_terms_equal_univariate_autograd():
    model = _mlp(nn.Sigmoid())
    x = torch.randn(1, 7, dtype=DT)
    K = 4
    terms = ta.taylor_terms(model, x, 0.0, order=K, target=0)
    for i in range(7):
        e = torch.zeros(7, dtype=DT)
        e[i] = x[0, i]
        ref = _autograd_orders(lambda z: model(z[None])[0, 0], x[0], e, K)
        torch.testing.assert_close(terms.independent[0, i], ref[1:].sum(), rtol=1e-8, atol=1e-14)
        torch.testing.assert_close(terms.first[0, i], ref[0], rtol=1e-8, atol=1e-14)


def test_higher_order_ig_share_sums_to_total_and_matches_autograd():
    """Order-3 IG share: (1/3) delta_i d_i (1/2 D^2 f[delta, delta]) computed by autograd."""
    model = _mlp(nn.Tanh())
    x = torch.randn(2, 7, dtype=DT)
    terms = ta.taylor_terms(model, x, 0.0, order=3, target=2)
    torch.testing.assert_close(terms.attribution().sum(1), terms.total, rtol=1e-10, atol=1e-12)
    for b in range(2):
        d = x[b]
        f = lambda z: model(z[None])[0, 2]
        z = x[b].clone().requires_grad_(True)
        (g,) = torch.autograd.grad(f(z), z, create_graph=True)
        hd = torch.autograd.grad(g @ d, z, create_graph=True)[0]  # H d as a function of z
        third = torch.autograd.grad(hd @ d, z)[0]  # d_i D^2 f[d, d]
        H = torch.autograd.functional.hessian(f, x[b])
        expected = g.detach() * d - 0.5 * d * (H @ d) + d * third / 6
        torch.testing.assert_close(terms.attribution()[b], expected, rtol=1e-8, atol=1e-12)


def test_other_operations_against_autograd():
    """Residual add, mul, matmul, exp, log, pow, sqrt, softmax, cat, getitem, reshape, max-pool."""

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(6, 6)
            self.mix = nn.Parameter(torch.randn(8, 6) / 3)
            self.w = nn.Parameter(torch.randn(6, 4))

        def forward(self, x):
            h = torch.sigmoid(self.lin(x)) + x  # residual
            h = h * torch.exp(-0.1 * x) + torch.log(1.5 + torch.tanh(x)) - x.pow(2) / 4
            h = torch.sqrt(h * h + 1.0)
            a = h.view(h.size(0), 2, 3)
            gram = torch.matmul(a, a.transpose(1, 2))  # input-dependent times input-dependent
            pair = a * a[:, :1] / (1.0 + gram.sum(-1, keepdim=True) ** 2)
            z = torch.cat([pair.reshape(x.shape[0], -1), h[:, :2]], dim=1) @ self.mix
            return torch.softmax(z @ self.w, dim=-1) + torch.log_softmax(z[:, :4], -1)

    model = Net().to(DT).eval()
    x = torch.randn(2, 6, dtype=DT)
    terms = ta.taylor_terms(model, x, 0.5, order=4, target=1)
    for b in range(2):
        ref = _autograd_orders(lambda z: model(z[None])[0, 1], x[b], x[b] - 0.5, 4)
        torch.testing.assert_close(terms.orders[b], ref, rtol=1e-8, atol=1e-14)


def test_max_pool_and_relu_follow_the_linear_region():
    model = nn.Sequential(nn.Conv2d(1, 2, 3), nn.MaxPool2d(2), nn.ReLU(), nn.Flatten(), nn.Linear(18, 2)).to(DT).eval()
    x = torch.randn(2, 1, 8, 8, dtype=DT)
    with pytest.warns(UserWarning, match="piecewise-linear"):
        terms = ta.taylor_terms(model, x, x + 1e-4 * torch.randn_like(x), order=2)
    # tiny delta keeps the linear region: the first-order term is the whole change
    torch.testing.assert_close(terms.total, terms.output_change, rtol=1e-6, atol=1e-12)
    assert terms.independent.abs().max() == 0


def test_group_expansion_equals_autograd_along_the_masked_change():
    """Occluding a patch: P_k of the change restricted to the patch (Theorem 3, corrected)."""
    model = _sigmoid_cnn()
    x, base = torch.rand(2, 1, 8, 8, dtype=DT), torch.rand(2, 1, 8, 8, dtype=DT)
    groups = (torch.arange(8)[:, None] // 4 * 2 + torch.arange(8)[None, :] // 4).view(1, 8, 8)
    got = ta.taylor.group_expansions(model, x, base, target=2, order=3, groups=groups, chunk_size=3)
    assert got.shape == (2, 4, 3)
    for b in range(2):
        for g in range(4):
            d = (x[b] - base[b]) * (groups == g)
            ref = _autograd_orders(lambda z: model(z[None])[0, 2], x[b], d, 3)
            torch.testing.assert_close(got[b, g], ref, rtol=1e-8, atol=1e-14)


def test_features_at_the_baseline_are_skipped_exactly():
    """Digits are mostly background: groups that do not move are not expanded. Each sample
    leaves different features (and whole groups) at the baseline; every field must still
    equal autograd, and the unmoved groups' terms must be exactly 0."""
    model = _sigmoid_cnn()
    base = torch.rand(1, 8, 8, dtype=DT)
    x = torch.rand(3, 1, 8, 8, dtype=DT)
    keep = torch.rand(3, 1, 8, 8) < torch.tensor([0.2, 0.6, 1.0]).view(3, 1, 1, 1)
    keep[0, :, :4, :4] = False  # sample 0: a whole patch at the baseline
    x = torch.where(keep, x, base)
    terms = ta.taylor_terms(model, x, base, order=2, target=1, chunk_size=5)
    for b in range(3):
        ref = _hessian_fields(lambda z: model(z[None])[0, 1], x[b], x[b] - base)
        for name in ("first", "independent", "interactive_ig"):
            torch.testing.assert_close(getattr(terms, name)[b], ref[name], rtol=1e-8, atol=1e-12)
    assert (terms.independent[~keep] == 0).all()
    groups = (torch.arange(8)[:, None] // 4 * 2 + torch.arange(8)[None, :] // 4).view(1, 8, 8)
    got = ta.taylor.group_expansions(model, x, base, target=1, order=3, groups=groups, chunk_size=1)
    assert (got[0, 0] == 0).all()
    for b in range(3):
        for g in range(4):
            d = (x[b] - base) * (groups == g)
            ref = _autograd_orders(lambda z: model(z[None])[0, 1], x[b], d, 3)
            torch.testing.assert_close(got[b, g], ref, rtol=1e-8, atol=1e-14)


def test_taylor_attribution_is_the_terms_attribution():
    model = _sigmoid_cnn()
    x = torch.rand(2, 1, 8, 8, dtype=DT)
    for K in (1, 2, 4):
        terms = ta.taylor_terms(model, x, 0.1, order=K, target=0)
        torch.testing.assert_close(ta.taylor.taylor_attribution(model, x, 0.1, 0, K), terms.attribution())


def test_batched_matches_per_sample_and_chunking_is_invisible():
    model = _sigmoid_cnn()
    x = torch.rand(3, 1, 8, 8, dtype=DT)
    full = ta.taylor_terms(model, x, 0.2, order=3, target=0)
    for chunk in (1, 5, 64):
        part = ta.taylor_terms(model, x[1:2], 0.2, order=3, target=0, chunk_size=chunk)
        torch.testing.assert_close(part.independent[0], full.independent[1], rtol=1e-10, atol=1e-14)
        torch.testing.assert_close(part.interactive_ig[0], full.interactive_ig[1], rtol=1e-10, atol=1e-14)


def test_float32_model_agrees_with_float64():
    model = _mlp(nn.Sigmoid())
    x = torch.randn(4, 7, dtype=DT)
    t64 = ta.taylor_terms(model, x, 0.0, order=2)
    t32 = ta.taylor_terms(model.float(), x.float(), 0.0, order=2, target=t64.first.new_zeros(4).long())
    t64 = ta.taylor_terms(model.double(), x, 0.0, order=2, target=0)
    torch.testing.assert_close(t32.attribution().double(), t64.attribution(), rtol=1e-4, atol=1e-6)


def test_baseline_forms_agree():
    model = _mlp(nn.Tanh())
    x = torch.randn(3, 7, dtype=DT)
    a = ta.taylor_terms(model, x, 0.3, order=2, target=0)
    b = ta.taylor_terms(model, x, torch.full((7,), 0.3, dtype=DT), order=2, target=0)
    c = ta.taylor_terms(model, x, torch.full((3, 7), 0.3, dtype=DT), order=2, target=0)
    for other in (b, c):
        torch.testing.assert_close(a.attribution(), other.attribution())


# ---------------------------------------------------------------- refusals and warnings

def test_bad_arguments_name_themselves():
    model = _mlp(nn.Sigmoid())
    x = torch.randn(2, 7, dtype=DT)
    with pytest.raises(ValueError, match="baselines"):
        ta.taylor_terms(model, x, torch.zeros(3, dtype=DT))
    with pytest.raises(TypeError, match="inputs"):
        ta.taylor_terms(model, x.long())
    # half precision is accepted (issue 34); a float64 model fails on it, and the message
    # names the inputs' dtype the model did not take
    with pytest.raises(ValueError, match="dtype torch.float16 .do the inputs have"):
        ta.taylor_terms(model, x.half())
    with pytest.raises(ValueError, match="inputs"):
        ta.taylor_terms(model, x.masked_fill(torch.eye(2, 7, dtype=torch.bool), float("nan")))
    with pytest.raises(ValueError, match="target"):
        ta.taylor_terms(model, x, target=3)
    with pytest.raises(ValueError, match="order"):
        ta.taylor_terms(model, x, order=0)
    with pytest.raises(ValueError, match="model"):
        ta.taylor_terms(nn.Sequential(nn.Linear(7, 2), nn.Unflatten(1, (1, 2))).to(DT).eval(), x)
    with pytest.raises(ValueError, match="inputs"):
        ta.taylor_terms(model, x[:0])


def test_unsupported_operation_is_named():
    class Odd(nn.Module):
        def forward(self, x):
            return torch.atan(x)

    with pytest.raises(UnsupportedOperation, match="atan"):
        ta.taylor_terms(Odd().to(DT).eval(), torch.randn(2, 3, dtype=DT), order=2)
    with pytest.raises(UnsupportedOperation, match="ELU"):
        ta.taylor_terms(nn.Sequential(nn.Linear(3, 2), nn.ELU()).to(DT).eval(), torch.randn(2, 3, dtype=DT))



def test_shape_ops_that_touch_the_batch_axis_are_exact():
    class Squeezed(nn.Module):  # with B = 1, squeeze() also drops the batch axis
        def forward(self, x):
            return torch.sigmoid(x.unsqueeze(1).squeeze().reshape(x.shape[0], -1))

    # the captured graph runs every coefficient with the shapes of the value: exact
    x = torch.randn(1, 3, dtype=DT)
    got = ta.taylor_terms(Squeezed().to(DT).eval(), x, order=2, target=0).orders[0]
    s = torch.sigmoid(x[0, 0])
    d1, d2 = s * (1 - s), s * (1 - s) * (1 - 2 * s)  # closed-form derivatives of sigmoid
    torch.testing.assert_close(got, torch.stack([d1 * x[0, 0], -d2 / 2 * x[0, 0] ** 2]),
                               rtol=1e-12, atol=1e-14)


def test_train_mode_warns():
    model = _mlp(nn.Sigmoid()).train()
    with pytest.warns(UserWarning, match="train mode"):
        ta.taylor_terms(model, torch.randn(2, 7, dtype=DT), order=1)


def test_smooth_model_does_not_warn():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ta.taylor_terms(_mlp(nn.Sigmoid()), torch.randn(2, 7, dtype=DT), order=3)
