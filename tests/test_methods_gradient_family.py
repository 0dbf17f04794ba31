"""The gradient family of issue 15 (Saliency, Guided Backprop, Grad-CAM, DeepLiftShap,
GradientShap, NoiseTunnel / SmoothGrad), each against Captum on the same inputs and
draws (float64, 1e-5 and much tighter in practice), and the tunnels' and GradientShap's
Taylor reformulations against Integrated Gradients written out here (float64
Gauss-Legendre) at the same noisy inputs on polynomial networks (exact: 1e-10).

Independent routes: Captum's classes (``Saliency``, ``GuidedBackprop``, ``LayerGradCam`` +
``LayerAttribution.interpolate``, ``DeepLiftShap``, ``GradientShap``, ``NoiseTunnel``), fed
Captum's own random draws (its ``torch.normal`` noise and numpy references/positions,
replayed here with the same seeds) or ours (its noise function patched to return them);
float64 autograd for the plain gradient and, with exact Gauss-Legendre quadrature, for
Integrated Gradients on polynomial networks (the reformulations).
"""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from _builders import DT
from _polynomial import poly_net
from captum import attr as C
from conftest import device_tolerance
from torch import nn

import taylorattr as ta
from taylorattr import paper_methods, principles, registry
from taylorattr.baselines import Noise, ReferenceSet
from taylorattr.methods import (
    Deconvolution,
    DeepLiftShap,
    ExpectedGradients,
    GradCAM,
    GradientShap,
    GSDraws,
    GuidedBackprop,
    NoiseTunnel,
    Saliency,
    SmoothGrad,
    SmoothIntegratedGradients,
    UnsupportedModelError,
)
from taylorattr.methods.noise_tunnel import draw_noise
from taylorattr.testing import cudnn_deterministic

TOL = {"rtol": 1e-7, "atol": 1e-9}


def _relu_cnn(inplace: bool = False, seed: int = 0, pool=nn.MaxPool2d) -> nn.Sequential:
    torch.manual_seed(seed)
    return nn.Sequential(
        nn.Conv2d(2, 4, 3, padding=1), nn.ReLU(inplace=inplace), pool(2),
        nn.Conv2d(4, 5, 3), nn.ReLU(), nn.Flatten(), nn.Linear(5 * 2 * 2, 6), nn.ReLU(),
        nn.Linear(6, 3)).to(DT).eval()


def _sigmoid_cnn(seed: int = 0) -> nn.Sequential:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Conv2d(2, 4, 3), nn.Sigmoid(), nn.Conv2d(4, 3, 3), nn.Softplus(),
                         nn.Flatten(), nn.Linear(3 * 4 * 4, 3)).to(DT).eval()


def _gradient_by_hand(model, x, t):
    rows = []
    for b in range(x.shape[0]):
        r = x[b:b + 1].clone().requires_grad_(True)
        (g,) = torch.autograd.grad(model(r)[0, t[b]], r)
        rows.append(g[0])
    return torch.stack(rows)


