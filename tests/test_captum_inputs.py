"""Issue 13 acceptance: tuple inputs, additional_forward_args, layers and feature masks
against Captum on the same inputs (and, for Expected Gradients, the same draws), float64."""
from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from _builders import DT
from captum import attr as captum_attr
from torch import nn

from taylorattr.baselines import ReferenceSet
from taylorattr.methods import (
    DeepLift,
    EGDraws,
    ExpectedGradients,
    GradientInput,
    IntegratedGradients,
    Occlusion,
)

TOL = {"rtol": 1e-5, "atol": 1e-7}


class TwoInputs(nn.Module):
    """x [B, 4] through a Linear-Tanh branch, y [B, 2, 5] through a Conv1d-Sigmoid branch."""

    def __init__(self):
        super().__init__()
        self.a, self.ta = nn.Linear(4, 5), nn.Tanh()
        self.b, self.sb = nn.Conv1d(2, 3, 2), nn.Sigmoid()
        self.out = nn.Linear(5 + 12, 3)

    def forward(self, x, y):
        return self.out(torch.cat([self.ta(self.a(x)), self.sb(self.b(y)).flatten(1)], 1))


class Text(nn.Module):
    """Token ids [B, L] -> Embedding -> Linear-Tanh per token, masked mean -> 3 logits."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(12, 4)
        self.proj, self.act = nn.Linear(4, 4), nn.Tanh()
        self.out = nn.Linear(4, 3)

    def forward(self, ids, mask):
        return self.from_embeddings(self.emb(ids), mask)

    def from_embeddings(self, h, mask):
        return self.out((self.act(self.proj(h)) * mask.unsqueeze(-1)).sum(1))


class FromEmbeddings(nn.Module):
    """The text model after its embedding, written out: an independent route for layers."""

    def __init__(self, text):
        super().__init__()
        self.text = text

    def forward(self, h, mask):
        return self.text.from_embeddings(h, mask)


@pytest.fixture(autouse=True)
def _quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


def two_inputs():
    torch.manual_seed(3)
    model = TwoInputs().to(DT).eval()
    x, y = torch.randn(3, 4, dtype=DT), torch.randn(3, 2, 5, dtype=DT)
    bx, by = torch.randn(1, 4, dtype=DT) * 0.1, torch.randn(3, 2, 5, dtype=DT) * 0.1
    return model, (x, y), (bx, by)


def text():
    torch.manual_seed(5)
    model = Text().to(DT).eval()
    ids = torch.randint(1, 12, (3, 6))
    mask = (torch.rand(3, 6) > 0.3).to(DT)
    return model, ids, mask


def close(ours, theirs):
    if isinstance(ours, tuple):
        assert isinstance(theirs, tuple) and len(ours) == len(theirs)
        for a, b in zip(ours, theirs):
            torch.testing.assert_close(a, b.to(DT), **TOL)
    else:
        torch.testing.assert_close(ours, theirs.to(DT), **TOL)


# ---- two inputs ----------------------------------------------------------------------
@pytest.mark.parametrize("chunk", [None, 2])
def test_two_inputs_integrated_gradients(chunk):
    model, xs, bs = two_inputs()
    ours, delta = IntegratedGradients(model).attribute(
        xs, bs, target=2, n_steps=7, method="riemann_middle", internal_batch_size=chunk,
        return_convergence_delta=True)
    theirs, their_delta = captum_attr.IntegratedGradients(model).attribute(
        xs, bs, target=2, n_steps=7, method="riemann_middle", return_convergence_delta=True)
    close(ours, theirs)
    torch.testing.assert_close(delta, their_delta.to(DT), **TOL)


def test_two_inputs_gradient_input_deeplift():
    model, xs, bs = two_inputs()
    close(GradientInput(model).attribute(xs, target=0),
          captum_attr.InputXGradient(model).attribute(xs, target=0))
    close(DeepLift(model).attribute(xs, bs, target=1),
          captum_attr.DeepLift(model).attribute(xs, bs, target=1))


def test_two_inputs_feature_ablation_and_occlusion():
    model, xs, bs = two_inputs()
    masks = (torch.tensor([[0, 0, 1, 2]]), torch.tensor([[[2, 3, 3, 4, 4], [5, 5, 6, 6, 7]]]))
    close(Occlusion(model).attribute(xs, bs, target=1, feature_mask=masks,
                                     perturbations_per_eval=4),
          captum_attr.FeatureAblation(model).attribute(xs, bs, target=1, feature_mask=masks))
    close(Occlusion(model).attribute(xs, (0.3, -0.1), target=1, patch=(2, (1, 2)),
                                     stride=(2, (1, 1))),
          captum_attr.Occlusion(model).attribute(xs, sliding_window_shapes=((2,), (1, 2)),
                                                 strides=(2, (1, 1)), baselines=(0.3, -0.1),
                                                 target=1))


def test_two_inputs_expected_gradients_equals_gradient_shap_on_the_same_draws():
    model, xs, _ = two_inputs()
    refs = (torch.randn(5, 4, dtype=DT), torch.randn(5, 2, 5, dtype=DT))
    n, batch = 4, xs[0].shape[0]
    np.random.seed(11)
    theirs = captum_attr.GradientShap(model).attribute(xs, refs, target=0, n_samples=n)
    # GradientShap draws rows for each input independently (Captum's
    # _expand_and_update_baselines), then the alphas, sample-major
    np.random.seed(11)
    idx = [torch.as_tensor(np.random.choice(r.shape[0], n * batch)) for r in refs]
    alphas = torch.as_tensor(np.random.uniform(0.0, 1.0, n * batch))
    flat = torch.cat([r[i].reshape(n * batch, -1) for r, i in zip(refs, idx)], 1)
    draws = EGDraws(flat.view(batch, n, -1), alphas.view(batch, n))
    close(ExpectedGradients(model).attribute(xs, target=0, draws=draws), theirs)


# ---- text classifier: additional_forward_args and layers --------------------------------
def test_text_layer_integrated_gradients():
    model, ids, mask = text()
    ours = IntegratedGradients(model).attribute(
        ids, 0, target=2, additional_forward_args=(mask,), layer=model.emb, n_steps=9,
        method="riemann_trapezoid", internal_batch_size=4)
    theirs = captum_attr.LayerIntegratedGradients(model, model.emb).attribute(
        ids, torch.zeros_like(ids), target=2, additional_forward_args=(mask,), n_steps=9,
        method="riemann_trapezoid")
    # Captum's trapezoid weights are 1/n (ours the rule's 1/(n-1)): integrated_gradients.py
    close(ours * (8 / 9), theirs)


def test_text_layer_deeplift_and_gradient_x_activation():
    model, ids, mask = text()
    base = torch.randint(1, 12, (3, 6))
    close(DeepLift(model, layer=model.emb).attribute(ids, base, target=1,
                                                     additional_forward_args=mask),
          captum_attr.LayerDeepLift(model, model.emb).attribute(
              ids, base, target=1, additional_forward_args=(mask,)))
    close(DeepLift(model).attribute(ids, base, target=1, additional_forward_args=mask,
                                    layer=model.proj, attribute_to_layer_input=True),
          captum_attr.LayerDeepLift(model, model.proj).attribute(
              ids, base, target=1, additional_forward_args=(mask,),
              attribute_to_layer_input=True))
    close(GradientInput(model).attribute(ids, target=0, additional_forward_args=(mask,),
                                         layer=model.emb),
          captum_attr.LayerGradientXActivation(model, model.emb).attribute(
              ids, target=0, additional_forward_args=(mask,)))


def test_text_layer_occlusion_and_expected_gradients_on_the_embeddings():
    """Layer variants of Occlusion and Expected Gradients against Captum's FeatureAblation and
    GradientShap run on the network after the embedding (an explicit second model)."""
    model, ids, mask = text()
    rest = FromEmbeddings(model).eval()
    h = model.emb(ids).detach()
    tokens = torch.arange(6).view(1, 6, 1).expand(1, 6, 4)  # one group per token
    close(Occlusion(model).attribute(ids, 0, target=2, additional_forward_args=(mask,),
                                     layer=model.emb, feature_mask=tokens),
          captum_attr.FeatureAblation(rest).attribute(
              h, model.emb(torch.zeros_like(ids)).detach(), target=2,
              additional_forward_args=(mask,), feature_mask=tokens))
    refs = torch.randn(5, 6, 4, dtype=DT)
    n, batch = 3, ids.shape[0]
    np.random.seed(2)
    theirs = captum_attr.GradientShap(rest).attribute(h, refs, target=2, n_samples=n,
                                                      additional_forward_args=(mask,))
    np.random.seed(2)
    idx = torch.as_tensor(np.random.choice(refs.shape[0], n * batch))
    alphas = torch.as_tensor(np.random.uniform(0.0, 1.0, n * batch))
    draws = EGDraws(refs[idx].view(batch, n, 6, 4), alphas.view(batch, n))
    close(ExpectedGradients(model).attribute(ids, target=2, additional_forward_args=(mask,),
                                             layer=model.emb, draws=draws), theirs)


def test_text_integrated_gradients_on_the_embeddings_with_a_mask_argument():
    """A float input plus a batch-first mask in additional_forward_args: every method row
    layout (IG step-major in pieces of a step) sees the right sample's mask."""
    model, ids, mask = text()
    rest = FromEmbeddings(model).eval()
    h = model.emb(ids).detach()
    ours = IntegratedGradients(rest).attribute(h, 0.0, target=0, additional_forward_args=mask,
                                               n_steps=5, method="riemann_left",
                                               internal_batch_size=2)
    theirs = captum_attr.IntegratedGradients(rest).attribute(
        h, target=0, additional_forward_args=(mask,), n_steps=5, method="riemann_left")
    close(ours, theirs)
    draws = ExpectedGradients.draw(h, ReferenceSet(torch.randn(4, 6, 4, dtype=DT)), n_samples=3)
    a, d = ExpectedGradients(rest).attribute(h, target=0, additional_forward_args=mask,
                                             draws=draws, return_convergence_delta=True)
    # the delta, sum(a) - (f(x) - mean_k f(x~_k)), recomputed sample by sample with each
    # sample's own mask: the references were run with the right rows of the mask
    with torch.no_grad():
        f_x = rest(h, mask)[:, 0]
        f_ref = torch.stack([rest(draws.baselines[b], mask[b:b + 1].expand(3, -1))[:, 0].mean()
                             for b in range(3)])
    torch.testing.assert_close(d, a.flatten(1).sum(1) - (f_x - f_ref), **TOL)
