"""Issue 27: ``taylorattr.captum`` side by side with Captum on the same models and inputs,
float64, the same draws where they sample (global seeds set alike before each call).

Where both are deterministic they agree to 1e-10, except where Captum computes in float32
(its Integrated Gradients step sizes, its Occlusion window weights and Shapley sums): there
a float64 hand computation decides (1e-10) and Captum agrees to its float32 rounding.
"""
from __future__ import annotations

import itertools
import math
import warnings

import numpy as np
import pytest
import torch
from _builders import DT
from captum import attr as C
from torch import nn

from taylorattr.captum import attr as T

EXACT = {"rtol": 0.0, "atol": 1e-10}
FLOAT32 = {"rtol": 1e-6, "atol": 1e-7}  # Captum's own float32 arithmetic


@pytest.fixture(autouse=True)
def _quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.l1, self.r, self.l2 = nn.Linear(5, 6), nn.ReLU(), nn.Linear(6, 3)

    def forward(self, x):
        return self.l2(self.r(self.l1(x)))


class CNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv, self.r1, self.pool = nn.Conv2d(2, 3, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(2)
        self.fc, self.r2, self.out = nn.Linear(12, 4), nn.ReLU(), nn.Linear(4, 3)

    def forward(self, x):
        return self.out(self.r2(self.fc(self.pool(self.r1(self.conv(x))).flatten(1))))


class TwoInputs(nn.Module):
    """x [B, 4], y [B, 3] and a per-sample scale [B, 1] as an additional argument."""

    def __init__(self):
        super().__init__()
        self.a, self.b, self.t = nn.Linear(4, 3), nn.Linear(3, 3), nn.Tanh()

    def forward(self, x, y, scale):
        return self.t(self.a(x) + self.b(y)) * scale


def _setup():
    """The shared models and inputs, drawn on the CPU (the same numbers on every device: a
    CUDA generator draws others from the seed) and moved to the default device."""
    torch.manual_seed(0)
    with torch.device("cpu"):
        mlp, cnn, two = MLP().to(DT).eval(), CNN().to(DT).eval(), TwoInputs().to(DT).eval()
        v = torch.randn(3, 5, dtype=DT)
        refs = torch.randn(4, 5, dtype=DT) * 0.1
        img = torch.randn(3, 2, 5, 5, dtype=DT)
        pair = (torch.randn(3, 4, dtype=DT), torch.randn(3, 3, dtype=DT))
        scale = torch.rand(3, 1, dtype=DT) + 0.5
    at = torch.get_default_device()
    return (mlp.to(at), cnn.to(at), two.to(at), v.to(at), refs.to(at), img.to(at),
            tuple(p.to(at) for p in pair), scale.to(at))


MLP_, CNN_, TWO, V, REFS, IMG, PAIR, SCALE = _setup()


def _same_draws(run):
    """``run(T)`` and ``run(C)`` with the global generators seeded alike."""
    out = []
    for module in (T, C):
        torch.manual_seed(7)
        np.random.seed(7)
        out.append(run(module))
    return out


def _close(a, b, tol):
    if isinstance(a, (tuple, list)):
        assert type(a) is type(b) and len(a) == len(b)
        for p, q in zip(a, b):
            _close(p, q, tol)
        return
    assert a.shape == b.shape, (a.shape, b.shape)
    torch.testing.assert_close(a, b.to(a.dtype), **tol)


# (name, call, tolerance) with both libraries deterministic or drawing the same numbers
CASES = [
    ("Saliency", lambda M: M.Saliency(CNN_).attribute(IMG, target=2), EXACT),
    ("Saliency abs=False", lambda M: M.Saliency(CNN_).attribute(IMG, target=2, abs=False), EXACT),
    ("Saliency tuple + args", lambda M: M.Saliency(TWO).attribute(
        PAIR, target=1, additional_forward_args=SCALE), EXACT),
    ("InputXGradient", lambda M: M.InputXGradient(CNN_).attribute(IMG, target=[0, 1, 2]), EXACT),
    ("LayerGradientXActivation", lambda M: M.LayerGradientXActivation(CNN_, CNN_.fc).attribute(
        IMG, target=2), EXACT),
    ("LayerGradientXActivation multiply_by_inputs=False", lambda M: M.LayerGradientXActivation(
        CNN_, CNN_.fc, multiply_by_inputs=False).attribute(IMG, target=2), EXACT),
    ("GuidedBackprop", lambda M: M.GuidedBackprop(CNN_).attribute(IMG, target=1), EXACT),
    ("Deconvolution", lambda M: M.Deconvolution(CNN_).attribute(IMG, target=1), EXACT),
    ("LayerGradCam", lambda M: M.LayerGradCam(CNN_, CNN_.conv).attribute(IMG, target=2), EXACT),
    ("LayerGradCam relu, per channel, layer input", lambda M: M.LayerGradCam(
        CNN_, CNN_.r1).attribute(IMG, target=0, relu_attributions=True, attr_dim_summation=False,
                                 attribute_to_layer_input=True), EXACT),
    ("LayerGradCam on a layer without spatial dims", lambda M: M.LayerGradCam(
        CNN_, CNN_.fc).attribute(IMG, target=2), EXACT),
    ("GuidedGradCam", lambda M: M.GuidedGradCam(CNN_, CNN_.conv).attribute(IMG, target=2), EXACT),
    ("DeepLift", lambda M: M.DeepLift(MLP_).attribute(V, REFS[:1], target=1), EXACT),
    ("DeepLift delta", lambda M: M.DeepLift(MLP_).attribute(
        V, REFS[:1], target=1, return_convergence_delta=True), EXACT),
    ("LayerDeepLift", lambda M: M.LayerDeepLift(MLP_, MLP_.l1).attribute(V, REFS[:1], target=1),
     EXACT),
    ("DeepLiftShap + delta [B*N]", lambda M: M.DeepLiftShap(MLP_).attribute(
        V, REFS, target=1, return_convergence_delta=True), EXACT),
    ("DeepLift multipliers (multiply_by_inputs=False)", lambda M: M.DeepLift(
        MLP_, multiply_by_inputs=False).attribute(V, REFS[:1], target=1), EXACT),
    ("DeepLift custom_attribution_func + delta", lambda M: M.DeepLift(MLP_).attribute(
        V, REFS[:1], target=1, return_convergence_delta=True,
        custom_attribution_func=lambda m, x, b: (m[0] * (x[0] - b[0]) ** 2,)), EXACT),
    ("LayerDeepLift custom_attribution_func", lambda M: M.LayerDeepLift(MLP_, MLP_.l1).attribute(
        V, REFS[:1], target=2, custom_attribution_func=lambda m, x: (m[0] * x[0],)), EXACT),
    ("DeepLiftShap multipliers", lambda M: M.DeepLiftShap(MLP_, multiply_by_inputs=False)
     .attribute(V, REFS, target=0), EXACT),
    ("DeepLiftShap custom_attribution_func + delta", lambda M: M.DeepLiftShap(MLP_).attribute(
        V, REFS, target=0, return_convergence_delta=True,
        custom_attribution_func=lambda m: (m[0] * 2,)), EXACT),
    ("LayerDeepLiftShap", lambda M: M.LayerDeepLiftShap(MLP_, MLP_.l1).attribute(
        V, REFS, target=1), EXACT),
    ("GradientShap + delta [B*n]", lambda M: M.GradientShap(MLP_).attribute(
        V, REFS, target=1, n_samples=7, stdevs=0.3, return_convergence_delta=True), EXACT),
    ("GradientShap tuple + args", lambda M: M.GradientShap(TWO).attribute(
        PAIR, (PAIR[0][:2] * 0.1, PAIR[1][:2] * 0.1), target=0, n_samples=4, stdevs=0.1,
        additional_forward_args=SCALE), EXACT),
    ("GradientShap multiply_by_inputs=False", lambda M: M.GradientShap(
        MLP_, multiply_by_inputs=False).attribute(V, REFS, target=1, n_samples=5), EXACT),
    ("LayerGradientShap, noisy inputs, a nonlinear layer + delta", lambda M:
     M.LayerGradientShap(MLP_, MLP_.r).attribute(V, REFS, n_samples=3, stdevs=0.2, target=1,
                                                 return_convergence_delta=True), EXACT),
    ("LayerGradientShap", lambda M: M.LayerGradientShap(MLP_, MLP_.l1).attribute(
        V, REFS, target=1, n_samples=6), EXACT),
    ("NoiseTunnel(Saliency) vargrad", lambda M: M.NoiseTunnel(M.Saliency(MLP_)).attribute(
        V, nt_type="vargrad", nt_samples=4, target=1, stdevs=0.2), EXACT),
    ("NoiseTunnel(InputXGradient) tuple + args, batches of 2", lambda M: M.NoiseTunnel(
        M.InputXGradient(TWO)).attribute(PAIR, nt_samples=5, nt_samples_batch_size=2, target=2,
                                         stdevs=0.1, additional_forward_args=SCALE), EXACT),
    ("NoiseTunnel(DeepLift) per-copy delta", lambda M: M.NoiseTunnel(M.DeepLift(MLP_)).attribute(
        V, nt_samples=3, stdevs=0.1, baselines=REFS[:1], target=0,
        return_convergence_delta=True), EXACT),
    ("NoiseTunnel(LayerGradientXActivation) at a layer", lambda M: M.NoiseTunnel(
        M.LayerGradientXActivation(MLP_, MLP_.l1)).attribute(V, nt_samples=3, stdevs=0.2,
                                                              target=2), EXACT),
    ("Lime (Captum's draws and Lasso)", lambda M: M.Lime(MLP_).attribute(
        V, REFS[:1], target=1, n_samples=30, feature_mask=torch.tensor([[0, 0, 1, 1, 2]])),
     FLOAT32),
    ("NeuronGradientShap", lambda M: M.NeuronGradientShap(MLP_, MLP_.l1).attribute(
        V, 2, REFS, n_samples=4, stdevs=0.1), EXACT),
    ("NeuronFeatureAblation", lambda M: M.NeuronFeatureAblation(MLP_, MLP_.r).attribute(V, 3),
     EXACT),
    ("NeuronGradient", lambda M: M.NeuronGradient(CNN_, CNN_.fc).attribute(IMG, 1), EXACT),
    ("NeuronGradient, a selector summing over the batch", lambda M: M.NeuronGradient(
        CNN_, CNN_.fc).attribute(IMG, lambda h: h[:, 1:3].sum()), EXACT),
    ("NeuronDeepLift at a layer input", lambda M: M.NeuronDeepLift(MLP_, MLP_.l2).attribute(
        V, 3, REFS[:1], attribute_to_neuron_input=True), EXACT),
    ("NeuronDeepLift multipliers", lambda M: M.NeuronDeepLift(
        CNN_, CNN_.fc, multiply_by_inputs=False).attribute(IMG, 2, 0.1), EXACT),
    ("NeuronDeepLiftShap", lambda M: M.NeuronDeepLiftShap(MLP_, MLP_.l2).attribute(
        V, 1, REFS), EXACT),
    ("NeuronGuidedBackprop", lambda M: M.NeuronGuidedBackprop(CNN_, CNN_.fc).attribute(IMG, 1),
     EXACT),
    ("NeuronDeconvolution", lambda M: M.NeuronDeconvolution(CNN_, CNN_.fc).attribute(IMG, 2),
     EXACT),
    ("NeuronIntegratedGradients, slices summed", lambda M: M.NeuronIntegratedGradients(
        CNN_, CNN_.conv).attribute(IMG, (1, slice(0, 2), 2), n_steps=10), FLOAT32),
    ("LayerConductance, tuple inputs + per-sample args + delta", lambda M: M.LayerConductance(
        TWO, TWO.t).attribute(PAIR, (0.1, 0.2), target=1, additional_forward_args=SCALE,
                              n_steps=9, return_convergence_delta=True), EXACT),
    ("LayerConductance + delta", lambda M: M.LayerConductance(CNN_, CNN_.fc).attribute(
        IMG, 0.1, target=1, n_steps=12, return_convergence_delta=True), EXACT),
    ("LayerConductance at a layer input, trapezoid nodes", lambda M: M.LayerConductance(
        CNN_, CNN_.conv).attribute(IMG, target=1, n_steps=7, method="riemann_trapezoid",
                                   attribute_to_layer_input=True), {"rtol": 0, "atol": 1e-8}),
    ("compute_convergence_delta from None (zero)", lambda M: M.IntegratedGradients(
        MLP_).compute_convergence_delta(V * 0.3, None, V, target=2), EXACT),
    ("compute_convergence_delta", lambda M: M.IntegratedGradients(
        TWO).compute_convergence_delta((PAIR[0] * 0.5, PAIR[1]), (0.1, PAIR[1][:1]), PAIR,
                                       target=[0, 2, 1], additional_forward_args=SCALE), EXACT),
    ("FeatureAblation", lambda M: M.FeatureAblation(CNN_).attribute(IMG, target=0), EXACT),
    ("FeatureAblation mask, tuple + args", lambda M: M.FeatureAblation(TWO).attribute(
        PAIR, target=1, additional_forward_args=SCALE,
        feature_mask=(torch.tensor([[0, 0, 1, 2]]), torch.tensor([[2, 3, 3]]))), EXACT),
    ("LayerFeatureAblation", lambda M: M.LayerFeatureAblation(MLP_, MLP_.l1).attribute(
        V, target=0), EXACT),
    ("LayerFeatureAblation at a conv layer (every neuron alone)", lambda M:
     M.LayerFeatureAblation(CNN_, CNN_.r1).attribute(IMG, target=0), EXACT),
    ("LayerFeatureAblation layer_baselines", lambda M: M.LayerFeatureAblation(
        MLP_, MLP_.l1).attribute(V, layer_baselines=0.3, target=0), EXACT),
    ("ShapleyValueSampling (Captum's orders)", lambda M: M.ShapleyValueSampling(MLP_).attribute(
        V, REFS[:1], target=0, n_samples=5), FLOAT32),
    ("NoiseTunnel(FeatureAblation), a mask per sample", lambda M: M.NoiseTunnel(
        M.FeatureAblation(MLP_)).attribute(V, target=0, nt_samples=3, stdevs=0.1, feature_mask=
        torch.tensor([[0, 0, 1, 1, 2], [0, 1, 1, 2, 2], [1, 1, 1, 0, 0]])), EXACT),
    ("LRP + delta f(x) - sum(R)", lambda M: M.LRP(MLP_).attribute(
        V, target=0, return_convergence_delta=True), EXACT),
]


@pytest.mark.parametrize("name", [c[0] for c in CASES])
def test_compat_class_equals_captum(name):
    _, run, tol = next(c for c in CASES if c[0] == name)
    ours, theirs = _same_draws(run)
    _close(ours, theirs, tol)


def _ig_by_hand(model, x, base, target, n):
    """Gauss-Legendre IG, one node at a time, float64 autograd."""
    nodes, weights = np.polynomial.legendre.leggauss(n)
    total = torch.zeros_like(x)
    for a, w in zip(0.5 * (nodes + 1), 0.5 * weights):
        p = (base + float(a) * (x - base)).requires_grad_(True)
        (g,) = torch.autograd.grad(model(p)[:, target].sum(), p)
        total += float(w) * g
    return total


def test_integrated_gradients_against_a_hand_computation_and_captum():
    hand = (IMG - 0.1) * _ig_by_hand(CNN_, IMG, torch.full_like(IMG, 0.1), 1, 8)
    ours, delta = T.IntegratedGradients(CNN_).attribute(IMG, 0.1, target=1, n_steps=8,
                                                        return_convergence_delta=True)
    theirs = C.IntegratedGradients(CNN_).attribute(IMG, 0.1, target=1, n_steps=8)
    torch.testing.assert_close(ours, hand, **EXACT)
    torch.testing.assert_close(ours, theirs, **FLOAT32)  # Captum's float32 step sizes
    assert delta.shape == (3,)
    no_mult = T.IntegratedGradients(CNN_, multiply_by_inputs=False).attribute(
        IMG, 0.1, target=1, n_steps=8)
    torch.testing.assert_close(no_mult, hand / (IMG - 0.1), rtol=1e-9, atol=1e-9)


def test_layer_integrated_gradients_several_layers_and_the_layer_input():
    h_fc = CNN_.pool(CNN_.r1(CNN_.conv(IMG))).flatten(1)
    head = nn.Sequential(CNN_.fc, CNN_.r2, CNN_.out)
    base_h = CNN_.pool(CNN_.r1(CNN_.conv(torch.zeros_like(IMG)))).flatten(1)
    hand = (h_fc - base_h) * _ig_by_hand(head, h_fc, base_h, 2, 10)
    both = T.LayerIntegratedGradients(CNN_, [CNN_.fc, CNN_.out]).attribute(
        IMG, target=2, n_steps=10, attribute_to_layer_input=True)
    assert isinstance(both, list) and len(both) == 2
    torch.testing.assert_close(both[0], hand, **EXACT)
    theirs = C.LayerIntegratedGradients(CNN_, CNN_.fc).attribute(
        IMG, target=2, n_steps=10, attribute_to_layer_input=True)
    torch.testing.assert_close(both[0], theirs, **FLOAT32)
    attrs, deltas = T.LayerIntegratedGradients(CNN_, [CNN_.fc, CNN_.out]).attribute(
        IMG, target=2, n_steps=10, attribute_to_layer_input=True, return_convergence_delta=True)
    assert isinstance(attrs, list) and isinstance(deltas, list)  # Captum's (list, delta) form
    torch.testing.assert_close(attrs[0], hand, **EXACT)
    torch.testing.assert_close(deltas[0], hand.sum(1) - (
        head(h_fc)[:, 2] - head(base_h)[:, 2]), rtol=0, atol=1e-8)


def _occlusion_by_hand(model, x, window, stride, target):
    """Every window's drop, averaged over the windows covering a feature (Captum's layout)."""
    shape = x.shape[1:]
    starts = [range(0, s * math.ceil((n - w) / s) + 1, s) for n, w, s in zip(shape, window, stride)]
    total, count = torch.zeros_like(x), torch.zeros(shape, dtype=DT)
    fx = model(x)[:, target]
    for corner in itertools.product(*starts):
        idx = tuple(slice(c, c + w) for c, w in zip(corner, window))
        y = x.clone()
        y[(slice(None),) + idx] = 0.0
        drop = fx - model(y)[:, target]
        total[(slice(None),) + idx] += drop.view(-1, *([1] * len(shape)))
        count[idx] += 1
    return total / count


def test_occlusion_against_a_hand_computation_and_captum():
    hand = _occlusion_by_hand(CNN_, IMG, (2, 2, 2), (1, 1, 2), 0)
    ours = T.Occlusion(CNN_).attribute(IMG, sliding_window_shapes=(2, 2, 2), strides=(1, 1, 2),
                                       target=0)
    theirs = C.Occlusion(CNN_).attribute(IMG, sliding_window_shapes=(2, 2, 2),
                                         strides=(1, 1, 2), target=0)
    torch.testing.assert_close(ours, hand, **EXACT)
    torch.testing.assert_close(ours, theirs.to(DT), **FLOAT32)  # Captum divides in float32


def _shapley_by_hand(model, x, base, mask, target):
    """Enumeration of every coalition of the mask's players."""
    players = sorted(set(mask.flatten().tolist()))
    G = len(players)
    phi = torch.zeros(x.shape[0], G, dtype=DT)

    def value(S):
        keep = torch.zeros_like(mask, dtype=torch.bool)
        for p in S:
            keep |= mask == p
        return model(torch.where(keep, x, base))[:, target]

    for i in players:
        others = [p for p in players if p != i]
        for k in range(G):
            for S in itertools.combinations(others, k):
                w = math.factorial(k) * math.factorial(G - k - 1) / math.factorial(G)
                phi[:, i] += w * (value(S + (i,)) - value(S))
    return phi[:, mask.flatten()].view_as(x)


def test_shapley_values_against_an_enumeration_and_captum():
    mask = torch.tensor([[0, 0, 1, 2, 2]])
    hand = _shapley_by_hand(MLP_, V, REFS[:1].expand_as(V), mask, 0)
    ours = T.ShapleyValues(MLP_).attribute(V, REFS[:1], target=0, feature_mask=mask)
    theirs = C.ShapleyValues(MLP_).attribute(V, REFS[:1], target=0, feature_mask=mask)
    torch.testing.assert_close(ours, hand, **EXACT)
    torch.testing.assert_close(ours, theirs.to(DT), **FLOAT32)  # Captum sums in float32


def test_kernel_shap_on_an_additive_model_is_the_closed_form_as_in_captum():
    """The draws differ (docs/captum.md); on a linear model every coalition sample gives the exact
    Shapley values (x - b) * w, which both return."""
    lin = nn.Linear(5, 2).to(DT)
    closed = (V - REFS[:1]) * lin.weight[1]
    ours = T.KernelShap(lin).attribute(V, REFS[:1], target=1, n_samples=40)
    theirs = C.KernelShap(lin).attribute(V, REFS[:1], target=1, n_samples=40)
    torch.testing.assert_close(ours, closed, rtol=1e-8, atol=1e-8)
    torch.testing.assert_close(theirs.to(DT), closed, rtol=1e-5, atol=1e-5)
    mask = torch.tensor([[0, 0, 1, 1, 2]])
    groups = T.KernelShap(lin).attribute(V, REFS[:1], target=1, n_samples=40,
                                         feature_mask=mask, return_input_shape=False)
    theirs = C.KernelShap(lin).attribute(V, REFS[:1], target=1, n_samples=40,
                                         feature_mask=mask, return_input_shape=False)
    by_group = torch.stack([closed[:, :2].sum(1), closed[:, 2:4].sum(1), closed[:, 4]], 1)
    assert groups.shape == theirs.shape == (3, 3)
    torch.testing.assert_close(groups, by_group, rtol=1e-8, atol=1e-8)


def test_noise_tunnel_integrated_gradients_per_copy_delta_order():
    """Captum's delta [B * nt_samples], block by block (nt_samples_batch_size) and sample-major;
    each entry is IG's own delta on that noisy copy."""
    def run(M):
        return M.NoiseTunnel(M.IntegratedGradients(MLP_)).attribute(
            V, nt_samples=5, nt_samples_batch_size=2, stdevs=0.2, target=1, n_steps=30,
            return_convergence_delta=True)
    (ours, d_ours), (theirs, d_theirs) = _same_draws(run)
    assert d_ours.shape == d_theirs.shape == (15,)
    torch.testing.assert_close(ours, theirs, **FLOAT32)
    torch.testing.assert_close(d_ours, d_theirs, rtol=1e-5, atol=1e-6)


def test_lrp_delta_has_captums_sign():
    attr, delta = T.LRP(MLP_).attribute(V, target=0, return_convergence_delta=True)
    torch.testing.assert_close(delta, MLP_(V)[:, 0] - attr.sum(1), **EXACT)


# ---- conventions: scalar outputs, 1-D inputs, integer token ids ------------------------
LIN = nn.Linear(5, 3).to(DT)
EMB = nn.Embedding(10, 4).to(DT)


def aggregate(x):
    """One value for the whole batch."""
    return torch.tanh(LIN(x)).sum()


def vector(v):
    """Inputs [B] -> outputs [B]."""
    return torch.sin(v) * 2 + v ** 2


def tokens(ids):
    """Token ids [B, 6] -> 3 logits."""
    return LIN(torch.cat([torch.tanh(EMB(ids)).sum(1), ids[:, :1].to(DT) * 0.1], 1))


IDS = torch.randint(1, 10, (3, 6), generator=torch.Generator().manual_seed(1))
VEC = torch.randn(4, dtype=DT, generator=torch.Generator().manual_seed(2))
IDS_MASK = torch.tensor([[0, 0, 1, 1, 2, 2]])
def ragged(x, sparse):
    """One value for the batch from a dense input and a list of ids of another length."""
    return LIN(x).sum() + (sparse.to(DT) * 0.5).sum()


EMB32 = nn.Embedding(10, 3)


def mixed(ids, x):
    """Token ids with a float32 input (the ids ride as float64 through a method)."""
    return EMB32(ids).sum(1) + x


SPARSE = torch.tensor([1, 7, 2, 4, 5, 3, 6])
CONVENTIONS = {
    "ragged inputs, whole-batch output": (ragged, (V, SPARSE), {}),
    "ids with float32": (mixed, (IDS[:, :2], torch.randn(3, 3)), {"target": 2}),
    "scalar output": (aggregate, V, {}),
    "inputs [B]": (vector, VEC, {}),
    "token ids": (tokens, IDS, {"target": 1}),
}


@pytest.mark.parametrize("case", sorted(CONVENTIONS))
def test_feature_ablation_and_occlusion_conventions_equal_captum(case):
    model, x, kw = CONVENTIONS[case]
    ours = T.FeatureAblation(model).attribute(x, **kw)
    theirs = C.FeatureAblation(model).attribute(x, **kw)
    _close(ours, theirs, EXACT)
    if isinstance(x, tuple):
        return  # Occlusion's windows: the one-tensor cases below
    if x.dim() == 1:  # Captum's Occlusion takes no window for [B] (one feature: ablation)
        ours = T.Occlusion(model).attribute(x, sliding_window_shapes=(), **kw)
    else:
        ours = T.Occlusion(model).attribute(x, sliding_window_shapes=(2,), **kw)
        theirs = C.Occlusion(model).attribute(x, sliding_window_shapes=(2,), **kw)
    _close(ours, theirs.to(ours.dtype), FLOAT32)


@pytest.mark.parametrize("method", ["ShapleyValueSampling", "Lime"])
@pytest.mark.parametrize("case", sorted(CONVENTIONS))
def test_sampled_methods_conventions_equal_captum(case, method):
    """Same draws (Captum's orders / coalitions); Captum's Lasso and sums are float32."""
    model, x, kw = CONVENTIONS[case]
    mask = IDS_MASK if case == "token ids" else None
    if isinstance(x, tuple) and method == "Lime":
        return  # Captum's Lime draws per input differently for tuples; FeatureAblation covers it
    ours, theirs = _same_draws(lambda M: getattr(M, method)(model).attribute(
        x, n_samples=12, feature_mask=mask, **kw))
    if isinstance(ours, tuple):
        theirs = tuple(t.to(o.dtype) for o, t in zip(ours, theirs))
    else:
        theirs = theirs.to(ours.dtype)
    _close(ours, theirs, FLOAT32)


def test_native_lime_on_an_additive_model_is_each_players_own_term():
    """Weighted least squares (the native default) on a linear model: every coalition set
    of full rank gives the exact coefficients (x - b) * w, whatever the similarity weights."""
    from taylorattr.methods import Lime

    lin = nn.Linear(5, 2).to(DT)
    ours = Lime(lin).attribute(V, REFS[:1], target=0, n_samples=40, seed=3)
    torch.testing.assert_close(ours, (V - REFS[:1]) * lin.weight[0], rtol=1e-8, atol=1e-8)


def test_aggregate_output_is_the_drop_of_removing_a_feature_in_every_sample():
    ours = T.FeatureAblation(aggregate).attribute(V)
    hand = torch.stack([aggregate(V) - aggregate(V.index_fill(1, torch.tensor([j]), 0.0))
                        for j in range(5)]).view(1, 5)
    torch.testing.assert_close(ours, hand, **EXACT)


@pytest.mark.parametrize("case", ["inputs [B]", "scalar output", "token ids"])
def test_kernel_shap_conventions_on_additive_games(case):
    """Beside the same draws (below), on additive games (a linear scalar output,
    a separable [B] model, a token model linear in its one-hot groups) every draw gives the
    exact Shapley values, the closed forms here (removal of a player = its own term)."""
    model, x, _ = CONVENTIONS[case]
    if case == "scalar output":
        model = lambda z: LIN(z).sum()
        ours = T.KernelShap(model).attribute(x, n_samples=60)
        hand = (LIN.weight.sum(0) * x.sum(0)).view(1, 5)
    elif case == "inputs [B]":  # two [B] inputs (one player would leave nothing to fit)
        ours = T.KernelShap(lambda a, b: vector(a) + 3 * b).attribute((x, x * 0.5), n_samples=10)
        ours = torch.stack(ours)
        hand = torch.stack([vector(x) - vector(torch.zeros_like(x)), 1.5 * x])
    else:
        w = torch.randn(10, dtype=DT, generator=torch.Generator().manual_seed(3))
        model = lambda ids: w[ids].sum(1, keepdim=True)
        ours = T.KernelShap(model).attribute(x, n_samples=60, feature_mask=IDS_MASK)
        groups = w[x].view(3, 3, 2).sum(2) - w[0] * 2
        hand = groups.repeat_interleave(2, 1)
    torch.testing.assert_close(ours.to(DT), hand, rtol=1e-7, atol=1e-7)


def test_output_beyond_two_dims_with_tuple_targets_equals_captum():
    def cube(x):
        return LIN(x).unsqueeze(2) * torch.tensor([1.0, -2.0], dtype=DT)
    for target in [(2, 1), [(0, 0), (1, 1), (2, 0)]]:
        ours = T.IntegratedGradients(cube).attribute(V, target=target, n_steps=6)
        theirs = C.IntegratedGradients(cube).attribute(V, target=target, n_steps=6)
        torch.testing.assert_close(ours, theirs, **FLOAT32)
        _close(T.FeatureAblation(cube).attribute(V, target=target),
               C.FeatureAblation(cube).attribute(V, target=target), EXACT)


def test_not_offered_options_are_refused_by_name():
    with pytest.raises(TypeError, match="custom_attribution_func must be callable"):
        T.DeepLift(MLP_).attribute(V, custom_attribution_func="square")
    with pytest.raises(NotImplementedError, match="draw_baseline_from_distrib"):
        T.NoiseTunnel(T.IntegratedGradients(MLP_)).attribute(
            V, draw_baseline_from_distrib=True, target=0)
    MLP_.r.rule = T.GammaRule()
    try:
        with pytest.raises(NotImplementedError, match="GammaRule on the ReLU module 'r'"):
            T.LRP(MLP_).attribute(V, target=0)
    finally:
        del MLP_.r.rule


@pytest.mark.parametrize("rules", [
    ("EpsilonRule(1e-3)", "GammaRule()"), ("GammaRule(gamma=1.0)", "Alpha1_Beta0_Rule()"),
    ("Alpha1_Beta0_Rule(set_bias_to_zero=True)", "GammaRule(0.5, set_bias_to_zero=True)"),
    ("IdentityRule()", None)])
def test_lrp_rules_per_layer_equal_captums(rules):
    """Captum's rules set per layer (``module.rule``; None: Captum's default) on a ReLU MLP
    whose first layer keeps its width (the identity rule needs it), side by side in float64."""
    from captum.attr._utils import lrp_rules as captum_rules

    torch.manual_seed(3)
    net = nn.Sequential(nn.Linear(5, 5), nn.ReLU(), nn.Linear(5, 3)).to(DT).eval()
    x = torch.randn(4, 5, dtype=DT)
    out = {}
    for M, where in ((T, vars(T)), (C, vars(captum_rules))):
        for layer, rule in zip((net[0], net[2]), rules):
            if rule is not None:
                layer.rule = eval(rule, {}, where)
        out[M] = M.LRP(net).attribute(x, target=1, return_convergence_delta=True)
        for layer in (net[0], net[2]):
            layer.__dict__.pop("rule", None)
    _close(out[T], out[C], EXACT)


@pytest.mark.parametrize("rules", [
    ("EpsilonRule(1e-3)", "GammaRule()"), ("GammaRule(gamma=1.0)", "Alpha1_Beta0_Rule()"),
    ("Alpha1_Beta0_Rule(set_bias_to_zero=True)", "GammaRule(0.5, set_bias_to_zero=True)"),
    ("IdentityRule()", "EpsilonRule(0.5)")])
def test_captums_own_rule_objects_are_read_with_their_parameters(rules):
    """The drop-in reads the rule objects of Captum itself (``captum.attr._utils.lrp_rules``)
    set on the layers: the same relevance and delta as Captum's LRP with those very objects
    (set again before Captum's call, which removes them)."""
    from captum.attr._utils import lrp_rules as captum_rules

    torch.manual_seed(3)
    net = nn.Sequential(nn.Linear(5, 5), nn.ReLU(), nn.Linear(5, 3)).to(DT).eval()
    x = torch.randn(4, 5, dtype=DT)
    out = {}
    for M in (T, C):
        for layer, rule in zip((net[0], net[2]), rules):
            layer.rule = eval(rule, {}, vars(captum_rules))
        out[M] = M.LRP(net).attribute(x, target=1, return_convergence_delta=True)
        for layer in (net[0], net[2]):
            layer.__dict__.pop("rule", None)
    _close(out[T], out[C], EXACT)


def test_rules_left_by_a_failed_captum_call_are_read_and_others_refused():
    """Captum's LRP attaches its default EpsilonRule to each layer before it meets one it has
    no rule for (here Flatten), and raises without removing them: the drop-in then reads
    them as Captum's default, the relevance of the model without rules. A rule object of
    another kind, a subclass of Captum's included, is refused naming the module and what to
    set."""
    from captum.attr._utils import lrp_rules as captum_rules

    torch.manual_seed(5)
    net = nn.Sequential(nn.Conv2d(1, 2, 3), nn.ReLU(), nn.Flatten(), nn.Linear(8, 2)).to(DT)
    x = torch.randn(2, 1, 4, 4, dtype=DT)
    clean = T.LRP(net).attribute(x, target=1)
    with pytest.raises(TypeError, match="no rule defined"):
        C.LRP(net).attribute(x, target=1)
    assert type(net[0].rule) is captum_rules.EpsilonRule  # left by Captum
    torch.testing.assert_close(T.LRP(net).attribute(x, target=1), clean, **EXACT)

    class Custom(captum_rules.EpsilonRule):
        pass

    net[0].rule = Custom()
    with pytest.raises(TypeError, match=r"rule of module '0' must be .*Custom.*del module.rule"):
        T.LRP(net)
    for m in net:
        m.__dict__.pop("rule", None)


def test_layer_lrp_equals_captums_with_rules_per_layer_and_several_layers():
    """(Captum's LRP removes the rules it read after a call; they are set before each.)"""
    from captum.attr._utils import lrp_rules as captum_rules

    torch.manual_seed(8)
    net = nn.Sequential(nn.Linear(5, 4), nn.ReLU(), nn.Linear(4, 3)).to(DT).eval()
    x = torch.randn(3, 5, dtype=DT)

    def with_rules(where, call):
        net[0].rule = where["GammaRule"](gamma=0.5)
        net[2].rule = where["EpsilonRule"](epsilon=1e-6)
        try:
            return call()
        finally:
            for m in (net[0], net[2]):
                m.__dict__.pop("rule", None)

    for M, where in ((T, vars(T)), (C, vars(captum_rules))):
        one = with_rules(where, lambda M=M: M.LayerLRP(net, net[2]).attribute(
            x, target=2, return_convergence_delta=True))
        both = with_rules(where, lambda M=M: M.LayerLRP(net, [net[0], net[2]]).attribute(
            x, target=1, attribute_to_layer_input=True, return_convergence_delta=True))
        if M is T:
            ours = (one, both)
    _close(ours, (one, both), EXACT)


def test_lrp_identity_rule_by_hand():
    """The identity rule passes a layer's relevance unchanged: relevance at the input is the
    epsilon rule's relevance at the second layer's input (a float64 hand computation), with
    the stabiliser's sign that of the output (Captum's ``z + 1e-9 sign(z)``): outputs of
    both signs (the top layer negated for the second)."""
    torch.manual_seed(4)
    with torch.device("cpu"):  # the same net on every device (the CPU's draws), then moved
        net = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2)).to(DT).eval()
        x = torch.randn(3, 4, dtype=DT)
    net, x = net.to(torch.get_default_device()), x.to(torch.get_default_device())
    for sign in (1.0, -1.0):
        with torch.no_grad():
            net[2].weight.mul_(sign)
            net[2].bias.mul_(sign)
        net[0].rule = T.IdentityRule()
        try:
            ours = T.LRP(net).attribute(x, target=0)
        finally:
            del net[0].rule
        h = net[1](net[0](x))
        z = net[2](h)[:, :1]
        assert bool((z * sign > 0).any())  # this sign is met
        s = z + 1e-9 * torch.where(z >= 0, 1.0, -1.0)  # epsilon rule, relevance f(x) at the top
        hand = h * net[2].weight[0] / s * z
        torch.testing.assert_close(ours, hand, **EXACT)