def _inputs(b=3, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(b, 2, 8, 8, generator=g, dtype=DT)


T = torch.tensor([0, 2, 1])


# ---- Saliency, Guided Backprop ---------------------------------------------------------
@pytest.mark.parametrize("absolute", [True, False])
def test_saliency_equals_captum(absolute):
    model, x = _sigmoid_cnn(), _inputs()
    ours = Saliency(model).attribute(x, target=T, abs=absolute)
    theirs = C.Saliency(model).attribute(x, target=T, abs=absolute)
    torch.testing.assert_close(ours, theirs, **TOL)
    grad = _gradient_by_hand(model, x, T)
    torch.testing.assert_close(ours, grad.abs() if absolute else grad, **TOL)
    with pytest.raises(TypeError, match="abs"):
        Saliency(model).attribute(x, abs=1)


@pytest.mark.parametrize("inplace", [False, True])
def test_guided_backprop_equals_captum_and_the_rule_by_hand(inplace):
    model, x = _relu_cnn(inplace), _inputs()
    ours = GuidedBackprop(model).attribute(x, target=T)
    theirs = C.GuidedBackprop(_relu_cnn(False)).attribute(x, target=T)
    torch.testing.assert_close(ours, theirs, **TOL)
    assert not torch.allclose(ours, Saliency(model).attribute(x, target=T, abs=False))
    # by hand on an MLP: backward through relu = relu(grad * 1[z > 0])
    torch.manual_seed(3)
    l1, l2 = nn.Linear(4, 6).to(DT), nn.Linear(6, 2).to(DT)
    mlp = nn.Sequential(l1, nn.ReLU(), l2)
    v = torch.randn(5, 4, dtype=DT)
    z = v @ l1.weight.T + l1.bias
    hand = ((l2.weight[1] * (z > 0)).clamp(min=0)) @ l1.weight
    torch.testing.assert_close(GuidedBackprop(mlp).attribute(v, target=1), hand, **TOL)


def test_guided_backprop_refuses_functional_relu_and_is_the_gradient_without_relus():
    class Functional(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(4, 2).to(DT)

        def forward(self, x):
            return F.relu(self.lin(x)) + torch.relu(x).sum(1, keepdim=True)

    with pytest.raises(TypeError, match="nn.ReLU modules.*relu"):
        GuidedBackprop(Functional())
    model, x = _sigmoid_cnn(), _inputs()
    torch.testing.assert_close(GuidedBackprop(model).attribute(x, target=T),
                               C.Saliency(model).attribute(x, target=T, abs=False), **TOL)


class _ResidualReLU(nn.Module):
    """A ResNet block's pattern: one in-place ``nn.ReLU`` called twice, around a residual sum."""

    def __init__(self):
        super().__init__()
        self.conv1, self.conv2 = nn.Conv2d(2, 2, 3, padding=1), nn.Conv2d(2, 2, 3, padding=1)
        self.relu = nn.ReLU(inplace=True)
        self.head = nn.Linear(2 * 4 * 4, 3)

    def forward(self, x):
        out = self.conv2(self.relu(self.conv1(x))) + x
        return self.head(self.relu(out).flatten(1))


class _RuleReLU(torch.autograd.Function):
    """relu forward; backward ``relu(grad * 1[z > 0])`` (guided) or ``relu(grad)``."""

    @staticmethod
    def forward(ctx, z, guided):
        ctx.save_for_backward(z)
        ctx.guided = guided
        return z.clamp(min=0)

    @staticmethod
    def backward(ctx, grad):
        (z,) = ctx.saved_tensors
        return (grad * (z > 0) if ctx.guided else grad).clamp(min=0), None


@pytest.mark.parametrize("guided", [True, False], ids=["guided_backprop", "deconvolution"])
def test_modified_relu_rules_through_a_reused_in_place_relu(guided):
    """The rule alone reaches z: a slow re-implementation (the block's two ReLU calls written
    out as non-in-place rule functions, no hooks) and Captum agree. Before: an in-place
    ReLU's own mask ran after Deconvolution's rule (0.81 of the scale off on ResNet-18)."""
    torch.manual_seed(5)
    model = _ResidualReLU().to(DT).eval()
    x = torch.randn(3, 2, 4, 4, dtype=DT)
    xx = x.clone().requires_grad_(True)
    m = model
    h = _RuleReLU.apply(m.conv2(_RuleReLU.apply(m.conv1(xx), guided)) + xx, guided)
    (hand,) = torch.autograd.grad(m.head(h.flatten(1)).gather(1, T[:, None]).sum(), xx)
    ours = (GuidedBackprop if guided else Deconvolution)(model).attribute(x, target=T)
    theirs = (C.GuidedBackprop if guided else C.Deconvolution)(model).attribute(x, target=T)
    torch.testing.assert_close(ours, hand, **TOL)
    torch.testing.assert_close(theirs, hand, **TOL)


def test_the_functional_relu_check_is_traced_once_per_model_until_its_modules_change(monkeypatch):
    """The fx trace behind the check runs once per model (a constructor per batch would
    pay it every time), and again once a module is replaced: a functional ReLU brought in
    by the new module is refused as on the first construction."""
    from taylorattr import _fx
    from taylorattr.methods import guided_backprop as gb

    traces = []
    real = _fx.trace
    monkeypatch.setattr(_fx, "trace", lambda *a, **k: traces.append(1) or real(*a, **k))

    class FunctionalReLU(nn.Module):
        def forward(self, x):
            return F.relu(x)

    model = nn.Sequential(nn.Linear(4, 3).to(DT), nn.ReLU(), nn.Linear(3, 2).to(DT))
    for _ in range(3):
        GuidedBackprop(model)
    assert len(traces) == 1 and gb.functional_relus(model) == []
    model[1] = FunctionalReLU()
    with pytest.raises(TypeError, match="nn.ReLU modules.*relu"):
        GuidedBackprop(model)
    assert len(traces) == 2


# ---- Grad-CAM ----------------------------------------------------------------------------
@pytest.mark.parametrize("relu,mode", [(False, "nearest"), (True, "bilinear")])
def test_grad_cam_equals_captum_layer_grad_cam_interpolated(relu, mode):
    model, x = _relu_cnn(), _inputs()
    for layer, ours_layer in ((model[3], None), (model[0], "0"), (model[4], model[4])):
        ours = GradCAM(model).attribute(x, target=T, conv_layer=ours_layer, relu_attributions=relu,
                                        interpolate_mode=mode)
        cam = C.LayerGradCam(model, layer).attribute(x, target=T, relu_attributions=relu)
        theirs = C.LayerAttribution.interpolate(cam, tuple(x.shape[2:]), interpolate_mode=mode)
        assert ours.shape == x.shape
        torch.testing.assert_close(ours, theirs.expand_as(x), **TOL)
    # the registry's Grad-CAM is the published one (ReLU, bilinear) at the last convolution
    reg = registry.METHODS["grad_cam"].bind()(model, x, 0.0, T)
    cam = C.LayerGradCam(model, model[3]).attribute(x, target=T, relu_attributions=True)
    torch.testing.assert_close(reg, C.LayerAttribution.interpolate(
        cam, (8, 8), interpolate_mode="bilinear").expand_as(x), **TOL)


def test_grad_cam_refuses_models_without_convolutions_and_foreign_layers():
    mlp = nn.Sequential(nn.Flatten(), nn.Linear(128, 3)).to(DT)
    with pytest.raises(UnsupportedModelError, match="layer: Grad-CAM needs a convolution"):
        GradCAM(mlp).attribute(_inputs(), target=T)
    model = _relu_cnn()
    with pytest.raises(ValueError, match="not part of it"):
        GradCAM(model).attribute(_inputs(), target=T, conv_layer=nn.Conv2d(2, 2, 1))
    with pytest.raises(ValueError, match="name a submodule"):
        GradCAM(model).attribute(_inputs(), target=T, conv_layer="nope")
    with pytest.raises(ValueError, match="spatial"):
        GradCAM(model).attribute(_inputs(), target=T, conv_layer=model[6])
    with pytest.raises(ValueError, match="interpolate_mode"):
        GradCAM(model).attribute(_inputs(), target=T, interpolate_mode="cubic")


# ---- DeepLiftShap ----------------------------------------------------------------------
def test_deeplift_shap_equals_captum_and_is_complete():
    """(Average pooling: after a ReLU, Captum's max-pool rule is incomplete and ours differs on
    purpose, see test_layerwise_cnn.py; the noise part below uses max pooling.)"""
    model, x = _relu_cnn(pool=nn.AvgPool2d), _inputs()
    refs = _inputs(5, seed=9) * 0.5
    ours, delta = DeepLiftShap(model).attribute(x, refs, target=T, return_convergence_delta=True,
                                                internal_batch_size=4)
    theirs = C.DeepLiftShap(_relu_cnn(pool=nn.AvgPool2d)).attribute(x, refs, target=T)
    torch.testing.assert_close(ours, theirs, **TOL)
    torch.testing.assert_close(delta, torch.zeros(3, dtype=DT), atol=1e-10, rtol=0)
    torch.testing.assert_close(DeepLiftShap(model).attribute(x, ReferenceSet(refs), target=T),
                               ours, **TOL)
    # noise references: Expected Gradients' draws of the same seed, DeepLIFT to each
    model = _relu_cnn()
    eg = ExpectedGradients.draw(x, Noise(0.3), n_samples=4, seed=5).baselines
    hand = torch.stack([ta.DeepLift(model).attribute(x, eg[:, k], target=T) for k in range(4)])
    torch.testing.assert_close(
        DeepLiftShap(model).attribute(x, target=T, noise_std=0.3, n_samples=4, seed=5),
        hand.mean(0), **TOL)
    with pytest.raises(ValueError, match="exactly one of baselines"):
        DeepLiftShap(model).attribute(x, target=T)


# ---- GradientShap -------------------------------------------------------------------------
def _captum_gradient_shap_draws(x, refs, n, stdev, seed):
    """Captum's draws for GradientShap, replayed: references (np.random.choice), then input
    noise (torch.normal with a float32 std), then positions (np.random.uniform)."""
    b, feat = x.shape[0], tuple(x.shape[1:])
    np.random.seed(seed)
    torch.manual_seed(seed)
    idx = np.random.choice(refs.shape[0], n * b).tolist()
    noise = torch.normal(0, torch.tensor(stdev).repeat((b * n,) + feat))
    alphas = torch.tensor(np.random.uniform(0.0, 1.0, b * n), dtype=DT)
    return GSDraws(noise.to(DT).view((b, n) + feat), refs[idx].view((b, n) + feat),
                   alphas.view(b, n))


def test_gradient_shap_equals_captum_with_the_same_draws():
    model, x = _sigmoid_cnn(), _inputs()
    refs = _inputs(6, seed=4)
    n, stdev, seed = 7, 0.3, 11
    np.random.seed(seed)
    torch.manual_seed(seed)
    theirs = C.GradientShap(model).attribute(x, refs, n_samples=n, stdevs=stdev, target=T)
    draws = _captum_gradient_shap_draws(x, refs, n, stdev, seed)
    ours = GradientShap(model).attribute(x, target=T, draws=draws, internal_batch_size=5)
    torch.testing.assert_close(ours, theirs, **TOL)


@cudnn_deterministic()  # on CUDA, bitwise only with cuDNN's deterministic algorithms
def test_gradient_shap_draws_are_seeded_and_zero_noise_is_expected_gradients():
    model, x = _sigmoid_cnn(), _inputs()
    refs = _inputs(6, seed=4)
    gs = GradientShap(model)
    a = gs.attribute(x, refs, target=T, n_samples=5, stdevs=0.2, seed=3)
    assert torch.equal(a, gs.attribute(x, refs, target=T, n_samples=5, stdevs=0.2, seed=3))
    assert not torch.equal(a, gs.attribute(x, refs, target=T, n_samples=5, stdevs=0.2, seed=4))
    eg = ExpectedGradients(model).attribute(x, refs, target=T, n_samples=5, seed=3)
    torch.testing.assert_close(gs.attribute(x, refs, target=T, n_samples=5, seed=3), eg,
                               **device_tolerance(1e-12, 1e-14))
    # the noise: stdevs * N(0, I) from its own generator, added to the inputs
    d = GradientShap.draw(x, refs, n_samples=5, stdevs=0.2, seed=3)
    assert 0.15 < float(d.noise.std()) < 0.25 and float(d.noise.mean()).__abs__() < 0.05
    with pytest.raises(ValueError, match="stdevs"):
        gs.attribute(x, refs, target=T, stdevs=-1.0)
    with pytest.raises(ValueError, match="draws must hold"):
        gs.attribute(x, target=T, draws=GSDraws(d.noise[:1], d.baselines, d.alphas))


# ---- NoiseTunnel -------------------------------------------------------------------------
@pytest.fixture
def captum_noise(monkeypatch):
    """Make Captum's NoiseTunnel add the noise given to ``use`` (layout [B, n, ...])."""
    state = {}

    def add(inp, stdev, n):
        noise = state["noise"]
        return inp.repeat_interleave(n, dim=0) + noise.reshape((-1,) + tuple(inp.shape[1:]))

    monkeypatch.setattr(C.NoiseTunnel, "_add_noise_to_input", staticmethod(add))
    return state


@pytest.mark.parametrize("nt_type", ["smoothgrad", "smoothgrad_sq", "vargrad"])
def test_smoothgrad_equals_captum_noise_tunnel(nt_type, captum_noise):
    model, x = _sigmoid_cnn(), _inputs()
    n, s, seed = 6, 0.4, 2
    captum_noise["noise"] = draw_noise(x, n, s, seed)
    theirs = C.NoiseTunnel(C.Saliency(model)).attribute(x, nt_type=nt_type, nt_samples=n,
                                                         stdevs=s, target=T)
    ours = SmoothGrad(model).attribute(x, target=T, nt_type=nt_type, nt_samples=n, stdevs=s,
                                       seed=seed, nt_samples_batch_size=4)
    torch.testing.assert_close(ours, theirs, **TOL)
    # the generic tunnel by registry name, and the registry rows, give the same
    generic = NoiseTunnel(model, "saliency").attribute(x, target=T, nt_type=nt_type,
                                                       nt_samples=n, stdevs=s, seed=seed)
    torch.testing.assert_close(generic, theirs, **TOL)
    name = {"smoothgrad": "smoothgrad", "smoothgrad_sq": "smoothgrad_sq",
            "vargrad": "vargrad"}[nt_type]
    row = registry.METHODS[name].bind(nt_samples=n, stdevs=s, seed=seed)
    torch.testing.assert_close(row(model, x, 0.0, T), theirs, **TOL)


def test_noise_tunnel_around_integrated_gradients_equals_captum(captum_noise):
    model, x = _sigmoid_cnn(), _inputs()
    base = _inputs(3, seed=8) * 0.1
    n, s, seed = 4, 0.2, 5
    captum_noise["noise"] = draw_noise(x, n, s, seed)
    theirs = C.NoiseTunnel(C.IntegratedGradients(model)).attribute(
        x, nt_type="smoothgrad", nt_samples=n, stdevs=s, target=T, baselines=base, n_steps=12)
    ours = SmoothIntegratedGradients(model).attribute(x, base, target=T, nt_samples=n, stdevs=s,
                                                      seed=seed, n_steps=12,
                                                      nt_samples_batch_size=3)
    torch.testing.assert_close(ours, theirs, **TOL)


@cudnn_deterministic()  # on CUDA, bitwise only with cuDNN's deterministic algorithms
def test_noise_tunnel_is_bitwise_reproducible_and_validates():
    model, x = _sigmoid_cnn(), _inputs()
    sg = SmoothGrad(model)
    a = sg.attribute(x, target=T, nt_samples=5, stdevs=0.3, seed=1)
    assert torch.equal(a, sg.attribute(x, target=T, nt_samples=5, stdevs=0.3, seed=1))
    assert not torch.equal(a, sg.attribute(x, target=T, nt_samples=5, stdevs=0.3, seed=2))
    with pytest.raises(ValueError, match="nt_type"):
        sg.attribute(x, target=T, nt_type="smooth")
    with pytest.raises(TypeError, match="unexpected keyword"):
        sg.attribute(x, target=T, n_steps=3)
    with pytest.raises(TypeError, match="inner"):
        NoiseTunnel(model)
    with pytest.raises(ValueError, match="inner must be a registered"):
        NoiseTunnel(model, "no_such")
    with pytest.raises(TypeError, match="implicit baseline"):
        NoiseTunnel(model, "saliency").attribute(x, 0.0, target=T)
    # an inner method that draws gets seeds from the tunnel's generator: reproducible
    eg = NoiseTunnel(model, "expected_gradients")
    kw = {"target": T, "nt_samples": 3, "stdevs": 0.1, "seed": 4, "noise_std": 0.2,
          "n_samples": 2}
    assert torch.equal(eg.attribute(x, **kw), eg.attribute(x, **kw))


# ---- Taylor reformulations: exact on polynomial networks ------------------------------------
def _ig_by_hand(model, x, base, n_steps):
    """Integrated Gradients with float64 Gauss-Legendre nodes on [0, 1] (exact for a
    polynomial path integrand of degree < 2 n_steps; Captum casts its weights to float32)."""
    nodes, weights = np.polynomial.legendre.leggauss(n_steps)
    total = torch.zeros_like(x)
    for a, w in zip((nodes + 1) / 2, weights / 2):
        point = (base + float(a) * (x - base)).requires_grad_(True)
        (g,) = torch.autograd.grad(model(point).sum(), point)
        total += float(w) * g
    return (x - base) * total


@pytest.mark.parametrize("nt_type", ["smoothgrad", "vargrad"])
def test_smoothgrad_ig_reformulation_is_exact_on_polynomials(nt_type):
    net = poly_net(4, [0.3, 1.0, -0.5, 0.25], hidden=5, seed=2)  # degree 3
    x = torch.randn(2, 4, dtype=DT, generator=torch.Generator().manual_seed(0))
    base = torch.full((4,), 0.2, dtype=DT)
    n, s, seed, K = 3, 0.3, 7, 3
    reform = ta.reformulate("smoothgrad_ig", net, x, base, order=K, nt_type=nt_type,
                            nt_samples=n, stdevs=s, seed=seed)
    noisy = x[:, None] + draw_noise(x, n, s, seed)
    ig = torch.stack([_ig_by_hand(net, noisy[:, k], base.expand_as(x), 4) for k in range(n)], 1)
    mean, sq = ig.mean(1), (ig * ig).mean(1)
    expect = mean if nt_type == "smoothgrad" else sq - mean * mean
    torch.testing.assert_close(reform, expect, rtol=1e-10, atol=1e-10)
    method = SmoothIntegratedGradients(net).attribute(x, base, nt_type=nt_type, nt_samples=n,
                                                      stdevs=s, seed=seed, n_steps=4)
    torch.testing.assert_close(method, expect, rtol=1e-10, atol=1e-10)


def test_gradient_shap_reformulation_is_exact_on_polynomials():
    net = poly_net(4, [0.3, 1.0, -0.5, 0.25], hidden=5, seed=3)
    x = torch.randn(2, 4, dtype=DT, generator=torch.Generator().manual_seed(1))
    refs = torch.randn(5, 4, dtype=DT, generator=torch.Generator().manual_seed(2))
    kw = {"n_samples": 4, "stdevs": 0.2, "seed": 9}
    reform = ta.reformulate("gradient_shap", net, x, refs, order=3, **kw)
    d = GradientShap.draw(x, refs, **kw)
    noisy = x[:, None] + d.noise
    ig = torch.stack([_ig_by_hand(net, noisy[:, k], d.baselines[:, k], 4) for k in range(4)], 1)
    torch.testing.assert_close(reform, ig.mean(1), rtol=1e-10, atol=1e-10)


# ---- the registry: audit, assessment ------------------------------------------------------
NEW = ["saliency", "guided_backprop", "deeplift_shap", "gradient_shap", "smoothgrad",
       "smoothgrad_sq", "vargrad", "smoothgrad_ig"]


def test_principles_table_runs_for_every_new_method():
    audited = [s.name for s, _ in paper_methods.variants("audit")]
    assert set(NEW) <= set(audited) and "grad_cam" not in audited  # no convolution in probes
    rows = {r["method"]: r for r in principles.principles_table(methods=NEW, seed=0)}
    # completeness (principle 1): DeepLiftShap is complete towards its references; SmoothGrad
    # squared is not even signed like the output change
    assert rows["deeplift_shap"]["score_1"] > 0.99
    assert rows["smoothgrad_sq"]["score_1"] < rows["deeplift_shap"]["score_1"]
    for r in rows.values():
        assert all(0.0 <= r[f"score_{p}"] <= 1.0 for p in (1, 2, 3)) and r["paper_1"] is None


def test_a_tiny_assessment_with_the_new_methods(tmp_path):
    from taylorattr.experiments import assessment as A
    from taylorattr.experiments.workspace import Workspace

    labels = ["GI", "Saliency", "GBP", "SG", "GS", "DLS"]
    ws = Workspace(tmp_path, epochs=0, progress=False)
    r = A.run_assessment(ws, experiments=("infidelity",), n_samples=2, batch_size=2,
                         models={"infidelity": ("m_sg",)}, methods=labels,
                         principle_counts={k: 0.0 for k in labels}, plots=False,
                         method_kwargs={"SG": {"nt_samples": 4}, "GS": {"n_samples": 4},
                                        "DLS": {"n_samples": 4}})
    inf = {row["method"]: row["infidelity"] for row in r.infidelity}
    assert set(inf) == set(labels) and all(np.isfinite(v) for v in inf.values())
    # on the sigmoid MLP there is no ReLU to gate: Guided Backprop is the gradient, whose
    # infidelity (optimal beta) is that of Saliency only where signs agree; GI differs
    assert inf["GBP"] != inf["GI"]
