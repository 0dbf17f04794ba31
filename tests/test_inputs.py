"""Tuple inputs, additional_forward_args, layers and feature masks (issue 13): Taylor terms
against float64 autograd and a hand-flattened model, and every malformed combination refused
with an error naming the argument."""
from __future__ import annotations

import math
import warnings

import pytest
import torch
from _builders import DT
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from taylorattr.methods import (
    DeepLift,
    ExpectedGradients,
    GradientInput,
    IntegratedGradients,
    Occlusion,
)
from taylorattr.taylor.terms import group_expansions, taylor_terms

TOL = {"rtol": 1e-7, "atol": 1e-10}


class Two(nn.Module):
    """f(x, y, scale) with an interaction between the two inputs; ``scale`` [B] is extra."""

    def __init__(self):
        super().__init__()
        self.a, self.b, self.out = nn.Linear(3, 4), nn.Linear(4, 4), nn.Linear(4, 2)

    def forward(self, x, y, scale):
        h = torch.tanh(self.a(x)) * torch.sigmoid(self.b(y.flatten(1)))
        return self.out(h * scale[:, None])


class Flat(nn.Module):
    """The same function of one flat tensor [B, 3 + 4], written by hand."""

    def __init__(self, two, scale):
        super().__init__()
        self.two, self.scale = two, scale

    def forward(self, z):
        return self.two(z[:, :3], z[:, 3:].reshape(-1, 2, 2), self.scale)


