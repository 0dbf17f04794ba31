"""Issue 44, Captum 0.9 side by side: the language-model front keeps the given method's
settings on every row (Lime's interpretable model), raises no warning on eval-mode models,
drops the keywords a method does not take with a warning; FeatureAblation with an integer
input and a float baseline, ``attribute_future``'s type and multi-task shape,
FeaturePermutation's aggregate / one-example / empty cases and LayerFeaturePermutation
without a target, each against Captum on the same inputs.

Warnings of this package fail these tests unless a test expects them.
"""
from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch
from captum import attr as C
from captum._utils.models.linear_model import SkLearnLasso
from test_captum_llm import _build, _same, make_tokenizer
from torch import nn

from taylorattr.captum import attr as T

pytestmark = pytest.mark.filterwarnings("error")


@pytest.fixture(scope="module")
def llama():
    return _build("llama")


@pytest.fixture(scope="module")
def tokenizer():
    return make_tokenizer()


def test_lime_keeps_the_given_interpretable_model_on_every_row(llama, tokenizer):
    """Captum's Lime with SkLearnLasso(alpha=0.001) (not the default 0.01): the same
    attributions, which are not all 0 (the default alpha gives 0 here)."""
    out = []
    for mod, extra in ((C, {"use_cached_outputs": False}), (T, {})):
        torch.manual_seed(2)
        np.random.seed(2)
        lime = mod.Lime(llama, interpretable_model=SkLearnLasso(alpha=0.001))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # Captum's own warnings
            out.append(mod.LLMAttribution(lime, tokenizer).attribute(
                T.TextTokenInput("the cat sat on", tokenizer) if mod is T else
                C.TextTokenInput("the cat sat on", tokenizer), target="is happy",
                n_samples=40, **extra))
    _same(out[1], out[0], 2e-6)
    assert out[1].seq_attr.abs().max() > 1e-3


def test_no_train_mode_warning_on_an_eval_model(llama, tokenizer):
    inp = T.TextTokenInput("the cat sat", tokenizer)
    emb = llama.get_input_embeddings()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for method in (T.LayerDeepLift(llama, emb), T.LayerIntegratedGradients(llama, emb)):
            T.LLMGradientAttribution(method, tokenizer).attribute(inp, target="is happy")
        T.LLMAttribution(T.FeatureAblation(llama), tokenizer).attribute(inp, target="is")


def test_keywords_a_method_does_not_take_are_dropped_with_a_warning(llama, tokenizer):
    inp = T.TextTokenInput("the cat sat", tokenizer)
    fa = T.LLMAttribution(T.FeatureAblation(llama), tokenizer)
    plain = fa.attribute(inp, target="is happy")
    for bad in ({"n_steps": 10}, {"skip_tokens": ["<s>"]}):
        with pytest.warns(UserWarning, match=f"does not take \\['{next(iter(bad))}'\\]"):
            res = fa.attribute(inp, target="is happy", **bad)
        torch.testing.assert_close(res.token_attr, plain.token_attr, rtol=0, atol=0)
    ig = T.LLMGradientAttribution(T.LayerIntegratedGradients(llama,
                                                             llama.get_input_embeddings()),
                                  tokenizer)
    plain = ig.attribute(inp, target="is", n_steps=8)
    with pytest.warns(UserWarning, match="skip_tokens"):
        res = ig.attribute(inp, target="is", n_steps=8, skip_tokens=["<s>"])
    torch.testing.assert_close(res.token_attr, plain.token_attr, rtol=0, atol=0)


def _sum_forward(*inps):
    return torch.cat([torch.flatten(i, start_dim=1) for i in inps], dim=1).sum(1)


