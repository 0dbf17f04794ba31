"""DeepLIFT and epsilon-LRP on real ReLU CNNs: BatchNorm, max and adaptive average
pooling, concatenation, residual sums; against Captum, and against float64 hand
computations where Captum double counts.
"""
from __future__ import annotations

import captum.attr as captum_attr
import pytest
import torch
import torch.nn.functional as F
from _builders import DT
from torch import nn

from taylorattr.methods import DeepLift, EpsilonLRP, UnsupportedModelError, local_relevance
from taylorattr.methods.layerwise import FAMILIES, supported_operations
from taylorattr.methods.layerwise.table import operation_names

pytestmark = [pytest.mark.filterwarnings("ignore::UserWarning"),
              pytest.mark.usefixtures("one_thread")]

TIGHT = {"rtol": 1e-9, "atol": 1e-12}


def _fresh(t, fresh):
    """``t + 0`` (a new tensor with the same values) when ``fresh``, else ``t``.

    Captum's DeepLift hooks a module through tensor hooks on its input and output
    tensors; when a ReLU's output tensor is a max pool's input, the ReLU's hook records
    its upstream gradient *before* the max pool's hook has replaced it by the max-pool
    rule, and the ReLU's Rescale multiplier is applied to the plain gradient (Captum's
    own convergence delta is then far from zero). A ``+ 0`` in between gives the two
    modules separate tensors and Captum is right again; taylorattr gives the same
    result with or without it.
    """
    return t + 0 if fresh else t