class Text(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(9, 3)
        self.proj, self.out = nn.Linear(3, 3), nn.Linear(3, 2)

    def forward(self, ids, mask):
        return self.rest(self.emb(ids), mask)

    def rest(self, h, mask):
        return self.out((torch.tanh(self.proj(h)) * mask.unsqueeze(-1)).sum(1))


def setup():
    torch.manual_seed(0)
    model = Two().to(DT).eval()
    x, y = torch.randn(2, 3, dtype=DT), torch.randn(2, 2, 2, dtype=DT)
    scale = torch.rand(2, dtype=DT) + 0.5
    return model, (x, y), (0.1, torch.full((2, 2), -0.2, dtype=DT)), scale


def autograd_orders(f, x, delta, order):
    """P_k = -(1/k!) d^k/dt_b^k f(x_b - t_b delta_b) at t = 0, by repeated autograd; one
    t_b per sample (sample b's output depends on t_b alone), so ``[B, K]`` at once."""
    t = torch.zeros(x.shape[0], dtype=DT, requires_grad=True)
    g = f(x - t.view((-1,) + (1,) * (x.dim() - 1)) * delta)
    out = []
    for k in range(1, order + 1):
        (g,) = torch.autograd.grad(g.sum(), t, create_graph=True)
        out.append(-g.detach() / math.factorial(k))
    return torch.stack(out, 1)


def test_taylor_terms_on_tuple_inputs_equal_autograd_and_the_flat_model():
    model, (x, y), (bx, by), scale = setup()
    terms = taylor_terms(model, (x, y), (bx, by), target=1, order=3,
                         additional_forward_args=scale)
    flat = Flat(model, scale).eval()
    z = torch.cat([x, y.flatten(1)], 1)
    zb = torch.cat([torch.full_like(x, bx), by.expand(2, 2, 2).reshape(2, -1)], 1)
    delta = z - zb

    def f(v):
        return flat(v)[:, 1]

    # orders and first-order terms from repeated float64 autograd
    torch.testing.assert_close(terms.orders, autograd_orders(f, z, delta, 3), **TOL)
    zg = z.clone().requires_grad_(True)
    (grad,) = torch.autograd.grad(f(zg).sum(), zg)
    first = grad * delta
    torch.testing.assert_close(terms.first[0], first[:, :3], **TOL)
    torch.testing.assert_close(terms.first[1], first[:, 3:].view(2, 2, 2), **TOL)
    # independent terms: feature-wise univariate expansions by autograd
    indep = torch.stack([autograd_orders(f, z, delta * (torch.arange(7) == i), 3)[:, 1:].sum(1)
                         for i in range(7)], 1)
    torch.testing.assert_close(terms.independent[0], indep[:, :3], **TOL)
    torch.testing.assert_close(terms.independent[1], indep[:, 3:].view(2, 2, 2), **TOL)
    # every field equals the single-tensor route on the hand-flattened model
    ref = taylor_terms(flat, z, zb, target=1, order=3)
    for name in ("interactive_ig", "first", "independent"):
        got = getattr(terms, name)
        torch.testing.assert_close(torch.cat([got[0], got[1].flatten(1)], 1),
                                   getattr(ref, name), **TOL)
    for name in ("interactive", "total", "output_change", "error"):
        torch.testing.assert_close(getattr(terms, name), getattr(ref, name), **TOL)
    attribution = terms.attribution()
    torch.testing.assert_close(attribution[0].sum(1) + attribution[1].flatten(1).sum(1),
                               terms.total, **TOL)


def test_taylor_terms_at_a_layer_equal_the_network_after_it():
    torch.manual_seed(1)
    model = Text().to(DT).eval()
    ids, base = torch.randint(0, 9, (2, 5)), torch.zeros(2, 5, dtype=torch.long)
    mask = (torch.rand(2, 5) > 0.3).to(DT)
    terms = taylor_terms(model, ids, base, target=0, order=2, layer=model.emb,
                         additional_forward_args=(mask,))
    h, hb = model.emb(ids).detach(), model.emb(base).detach()
    torch.testing.assert_close(
        terms.orders, autograd_orders(lambda v: model.rest(v, mask)[:, 0], h, h - hb, 2), **TOL)
    hg = h.clone().requires_grad_(True)
    (grad,) = torch.autograd.grad(model.rest(hg, mask)[:, 0].sum(), hg)
    torch.testing.assert_close(terms.first, grad * (h - hb), **TOL)


def test_group_expansions_with_groups_per_input():
    """Group g's expansion sums to the autograd expansion along delta restricted to g."""
    model, xs, bs, scale = setup()
    groups = (torch.tensor([0, 0, 1]), torch.tensor([[1, 2], [2, 0]]))
    got = group_expansions(model, xs, bs, target=0, order=3, groups=groups,
                           additional_forward_args=scale)
    flat = Flat(model, scale).eval()
    z = torch.cat([xs[0], xs[1].flatten(1)], 1)
    zb = torch.cat([torch.full_like(xs[0], 0.1), bs[1].expand(2, 2, 2).reshape(2, -1)], 1)
    ids = torch.cat([groups[0], groups[1].flatten()])
    for g in range(3):
        want = autograd_orders(lambda v: flat(v)[:, 0], z, (z - zb) * (ids == g), 3)
        torch.testing.assert_close(got[:, g], want, **TOL)


def test_occlusion_with_per_sample_masks_and_a_batch_argument_equals_a_slow_loop():
    """Per-sample feature masks with a batch-first additional argument (the method runs
    sample by sample): each group's drop recomputed by an obvious loop."""
    model, (x, y), _, scale = setup()
    masks = (torch.tensor([[0, 1, 1], [2, 2, 0]]), torch.tensor([[[0, 0], [1, 1]],
                                                                [[1, 0], [0, 1]]]))
    got = Occlusion(model).attribute((x, y), 0.0, target=1, feature_mask=masks,
                                     additional_forward_args=scale)
    fx = model(x, y, scale)[:, 1]
    for b in range(2):
        for i, (part, m) in enumerate(zip((x, y), masks)):
            for j in range(part[b].numel()):
                gid = m[b].flatten()[j]
                xo, yo = x[b:b + 1].clone(), y[b:b + 1].clone()
                xo[0][masks[0][b] == gid] = 0.0
                yo[0][masks[1][b] == gid] = 0.0
                drop = fx[b] - model(xo, yo, scale[b:b + 1])[0, 1]
                torch.testing.assert_close(got[i][b].flatten()[j], drop, **TOL)


# ---- refusals ---------------------------------------------------------------------------
def _cases():
    model, (x, y), _, scale = setup()
    text = Text().to(DT).eval()
    ids, mask = torch.randint(0, 9, (2, 5)), torch.ones(2, 5, dtype=DT)
    other = nn.Linear(2, 2)
    return [
        # (method, inputs, baselines, kwargs, error, words)
        (GradientInput(model), (), None, {"additional_forward_args": scale}, ValueError,
         "inputs"),
        (GradientInput(model), (x, "y"), None, {"additional_forward_args": scale}, TypeError,
         "inputs[1]"),
        (GradientInput(model), (x, y[:1]), None, {"additional_forward_args": scale},
         ValueError, "inputs[1]"),
        (GradientInput(model), (x, y.long()), None, {"additional_forward_args": scale},
         TypeError, "inputs[1]"),
        (IntegratedGradients(model), (x, y), (0.0,), {"additional_forward_args": scale},
         ValueError, "baselines"),
        (IntegratedGradients(model), (x, y), x, {"additional_forward_args": scale},
         TypeError, "baselines"),
        (IntegratedGradients(model), (x, y), (0.0, torch.zeros(3, 3, dtype=DT)),
         {"additional_forward_args": scale}, ValueError, "baselines[1]"),
        (IntegratedGradients(model), (x, y), 0.0, {"additional_forward_args": scale[:1]},
         ValueError, "additional_forward_args[0]"),
        (IntegratedGradients(model), (x, y), 0.0, {"additional_forward_args": scale,
                                                   "attribute_to_layer_input": True},
         ValueError, "attribute_to_layer_input"),
        (IntegratedGradients(text), ids, 0, {"additional_forward_args": mask, "layer": other},
         ValueError, "layer"),
        (IntegratedGradients(text), ids, 0, {"additional_forward_args": mask,
                                             "layer": "emb"}, TypeError, "layer"),
        (IntegratedGradients(text), ids, 0, {"additional_forward_args": mask,
                                             "layer": text.emb,
                                             "attribute_to_layer_input": 1},
         TypeError, "attribute_to_layer_input"),
        (IntegratedGradients(text), ids, 0, {"additional_forward_args": mask,
                                             "layer": text.emb,
                                             "attribute_to_layer_input": True},
         TypeError, "layer's input"),
        (Occlusion(model), (x, y), 0.0, {"additional_forward_args": scale,
                                         "feature_mask": (torch.zeros(1, 3), torch.zeros(
                                             1, 2, 2, dtype=torch.long))},
         TypeError, "feature_mask[0]"),
        (Occlusion(model), (x, y), 0.0, {"additional_forward_args": scale,
                                         "feature_mask": (torch.zeros(1, 3, dtype=torch.long),
                                                          torch.zeros(1, 3, 2,
                                                                      dtype=torch.long))},
         ValueError, "feature_mask[1]"),
        (Occlusion(model), (x, y), 0.0, {"additional_forward_args": scale,
                                         "feature_mask": torch.zeros(1, 3, dtype=torch.long)},
         TypeError, "feature_mask"),
        (Occlusion(model), (x, y), 0.0, {"additional_forward_args": scale, "patch": (1, 1, 1)},
         ValueError, "patch"),
        (Occlusion(model), (x, y), 0.0, {"additional_forward_args": scale, "patch": 2,
                                         "feature_mask": (torch.zeros(1, 3, dtype=torch.long),
                                                          torch.zeros(1, 2, 2,
                                                                      dtype=torch.long))},
         ValueError, "feature_mask"),
        (ExpectedGradients(model), (x, y), torch.zeros(4, 3, dtype=DT),
         {"additional_forward_args": scale}, TypeError, "baselines"),
        (ExpectedGradients(model), (x, y), (torch.zeros(4, 3, dtype=DT),
                                            torch.zeros(4, 2, 3, dtype=DT)),
         {"additional_forward_args": scale}, ValueError, "baselines[1]"),
        (DeepLift(text), ids, 0, {"additional_forward_args": mask, "layer": text.proj,
                                  "nonsense": 1}, TypeError, "nonsense"),
    ]


@pytest.mark.parametrize("index", range(21))
def test_malformed_tuple_layer_and_mask_combinations_are_refused(index):
    method, inputs, baselines, kwargs, error, words = _cases()[index]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(error) as err:
            if baselines is None:
                method.attribute(inputs, target=0, **kwargs)
            else:
                method.attribute(inputs, baselines, target=0, **kwargs)
    assert words in str(err.value), str(err.value)


@settings(max_examples=25, deadline=None)
@given(extra_rows=st.integers(0, 4), y_rows=st.integers(1, 4), n_base=st.integers(0, 3))
def test_batch_mismatches_are_refused_by_name(extra_rows, y_rows, n_base):
    """Any disagreement in batch size or input count names the argument it is in."""
    model, (x, y), _, scale = setup()
    y2 = y.repeat(3, 1, 1)[:y_rows]
    s2 = scale.repeat(3)[:extra_rows]
    base = (0.0,) * n_base
    ok = y_rows == 2 and extra_rows == 2 and n_base == 2
    call = lambda: IntegratedGradients(model).attribute(
        (x, y2), base, target=0, n_steps=2, additional_forward_args=s2)
    if ok:
        call()
        return
    with pytest.raises((ValueError, TypeError)) as err:
        call()
    assert any(w in str(err.value) for w in ("inputs[1]", "additional_forward_args",
                                             "baselines")), str(err.value)


def test_infidelity_over_tuple_inputs_with_a_batch_argument_equals_a_slow_loop():
    from taylorattr.metrics import infidelity

    model, (x, y), _, scale = setup()
    a = (torch.randn(2, 3, dtype=DT), torch.randn(2, 2, 2, dtype=DT))

    def perturb(inputs, generator):
        noise = tuple(torch.randn(p.shape, generator=generator, dtype=DT) * 0.3 for p in inputs)
        return noise, tuple(p - q for p, q in zip(inputs, noise))

    got = infidelity(model, (x, y), a, target=1, perturbation=perturb, n_perturb_samples=6,
                     seed=4, batch_size=5, additional_forward_args=scale)
    gen = torch.Generator().manual_seed(4)
    pred, true = [], []
    with torch.no_grad():
        f0 = model(x, y, scale)[:, 1]
        for _ in range(6):
            (nx, ny), (px, py) = perturb((x, y), gen)
            pred.append((a[0] * nx).sum(1) + (a[1] * ny).flatten(1).sum(1))
            true.append(f0 - torch.stack([model(px[b:b + 1], py[b:b + 1], scale[b:b + 1])[0, 1]
                                          for b in range(2)]))
    pred, true = torch.stack(pred, 1), torch.stack(true, 1)
    beta = (pred * true).sum(1) / pred.pow(2).sum(1)
    torch.testing.assert_close(got, (beta[:, None] * pred - true).pow(2).mean(1), **TOL)
    with pytest.raises(ValueError, match="square"):
        infidelity(model, (x, y), a, target=1, additional_forward_args=scale)
    with pytest.raises(ValueError, match=r"attributions\[1\]"):
        infidelity(model, (x, y), (a[0], a[1][:, 0]), target=1, perturbation="gaussian",
                   n_perturb_samples=2, additional_forward_args=scale)


def test_group_expansions_take_captum_feature_masks():
    """feature_mask with arbitrary ids gives the groups' expansions in sorted-id order, the
    same as the equivalent 0..G-1 groups."""
    model, xs, bs, scale = setup()
    masks = (torch.tensor([[7, 7, -1]]), torch.tensor([[[-1, 3], [3, 7]]]))
    groups = (torch.tensor([2, 2, 0]), torch.tensor([[0, 1], [1, 2]]))
    got = group_expansions(model, xs, bs, target=0, order=2, feature_mask=masks,
                           additional_forward_args=scale)
    want = group_expansions(model, xs, bs, target=0, order=2, groups=groups,
                            additional_forward_args=scale)
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    with pytest.raises(ValueError, match="feature_mask"):
        group_expansions(model, xs, bs, target=0, order=2, feature_mask=masks, groups=groups,
                         additional_forward_args=scale)


def test_deeplift_shap_at_a_layer_is_deeplift_shap_of_the_rest():
    """layer= reaches DeepLiftShap's DeepLIFT passes (it used to run the whole model on the
    layer's activations): with references in the layer's space it equals DeepLiftShap of
    the layers after it, on the layer's activations."""
    from taylorattr.methods import DeepLiftShap

    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(4, 5), nn.Sigmoid(), nn.Linear(5, 3), nn.Sigmoid(),
                      nn.Linear(3, 2)).double().eval()
    x, refs = torch.rand(2, 4, dtype=torch.float64), torch.rand(3, 5, dtype=torch.float64)
    at_layer = DeepLiftShap(m).attribute(x, refs, target=1, layer=m[1])
    with torch.no_grad():
        h = m[:2](x)
    rest = DeepLiftShap(m[2:]).attribute(h, refs, target=1)
    torch.testing.assert_close(at_layer, rest, rtol=1e-10, atol=1e-12)