def test_feature_ablation_of_an_integer_input_with_a_float_baseline_equals_captums():
    inp1, inp3 = torch.tensor([[0, 1], [3, 4]]), torch.tensor([[0], [1]])
    inp2 = torch.tensor([[[0.1, 0.2], [0.3, 0.2]], [[0.4, 0.5], [0.3, 0.2]]])
    args = ((inp1, inp2, inp3),)
    kw = {"baselines": (0.2, 3.1, 0.4)}
    theirs = C.FeatureAblation(_sum_forward).attribute(*args, **kw)
    ours = T.FeatureAblation(_sum_forward).attribute(*args, **kw)
    for o, t in zip(ours, theirs):
        torch.testing.assert_close(o, t, rtol=0, atol=1e-6)
    torch.testing.assert_close(ours[0], torch.tensor([[-0.2, 0.8], [2.8, 3.8]]))  # x - 0.2


def _future(f):
    def forward(*args):
        done = torch.futures.Future()
        done.set_result(f(*args))
        return done
    return forward


def test_attribute_future_type_and_multi_task_shape_equal_captums():
    lin = nn.Linear(3, 2).double()

    def four(x):
        return torch.cat([lin(x), torch.ones(x.shape[0], 2, dtype=x.dtype)], -1)

    x = torch.tensor([[2.0, 5.0, 3.0]], dtype=torch.float64)
    torch.manual_seed(0)
    theirs = C.ShapleyValueSampling(_future(four)).attribute_future(x, n_samples=5)
    torch.manual_seed(0)
    ours = T.ShapleyValueSampling(_future(four)).attribute_future(x, n_samples=5)
    assert type(ours) is type(theirs) is torch.Future
    assert ours.wait().shape == theirs.wait().shape == (1, 4, 3)
    torch.testing.assert_close(ours.wait(), theirs.wait().to(ours.wait().dtype), rtol=0,
                               atol=1e-5)


def test_feature_permutation_aggregate_one_example_and_empty_equal_captums():
    w = torch.tensor([1.0, -2.0, 0.5])

    def mse(x):  # one value for the whole batch
        return ((x @ w) ** 2).mean()

    x = torch.randn(6, 3)
    torch.manual_seed(3)
    theirs = C.FeaturePermutation(mse).attribute(x)
    torch.manual_seed(3)
    ours = T.FeaturePermutation(mse).attribute(x)
    assert ours.shape == theirs.shape == (1, 3)
    torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-6)

    def rows(x):
        return x.sum(-1)
    one = torch.tensor([[1.0, 2.0]])
    with pytest.warns(UserWarning, match="fewer than 2 examples"):
        ours = T.FeaturePermutation(rows).attribute(one)
    torch.testing.assert_close(ours, C.FeaturePermutation(rows).attribute(one))
    assert not ours.any()
    empty = torch.tensor([])
    torch.testing.assert_close(T.FeaturePermutation(rows).attribute(empty),
                               C.FeaturePermutation(rows).attribute(empty))


def test_layer_feature_permutation_of_a_two_column_output_without_target_equals_captums():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(3, 3), nn.Tanh(), nn.Linear(3, 2)).eval()
    x = torch.randn(2, 3)
    torch.manual_seed(4)
    theirs = C.LayerFeaturePermutation(net, net[1]).attribute(x)
    torch.manual_seed(4)
    ours = T.LayerFeaturePermutation(net, net[1]).attribute(x)
    assert ours.shape == theirs.shape == (4, 3)
    torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-6)


def test_feature_ablation_refuses_several_perturbations_per_call_on_a_batch_aggregate():
    """Captum's aggregate mode (one value, or three, for the whole batch) takes
    perturbations_per_eval=1 only: both raise AssertionError; with 1 both agree."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(3, 4), nn.ReLU(), nn.Linear(4, 2)).eval()
    x = torch.tensor([[2.0, 10.0, 3.0], [20.0, 50.0, 30.0]])
    for forward in (lambda v: net(v).sum().item(),
                    lambda v: torch.stack([net(v).sum(), net(v).max(), net(v).min()])):
        for mod in (C, T):
            with pytest.raises(AssertionError):
                mod.FeatureAblation(forward).attribute(x, perturbations_per_eval=2)
    ours = T.FeatureAblation(lambda v: net(v).sum()).attribute(x)
    theirs = C.FeatureAblation(lambda v: net(v).sum()).attribute(x)
    torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-5)