def test_native_layer_rules_equal_captums_rules():
    """The native ``layer_rules`` behind the compatibility class: names of Linear layers to a
    rule name or a rule object; unknown names and non-Linear/Conv modules refused by name."""
    from captum.attr._utils import lrp_rules as captum_rules

    from taylorattr.methods import LRP as NativeLRP
    from taylorattr.methods.layerwise.relevance import LayerEpsilon

    MLP_.l1.rule = captum_rules.GammaRule(gamma=0.5)
    try:
        theirs = C.LRP(MLP_).attribute(V, target=2)
    finally:
        MLP_.l1.__dict__.pop("rule", None)  # Captum removes the rules it reads
    gamma = LayerEpsilon(1e-9, weight=lambda w: w + 0.5 * w.clamp(min=0))
    ours = NativeLRP(MLP_, rule="epsilon", epsilon=1e-9,
                     layer_rules={"l1": gamma}).attribute(V, target=2)
    torch.testing.assert_close(ours, theirs, **EXACT)
    with pytest.raises(ValueError, match="'nope', which is not a module"):
        NativeLRP(MLP_, layer_rules={"nope": "flat"})
    with pytest.raises(ValueError, match=r"layer_rules\['r'\]: rules are set on Linear/Conv"):
        NativeLRP(MLP_, layer_rules={"r": "flat"})
    with pytest.raises(ValueError, match=r"layer_rules\['l1'\] must be one of"):
        NativeLRP(MLP_, layer_rules={"l1": "sideways"})


