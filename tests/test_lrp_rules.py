"""LRP rules and composites (issue 15, part 2) against Zennit, and the z-plus rule against a
slow per-neuron loop.

Independent routes: Zennit's rules and composites (its own hooks) on the same float64 ReLU
CNN and MLP, relevance ``f(x)`` put on the target output; the z-plus rule written as the
textbook double loop over the neurons of a two-layer MLP.
"""
from __future__ import annotations

import pytest
import torch
from _builders import DT, mlp, normal
from torch import nn
from zennit import composites as zc
from zennit import rules as zr
from zennit import types as zt

import taylorattr as ta
from taylorattr.methods.lrp_rules import LRP

CLOSE = {"rtol": 1e-5, "atol": 1e-8}


def _cnn():
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(2, 4, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(4, 5, 3), nn.ReLU(), nn.AvgPool2d(1), nn.Flatten(),
        nn.Linear(5 * 4, 7), nn.ReLU(), nn.Linear(7, 3)).to(DT).eval()


def _mlp():  # flatten, 8 -> 6 -> 5 -> 3 with ReLUs
    return mlp(8, 6, 5, 3, acts=(nn.ReLU,), seed=1, flatten=True)


def _zennit(model, composite, x, target):
    with composite.context(model) as modified:
        xg = x.clone().requires_grad_(True)
        out = modified(xg)
        onehot = torch.zeros_like(out)
        onehot[torch.arange(x.shape[0]), target] = 1.0
        (rel,) = torch.autograd.grad(out, xg, onehot * out.detach())
    return rel


_ZENNIT_RULES = {
    "epsilon": lambda: zr.Epsilon(), "z_plus": lambda: zr.ZPlus(),
    "alpha1_beta0": lambda: zr.AlphaBeta(1, 0), "alpha2_beta1": lambda: zr.AlphaBeta(2, 1),
    "gamma": lambda: zr.Gamma(0.25), "flat": lambda: zr.Flat(), "w_square": lambda: zr.WSquare(),
}
_ZENNIT_COMPOSITES = {
    "epsilon_plus": zc.EpsilonPlus, "epsilon_plus_flat": zc.EpsilonPlusFlat,
    "epsilon_alpha2_beta1": zc.EpsilonAlpha2Beta1,
    "epsilon_alpha2_beta1_flat": zc.EpsilonAlpha2Beta1Flat,
}


@pytest.mark.parametrize("rule", sorted(_ZENNIT_RULES) + sorted(_ZENNIT_COMPOSITES))
@pytest.mark.parametrize("kind", ["cnn", "mlp"])
def test_rule_equals_zennit(rule, kind):
    model = _cnn() if kind == "cnn" else _mlp()
    x = normal((3, 2, 8, 8) if kind == "cnn" else (3, 2, 4), seed=2)
    target = torch.tensor([0, 2, 1])
    if rule in _ZENNIT_RULES:
        composite = zc.LayerMapComposite(zc.layer_map_base() + [(zt.Linear, _ZENNIT_RULES[rule]())])
    else:
        composite = _ZENNIT_COMPOSITES[rule]()
    ours = LRP(model, rule=rule).attribute(x, target=target)
    theirs = _zennit(model, composite, x, target)
    assert theirs.abs().max() > 1e-5  # a non-trivial map
    torch.testing.assert_close(ours, theirs, **CLOSE)


def test_z_plus_equals_a_per_neuron_loop():
    """R_j = f(x) at the output, R_i = sum_j (x_i w_ji)+ / (sum_i' (x_i' w_ji')+ + b+_j) R_j
    (Zennit's z-plus keeps x+ w+ and x- w-: every positive contribution)."""
    model = _mlp()
    x = normal((2, 2, 4), seed=5)
    ours = LRP(model, rule="z_plus", stabilizer=1e-300).attribute(x, target=1)
    layers = [model[1], model[3], model[5]]
    for b in range(2):
        acts = [x[b].flatten()]
        for i, lin in enumerate(layers):
            z = lin.weight @ acts[-1] + lin.bias
            acts.append(z.clamp(min=0) if i < 2 else z)
        rel = torch.zeros(3, dtype=DT)
        rel[1] = acts[-1][1]
        for lin, a in zip(reversed(layers), reversed(acts[:-1])):
            new = torch.zeros_like(a)
            for j in range(lin.out_features):
                terms = [max(a[i] * lin.weight[j, i], 0.0) for i in range(lin.in_features)]
                denom = sum(terms) + max(float(lin.bias[j]), 0.0)
                for i in range(lin.in_features):
                    new[i] += terms[i] / denom * rel[j] if denom > 0 else 0.0
            rel = new
        torch.testing.assert_close(ours[b].flatten(), rel, rtol=1e-10, atol=1e-12)


