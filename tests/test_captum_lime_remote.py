"""Captum 0.9's ``DataLoaderAttribution``, general LIME (``LimeBase``, ``Lime`` with a
similarity function, a perturbation function or any interpretable model of Captum's
interface) and the remote language-model attribution (``RemoteLLMAttribution``, ``VLLMProvider``), side by side with
Captum on the same inputs and draws.

The remote provider is a local model's log-probabilities behind Captum's provider
interface (so the remote front must equal the local one), and ``VLLMProvider`` talks to a
stand-in for the ``openai`` client, as Captum's own tests mock it.
Warnings of this package fail these tests unless a test expects them.
"""
from __future__ import annotations

import sys
import types

import numpy as np
import pytest
import torch
from captum import attr as C
from captum._utils.models.linear_model import SGDLasso, SkLearnLasso
from captum.attr._core import lime as captum_lime
from captum.attr._core import remote_provider as captum_remote
from test_captum_llm import _build, _same, make_tokenizer
from torch import nn

from taylorattr.captum import attr as T

pytestmark = pytest.mark.filterwarnings("error")


def _net():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 5), nn.Tanh(), nn.Linear(5, 3)).eval()


@pytest.mark.parametrize("kw", [
    {"similarity_func": "euclidean"},
    {"interpretable_model": "sgd"},
    {"interpretable_model": "sklearn", "similarity_func": "cosine2"}])
def test_general_lime_equals_captums(kw):
    net, x = _net(), torch.randn(2, 4, generator=torch.Generator().manual_seed(1))
    out = []
    for mod in (C, T):
        args = {}
        if kw.get("similarity_func") == "euclidean":
            args["similarity_func"] = _kernel(mod)("euclidean", 2.0)
        if kw.get("similarity_func") == "cosine2":
            args["similarity_func"] = _kernel(mod)("cosine", 0.5)
        if kw.get("interpretable_model") == "sgd":
            args["interpretable_model"] = SGDLasso()
        if kw.get("interpretable_model") == "sklearn":
            args["interpretable_model"] = SkLearnLasso(alpha=0.001)
        torch.manual_seed(5)
        np.random.seed(5)
        with pytest.warns(UserWarning, match="multiple inputs") if mod is C else \
                _nothing():
            out.append(mod.Lime(net, **args).attribute(x, target=1, n_samples=40,
                                                       feature_mask=torch.tensor(
                                                           [[0, 0, 1, 2]])))
    torch.testing.assert_close(out[1], out[0], rtol=0, atol=1e-6)
    assert out[1].shape == x.shape and out[1].abs().max() > 0


def _kernel(mod):
    return T.get_exp_kernel_similarity_function if mod is T else \
        captum_lime.get_exp_kernel_similarity_function


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def test_lime_base_with_a_generator_in_the_input_space_equals_captums():
    net, x = _net(), torch.tensor([[0.5, -1.0, 2.0, 0.3]])

    def perturb(inputs, **kw):
        for i in range(30):
            yield inputs + 0.3 * torch.randn(inputs.shape, generator=torch.Generator()
                                             .manual_seed(i))

    def to_interp(sample, inputs, **kw):
        return (sample - inputs).abs()

    def similarity(inputs, sample, interp, **kw):
        return torch.exp(-((inputs - sample) ** 2).sum())
    out = []
    for mod in (C, T):
        base = mod.LimeBase(net, SkLearnLasso(alpha=0.0001), similarity, perturb, False, None,
                            to_interp)
        out.append(base.attribute(x, target=2, n_samples=25, perturbations_per_eval=4))
    torch.testing.assert_close(out[1], out[0], rtol=0, atol=1e-6)


# --- remote ------------------------------------------------------------------------------
PROMPT, TARGET = "the cat sat on the mat", "is very happy"


def _provider(base, model, tokenizer):
    """A provider of ``base``'s interface serving the local ``model``'s log-probabilities
    of the target after the prompt (as text), and a canned generation."""
    class Local(base):
        api_url = "local"

        def generate(self, prompt, **gen_args):
            return "is happy"

        def get_logprobs(self, input_prompt, target_str, tokenizer=None):
            ids = tokenizer.encode(input_prompt, return_tensors="pt")
            target = tokenizer.encode(target_str, add_special_tokens=False)
            joined = torch.cat([ids, torch.tensor([target])], 1)
            with torch.no_grad():
                logits = model(joined).logits[0, ids.shape[1] - 1:-1]
            return torch.log_softmax(logits, -1)[torch.arange(len(target)),
                                                 torch.tensor(target)].tolist()
    return Local()


@pytest.mark.parametrize("method", ["FeatureAblation", "ShapleyValueSampling"])
def test_remote_attribution_equals_captums_and_the_local_front(method):
    tokenizer, model = make_tokenizer(), _build("llama")
    out = []
    for mod, base in ((C, captum_remote.RemoteLLMProvider), (T, T.RemoteLLMProvider)):
        torch.manual_seed(1)
        inp = mod.TextTemplateInput("{} sat on the {}", ["the cat", "mat"])
        remote = mod.RemoteLLMAttribution(
            getattr(mod, method)(mod.RemoteLLMAttribution.placeholder_model), tokenizer,
            _provider(base, model, tokenizer))
        out.append(remote.attribute(inp, target=TARGET))
    _same(out[1], out[0], 1e-6)
    torch.manual_seed(1)
    local = T.LLMAttribution(getattr(T, method)(model), tokenizer).attribute(
        T.TextTemplateInput("{} sat on the {}", ["the cat", "mat"]), target=TARGET)
    torch.testing.assert_close(out[1].token_attr, local.token_attr, rtol=0, atol=1e-5)
    generated = remote.attribute(T.TextTemplateInput("{} sat", ["the cat"]))
    assert generated.output_tokens == ["is", "happy"]
    with pytest.raises(NotImplementedError):
        remote.attribute_future()