def test_progress_bars_carry_captums_label(capsys):
    T.FeatureAblation(MLP_).attribute(V, target=0, show_progress=True)
    T.ShapleyValues(MLP_).attribute(V[:1], target=0, show_progress=True)
    err = capsys.readouterr().err
    assert "Feature Ablation attribution: 100%" in err
    assert "Shapley Values attribution: 100%" in err


def test_output_with_singleton_axes_reads_as_captums():
    """A per-sample output ``[B, C, 1, 1]`` (e.g. a final pooling): an int target picks
    ``output[:, t]`` as Captum does; no target is the argmax column, as for ``[B, C]``."""
    torch.manual_seed(5)
    pool = nn.Sequential(nn.Conv2d(2, 3, 3), nn.ReLU(), nn.MaxPool2d(3)).to(DT).eval()
    x = torch.randn(2, 2, 5, 5, dtype=DT)
    for cls in ("LRP", "DeepLift", "Saliency", "FeatureAblation"):
        ours = getattr(T, cls)(pool).attribute(x, target=1)
        theirs = getattr(C, cls)(pool).attribute(x, target=1)
        _close(ours, theirs, EXACT)
    flat = nn.Sequential(pool, nn.Flatten())
    col = flat(x).argmax(1)
    torch.testing.assert_close(T.Saliency(pool).attribute(x),
                               C.Saliency(flat).attribute(x, target=col), **EXACT)