def test_alpha1_beta0_is_z_plus_and_errors():
    model = _cnn()
    x = normal((2, 2, 8, 8), seed=2)
    torch.testing.assert_close(LRP(model, rule="alpha1_beta0").attribute(x),
                               LRP(model, rule="z_plus").attribute(x), rtol=1e-12, atol=1e-12)
    with pytest.raises(ValueError, match="rule must be one of"):
        LRP(model, rule="zplus")
    with pytest.raises(ValueError, match="gamma must be >= 0"):
        LRP(model, rule="gamma", gamma=-1.0)



class _Residual(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(4)
        self.a, self.b = nn.Linear(4, 4), nn.Linear(4, 2)

    def forward(self, x):
        return self.b(torch.relu(self.a(x)) + x)


def test_residual_sum_splits_relevance_in_proportion():
    """b(relu(a(x)) + x) with the epsilon rule everywhere, written out in relevance form:
    the sum s = h + x sends R_h = h / s(s) R_s and x / s(s) R_s (Zennit's Norm rule on a
    sum, no double counting); the skip and the branch relevances add up at x."""
    model = _Residual().to(DT).eval()
    x = normal((3, 4), seed=6)
    eps = 1e-6
    stab = lambda v: v + eps * torch.where(v >= 0, 1.0, -1.0).to(v.dtype)
    with torch.no_grad():
        y = model.a(x)
        h = torch.relu(y)
        s = h + x
        z = model.b(s)
        r_z = torch.zeros_like(z)
        r_z[:, 1] = z[:, 1]
        r_s = s * ((r_z / stab(z)) @ model.b.weight)
        r_h, r_skip = h / stab(s) * r_s, x / stab(s) * r_s
        r_x = x * ((r_h / stab(y)) @ model.a.weight) + r_skip
    ours = LRP(model, rule="epsilon", epsilon=eps, stabilizer=eps).attribute(x, target=1)
    torch.testing.assert_close(ours, r_x, rtol=1e-10, atol=1e-12)


def test_registry_rows_run():
    model = _mlp()
    x = normal((2, 2, 4), seed=2)
    rows = [s for s in ta.METHODS.values() if issubclass(s.cls, LRP)]
    assert {s.name for s in rows} >= {"lrp_z_plus", "lrp_epsilon_plus_flat", "lrp_flat"}
    t = torch.tensor([0, 1])
    for spec in rows:
        rule = spec.name.removeprefix("lrp_")
        theirs = LRP(model, rule=rule).attribute(x, target=t)
        torch.testing.assert_close(spec.bind()(model, x, 0.0, t), theirs, rtol=0, atol=0)
        torch.testing.assert_close(spec(model, x, target=t), theirs, rtol=0, atol=0)


@pytest.mark.parametrize("rule", ["epsilon", "z_plus", "gamma", "alpha2_beta1", "flat"])
def test_batch_norm_folds_into_a_bias_free_linear_as_into_a_zero_bias_one(rule):
    """A bias-free Linear (captured as mm, no bias slot) followed by batch norm is the same
    layer as a Linear with a zero bias: the folded batch norm's shift becomes the layer's
    bias in both, so every rule gives the same relevances (it was dropped before for mm)."""
    torch.manual_seed(23)
    free = nn.Sequential(nn.Linear(5, 4, bias=False), nn.BatchNorm1d(4), nn.ReLU(),
                         nn.Linear(4, 3)).double()
    with torch.no_grad():
        free[1].running_mean.uniform_(-1, 1)
        free[1].running_var.uniform_(0.5, 2)
        free[1].weight.uniform_(0.5, 1.5)
        free[1].bias.uniform_(-1, 1)
    free.eval()
    zero = nn.Sequential(nn.Linear(5, 4), *free[1:]).double().eval()
    with torch.no_grad():
        zero[0].weight.copy_(free[0].weight)
        zero[0].bias.zero_()
    x = torch.randn(3, 5, dtype=torch.float64)
    torch.testing.assert_close(LRP(free, rule=rule).attribute(x, target=1),
                               LRP(zero, rule=rule).attribute(x, target=1), rtol=0, atol=1e-12)
