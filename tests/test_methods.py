"""The seven attribution methods: equal to Captum, and analytic checks.

Models are small and float64 so that agreement can be asserted far below 1e-5.
"""
from __future__ import annotations

import math
import warnings

import captum.attr as captum_attr
import numpy as np
import pytest
import torch
from _builders import DT
from torch import nn

import taylorattr as ta
from taylorattr.methods import (
    DeepLift,
    EGDraws,
    EpsilonLRP,
    ExpectedGradients,
    GradientInput,
    IntegratedGradients,
    Occlusion,
    UnsupportedModelError,
    global_relevance,
    local_relevance,
)
from taylorattr.methods.expected_gradients import draw
from taylorattr.methods.integrated_gradients import quadrature
from taylorattr.methods.layerwise import denominator, edge_terms
from taylorattr.registry import METHODS
from taylorattr.testing import cudnn_deterministic

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

TOL = {"rtol": 1e-7, "atol": 1e-10}


@pytest.fixture(autouse=True)
def _one_thread():
    """The models here are tiny: a second thread only adds synchronisation, which costs
    tens of milliseconds per operation when the machine's cores are busy."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


# ---------------------------------------------------------------------------------------
# Models
# ---------------------------------------------------------------------------------------
class CNN(nn.Module):
    """Conv-act-avgpool-conv-act-flatten-linear, like C-sg in miniature."""

    def __init__(self, act=nn.Sigmoid, bias=True, c_in=2):
        super().__init__()
        self.conv1 = nn.Conv2d(c_in, 3, 3, bias=bias)
        self.act1 = act()
        self.pool = nn.AvgPool2d(2)
        self.conv2 = nn.Conv2d(3, 4, 2, bias=bias)
        self.act2 = act()
        self.fc = nn.Linear(16, 3, bias=bias)

    def forward(self, x):
        x = self.pool(self.act1(self.conv1(x)))
        x = self.act2(self.conv2(x))
        return self.fc(torch.flatten(x, 1))


def mlp(act=nn.Sigmoid, bias=True, n_in=6):
    return nn.Sequential(nn.Linear(n_in, 8, bias=bias), act(), nn.Linear(8, 5, bias=bias), act(),
                         nn.Linear(5, 3, bias=bias))


class Poly(nn.Module):
    """A polynomial activation declaring itself elementwise."""

    elementwise = True

    def forward(self, x):
        return x + 0.5 * x**2


class PolyUndeclared(nn.Module):
    def forward(self, x):
        return x + 0.5 * x**2


def make(model, seed=0):
    """``model`` with N(0, 0.8^2) weights and N(0, 0.3^2) biases drawn after
    ``torch.manual_seed(seed)`` on the CPU and copied in: the same model on every device (a
    CUDA generator draws other numbers from the same seed)."""
    torch.manual_seed(seed)
    for m in model.modules():
        if isinstance(m, (nn.Linear, nn.Conv2d)):
            for p, std in ((m.weight, 0.8), (m.bias, 0.3)):
                if p is not None:
                    with torch.no_grad():
                        p.copy_(nn.init.normal_(torch.empty(p.shape, device="cpu"), std=std))
    return model.to(DT).eval()


def images(b=3, seed=1, c=2):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(b, c, 8, 8, generator=g, dtype=DT)


def vectors(b=4, n=6, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(b, n, generator=g, dtype=DT)


CASES = {
    "mlp-sigmoid": (lambda: make(mlp(nn.Sigmoid)), vectors),
    "mlp-tanh": (lambda: make(mlp(nn.Tanh)), vectors),
    "mlp-softplus": (lambda: make(mlp(nn.Softplus)), vectors),
    "cnn-sigmoid": (lambda: make(CNN(nn.Sigmoid)), images),
    "cnn-relu": (lambda: make(CNN(nn.ReLU)), images),
}
SMOOTH = ["mlp-sigmoid", "mlp-tanh", "cnn-sigmoid"]


def case(name):
    model_fn, data_fn = CASES[name]
    model, x = model_fn(), data_fn()
    g = torch.Generator().manual_seed(7)
    b = 0.3 * torch.randn(x.shape, generator=g, dtype=DT)
    t = torch.arange(x.shape[0]) % 3
    return model, x, b, t


@pytest.fixture
def captum_lrp_sigmoid(monkeypatch):
    """Let Captum's LRP pass relevance through Sigmoid/Softplus as it does for Tanh."""
    from captum.attr._core import lrp

    monkeypatch.setattr(lrp, "SUPPORTED_NON_LINEAR_LAYERS",
                        list(lrp.SUPPORTED_NON_LINEAR_LAYERS) + [nn.Sigmoid, nn.Softplus])


# ---------------------------------------------------------------------------------------
# Equal to Captum
# ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", list(CASES))
def test_gradient_input_equals_captum(name):
    model, x, _, t = case(name)
    ours = GradientInput(model).attribute(x, target=t)
    theirs = captum_attr.InputXGradient(model).attribute(x, target=t)
    torch.testing.assert_close(ours, theirs, **TOL)