def test_layers_before_and_at_an_in_place_relu_equal_captums():
    """The layer's output is kept before ``ReLU(inplace=True)`` overwrites it, and a layer's
    input before the layer runs (Captum reads them the same way)."""
    torch.manual_seed(12)
    net = nn.Sequential(nn.Linear(5, 4), nn.ReLU(inplace=True), nn.Linear(4, 3)).to(DT).eval()
    x = torch.randn(3, 5, dtype=DT)
    for run in (lambda M: M.NeuronGradient(net, net[0]).attribute(x, 1),
                lambda M: M.NeuronGradient(net, net[1]).attribute(
                    x, 2, attribute_to_neuron_input=True),
                lambda M: M.LayerGradientXActivation(net, net[0]).attribute(x, target=1),
                lambda M: M.LayerFeatureAblation(net, net[1]).attribute(
                    x, target=0, attribute_to_layer_input=True)):
        _close(run(T), run(C), EXACT)


def test_guided_grad_cam_on_tuple_inputs_equals_captums():
    """Two images: the layer's map upsampled to each; an input without spatial axes gets an
    empty tensor and a warning, as Captum gives it."""

    class Pair(nn.Module):
        def __init__(self):
            super().__init__()
            self.net = CNN_

        def forward(self, a, b):  # b: a second image, or a vector [B, 4]
            if b.dim() == 4:
                return self.net(a + 0.5 * b)
            return self.net(a) + b.sum(1, keepdim=True)

    pair = Pair().eval()
    b = torch.randn(3, 2, 5, 5, dtype=DT, generator=torch.Generator().manual_seed(13))
    vec = torch.randn(3, 4, dtype=DT)
    ours, theirs = (M.GuidedGradCam(pair, CNN_.conv).attribute((IMG, b), target=1)
                    for M in (T, C))
    _close(ours, theirs, EXACT)
    with pytest.warns(UserWarning, match=r"inputs\[1\]"):
        ours = T.GuidedGradCam(pair, CNN_.conv).attribute((IMG, vec), target=0)
    theirs = C.GuidedGradCam(pair, CNN_.conv).attribute((IMG, vec), target=0)
    _close(ours[0], theirs[0], EXACT)
    assert ours[1].numel() == theirs[1].numel() == 0