def conv_bn(c_in, c_out, k, bias=True):
    return nn.Conv2d(c_in, c_out, k, padding=k // 2, bias=bias), nn.BatchNorm2d(c_out)


class Branched(nn.Module):
    """Conv-BN-ReLU-maxpool, two branches concatenated, Conv-BN-ReLU, adaptive average
    pooling, flatten, linear. No residual sum: Captum's LRP handles all of it.

    ``fresh=True`` computes the same function with ``+ 0`` between the ReLU and the max
    pool, so that the two modules do not share a tensor (see :func:`_fresh`)."""

    def __init__(self, fresh=False):
        super().__init__()
        self.fresh = fresh
        self.conv1, self.bn1 = conv_bn(2, 4, 3)
        self.relu1, self.pool1 = nn.ReLU(), nn.MaxPool2d(2)
        self.conv_a, self.bn_a = conv_bn(4, 3, 3, bias=False)
        self.relu_a = nn.ReLU()
        self.conv_b, self.relu_b = nn.Conv2d(4, 3, 1), nn.ReLU()
        self.conv2, self.bn2 = conv_bn(6, 5, 3)
        self.relu2, self.gap = nn.ReLU(), nn.AdaptiveAvgPool2d(2)
        self.fc = nn.Linear(20, 3)

    def forward(self, x):
        h = self.pool1(_fresh(self.relu1(self.bn1(self.conv1(x))), self.fresh))
        h = torch.cat([self.relu_a(self.bn_a(self.conv_a(h))), self.relu_b(self.conv_b(h))], 1)
        h = self.gap(self.relu2(self.bn2(self.conv2(h))))
        return self.fc(torch.flatten(h, 1))


class ResNetLike(nn.Module):
    """Stem Conv-BN-ReLU-maxpool, one basic residual block, adaptive average pooling."""

    def __init__(self, fresh=False):
        super().__init__()
        self.fresh = fresh
        self.stem, self.stem_bn = conv_bn(2, 4, 3)
        self.stem_relu, self.pool = nn.ReLU(), nn.MaxPool2d(2)
        self.conv1, self.bn1 = conv_bn(4, 4, 3, bias=False)
        self.relu1 = nn.ReLU()
        self.conv2, self.bn2 = conv_bn(4, 4, 3, bias=False)
        self.relu_out, self.gap = nn.ReLU(), nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(4, 3)

    def forward(self, x):
        p = self.pool(_fresh(self.stem_relu(self.stem_bn(self.stem(x))), self.fresh))
        h = self.bn2(self.conv2(self.relu1(self.bn1(self.conv1(p)))))
        s = self.relu_out(h + p)
        return self.fc(torch.flatten(self.gap(s), 1))


def make(model, seed=0):
    torch.manual_seed(seed)
    for m in model.modules():
        if isinstance(m, (nn.Linear, nn.Conv2d)):
            nn.init.normal_(m.weight, std=0.5)
            if m.bias is not None:
                nn.init.normal_(m.bias, std=0.3)
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.normal_(0, 0.3)
            m.running_var.uniform_(0.5, 2.0)
            nn.init.normal_(m.weight, 1.0, 0.3)
            nn.init.normal_(m.bias, 0.0, 0.3)
    return model.to(DT).eval()


def data(seed=1, b=3):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(b, 2, 8, 8, generator=g, dtype=DT)
    base = 0.5 * torch.randn(b, 2, 8, 8, generator=g, dtype=DT)
    return x, base, torch.arange(b) % 3


MODELS = {"branched": Branched, "resnet": ResNetLike}


# ---------------------------------------------------------------------------------------
# DeepLIFT
# ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", list(MODELS))
def test_deeplift_equals_captum_on_cnns_with_batchnorm_pooling_and_residuals(name):
    model = make(MODELS[name](fresh=True))
    x, base, t = data()
    ours, delta = DeepLift(model).attribute(x, base, target=t, return_convergence_delta=True)
    theirs, their_delta = captum_attr.DeepLift(model).attribute(
        x, base, target=t, return_convergence_delta=True)
    torch.testing.assert_close(ours, theirs, **TIGHT)
    with torch.no_grad():
        df = (model(x) - model(base)).gather(1, t[:, None])[:, 0]
    torch.testing.assert_close(ours.flatten(1).sum(1), df, **TIGHT)  # complete
    torch.testing.assert_close(delta, their_delta, rtol=0, atol=1e-10)  # same sign as Captum
    # The max-pool rule's cross terms are exercised: the arg-max of some window differs
    # between the input and the baseline run.
    with torch.no_grad():
        pre = [model.relu1(model.bn1(model.conv1(v))) if name == "branched"
               else model.stem_relu(model.stem_bn(model.stem(v))) for v in (x, base)]
    idx = [F.max_pool2d(p, 2, return_indices=True)[1] for p in pre]
    assert (idx[0] != idx[1]).any()
    # Without the ``+ 0`` the function and taylorattr's attributions are the same, while
    # Captum's hooks collide (see _fresh): Captum is then incomplete.
    plain = make(MODELS[name](fresh=False))
    torch.testing.assert_close(DeepLift(plain).attribute(x, base, target=t), ours, **TIGHT)
    _, collided = captum_attr.DeepLift(plain).attribute(x, base, target=t,
                                                         return_convergence_delta=True)
    assert collided.abs().max() > 1e-3


def test_deeplift_of_relu_then_max_pool_by_hand_where_captum_is_incomplete():
    """Conv-ReLU-maxpool-linear written out with DeepLIFT's chain rule of multipliers:
    the max-pool rule on ``r = relu(y)`` gives contributions ``U`` at ``r``; the ReLU's
    Rescale multiplier turns them into ``g_y = U / (y - y~)``; the conv is linear."""
    model = make(nn.Sequential(nn.Conv2d(2, 3, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
                               nn.Flatten(), nn.Linear(48, 3)))
    x, base, t = data(seed=5)
    conv, fc = model[0], model[4]
    with torch.no_grad():
        y, y_ref = conv(x), conv(base)
        r, r_ref = torch.relu(y), torch.relu(y_ref)
        u = _max_rescale_by_hand(lambda v: F.max_pool2d(v, 2, return_indices=True),
                                 fc.weight, r, r_ref, t)
        g_y = torch.where(r != r_ref, u / (y - y_ref), 0.0)
        hand = (x - base) * F.conv_transpose2d(g_y, conv.weight, padding=1)
    ours = DeepLift(model).attribute(x, base, target=t)
    torch.testing.assert_close(ours, hand, **TIGHT)
    theirs, their_delta = captum_attr.DeepLift(model).attribute(x, base, target=t,
                                                                return_convergence_delta=True)
    assert (theirs - hand).abs().max() > 1e-2 and their_delta.abs().max() > 1e-3


def _max_rescale_by_hand(pool, w, x, base, t):
    """DeepLIFT of ``f(v) = w[t] . flatten(pool(v))`` written out per window: the output
    change ``w (M - z~)`` goes to the arg-max of ``x``, ``w (z - M)`` to the arg-max of
    ``x~``, ``M = max(z, z~)`` (Captum's max-pool rule)."""
    z, ix = pool(x)
    zr, ir = pool(base)
    top = torch.maximum(z, zr)
    wt = w[t].reshape(z.shape)
    out = torch.zeros_like(x).flatten(2)
    out.scatter_add_(2, ix.flatten(2), (wt * (top - zr)).flatten(2))
    out.scatter_add_(2, ir.flatten(2), (wt * (z - top)).flatten(2))
    return out.view_as(x)


@pytest.mark.parametrize("kind", ["module", "functional", "adaptive"])
def test_deeplift_max_pool_rule_by_hand(kind):
    class Pooled(nn.Module):
        def __init__(self):
            super().__init__()
            self.pool = nn.AdaptiveMaxPool2d(3) if kind == "adaptive" else nn.MaxPool2d(2)
            self.fc = nn.Linear(2 * 9 if kind == "adaptive" else 2 * 16, 3)

        def forward(self, x):
            h = F.max_pool2d(x, 2) if kind == "functional" else self.pool(x)
            return self.fc(h.flatten(1))

    model = make(Pooled())
    x, base, t = data(seed=3)
    pool = ((lambda v: F.adaptive_max_pool2d(v, 3, return_indices=True)) if kind == "adaptive"
            else (lambda v: F.max_pool2d(v, 2, return_indices=True)))
    hand = _max_rescale_by_hand(pool, model.fc.weight, x, base, t)
    torch.testing.assert_close(DeepLift(model).attribute(x, base, target=t), hand, **TIGHT)


# ---------------------------------------------------------------------------------------
# epsilon-LRP
# ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("fresh", [False, True])
def test_epsilon_lrp_equals_captum_without_residual_sums(fresh):
    model = make(Branched(fresh))
    x, _, t = data()
    ours, delta = EpsilonLRP(model).attribute(x, target=t, return_convergence_delta=True)
    theirs, their_delta = captum_attr.LRP(model).attribute(x, target=t,
                                                           return_convergence_delta=True)
    # Captum puts a separate epsilon step (1e-9) between each Conv and its BatchNorm;
    # here the BatchNorm is folded into the Conv: they differ by O(1e-9) relative.
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-8)
    # The convergence delta has the opposite sign to Captum's LRP delta (f(x) - sum R).
    torch.testing.assert_close(delta, -their_delta, rtol=1e-5, atol=1e-8)
    with torch.no_grad():
        fx = model(x).gather(1, t[:, None])[:, 0]
    torch.testing.assert_close(delta, ours.flatten(1).sum(1) - fx, **TIGHT)


def _eps_step(layer, a, r_out, eps):
    """The epsilon rule of one layer: ``R_a = a * J^T (R_out / (out + eps s(out)))``."""
    a = a.detach().requires_grad_(True)
    with torch.enable_grad():
        out = layer(a)
        sign = torch.where(out >= 0, 1.0, -1.0).to(out.dtype)
        (g,) = torch.autograd.grad(out, a, r_out / (out + eps * sign))
    return a.detach() * g


def _lrp_by_hand(m: ResNetLike, x, t, eps):
    """epsilon-LRP of :class:`ResNetLike` written out layer by layer in relevance form
    (BatchNorm folded into its Conv; relevance passes ReLUs; the residual sum splits
    relevance in proportion, ``R_h = h / (s + eps sgn s) R_s``, ``R_p`` likewise)."""
    sgn = lambda v: torch.where(v >= 0, 1.0, -1.0).to(v.dtype)
    stem = lambda v: m.stem_bn(m.stem(v))
    branch1 = lambda v: m.bn1(m.conv1(v))
    branch2 = lambda v: m.bn2(m.conv2(v))
    with torch.no_grad():
        r1 = torch.relu(stem(x))
        p = m.pool(r1)
        q = torch.relu(branch1(p))
        h = branch2(q)
        s = h + p
        r2 = torch.relu(s)
        flat = torch.flatten(m.gap(r2), 1)
        z = m.fc(flat)
    r_z = torch.zeros_like(z).scatter_(1, t[:, None], z.gather(1, t[:, None]))
    r_flat = _eps_step(m.fc, flat, r_z, eps)
    r_r2 = _eps_step(m.gap, r2, r_flat.view(-1, 4, 1, 1), eps)
    r_s = r_r2                                      # ReLU: relevance passes
    r_h = h / (s + eps * sgn(s)) * r_s              # the residual sum, proportional split
    r_p_skip = p / (s + eps * sgn(s)) * r_s
    r_q = _eps_step(branch2, q, r_h, eps)
    r_p = r_p_skip + _eps_step(branch1, p, r_q, eps)  # ReLU passes; p feeds two users
    r_r1 = _eps_step(m.pool, r1, r_p, eps)           # winner-take-all
    return _eps_step(stem, x, r_r1, eps)


@pytest.mark.parametrize("eps", [1e-9, 0.05])
def test_epsilon_lrp_splits_residual_sums_where_captum_double_counts(eps):
    model = make(ResNetLike())
    x, _, t = data()
    ours = EpsilonLRP(model, epsilon=eps).attribute(x, target=t)
    hand = _lrp_by_hand(model, x, t, eps)
    torch.testing.assert_close(ours, hand, **TIGHT)
    if eps == 1e-9:
        # Captum's LRP hands the whole relevance of h + p to both h and p: it disagrees
        # with the hand computation (the rule as published) far beyond its epsilon.
        theirs = captum_attr.LRP(model).attribute(x, target=t)
        gap = (theirs - hand).abs().max() / hand.abs().max()
        assert gap > 1e-2, gap


def test_epsilon_lrp_records_fold_batchnorm():
    model = make(ResNetLike())
    x, _, t = data()
    recs = EpsilonLRP(model, epsilon=1e-9).layer_records(x, target=t)
    assert [r.name for r in recs] == ["stem", "conv1", "conv2", "fc"]
    assert [r.folded for r in recs] == ["stem_bn", "bn1", "bn2", None]
    with torch.no_grad():
        p = model.pool(torch.relu(model.stem_bn(model.stem(x))))
        torch.testing.assert_close(recs[1].layer(p), model.bn1(model.conv1(p)), **TIGHT)
        torch.testing.assert_close(recs[1].pre, model.bn1(model.conv1(p)), **TIGHT)
        torch.testing.assert_close(recs[1].post, torch.relu(recs[1].pre), **TIGHT)


def test_deeplift_records_of_folded_layers_are_complete_per_neuron():
    model = make(ResNetLike())
    x, base, t = data()
    recs = DeepLift(model).layer_records(x, base, target=t)
    with torch.no_grad():
        for v, key in ((x, "post"), (base, "ref_post")):
            stem = torch.relu(model.stem_bn(model.stem(v)))
            q = torch.relu(model.bn1(model.conv1(model.pool(stem))))
            torch.testing.assert_close(getattr(recs[0], key), stem, **TIGHT)
            torch.testing.assert_close(getattr(recs[1], key), q, **TIGHT)
    for r in recs[:2]:
        a = local_relevance(r)  # [B, C_out, L, K]
        change = (r.post - r.ref_post).flatten(2)
        torch.testing.assert_close(a.sum(-1), change, **TIGHT)


# ---------------------------------------------------------------------------------------
# Refusals and the support table
# ---------------------------------------------------------------------------------------
def test_batchnorm_in_training_mode_is_refused():
    model = make(ResNetLike())
    x, base, t = data()
    dl = DeepLift(model)
    model.bn1.train()
    with pytest.raises(ValueError, match="BatchNorm2d module 'bn1' is in training mode"):
        dl.attribute(x, base, target=t)


class WithSort(nn.Module):
    """Sorting (a permutation that depends on the values) twice and a cumulative product:
    no layer-wise rule."""

    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(2, 3, 3), nn.LayerNorm(6))
        self.fc = nn.Linear(108, 2)

    def forward(self, x):
        h = torch.sort(self.body(x), dim=-1).values
        h = torch.sort(h, dim=-2).values
        return self.fc(torch.cumprod(h, -1).flatten(1))