@pytest.mark.parametrize("name", list(CASES))
def test_deeplift_equals_captum(name):
    model, x, b, t = case(name)
    ours = DeepLift(model).attribute(x, b, target=t)
    theirs = captum_attr.DeepLift(model).attribute(x, b, target=t)
    torch.testing.assert_close(ours, theirs, **TOL)


def test_deeplift_equals_captum_float32_where_inputs_equal_baseline():
    # Zero pixels with a zero baseline make |y - y~| = 0 at some neurons: the Rescale
    # multiplier falls back to sigma'(y) there, as in Captum.
    model = make(CNN(nn.Sigmoid)).float()
    x = images().float()
    x[:, :, :4, :4] = 0
    ours = DeepLift(model).attribute(x, 0.0, target=1)
    theirs = captum_attr.DeepLift(model).attribute(x, torch.zeros_like(x), target=1)
    torch.testing.assert_close(ours, theirs, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", list(CASES))
def test_epsilon_lrp_equals_captum(name, captum_lrp_sigmoid):
    model, x, _, t = case(name)
    ours = EpsilonLRP(model).attribute(x, target=t)
    theirs = captum_attr.LRP(model).attribute(x, target=t)
    torch.testing.assert_close(ours, theirs, rtol=1e-7, atol=1e-9)


@pytest.mark.parametrize("method", ["gausslegendre", "riemann_left", "riemann_right",
                                    "riemann_middle", "riemann_trapezoid"])
@pytest.mark.parametrize("name", ["mlp-sigmoid", "cnn-sigmoid"])
def test_integrated_gradients_equals_captum(name, method):
    model, x, b, t = case(name)
    ours = IntegratedGradients(model).attribute(x, b, target=t, n_steps=9, method=method,
                                                internal_batch_size=7)
    theirs = captum_attr.IntegratedGradients(model).attribute(x, b, target=t, n_steps=9,
                                                              method=method)
    if method == "riemann_trapezoid":  # Captum's trapezoid weights sum to (n-1)/n
        theirs = theirs * 9 / 8
    # Captum's Riemann nodes come from a float32 linspace.
    torch.testing.assert_close(ours, theirs, rtol=1e-6, atol=1e-8)


@pytest.mark.parametrize("name", ["mlp-tanh", "cnn-sigmoid"])
def test_expected_gradients_equals_gradient_shap_with_the_same_draws(name):
    model, x, _, t = case(name)
    ref = 0.5 * torch.randn((5,) + tuple(x.shape[1:]), dtype=DT)
    n, batch = 6, x.shape[0]
    np.random.seed(11)
    theirs = captum_attr.GradientShap(model).attribute(x, ref, target=t, n_samples=n)
    np.random.seed(11)  # GradientShap draws the rows, then the alphas, sample-major
    idx = torch.as_tensor(np.random.choice(ref.shape[0], n * batch))
    alphas = torch.as_tensor(np.random.uniform(0.0, 1.0, n * batch))
    draws = EGDraws(ref[idx].view((batch, n) + tuple(x.shape[1:])), alphas.view(batch, n))
    ours = ExpectedGradients(model).attribute(x, target=t, draws=draws, internal_batch_size=5)
    torch.testing.assert_close(ours, theirs, **TOL)


@pytest.mark.parametrize("patch,stride", [(1, None), ((2, 2), None), (3, None), ((3, 2), (2, 1)),
                                          ((4, 4), (1, 3))])
def test_occlusion_equals_captum_on_images(patch, stride):
    model, x, b, t = case("cnn-sigmoid")
    ours = Occlusion(model).attribute(x, b, target=t, patch=patch, stride=stride,
                                      perturbations_per_eval=13)
    p = (patch, patch) if isinstance(patch, int) else patch
    s = p if stride is None else stride
    theirs = captum_attr.Occlusion(model).attribute(
        x, sliding_window_shapes=(x.shape[1],) + p, strides=(x.shape[1],) + s, baselines=b,
        target=t)
    # Captum divides by the window counts in float32 (``.float() / weight``).
    torch.testing.assert_close(ours, theirs.to(DT), rtol=1e-6, atol=1e-9)


def test_occlusion_on_vectors_equals_captum_and_feature_ablation():
    model, x, b, t = case("mlp-sigmoid")
    ours = Occlusion(model).attribute(x, b, target=t)
    torch.testing.assert_close(ours, captum_attr.FeatureAblation(model).attribute(
        x, baselines=b, target=t), **TOL)
    ours = Occlusion(model).attribute(x, 0.2, target=t, patch=3, stride=2)
    theirs = captum_attr.Occlusion(model).attribute(x, sliding_window_shapes=(3,), strides=2,
                                                    baselines=0.2, target=t)
    torch.testing.assert_close(ours, theirs.to(DT), rtol=1e-6, atol=1e-9)


# ---------------------------------------------------------------------------------------
# Analytic checks
# ---------------------------------------------------------------------------------------
def test_integrated_gradients_completeness_on_a_sigmoid_cnn():
    model, x, b, t = case("cnn-sigmoid")
    _, delta = IntegratedGradients(model).attribute(x, b, target=t, n_steps=32,
                                                    return_convergence_delta=True)
    assert delta.abs().max() < 1e-9
    _, delta_riemann = IntegratedGradients(model).attribute(
        x, b, target=t, n_steps=32, method="riemann_right", return_convergence_delta=True)
    assert delta_riemann.abs().max() > 100 * delta.abs().max()


def test_integrated_gradients_gauss_legendre_is_exact_on_a_polynomial_network():
    # Two quadratic activations: f has degree 4, the path integrand degree 3 in alpha, so
    # two Gauss-Legendre nodes integrate it exactly; two midpoints do not.
    model = make(nn.Sequential(nn.Linear(5, 4), Poly(), nn.Linear(4, 3), Poly(), nn.Linear(3, 2)))
    x, b = vectors(n=5), 0.5 * vectors(n=5, seed=3)
    _, delta = IntegratedGradients(model).attribute(x, b, target=1, n_steps=2,
                                                    return_convergence_delta=True)
    assert delta.abs().max() < 1e-12
    _, delta_mid = IntegratedGradients(model).attribute(
        x, b, target=1, n_steps=2, method="riemann_middle", return_convergence_delta=True)
    assert delta_mid.abs().max() > 1e-4


def test_quadrature_rules_integrate_what_they_should():
    for n in (1, 3, 8):
        a, w = quadrature("gausslegendre", n)
        for deg in range(2 * n):
            assert math.isclose(float((w * a**deg).sum()), 1 / (deg + 1), rel_tol=1e-12)
    a, w = quadrature("riemann_trapezoid", 5)
    assert a.device.type == w.device.type == "cpu"  # a table, whatever the default device
    assert torch.allclose(a, torch.linspace(0, 1, 5, dtype=DT, device="cpu"))
    assert torch.allclose(w, torch.tensor([1, 2, 2, 2, 1], dtype=DT, device="cpu") / 8)
    for method in ("riemann_left", "riemann_right", "riemann_middle"):
        a, w = quadrature(method, 4)
        assert math.isclose(float(w.sum()), 1.0) and float(a.min()) >= 0 and float(a.max()) <= 1


def test_gradient_input_equals_epsilon_lrp_on_bias_free_relu_networks():
    for model, x in ((make(mlp(nn.ReLU, bias=False)), vectors()),
                     (make(CNN(nn.ReLU, bias=False)), images())):
        gi = GradientInput(model).attribute(x, target=2)
        lrp = EpsilonLRP(model, epsilon=1e-14).attribute(x, target=2)
        torch.testing.assert_close(lrp, gi, rtol=1e-6, atol=1e-9)
        assert gi.abs().max() > 1e-3


class Separable(nn.Module):
    """f(x) = sum_i c_i sin(x_i) + d_i x_i^2, returned as shape [B]."""

    def __init__(self, n):
        super().__init__()
        g = torch.Generator().manual_seed(5)
        self.c = nn.Parameter(torch.randn(n, generator=g, dtype=DT))
        self.d = nn.Parameter(torch.randn(n, generator=g, dtype=DT))

    def terms(self, x):
        return self.c * torch.sin(x) + self.d * x**2

    def forward(self, x):
        return self.terms(x).sum(1)


def test_occlusion_1_of_an_additively_separable_function_is_its_closed_form():
    model, x = Separable(6), vectors()
    b = 0.4 * vectors(seed=9)
    with torch.no_grad():
        expected = model.terms(x) - model.terms(b)
    ours = Occlusion(model).attribute(x, b)
    torch.testing.assert_close(ours, expected, **TOL)
    assert METHODS["occlusion_1"](model, x, baselines=b).equal(ours)


def test_occlusion_patch_gives_every_pixel_of_a_patch_its_output_drop():
    model, x, _, _ = case("cnn-sigmoid")
    attr = Occlusion(model).attribute(x, -0.5, target=2, patch=(2, 4))
    with torch.no_grad():
        fx = model(x)[:, 2]
        for i, j in ((0, 0), (2, 4), (6, 0)):
            occluded = x.clone()
            occluded[:, :, i:i + 2, j:j + 4] = -0.5
            drop = fx - model(occluded)[:, 2]
            block = attr[:, :, i:i + 2, j:j + 4]
            torch.testing.assert_close(block, drop.view(-1, 1, 1, 1).expand_as(block), **TOL)


def test_occlusion_overlapping_windows_average_their_drops():
    model = Separable(5)
    x = vectors(b=2, n=5)
    attr = Occlusion(model).attribute(x, 0.0, patch=2, stride=1)
    with torch.no_grad():
        fx = model(x)
        drops = []
        for s in range(4):
            occ = x.clone()
            occ[:, s:s + 2] = 0
            drops.append(fx - model(occ))
    # feature 0: window 0 only; feature 2: windows 1 and 2
    torch.testing.assert_close(attr[:, 0], drops[0], **TOL)
    torch.testing.assert_close(attr[:, 2], (drops[1] + drops[2]) / 2, **TOL)


@pytest.mark.parametrize("name", list(CASES))
def test_deeplift_is_complete(name):
    model, x, b, t = case(name)
    attr, delta = DeepLift(model).attribute(x, b, target=t, return_convergence_delta=True)
    with torch.no_grad():
        df = model(x).gather(1, t[:, None])[:, 0] - model(b).gather(1, t[:, None])[:, 0]
    torch.testing.assert_close(attr.flatten(1).sum(1), df, **TOL)
    assert delta.abs().max() < 1e-12


class Residual(nn.Module):
    """Branches, a polynomial activation, a Tanh module used twice, and (optionally)
    activations called as functions instead of modules."""

    def __init__(self, functional):
        super().__init__()
        self.functional = functional
        self.lin1, self.lin2, self.out = nn.Linear(6, 6), nn.Linear(6, 6), nn.Linear(6, 2)
        self.sig, self.tanh, self.poly = nn.Sigmoid(), nn.Tanh(), Poly()

    def forward(self, x):
        if self.functional:
            h = x + torch.tanh(torch.sigmoid(self.lin1(x)))
        else:
            h = x + self.tanh(self.sig(self.lin1(x)))
        h = h - 0.5 * self.poly(self.lin2(h))
        return self.out(self.tanh(h))


def test_deeplift_handles_branches_functional_activations_and_reused_modules():
    x, b = vectors(), 0.3 * vectors(seed=4)
    modules = make(Residual(functional=False))
    functional = make(Residual(functional=True))
    attr, delta = DeepLift(modules).attribute(x, b, target=1, return_convergence_delta=True)
    assert delta.abs().max() < 1e-12
    torch.testing.assert_close(DeepLift(functional).attribute(x, b, target=1), attr, **TOL)
    # Captum silently uses the plain gradient for the functional calls (its #1082/#1085).
    theirs = captum_attr.DeepLift(functional).attribute(x, b, target=1)
    assert not torch.allclose(theirs, attr, rtol=1e-4, atol=1e-6)


class LeakyFunctional(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin1, self.lin2 = nn.Linear(6, 5), nn.Linear(5, 3)

    def forward(self, x):
        return self.lin2(torch.nn.functional.leaky_relu(self.lin1(x), 0.1))


def test_functional_activations_with_arguments_equal_their_modules():
    x, b = vectors(), 0.3 * vectors(seed=4)
    functional = make(LeakyFunctional())
    modules = make(nn.Sequential(nn.Linear(6, 5), nn.LeakyReLU(0.1), nn.Linear(5, 3)))
    for p, q in zip(functional.parameters(), modules.parameters()):
        q.data.copy_(p.data)
    theirs = captum_attr.DeepLift(modules).attribute(x, b, target=2)
    torch.testing.assert_close(DeepLift(functional).attribute(x, b, target=2), theirs, **TOL)
    torch.testing.assert_close(EpsilonLRP(functional).attribute(x, target=2),
                               EpsilonLRP(modules).attribute(x, target=2), **TOL)


def test_layerwise_models_are_retraced_when_a_submodule_is_replaced():
    model, x, b, t = case("mlp-sigmoid")
    dl = DeepLift(model)
    before = dl.attribute(x, b, target=t)
    model[1] = nn.Tanh()
    after = dl.attribute(x, b, target=t)
    torch.testing.assert_close(after, captum_attr.DeepLift(model).attribute(x, b, target=t),
                               **TOL)
    assert not torch.allclose(before, after)


@cudnn_deterministic()  # on CUDA, bitwise only with cuDNN's deterministic algorithms
def test_expected_gradients_is_bitwise_deterministic_per_seed():
    model, x, _, t = case("cnn-sigmoid")
    ref = torch.randn((7,) + tuple(x.shape[1:]), dtype=DT)
    eg = ExpectedGradients(model)
    a = eg.attribute(x, ref, target=t, n_samples=8, seed=3)
    assert torch.equal(a, eg.attribute(x, ref, target=t, n_samples=8, seed=3))
    torch.testing.assert_close(a, eg.attribute(x, ref, target=t, n_samples=8, seed=3,
                                               internal_batch_size=5), **TOL)
    assert not torch.allclose(a, eg.attribute(x, ref, target=t, n_samples=8, seed=4))
    n1 = eg.attribute(x, target=t, n_samples=8, noise_std=0.2, seed=3)
    assert torch.equal(n1, eg.attribute(x, target=t, n_samples=8, noise_std=0.2, seed=3))
    assert not torch.allclose(n1, eg.attribute(x, target=t, n_samples=8, noise_std=0.2, seed=5))
    d = draw(x, noise_std=0.2, n_samples=8, seed=3)
    assert torch.equal(d.baselines, ExpectedGradients.draw(x, None, 8, 0.2, 3).baselines)
    assert d.baselines.shape == (x.shape[0], 8) + tuple(x.shape[1:])
    assert ((d.alphas >= 0) & (d.alphas < 1)).all()
    assert torch.equal(n1, eg.attribute(x, target=t, draws=d))


def test_expected_gradients_with_one_reference_row_is_a_single_point_ig_estimate():
    model, x, b, t = case("mlp-sigmoid")
    ref = b[:1]
    attr, delta = ExpectedGradients(model).attribute(x, ref, target=t, n_samples=400,
                                                     return_convergence_delta=True)
    ig = IntegratedGradients(model).attribute(x, ref, target=t, n_steps=40)
    torch.testing.assert_close(attr, ig, rtol=0.0, atol=0.1 * ig.abs().max().item())
    assert delta.shape == (x.shape[0],)


# ---------------------------------------------------------------------------------------
# Unsupported operations
# ---------------------------------------------------------------------------------------
class WithExp(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(6, 3)

    def forward(self, x):
        return torch.exp(self.lin(x))


class Gate(nn.Module):
    def forward(self, x):
        return x * x


class Branchy(nn.Module):
    def forward(self, x):
        if x.sum() > 0:
            return x
        return -x


class Sorted(nn.Module):
    def forward(self, x):
        return torch.sort(x, dim=-1).values


@pytest.mark.parametrize("cls", [DeepLift, EpsilonLRP])
def test_unsupported_operations_raise_errors_naming_them(cls):
    x = vectors()
    cases = [
        (nn.Sequential(nn.Linear(6, 6), nn.BatchNorm1d(6, track_running_stats=False),
                       nn.Linear(6, 2)), ["batch_norm", "1 (BatchNorm1d)", "batch"]),
        (nn.Sequential(nn.Linear(6, 6), Sorted()), ["aten.sort", "test_methods.py", "What to do"]),
        (Branchy(), ["torch.export", "Branchy"]),
    ]
    for model, words in cases:
        with pytest.raises(UnsupportedModelError) as err:
            cls(model.to(DT).eval()).attribute(x, target=0)
        for w in words:
            assert w in str(err.value), (w, str(err.value))
    assert issubclass(UnsupportedModelError, TypeError)


def test_formerly_refused_operations_are_complete():
    """LayerNorm, exp, a gate x * x and an undeclared polynomial now have rules: DeepLIFT
    is complete on each (f(x) - f(x~) from the model itself)."""
    x, base = vectors(), 0.3 * vectors()
    for model in (nn.Sequential(nn.Linear(6, 6), nn.LayerNorm(6), nn.Linear(6, 2)), WithExp(),
                  nn.Sequential(nn.Linear(6, 6), Gate(), nn.Linear(6, 2)),
                  nn.Sequential(nn.Linear(6, 6), PolyUndeclared())):
        model = model.to(DT).eval()
        a = DeepLift(model).attribute(x, base, target=0)
        with torch.no_grad():
            df = model(x)[:, 0] - model(base)[:, 0]
        torch.testing.assert_close(a.sum(1), df, rtol=1e-10, atol=1e-12)


def test_dropout_in_training_mode_is_refused_and_identity_in_eval():
    model = make(nn.Sequential(nn.Linear(6, 4), nn.Dropout(0.5), nn.Sigmoid(), nn.Linear(4, 2)))
    x = vectors()
    a = DeepLift(model).attribute(x, target=0)
    torch.testing.assert_close(a, captum_attr.DeepLift(model).attribute(x, 0 * x, target=0),
                               **TOL)
    model.train()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(ValueError, match="training mode"):
            DeepLift(model).attribute(x, target=0)


# ---------------------------------------------------------------------------------------
# Per-layer local relevances
# ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["mlp-sigmoid", "cnn-sigmoid", "cnn-relu"])
def test_deeplift_local_relevances_are_complete_per_neuron(name):
    model, x, b, t = case(name)
    dl = DeepLift(model)
    records = dl.layer_records(x, b, target=t)
    kinds = [type(r.layer) for r in records]
    assert kinds == ([nn.Linear] * 3 if name.startswith("mlp") else [nn.Conv2d, nn.Conv2d,
                                                                     nn.Linear])
    assert records[-1].activation is None and records[0].activation is not None
    for r in records:
        with torch.no_grad():
            torch.testing.assert_close(r.layer(r.inputs), r.pre, **TOL)
            torch.testing.assert_close(r.layer(r.ref_inputs), r.ref_pre, **TOL)
            if r.activation is not None:
                torch.testing.assert_close(r.activation(r.pre), r.post, **TOL)
        a = local_relevance(r)
        dpost = (r.post - r.ref_post).reshape(a.shape[:-1])
        torch.testing.assert_close(a.sum(-1), dpost, **TOL)
        e = edge_terms(r)
        torch.testing.assert_close(e.sum(-1), denominator(r), **TOL)
    # The relevance the method sends through the first layer's edges is its attribution.
    attr = dl.attribute(x, b, target=t)
    g = global_relevance(records[0])
    torch.testing.assert_close(g.flatten(1).sum(1), attr.flatten(1).sum(1), **TOL)
    if name.startswith("mlp"):
        torch.testing.assert_close(g.sum(1), attr, **TOL)


def test_edge_terms_of_strided_grouped_padded_and_1d_convolutions():
    torch.manual_seed(3)
    conv2d = nn.Sequential(nn.Conv2d(2, 4, 3, stride=2, padding=1, groups=2), nn.Tanh(),
                           nn.Flatten(), nn.Linear(64, 3)).to(DT).eval()
    conv1d = nn.Sequential(nn.Conv1d(2, 3, 3, padding=2, dilation=2), nn.Softplus(),
                           nn.Flatten(), nn.Linear(30, 3)).to(DT).eval()
    for model, x in ((conv2d, images()), (conv1d, torch.randn(3, 2, 10, dtype=DT))):
        b = 0.5 * torch.randn(x.shape, dtype=DT)
        attr = DeepLift(model).attribute(x, b, target=2)
        torch.testing.assert_close(attr, captum_attr.DeepLift(model).attribute(x, b, target=2),
                                   **TOL)
        r = DeepLift(model).layer_records(x, b, target=2)[0]
        a = local_relevance(r)
        torch.testing.assert_close(a.sum(-1), (r.post - r.ref_post).flatten(2), **TOL)
        torch.testing.assert_close(edge_terms(r).sum(-1), denominator(r), **TOL)
        torch.testing.assert_close(global_relevance(r).flatten(1).sum(1),
                                   attr.flatten(1).sum(1), **TOL)


def test_deeplift_local_relevance_of_a_linear_layer_by_hand():
    model, x, b, t = case("mlp-tanh")
    r = DeepLift(model).layer_records(x, b, target=t)[1]
    w = r.layer.weight.detach()
    z, zr = w[None] * r.inputs[:, None, :], w[None] * r.ref_inputs[:, None, :]
    ratio = (z - zr) / (r.pre - r.ref_pre)[:, :, None]
    expected = ratio * (torch.tanh(r.pre) - torch.tanh(r.ref_pre))[:, :, None]
    torch.testing.assert_close(local_relevance(r), expected, **TOL)


def test_epsilon_lrp_records_use_the_zero_baseline_and_are_complete_without_bias():
    model, x = make(CNN(nn.Tanh, bias=False)), images()
    lrp = EpsilonLRP(model, epsilon=1e-12)
    records = lrp.layer_records(x, target=1)
    for r in records:
        assert torch.count_nonzero(r.ref_inputs) == 0
        a = local_relevance(r)
        torch.testing.assert_close(a.sum(-1), (r.post - r.ref_post).reshape(a.shape[:-1]),
                                   rtol=1e-7, atol=1e-9)
    attr = lrp.attribute(x, target=1)
    torch.testing.assert_close(global_relevance(records[0]).flatten(1).sum(1),
                               attr.flatten(1).sum(1), **TOL)
    # With biases, the paper's LRP ratio z / (y + eps) loses the share of the bias.
    model_b, x = make(mlp(nn.Sigmoid)), vectors()
    r = EpsilonLRP(model_b).layer_records(x, target=0)[0]
    torch.testing.assert_close(r.ref_pre, r.layer.bias.detach().expand_as(r.pre), **TOL)
    a = local_relevance(r)
    expected = (r.pre - r.ref_pre) / r.pre * (r.post - r.ref_post)
    torch.testing.assert_close(a.sum(-1), expected, **TOL)


# ---------------------------------------------------------------------------------------
# The contract: targets, chunking, deltas, registry, bad arguments
# ---------------------------------------------------------------------------------------
ALL = {
    "gradient_input": lambda m, x, **k: GradientInput(m).attribute(x, **k),
    "occlusion_1": lambda m, x, **k: Occlusion(m).attribute(x, 0.1, **k),
    "occlusion_patch": lambda m, x, **k: Occlusion(m).attribute(x, 0.1, patch=(2, 3), **k),
    "deeplift": lambda m, x, **k: DeepLift(m).attribute(x, 0.1, **k),
    "epsilon_lrp": lambda m, x, **k: EpsilonLRP(m).attribute(x, **k),
    "integrated_gradients": lambda m, x, **k: IntegratedGradients(m).attribute(
        x, 0.1, n_steps=4, **k),
    "expected_gradients": lambda m, x, **k: ExpectedGradients(m).attribute(
        x, n_samples=4, noise_std=0.3, **k),
}


@pytest.mark.parametrize("name", list(ALL))
def test_contract_targets_shapes_and_deltas(name):
    model, x, _, _ = case("cnn-sigmoid")
    run = ALL[name]
    with torch.no_grad():
        argmax = model(x).argmax(1)
    a_none = run(model, x)
    assert a_none.shape == x.shape and a_none.dtype == x.dtype
    torch.testing.assert_close(a_none, run(model, x, target=argmax), **TOL)
    torch.testing.assert_close(run(model, x, target=1), run(model, x, target=torch.ones(3).long()),
                               **TOL)
    attr, delta = run(model, x, target=1, return_convergence_delta=True)
    assert delta.shape == (x.shape[0],)
    torch.testing.assert_close(attr, run(model, x, target=1), **TOL)
    # the delta from plain model calls: sum(a) - (f(x) - f(reference))
    with torch.no_grad():
        f = model(x)[:, 1]
        if name == "epsilon_lrp":  # relevance conservation: sum(a) against f(x) itself
            reference = torch.zeros_like(f)
        elif name == "expected_gradients":  # the mean over the same baseline draws
            drawn = ExpectedGradients.draw(x, n_samples=4, noise_std=0.3).baselines
            reference = model(drawn.reshape((-1,) + x.shape[1:]))[:, 1].view(3, 4).mean(1)
        else:
            reference = model(torch.full_like(x, 0.0 if name == "gradient_input" else 0.1))[:, 1]
    torch.testing.assert_close(delta, attr.flatten(1).sum(1) - (f - reference), **TOL)


def test_delta_follows_captums_convention():
    model, x, b, t = case("mlp-sigmoid")
    kw = {"target": t, "n_steps": 3, "method": "riemann_right",
          "return_convergence_delta": True}
    attr, delta = IntegratedGradients(model).attribute(x, b, **kw)
    with torch.no_grad():
        df = model(x).gather(1, t[:, None])[:, 0] - model(b).gather(1, t[:, None])[:, 0]
    torch.testing.assert_close(delta, attr.sum(1) - df, **TOL)
    assert delta.abs().min() > 1e-4  # a coarse rule, so the comparison below means something
    _, theirs = captum_attr.IntegratedGradients(model).attribute(x, b, **kw)
    # Captum multiplies by float32 step sizes, hence the 1e-6 tolerance.
    torch.testing.assert_close(delta, theirs, rtol=1e-5, atol=1e-8)


def test_chunk_sizes_do_not_change_results():
    model, x, b, t = case("cnn-sigmoid")
    ig = IntegratedGradients(model)
    ref = ig.attribute(x, b, target=t, n_steps=5)
    for c in (1, 4, 15, 1000):
        torch.testing.assert_close(ig.attribute(x, b, target=t, n_steps=5, internal_batch_size=c),
                                   ref, rtol=1e-12, atol=1e-14)
    occ = Occlusion(model)
    ref = occ.attribute(x, b, target=t, patch=3)
    for c in (1, 5, 1000):
        torch.testing.assert_close(occ.attribute(x, b, target=t, patch=3,
                                                 perturbations_per_eval=c), ref, **TOL)


def test_show_progress_runs(capsys):
    model, x, b, t = case("mlp-sigmoid")
    a = IntegratedGradients(model).attribute(x, b, target=t, n_steps=4, internal_batch_size=3,
                                             show_progress=True)
    torch.testing.assert_close(a, IntegratedGradients(model).attribute(x, b, target=t, n_steps=4))
    assert "integrated gradients" in capsys.readouterr().err  # the tqdm bar


def test_methods_registry():
    assert set(METHODS) >= {"gradient_input", "occlusion_1", "occlusion_patch", "deeplift",
                            "epsilon_lrp", "integrated_gradients", "expected_gradients", "taylor"}
    assert ta.DeepLift is DeepLift and ta.METHODS is METHODS
    model, x, _, t = case("cnn-sigmoid")
    for name in ("gradient_input", "occlusion_1", "occlusion_patch", "deeplift", "epsilon_lrp",
                 "integrated_gradients", "expected_gradients", "taylor"):
        kwargs = {"noise_std": 0.1, "n_samples": 2} if name == "expected_gradients" else {}
        a = METHODS[name](model, x, target=t, **kwargs)
        assert a.shape == x.shape, name
    assert METHODS["occlusion_patch"].cls is Occlusion is METHODS["occlusion_1"].cls
    torch.testing.assert_close(METHODS["occlusion_patch"](model, x, target=t),
                               Occlusion(model).attribute(x, target=t, patch=2))
    torch.testing.assert_close(METHODS["occlusion_patch"](model, x, target=t, patch=(4, 4)),
                               Occlusion(model).attribute(x, target=t, patch=4))
    with pytest.raises(ValueError, match="patch"):
        METHODS["occlusion_1"](model, x, patch=2)
    lrp = METHODS["epsilon_lrp"].build(model, epsilon=0.5)
    assert isinstance(lrp, EpsilonLRP) and lrp.epsilon == 0.5
    torch.testing.assert_close(METHODS["epsilon_lrp"](model, x, epsilon=0.5, target=t),
                               lrp.attribute(x, target=t))


def _raises(exc, word, fn):
    with pytest.raises(exc) as err:
        fn()
    assert word in str(err.value), str(err.value)


def test_bad_arguments_name_themselves():
    model, x, b, _ = case("cnn-sigmoid")
    ig, occ, eg = IntegratedGradients(model), Occlusion(model), ExpectedGradients(model)
    _raises(TypeError, "inputs", lambda: ig.attribute(x.cpu().numpy()))
    _raises(TypeError, "inputs", lambda: GradientInput(model).attribute(x.long()))
    _raises(ValueError, "target", lambda: ig.attribute(x, target=7))
    _raises(TypeError, "target", lambda: DeepLift(model).attribute(x, target=1.0))
    _raises(ValueError, "baselines", lambda: DeepLift(model).attribute(x, torch.zeros(2, 3)))
    _raises(ValueError, "n_steps", lambda: ig.attribute(x, n_steps=0))
    _raises(TypeError, "n_steps", lambda: ig.attribute(x, n_steps=2.0))
    _raises(ValueError, "n_steps", lambda: ig.attribute(x, n_steps=1, method="riemann_trapezoid"))
    _raises(ValueError, "method", lambda: ig.attribute(x, method="simpson"))
    _raises(TypeError, "internal_batch_size", lambda: ig.attribute(x, internal_batch_size="8"))
    _raises(ValueError, "internal_batch_size", lambda: ig.attribute(x, internal_batch_size=0))
    _raises(TypeError, "return_convergence_delta",
            lambda: ig.attribute(x, return_convergence_delta=1))
    _raises(ValueError, "patch", lambda: occ.attribute(x, patch=0))
    _raises(ValueError, "patch", lambda: occ.attribute(x, patch=(9, 1)))
    _raises(ValueError, "patch", lambda: occ.attribute(x, patch=(1, 1, 1, 1)))
    _raises(TypeError, "patch", lambda: occ.attribute(x, patch=2.0))
    _raises(ValueError, "stride", lambda: occ.attribute(x, patch=2, stride=3))
    _raises(ValueError, "stride", lambda: occ.attribute(x, patch=2, stride=(1, 1, 1)))
    _raises(ValueError, "perturbations_per_eval",
            lambda: occ.attribute(x, perturbations_per_eval=0))
    _raises(ValueError, "noise_std", lambda: eg.attribute(x))
    _raises(ValueError, "noise_std", lambda: eg.attribute(x, b, noise_std=0.1))
    _raises(ValueError, "noise_std", lambda: eg.attribute(x, noise_std=-1.0))
    _raises(TypeError, "seed", lambda: eg.attribute(x, noise_std=0.1, seed=1.5))
    _raises(ValueError, "n_samples", lambda: eg.attribute(x, noise_std=0.1, n_samples=0))
    _raises(ValueError, "baselines", lambda: eg.attribute(x, torch.zeros(4, 2, 8)))
    _raises(TypeError, "draws", lambda: eg.attribute(x, draws=(b, b)))
    _raises(ValueError, "draws", lambda: eg.attribute(
        x, draws=EGDraws(torch.zeros(2, 3, 2, 8, 8, dtype=DT), torch.zeros(2, 3, dtype=DT))))
    _raises(ValueError, "epsilon", lambda: EpsilonLRP(model, epsilon=-1.0))
    _raises(TypeError, "epsilon", lambda: EpsilonLRP(model, epsilon="small"))
    _raises(TypeError, "model", lambda: GradientInput(3))
    _raises(TypeError, "model", lambda: DeepLift(lambda x: x.sum(1)))


def test_noise_tunnel_repeats_a_per_sample_mask_for_every_noisy_copy():
    """NoiseTunnel(Occlusion) with one feature mask per sample equals, sample by sample, the
    tunnel run on that sample alone with its own mask and its own noise (given, so both runs
    add the same noise)."""
    from taylorattr.methods import NoiseTunnel, Occlusion

    torch.manual_seed(7)
    net = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Tanh(), torch.nn.Linear(3, 2)).double()
    x = torch.randn(2, 4, dtype=torch.float64)
    masks = torch.tensor([[0, 0, 1, 1], [0, 1, 1, 1]])
    noise = torch.randn(2, 3, 4, dtype=torch.float64) * 0.1
    both = NoiseTunnel(net, Occlusion).attribute(x, target=1, feature_mask=masks, nt_samples=3,
                                                 noise=noise)
    for b in range(2):
        one = NoiseTunnel(net, Occlusion).attribute(x[b:b + 1], target=1,
                                                    feature_mask=masks[b:b + 1], nt_samples=3,
                                                    noise=noise[b:b + 1])
        torch.testing.assert_close(both[b:b + 1], one, rtol=0, atol=1e-12)


def test_a_method_with_its_own_layer_refuses_two_different_layers():
    """Grad-CAM's and conductance's layer may be named by layer= or by their own option;
    two different ones are refused, never one silently preferred."""
    from taylorattr.methods import GradCAM, LayerConductance

    net = torch.nn.Sequential(torch.nn.Conv2d(1, 2, 3), torch.nn.ReLU(), torch.nn.Flatten(),
                              torch.nn.Linear(2 * 4 * 4, 3)).double().eval()
    x = torch.randn(2, 1, 6, 6, dtype=torch.float64)
    for method, key in ((GradCAM, "conv_layer"), (LayerConductance, "conductance_layer")):
        with pytest.raises(ValueError, match=f"give the layer once: {key}= or layer="):
            method(net).attribute(x, target=0, layer=net[1], **{key: net[0]})