def test_neuron_selector_with_fewer_indices_sums_the_axes_left():
    """(1, 0) on a [B, 3, 2, 2] layer is the sum of neurons (1, 0, 0) and (1, 0, 1): DeepLIFT
    is additive over summed outputs. Captum refuses the partial index where more than one
    value is left, and gives the two full ones."""
    part = T.NeuronDeepLift(CNN_, CNN_.pool).attribute(IMG, (1, 0), 0.1)
    full = sum(C.NeuronDeepLift(CNN_, CNN_.pool).attribute(IMG, (1, 0, j), 0.1) for j in (0, 1))
    torch.testing.assert_close(part, full, **EXACT)


def test_layer_attribution_interpolate_is_captums():
    m = torch.randn(2, 1, 3, 3, dtype=DT)
    torch.testing.assert_close(T.LayerAttribution.interpolate(m, (6, 6)),
                               C.LayerAttribution.interpolate(m, (6, 6)), **EXACT)


def test_grad_cam_warns_at_a_stem_and_refuses_to_upsample_a_map_without_spatial_dims():
    from taylorattr.methods import GradCAM

    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        GradCAM(CNN_).attribute(IMG, target=0, conv_layer=CNN_.conv)
    assert any("stem or patch embedding" in str(w.message) for w in seen)
    with pytest.raises(ValueError, match="upsample=False"):
        GradCAM(CNN_).attribute(IMG, target=0, conv_layer=CNN_.fc)
    flat = GradCAM(CNN_).attribute(IMG, target=0, conv_layer=CNN_.fc, upsample=False)
    h = CNN_.pool(CNN_.r1(CNN_.conv(IMG))).flatten(1).requires_grad_(True)
    a = CNN_.fc(h)
    (g,) = torch.autograd.grad(CNN_.out(CNN_.r2(a))[:, 0].sum(), a)
    torch.testing.assert_close(flat, (g * a).sum(1, keepdim=True), **EXACT)
    # layer= names Grad-CAM's layer (as conv_layer=), at construction or per call
    by_name = GradCAM(CNN_, layer=CNN_.fc).attribute(IMG, target=0, upsample=False)
    torch.testing.assert_close(by_name, flat, **EXACT)
    with pytest.raises(ValueError, match="tuple inputs"):
        GradCAM(TWO).attribute(PAIR, target=0, conv_layer=TWO.a, additional_forward_args=SCALE)