def test_vllm_provider_reads_the_servers_prompt_logprobs(monkeypatch):
    calls = []

    class Completions:
        def create(self, **kw):
            calls.append(kw)
            if "extra_body" in kw:
                logprobs = [None, {"5": {"logprob": -0.5}}, {"7": {"logprob": -1.25}},
                            {"9": {"logprob": -2.0}}]
                return types.SimpleNamespace(choices=[types.SimpleNamespace(
                    prompt_logprobs=logprobs, text="")])
            return types.SimpleNamespace(choices=[types.SimpleNamespace(text=" is happy")])

    class Client:
        def __init__(self, base_url, api_key):
            self.base_url, self.api_key = base_url, api_key
            self.completions = Completions()
            self.models = types.SimpleNamespace(list=lambda: types.SimpleNamespace(
                data=[types.SimpleNamespace(id="served-model")]))

    monkeypatch.setitem(sys.modules, "openai", types.SimpleNamespace(OpenAI=Client))
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    provider = T.VLLMProvider("http://localhost:8000/v1")
    assert provider.model_name == "served-model" and provider.client.api_key == "EMPTY"
    tokenizer = make_tokenizer()
    assert provider.get_logprobs("the cat", " very happy", tokenizer) == [-1.25, -2.0]
    assert calls[-1]["prompt"] == "the cat very happy" and calls[-1]["max_tokens"] == 1
    assert provider.generate("the cat", max_new_tokens=3, do_sample=False) == " is happy"
    assert calls[-1]["max_tokens"] == 3 and "do_sample" not in calls[-1]
    with pytest.raises(ValueError, match="Tokenizer is required"):
        provider.get_logprobs("the cat", "happy")
    with pytest.raises(ValueError, match="API URL"):
        T.VLLMProvider("  ")


# --- DataLoaderAttribution ----------------------------------------------------------------
def test_dataloader_attribution_equals_captums_and_per_batch_ablation():
    """Per-example outputs concatenated (the default reduce): the batches' own
    FeatureAblation; a custom reduce / to_metric (mean and sum of the data set) with a mask
    and baselines: Captum's numbers; the label column not passed to the model."""
    from captum.attr._core.dataloader_attr import DataLoaderAttribution as CD
    from torch.utils.data import DataLoader, TensorDataset

    torch.manual_seed(0)
    lin = nn.Linear(6, 1).double()

    def forward(a, b):
        return lin(torch.cat([a, b.flatten(1)], 1))[:, 0]

    data = TensorDataset(torch.randn(7, 2, dtype=torch.float64),
                         torch.randn(7, 2, 2, dtype=torch.float64), torch.arange(7))
    loader = DataLoader(data, batch_size=3)
    roles = (0, 0, 2)
    ours = T.DataLoaderAttribution(T.FeatureAblation(forward)).attribute(loader,
                                                                          input_roles=roles)
    theirs = CD(C.FeatureAblation(forward)).attribute(loader, input_roles=roles)
    per_batch = [T.FeatureAblation(forward).attribute((a, b)) for a, b, _ in loader]
    for o, t, k in zip(ours, theirs, range(2)):
        torch.testing.assert_close(o, t, rtol=0, atol=1e-12)
        torch.testing.assert_close(o, torch.cat([p[k] for p in per_batch]), rtol=0,
                                   atol=1e-12)

    def reduce(accum, out, inputs):
        assert len(inputs) == 3
        return out if accum is None else torch.cat([accum, out])

    def to_metric(outs):
        return torch.stack([outs.mean(), outs.sum()])
    kw = {"input_roles": roles, "reduce": reduce, "to_metric": to_metric,
          "feature_mask": (torch.tensor([[0, 1]]), torch.tensor([[[1, 2], [2, 0]]])),
          "baselines": (0.5, -1.0), "perturbations_per_pass": 2}
    ours = T.DataLoaderAttribution(T.FeatureAblation(forward)).attribute(loader, **kw)
    theirs = CD(C.FeatureAblation(forward)).attribute(loader, **kw)
    for o, t in zip(ours, theirs):
        assert o.shape == t.shape == (2, *o.shape[1:])
        torch.testing.assert_close(o, t, rtol=0, atol=1e-12)
    flat = T.DataLoaderAttribution(T.FeatureAblation(forward)).attribute(
        loader, return_input_shape=False, **kw)
    torch.testing.assert_close(flat, CD(C.FeatureAblation(forward)).attribute(
        loader, return_input_shape=False, **kw), rtol=0, atol=1e-12)
    with pytest.raises(TypeError, match="FeatureAblation"):
        T.DataLoaderAttribution(T.ShapleyValueSampling(forward))
