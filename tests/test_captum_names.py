"""Issue 36: every public name of ``captum.attr`` and ``captum.metrics`` exists in
``taylorattr.captum``; the ones that work equal Captum on the same inputs (float64, the same
seeds), the others refuse at construction naming an alternative; ``attribute_future`` as
Captum defines it.
"""
from __future__ import annotations

import random
import warnings

import pytest
import torch
from _builders import DT, mlp
from captum import attr as C
from captum import metrics as CM
from torch import nn

from taylorattr.captum import attr as T
from taylorattr.captum import metrics as TM

FLOAT32 = {"rtol": 1e-6, "atol": 1e-7}  # Captum's float32 step sizes and sums
EXACT = {"rtol": 0.0, "atol": 1e-12}


@pytest.fixture(autouse=True)
def _quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


def _public(module) -> set:
    names = set(getattr(module, "__all__", ())) | {n for n in dir(module)
                                                    if not n.startswith("_")}
    return {n for n in names if not isinstance(getattr(module, n, None), type(torch))
            or n == "visualization"}


@pytest.mark.parametrize("theirs, ours", [(C, T), (CM, TM)], ids=["attr", "metrics"])
def test_every_public_captum_name_exists(theirs, ours):
    """A Captum release that adds a name fails here until the name is mapped or refused."""
    missing = sorted(n for n in theirs.__all__ if not hasattr(ours, n))
    assert not missing, f"names of {theirs.__name__} missing in {ours.__name__}: {missing}"
    assert set(theirs.__all__) <= set(ours.__all__)


def test_visualization_names_exist():
    public = {n for n in dir(C.visualization) if not n.startswith("_") and
              getattr(getattr(C.visualization, n), "__module__", "") ==
              C.visualization.__name__}
    assert public and not sorted(public - set(dir(T.visualization)))


REFUSED = [
           "ImageMaskInput"]


@pytest.mark.parametrize("name", REFUSED)
def test_refused_names_raise_at_construction_with_an_alternative(name):
    with pytest.raises(NotImplementedError, match="instead: .*taylorattr"):
        getattr(T, name)(lambda x: x)


def _mlp():
    return mlp(5, 6, 3)