def test_native_several_layers_at_once_equal_captums_list_of_layers():
    from taylorattr.methods import GradientInput

    ours = GradientInput(CNN_).attribute(IMG, target=1, layer=[CNN_.conv, CNN_.fc])
    theirs = C.LayerGradientXActivation(CNN_, [CNN_.conv, CNN_.fc]).attribute(IMG, target=1)
    assert isinstance(ours, list) and len(ours) == 2
    _close(ours, theirs, EXACT)


def test_infidelity_equals_captums_with_the_same_perturbations():
    from captum.metrics import infidelity as captum_infidelity

    from taylorattr.captum.metrics import infidelity

    def perturb(inputs):
        noise = torch.randn_like(inputs) * 0.1
        return noise, inputs - noise

    attr = T.IntegratedGradients(MLP_).attribute(V, target=1, n_steps=8)
    for normalize in (False, True):
        ours, theirs = _same_draws(lambda M, norm=normalize: (
            infidelity if M is T else captum_infidelity)(
            MLP_, perturb, V, attr, target=1, n_perturb_samples=6, normalize=norm))
        torch.testing.assert_close(ours, theirs.to(DT), rtol=1e-6, atol=1e-9)


@pytest.mark.parametrize("batch", [None, 6])
def test_sensitivity_max_equals_captums_with_the_same_draws(batch):
    """Captum's default perturbation and a custom one of one argument, tuple inputs with a
    per-sample additional argument and target, batches of perturbations."""
    from captum.metrics import sensitivity_max as captum_sensitivity_max

    from taylorattr.captum.metrics import sensitivity_max

    for M, sens in ((T, sensitivity_max), (C, captum_sensitivity_max)):
        torch.manual_seed(11)
        one = sens(M.Saliency(MLP_).attribute, V, target=1, n_perturb_samples=5,
                   max_examples_per_batch=batch)
        two = sens(M.IntegratedGradients(TWO).attribute, PAIR,
                   perturb_func=lambda inp: tuple(t * 1.01 + 0.01 for t in inp),
                   target=torch.tensor([0, 2, 1]), additional_forward_args=SCALE,
                   n_perturb_samples=3, max_examples_per_batch=batch, norm_ord=1)
        if M is T:
            ours = (one, two)
    torch.testing.assert_close(ours[0], one.to(DT), rtol=1e-6, atol=1e-9)
    torch.testing.assert_close(ours[1], two.to(DT), rtol=1e-6, atol=1e-9)