@pytest.mark.parametrize("cls", [DeepLift, EpsilonLRP])
def test_refusals_list_each_op_once_with_count_location_and_what_to_do(cls):
    x = torch.randn(2, 2, 8, 8, dtype=DT)
    with pytest.raises(UnsupportedModelError) as err:
        cls(WithSort().to(DT).eval()).attribute(x, target=0)
    msg = str(err.value)
    for words in ("aten.sort.default", "(x2)", "aten.cumprod.default", "(x1)",
                  "test_layerwise_cnn.py\", line", "h = torch.sort(self.body(x), dim=-1).values",
                  "What to do", "IntegratedGradients"):
        assert words in msg, (words, msg)
    assert msg.count("aten.sort") == 1  # one line per distinct operation
    assert "torch.sort(h, dim=-2)" not in msg  # one location each
    assert len(msg) < 3000


def test_error_and_table_list_the_same_operations():
    """The error quotes the generated table: every row's operations are in it, and GELU
    (in the table) really is supported, by Rescale (checked by hand)."""
    rows = supported_operations()
    assert [r.family for r in rows] == [f.title for f in FAMILIES]
    with pytest.raises(UnsupportedModelError) as err:
        DeepLift(WithSort().to(DT).eval()).attribute(torch.randn(2, 2, 8, 8, dtype=DT), target=0)
    for row in rows:
        assert row.deeplift != "-" and row.epsilon_lrp != "-"
        assert row.operations in str(err.value), row.operations
    assert operation_names(FAMILIES[0])[0] == "views"
    model = make(nn.Sequential(nn.Linear(5, 4), nn.GELU(), nn.Linear(4, 2)))
    g = torch.Generator().manual_seed(5)
    x, base = torch.randn(3, 5, generator=g, dtype=DT), torch.randn(3, 5, generator=g, dtype=DT)
    w1, b1, w2 = model[0].weight, model[0].bias, model[2].weight
    y, y_ref = x @ w1.T + b1, base @ w1.T + b1
    with torch.no_grad():
        rescale = (F.gelu(y) - F.gelu(y_ref)) / (y - y_ref)
        hand = (x - base) * ((rescale * w2[1]) @ w1)
    torch.testing.assert_close(DeepLift(model).attribute(x, base, target=1), hand, **TIGHT)