class _Column(nn.Module):
    """A per-sample output [B] (Captum's LayerFeaturePermutation selects the target twice)."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, x):
        return self.model(x)[:, 1]


def test_layer_activation_equals_captums():
    m, x = _mlp(), torch.randn(4, 5, dtype=DT)
    for to_input in (False, True):
        ours = T.LayerActivation(m, m[1]).attribute(x, attribute_to_layer_input=to_input)
        theirs = C.LayerActivation(m, m[1]).attribute(x, attribute_to_layer_input=to_input)
        torch.testing.assert_close(ours, theirs, **EXACT)
    ours = T.LayerActivation(m, [m[0], m[2]]).attribute(x)
    theirs = C.LayerActivation(m, [m[0], m[2]]).attribute(x)
    assert isinstance(ours, list) and len(ours) == 2
    for a, b in zip(ours, theirs):
        torch.testing.assert_close(a, b, **EXACT)


@pytest.mark.parametrize("method", ["gausslegendre", "riemann_left", "riemann_middle"])
def test_internal_influence_equals_captums(method):
    m, x = _mlp(), torch.randn(4, 5, dtype=DT)
    base = 0.3 * torch.randn(4, 5, dtype=DT)
    ours = T.InternalInfluence(m, m[1]).attribute(x, base, target=[0, 2, 1, 2], method=method,
                                                  n_steps=20)
    theirs = C.InternalInfluence(m, m[1]).attribute(x, base, target=[0, 2, 1, 2],
                                                    method=method, n_steps=20)
    torch.testing.assert_close(ours, theirs, **FLOAT32)


def test_internal_influence_by_hand():
    """A linear layer after Tanh: d f / d h is the last weight row, whatever the path."""
    m, x = _mlp(), torch.randn(3, 5, dtype=DT)
    ours = T.InternalInfluence(m, m[1]).attribute(x, target=2)
    torch.testing.assert_close(ours, m[2].weight[2].expand(3, 6), **EXACT)


@pytest.mark.parametrize("selector", [3, (2,), (slice(1, 3),)])
@pytest.mark.parametrize("method", ["gausslegendre", "riemann_right"])
def test_neuron_conductance_equals_captums(selector, method):
    m, x = _mlp(), torch.randn(4, 5, dtype=DT)
    for mult in (True, False):
        ours = T.NeuronConductance(m, m[1], multiply_by_inputs=mult).attribute(
            x, selector, target=1, method=method, n_steps=30)
        theirs = C.NeuronConductance(m, m[1], multiply_by_inputs=mult).attribute(
            x, selector, target=1, method=method, n_steps=30)
        torch.testing.assert_close(ours, theirs, **FLOAT32)


def test_neuron_conductance_trapezoid_is_captums_times_the_rules_weight():
    """Captum's riemann_trapezoid weights sum to (n-1)/n; the rule's own (native IG's,
    docs/captum.md) sum to 1: the two differ by exactly n/(n-1)."""
    m, x, n = _mlp(), torch.randn(4, 5, dtype=DT), 25
    ours = T.NeuronConductance(m, m[1]).attribute(x, 2, target=0, n_steps=n)
    theirs = C.NeuronConductance(m, m[1]).attribute(x, 2, target=0, n_steps=n)
    torch.testing.assert_close(ours * (n - 1) / n, theirs, **FLOAT32)


def test_neuron_conductance_sums_to_the_neurons_internal_influence():
    """Completeness through one neuron: summed over the inputs, conductance is the path
    integral of (df/dn)(dn/dalpha), i.e. the neuron's change times its mean gradient; on a
    path where df/dn is constant (the last layer is linear) it is w_n (n(x) - n(x~))."""
    m, x = _mlp(), torch.randn(4, 5, dtype=DT)
    ours = T.NeuronConductance(m, m[1]).attribute(x, 4, target=2, n_steps=200,
                                                  method="gausslegendre")
    change = torch.tanh(m[0](x))[:, 4] - torch.tanh(m[0](torch.zeros_like(x)))[:, 4]
    torch.testing.assert_close(ours.sum(1), m[2].weight[2, 4] * change, rtol=0, atol=1e-10)


@pytest.mark.parametrize("mask", [None, torch.tensor([[0, 0, 1, 1, 2]])])
def test_feature_permutation_equals_captums(mask):
    m, x = _mlp(), torch.randn(6, 5, dtype=DT)
    torch.manual_seed(5)
    theirs = C.FeaturePermutation(m).attribute(x, target=1, feature_mask=mask)
    torch.manual_seed(5)
    ours = T.FeaturePermutation(m).attribute(x, target=1, feature_mask=mask)
    torch.testing.assert_close(ours, theirs, **EXACT)


def test_feature_permutation_tuple_inputs_equal_captums():
    torch.manual_seed(1)
    a, b = nn.Linear(3, 2).to(DT), nn.Linear(2, 2).to(DT)

    def f(x, y):
        return torch.tanh(a(x)) * b(y)

    x, y = torch.randn(5, 3, dtype=DT), torch.randn(5, 2, dtype=DT)
    torch.manual_seed(2)
    theirs = C.FeaturePermutation(f).attribute((x, y), target=0)
    torch.manual_seed(2)
    ours = T.FeaturePermutation(f).attribute((x, y), target=0)
    for o, t in zip(ours, theirs):
        torch.testing.assert_close(o, t, **EXACT)


def test_feature_permutation_by_hand():
    """f(x) - f(x with feature i permuted): a linear model gives w_i (x_i - x_perm(i))."""
    x = torch.randn(4, 3, dtype=DT)
    w = torch.tensor([1.0, -2.0, 0.5], dtype=DT)
    torch.manual_seed(7)
    ours = T.FeaturePermutation(lambda v: v @ w).attribute(x)
    torch.manual_seed(7)
    perms = []
    for _ in range(3):
        p = torch.randperm(4)
        while (p == torch.arange(4)).all():
            p = torch.randperm(4)
        perms.append(p)
    expected = torch.stack([w[i] * (x[:, i] - x[perms[i], i]) for i in range(3)], 1)
    torch.testing.assert_close(ours, expected, **EXACT)


def test_layer_feature_permutation_equals_captums():
    m, x = _mlp(), torch.randn(5, 5, dtype=DT)
    f = _Column(m)
    for mask in (None, torch.tensor([[0, 0, 1, 1, 2, 2]])):
        torch.manual_seed(3)
        theirs = C.LayerFeaturePermutation(f, m[1]).attribute(x, layer_mask=mask)
        torch.manual_seed(3)
        ours = T.LayerFeaturePermutation(f, m[1]).attribute(x, layer_mask=mask)
        torch.testing.assert_close(ours, theirs, **EXACT)


def _future(model):
    def forward(*args):
        done = torch.futures.Future()
        done.set_result(model(*args))
        return done
    return forward


@pytest.mark.parametrize("cls, kw", [("FeatureAblation", {"baselines": 0.2}),
                                     ("FeatureAblation", {"feature_mask":
                                                          torch.tensor([[0, 1, 1, 2, 2]])}),
                                     ("ShapleyValueSampling", {"n_samples": 4}),
                                     ("ShapleyValues", {"feature_mask":
                                                        torch.tensor([[0, 1, 1, 2, 2]])}),
                                     ("FeaturePermutation", {})])
def test_attribute_future_equals_captums(cls, kw):
    m, x = _mlp(), torch.randn(4, 5, dtype=DT)
    torch.manual_seed(4)
    theirs = getattr(C, cls)(_future(m)).attribute_future(x, target=2, **kw)
    torch.manual_seed(4)
    ours = getattr(T, cls)(_future(m)).attribute_future(x, target=2, **kw)
    assert type(ours) is type(theirs) is torch.Future  # Captum's type, not torch.jit.Future
    # Captum's Shapley futures sum in float32 (its attribute in float64); ours keep float64
    torch.testing.assert_close(ours.wait(), theirs.wait().to(DT), **FLOAT32)
    torch.manual_seed(4)
    plain = getattr(T, cls)(m).attribute(x, target=2, **kw)
    torch.testing.assert_close(ours.wait(), plain, **EXACT)


def test_attribute_future_needs_a_future_and_attribute_refuses_one():
    m, x = _mlp(), torch.randn(2, 5, dtype=DT)
    with pytest.raises(AssertionError, match="Future"):
        T.FeatureAblation(m).attribute_future(x, target=0)
    with pytest.raises(TypeError, match="attribute_future"):
        T.FeatureAblation(_future(m)).attribute(x, target=0)


@pytest.mark.parametrize("cls", ["IntegratedGradients", "Saliency", "DeepLift",
                                 "InputXGradient", "GuidedBackprop", "GradientShap", "LRP",
                                 "Occlusion", "Lime", "KernelShap"])
def test_attribute_future_is_refused_where_captum_refuses_it(cls):
    m = _mlp()
    for mod in (C, T):
        with pytest.raises(NotImplementedError):
            getattr(mod, cls)(m).attribute_future()


def _stats(mod):
    return [mod.Mean(), mod.Var(), mod.Var(order=1), mod.StdDev(), mod.StdDev(order=1),
            mod.Min(), mod.Max(), mod.Sum(), mod.MSE(), mod.Count(), mod.StdDev(order=2)]


def test_summarizers_equal_captums():
    data = [torch.randn(3, 2, dtype=DT) for _ in range(6)] + [torch.arange(6.).view(3, 2)]
    for stats in (_stats, lambda mod: mod.CommonStats()):
        ours, theirs = T.Summarizer(stats(T)), C.Summarizer(stats(C))
        assert ours.summary is None and theirs.summary is None
        for d in data:
            ours.update((d, 2 * d))
            theirs.update((d, 2 * d))
        for o, t in zip(ours.summary, theirs.summary):
            assert o.keys() == t.keys()
            for k in o:
                torch.testing.assert_close(torch.as_tensor(o[k]), torch.as_tensor(t[k]), **EXACT)
    # the moments by hand: float64 sample variance
    s = T.Summarizer([T.Var(order=1)])
    for d in data:
        s.update(d)
    torch.testing.assert_close(s.summary["sample_variance"], torch.stack(data).var(0),
                               rtol=0, atol=1e-12)


def test_class_summarizer_equals_captums():
    x = torch.randn(6, 3, dtype=DT)
    labels = [0, 1, 0, 2, 1, 0]
    ours, theirs = T.ClassSummarizer(T.CommonStats()), C.ClassSummarizer(C.CommonStats())
    ours.update(x, labels)
    theirs.update(x, labels)
    ours.update(x[:2], 5)
    theirs.update(x[:2], 5)
    assert ours.class_summaries.keys() == theirs.class_summaries.keys()
    pairs = [(ours.summary, theirs.summary)] + [
        (ours.class_summaries[k], v) for k, v in theirs.class_summaries.items()]
    for o, t in pairs:  # a list of one summary per input (tuple updates)
        assert isinstance(o, list) and len(o) == len(t) == 1
        assert o[0].keys() == t[0].keys()
        for k, v in t[0].items():
            torch.testing.assert_close(o[0][k], v, **EXACT)


def test_token_reference_and_interpretable_embedding_equal_captums():
    torch.manual_seed(0)

    class Text(nn.Module):
        def __init__(self):
            super().__init__()
            self.body = nn.Module()
            self.body.embedding = nn.Embedding(10, 4)
            self.fc = nn.Linear(4, 2)

        def forward(self, e):
            return self.fc(self.body.embedding(e).mean(1))

    model = Text().to(DT)
    ids = torch.tensor([[1, 2, 3], [4, 5, 0]])
    want = model(ids)
    assert torch.equal(T.TokenReferenceBase(7).generate_reference(3, "cpu"),
                       C.TokenReferenceBase(7).generate_reference(3, "cpu"))
    layer = T.configure_interpretable_embedding_layer(model, "body.embedding")
    assert isinstance(model.body.embedding, T.InterpretableEmbeddingBase)
    e = layer.indices_to_embeddings(ids)
    torch.testing.assert_close(model(e), want, **EXACT)
    ig = T.IntegratedGradients(model).attribute(e, target=1)
    T.remove_interpretable_embedding_layer(model, layer)
    assert isinstance(model.body.embedding, nn.Embedding)
    theirs_layer = C.configure_interpretable_embedding_layer(model, "body.embedding")
    theirs = C.IntegratedGradients(model).attribute(e, target=1)
    C.remove_interpretable_embedding_layer(model, theirs_layer)
    torch.testing.assert_close(ig, theirs, **FLOAT32)
    torch.testing.assert_close(model(ids), want, **EXACT)


def test_product_baselines_equal_captums():
    values = {"a": [1, 2, 3], ("b", "c"): [(4, 5), (6, 7)]}
    for arg in (values, [[1, 2, 3], [4, 5]]):
        random.seed(9)
        theirs = [C.ProductBaselines(arg)() for _ in range(5)]
        random.seed(9)
        ours = [T.ProductBaselines(arg)() for _ in range(5)]
        assert ours == theirs


@pytest.mark.parametrize("multiply", [True, False])
@pytest.mark.parametrize("with_baselines", [False, True])
def test_infidelity_perturb_func_decorator_equals_captums(multiply, with_baselines):
    m, x = _mlp(), torch.randn(3, 5, dtype=DT)
    x[0, 1] = 0.0  # a zero denominator reads as 1

    def perturbed(inputs, baselines=None):
        return inputs - 0.1 * torch.sin(7 * inputs)

    ours_f = TM.infidelity_perturb_func_decorator(multiply)(perturbed)
    theirs_f = CM.infidelity_perturb_func_decorator(multiply)(perturbed)
    base = 0.5 * x if with_baselines else None
    args = (x,) if base is None else (x, base)
    for o, t in zip(ours_f(*args), theirs_f(*args)):
        torch.testing.assert_close(o[0], t[0], **EXACT)
    attributions = T.IntegratedGradients(m).attribute(x, target=1)
    kw = {"baselines": base} if base is not None else {}
    ours = TM.infidelity(m, ours_f, x, attributions, target=1, n_perturb_samples=3, **kw)
    theirs = CM.infidelity(m, theirs_f, x, attributions, target=1, n_perturb_samples=3, **kw)
    torch.testing.assert_close(ours, theirs, rtol=1e-8, atol=1e-12)


def test_lime_with_captums_lasso_of_another_alpha_equals_captums():
    from captum._utils.models.linear_model import SkLearnLasso

    m, x = _mlp(), torch.randn(2, 5, dtype=DT)
    out = []
    for mod in (C, T):
        torch.manual_seed(2)
        out.append(mod.Lime(m, interpretable_model=SkLearnLasso(alpha=0.001)).attribute(
            x, target=1, n_samples=40))
    # Captum returns this fit in float32; ours in the inputs dtype
    torch.testing.assert_close(out[1], out[0].to(DT), rtol=0, atol=1e-7)
    # another setting than alpha: Captum's general framework (taylorattr.captum.attr._lime)
    out = []
    for mod in (C, T):
        torch.manual_seed(2)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # Captum's warning on several inputs
            out.append(mod.Lime(m, interpretable_model=SkLearnLasso(alpha=0.01, max_iter=5))
                       .attribute(x, target=1, n_samples=40))
    torch.testing.assert_close(out[1], out[0], rtol=0, atol=1e-6)


@pytest.mark.parametrize("mask", [None, (torch.tensor([[0, 1, 1]]), torch.tensor([[2, 0]]))])
def test_kernel_shap_player_values_on_tuple_inputs_equal_captums(mask):
    """return_input_shape=False on tuple inputs: one [B, G] tensor of player values."""
    torch.manual_seed(0)
    w1, w2 = torch.randn(3, dtype=DT), torch.randn(2, dtype=DT)

    def f(x, y):
        return torch.tanh(x @ w1 + y @ w2).unsqueeze(1)

    x, y = torch.randn(2, 3, dtype=DT), torch.randn(2, 2, dtype=DT)
    out = []
    for mod in (C, T):
        torch.manual_seed(1)
        out.append(mod.KernelShap(f).attribute((x, y), target=0, n_samples=30,
                                               return_input_shape=False, feature_mask=mask))
    assert out[1].shape == (2, 5 if mask is None else 3)
    assert out[1].device == x.device
    # Captum fits and returns these in float32 and on the CPU (its fit's weights are a
    # torch.FloatTensor); ours keep the inputs' dtype and device
    torch.testing.assert_close(out[1], out[0].to(x.device, DT), rtol=0, atol=1e-6)
    # the same values as the input-shaped call, read per player
    torch.manual_seed(1)
    shaped = T.KernelShap(f).attribute((x, y), target=0, n_samples=30, feature_mask=mask)
    torch.testing.assert_close(out[1][:, :3] if mask is None else out[1][:, [0, 1, 1]],
                               shaped[0], **EXACT)


@pytest.mark.parametrize("cls", ["InternalInfluence", "LayerIntegratedGradients",
                                 "LayerGradientXActivation", "LayerConductance"])
def test_neutral_grad_kwargs_equal_captums_and_others_are_refused(cls):
    """Captum's unused-input case: a layer taking two tensors, one unused downstream;
    materialize_grads (zeros for it) changes no number here."""
    from captum.testing.helpers.basic_models import BasicModel_MultiLayer

    net = BasicModel_MultiLayer(multi_input_module=True).to(DT)
    x = torch.tensor([[0.0, 100.0, 0.0], [3.0, -2.0, 1.0]], dtype=DT)
    kw = {"target": 0, "attribute_to_layer_input": True,
          "grad_kwargs": {"materialize_grads": True}}
    ours = getattr(T, cls)(net, net.multi_relu).attribute(x, **kw)
    theirs = getattr(C, cls)(net, net.multi_relu).attribute(x, **kw)
    for o, t in zip(ours, theirs):
        torch.testing.assert_close(o, t, rtol=0, atol=1e-6)  # Captum's float32 steps
    with pytest.raises(NotImplementedError, match="create_graph"):
        getattr(T, cls)(net, net.multi_relu).attribute(x, target=0,
                                                       grad_kwargs={"create_graph": True})