def test_infidelity_of_inputs_b_and_of_outputs_beyond_two_dims_equals_captums():
    """Inputs ``[B]`` (one feature per sample, two of them) and a model ``[B, 2, 3]`` with one
    tuple target per sample: the same perturbations give Captum's scores."""
    from captum.metrics import infidelity as captum_infidelity

    from taylorattr.captum.metrics import infidelity

    def perturb(inputs):
        a, b = inputs
        noise = (torch.randn_like(a) * 0.1, torch.randn_like(b) * 0.1)
        return noise, (a - noise[0], b - noise[1])

    def pair(a, b):
        return torch.stack([torch.tanh(a * b), a - b ** 2], 1)

    a, b = V[:, 0].clone(), V[:, 1].clone()
    attr = T.IntegratedGradients(pair).attribute((a, b), target=0, n_steps=8)
    ours, theirs = _same_draws(lambda M: (infidelity if M is T else captum_infidelity)(
        pair, perturb, (a, b), attr, target=0, n_perturb_samples=5))
    torch.testing.assert_close(ours, theirs.to(DT), rtol=1e-6, atol=1e-9)

    def cube(x):
        return MLP_(x).view(-1, 1, 3).expand(-1, 2, 3) * torch.tensor([1.0, -2.0], dtype=DT).view(1, 2, 1)

    def noise(x):
        z = torch.randn_like(x) * 0.1
        return z, x - z

    targets = [(0, 1), (1, 2), (1, 0)]
    attr = C.Saliency(cube).attribute(V, target=targets)
    ours, theirs = _same_draws(lambda M: (infidelity if M is T else captum_infidelity)(
        cube, noise, V, attr, target=targets, n_perturb_samples=4))
    torch.testing.assert_close(ours, theirs.to(DT), rtol=1e-6, atol=1e-9)


@pytest.mark.parametrize("method", ["FeatureAblation", "ShapleyValueSampling"])
def test_scalar_output_of_tuple_inputs_equals_captum(method):
    """A whole-batch output of two inputs, groups shared by the inputs (the same id in both
    is one group, as Captum 0.9 ablates it). Captum's Lime fails on this call (it passes the
    additional arguments wrongly in its whole-batch mode)."""
    def total(x, y, scale):
        return TWO(x, y, scale).sum()

    masks = (torch.tensor([[0, 0, 1, 2]]), torch.tensor([[2, 3, 3]]))
    ours, theirs = _same_draws(lambda M: getattr(M, method)(total).attribute(
        PAIR, additional_forward_args=SCALE, feature_mask=masks,
        **({} if method == "FeatureAblation" else {"n_samples": 6})))
    _close(ours, tuple(t.to(DT) for t in theirs), EXACT if method == "FeatureAblation" else FLOAT32)


@pytest.mark.parametrize("name", ["ShapleyValues", "KernelShap"])
def test_native_shapley_family_takes_token_ids(name):
    """Integer inputs through the native Shapley family: three players of token ids equal
    the Shapley values enumerated by hand over the 8 coalitions (KernelShap with every
    coalition is exact)."""
    import taylorattr.methods as M

    by_hand = _shapley_by_hand(tokens, IDS, torch.zeros_like(IDS), IDS_MASK, 1).to(DT)[:, ::2]
    options = {"method": "exact"} if name == "ShapleyValues" else {"n_samples": 8}
    ours = getattr(M, name)(tokens).attribute(IDS, 0, target=1, feature_mask=IDS_MASK, **options)
    assert ours.dtype.is_floating_point and ours.shape == IDS.shape
    torch.testing.assert_close(ours[:, ::2].to(DT), by_hand, rtol=1e-9, atol=1e-12)


class _Split(nn.Module):
    """A layer returning two tensors and a layer taking two (tuple-valued layers)."""

    def forward(self, a, b):
        return torch.relu(a), torch.tanh(b)


class TupleLayers(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b, self.split, self.out = nn.Linear(5, 4), nn.Linear(5, 3), _Split(), \
            nn.Linear(7, 2)

    def forward(self, x):
        p, q = self.split(self.a(x), self.b(x))
        return self.out(torch.cat([p * q.sum(1, keepdim=True), q], 1))


@pytest.mark.parametrize("cls, kw", [("LayerGradientXActivation", {}),
                                     ("LayerGradCam", {}),
                                     ("LayerFeatureAblation", {}),
                                     ("LayerConductance", {"n_steps": 9}),
                                     ("LayerIntegratedGradients", {"n_steps": 20}),
                                     ("LayerGradientXActivation",
                                      {"attribute_to_layer_input": True}),
                                     ("LayerIntegratedGradients",
                                      {"attribute_to_layer_input": True, "n_steps": 20})])
def test_layers_returning_or_taking_tuples_equal_captums(cls, kw):
    """A layer returning (taking) two tensors: a tuple of attributions, one per tensor."""
    torch.manual_seed(6)
    net = TupleLayers().to(DT).eval()
    x = torch.randn(3, 5, dtype=DT)
    ours, theirs = (getattr(M, cls)(net, net.split).attribute(x, target=1, **kw) for M in (T, C))
    assert isinstance(ours, tuple) and len(ours) == 2
    _close(ours, theirs, FLOAT32 if "Integrated" in cls else EXACT)  # Captum's float32 steps


def test_readme_table_names_every_compatible_class():
    """The docs' "Coming from Captum" table (docs/captum.md) lists every public class of
    taylorattr.captum (base classes aside), so the table of differences stays complete."""
    from pathlib import Path

    from taylorattr.captum import attr, metrics

    text = (Path(__file__).parent.parent / "docs" / "captum.md").read_text()
    table = text.split("# Coming from Captum", 1)[1].split("\n## ", 1)[0]
    bases = {"Attribution", "GradientAttribution", "LayerAttribution", "NeuronAttribution",
             "PerturbationAttribution", "PropagationRule", "default_perturb_func",
             "get_exp_kernel_similarity_function", "InputRole"}  # helpers, not methods
    missing = [n for n in (*attr.__all__, *metrics.__all__) if n not in bases and
               n not in table]
    row = next(line for line in table.splitlines() if "`Neuron*` of" in line)
    missing = [n for n in missing if not (n.startswith("Neuron") and n[len("Neuron"):]
                                          .replace("IntegratedGradients", "IG") in row)]
    assert not missing, missing


@pytest.mark.parametrize("cls", ["FeatureAblation", "Occlusion", "ShapleyValueSampling",
                                 "KernelShap", "Lime", "IntegratedGradients", "DeepLift"])
def test_a_call_leaves_the_models_eval_mode_alone(cls):
    """The wrappers a call puts around the model follow its mode without setting it (a
    wrapper's ``train()`` would have put the user's dropout in training mode)."""
    class Scaled(nn.Module):  # an additional argument: the structured path of the call
        def __init__(self):
            super().__init__()
            self.net = nn.Sequential(nn.Linear(5, 4), nn.Dropout(0.5), nn.Tanh(),
                                     nn.Linear(4, 2))

        def forward(self, x, scale):
            return self.net(x) * scale

    net = Scaled().to(DT).eval()
    kw = {"sliding_window_shapes": (2,)} if cls == "Occlusion" else {}
    for _ in range(2):
        getattr(T, cls)(net).attribute(V, target=1, additional_forward_args=SCALE, **kw)
        assert not any(m.training for m in net.modules())


@pytest.mark.parametrize("cls, kw", [("FeatureAblation", {}), ("ShapleyValues", {}),
                                     ("IntegratedGradients", {"n_steps": 8}),
                                     ("Saliency", {})])
def test_an_input_without_features_beside_others_equals_captum(cls, kw):
    """Captum's empty sparse input: nothing of it is attributed (an empty tensor), the rest
    as without it."""
    def model(x, empty):
        return MLP_(x) + empty.sum(1, keepdim=True)

    empty = torch.zeros(3, 0, dtype=DT)
    ours, theirs = (getattr(M, cls)(model).attribute((V, empty), target=1, **kw) for M in (T, C))
    assert ours[1].shape == (3, 0)
    _close(ours, theirs, EXACT if cls in ("FeatureAblation", "Saliency")
           else FLOAT32)  # Captum's float32 IG steps and Shapley sums
    with pytest.raises(ValueError, match="every input is empty"):
        T.Saliency(model).attribute((V[:, :0], empty), target=1)


def _cube(x):
    """A per-sample output [B, 2, 3] (the tuple-target convention)."""
    return MLP_(x).view(-1, 1, 3) * torch.tensor([1.0, -0.5], dtype=DT).view(1, 2, 1)


@pytest.mark.parametrize("target", [torch.tensor([2]), [0, 2, 1], (1, 2), [(0, 1), (1, 2), (1, 0)]])
def test_targets_of_every_form_through_noise_tunnel_and_layer_grad_cam_equal_captums(target):
    """A one-element tensor (one class for all), a list of classes, a tuple and a list of
    tuples (outputs [B, 2, 3]) reach the tunnel's inner method and Grad-CAM's layer map."""
    model = MLP_ if not isinstance(target, tuple) and not (
        isinstance(target, list) and isinstance(target[0], tuple)) else _cube
    layer = MLP_.l1
    runs = (lambda M: M.NoiseTunnel(M.Saliency(model)).attribute(
                V, nt_samples=3, stdevs=0.1, target=target, abs=False),
            lambda M: M.NoiseTunnel(M.IntegratedGradients(model)).attribute(
                V, nt_samples=2, stdevs=0.1, target=target, n_steps=6),
            lambda M: M.LayerGradCam(model if model is MLP_ else _CubeNet(), layer).attribute(
                V, target=target))
    for run in runs:
        ours, theirs = _same_draws(run)
        _close(ours, theirs, FLOAT32)


class _CubeNet(nn.Module):
    """_cube as a module holding MLP_ (Grad-CAM's layer lives in it)."""

    def __init__(self):
        super().__init__()
        self.mlp = MLP_

    def forward(self, x):
        return _cube(x)


class _Shifted(nn.Module):
    """MLP_ on its input shifted by a per-sample additional argument (before l1, so the
    layer's values at the references depend on the sample)."""

    def __init__(self):
        super().__init__()
        self.mlp = MLP_

    def forward(self, x, shift):
        return self.mlp(x + shift)


def test_layer_deeplift_shap_with_per_sample_arguments_equals_captum():
    """The references' layer values depend on each sample's additional argument: Captum's
    mean over (sample, reference) pairs."""
    net, shift = _Shifted().eval(), torch.randn(3, 5, dtype=DT) * 0.3
    for M in (T, C):
        out = M.LayerDeepLiftShap(net, MLP_.r).attribute(
            V, REFS[:2], target=1, additional_forward_args=(shift,),
            return_convergence_delta=True)
        if M is T:
            ours = out
    _close(ours, out, EXACT)


def test_kernel_shap_draws_captums_coalitions_from_the_global_generator():
    """The same coalitions after the same torch.manual_seed (Captum's fit is float32), one
    call after another, and the global generator left where Captum leaves it."""
    mask = torch.tensor([[0, 0, 1, 2, 2]])
    out = {}
    for M in (T, C):
        torch.manual_seed(21)
        out[M] = (M.KernelShap(MLP_).attribute(V, target=1, n_samples=30),
                  M.KernelShap(MLP_).attribute(V, target=2, n_samples=20, feature_mask=mask,
                                               perturbations_per_eval=4),
                  torch.rand(3))
    _close(out[T], out[C], FLOAT32)


def test_a_list_target_is_read_as_given_never_rounded():
    """One class per sample as a list of ints; floats or bools in it are refused by name
    (they used to be cast to integers)."""
    _close(T.Saliency(MLP_).attribute(V, target=[2, 0, 1]),
           C.Saliency(MLP_).attribute(V, target=[2, 0, 1]), EXACT)
    for bad in ([1.7, 0, 1], [True, 0, 1]):
        with pytest.raises(TypeError, match="target must be a list of ints"):
            T.Saliency(MLP_).attribute(V, target=bad)


@pytest.mark.parametrize("mask", [torch.tensor([0, 1, 1, 2, 2]), torch.tensor(1),
                                  torch.tensor([[0, 0, 1, 1, 1]])])
def test_feature_masks_of_any_broadcastable_shape_equal_captums(mask):
    """One reader of Captum's feature_mask for every method: a mask without the batch axis,
    a 0-d mask (the whole input one feature; Captum's ShapleyValues fails on it) and a
    shared [1, n] mask."""
    for cls in ("FeatureAblation",) + (("ShapleyValues",) if mask.dim() else ()):
        _close(getattr(T, cls)(MLP_).attribute(V, target=1, feature_mask=mask),
               getattr(C, cls)(MLP_).attribute(V, target=1, feature_mask=mask), FLOAT32)


def test_sensitivity_max_with_a_tuple_target_per_sample_equals_captums():
    """A list of tuple targets (outputs [B, 2, 3]) is per-sample: repeated for the copies."""
    from captum.metrics import sensitivity_max as captum_sensitivity_max

    from taylorattr.captum.metrics import sensitivity_max

    targets = [(0, 1), (1, 2), (1, 0)]
    for M, sens in ((T, sensitivity_max), (C, captum_sensitivity_max)):
        torch.manual_seed(31)
        out = sens(M.Saliency(_cube).attribute, V, target=targets, n_perturb_samples=4)
        if M is T:
            ours = out
    torch.testing.assert_close(ours, out.to(DT), rtol=1e-6, atol=1e-9)
