"""Issue 36: the language-model front (``TextTokenInput``, ``TextTemplateInput``,
``LLMAttribution``, ``LLMGradientAttribution``) side by side with Captum's on small random
Hugging Face Llama, Qwen2 and GPT-2 models (float64), and DeepLIFT's completeness on them
checked against the models' own forwards.

Captum is run with ``use_cached_outputs=False``: its default, token by token with the
key-value cache, gives other log-probabilities under transformers 5 (e.g. -3.2579 for
-3.2597 on the second target token here) than the uncached and the joined-sequence forwards,
which agree with each other and with this front.
"""
from __future__ import annotations

import warnings
from typing import ClassVar

import matplotlib
import numpy as np
import pytest
import torch
from _builders import DT
from captum import attr as C
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
from torch import nn
from transformers import (
    GPT2Config,
    GPT2LMHeadModel,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedTokenizerFast,
    Qwen2Config,
    Qwen2ForCausalLM,
)

from taylorattr.captum import attr as T
from taylorattr.runtime.completeness import CompletenessWarning

matplotlib.use("Agg")
WORDS = ["<unk>", "<s>", "</s>", "<pad>", "the", "a", "cat", "dog", "sat", "on", "mat", "is",
         "red", "blue", "big", "small", "and", "it", "was", "very", "happy", "sad", "Paris",
         "capital", "of", "France"]
PROMPT, TARGET = "the cat sat on the mat", "is very happy"


@pytest.fixture(autouse=True)
def _quiet():
    """This package's warnings fail the tests; Captum's and transformers' own are let be."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for peer in ("captum", "transformers", "torch", "matplotlib"):
            warnings.filterwarnings("ignore", module=peer)
        yield


@pytest.fixture(scope="module")
def tokenizer():
    return make_tokenizer()


def make_tokenizer():
    """A word-level tokenizer over ``WORDS``, ``<s>`` first."""
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.post_processor = processors.TemplateProcessing(single="<s> $A",
                                                       special_tokens=[("<s>", 1)])
    tok.decoder = decoders.WordPiece(prefix="##")
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>",
                                   unk_token="<unk>", pad_token="<pad>")


_SIZES = {"vocab_size": len(WORDS), "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 3}


def _build(arch: str):
    """The model with its weights drawn on the CPU (the same model on every device: a CUDA
    generator draws other numbers from the seed), moved to the default device."""
    torch.manual_seed(0)
    with torch.device("cpu"):
        if arch == "gpt2":
            config = GPT2Config(n_embd=16, n_layer=2, n_head=4, n_positions=64, **_SIZES)
            model = GPT2LMHeadModel(config)
        else:
            config_cls, model_cls = {"llama": (LlamaConfig, LlamaForCausalLM),
                                     "qwen2": (Qwen2Config, Qwen2ForCausalLM)}[arch]
            model = model_cls(config_cls(hidden_size=16, intermediate_size=32,
                                         num_hidden_layers=2, num_attention_heads=4,
                                         num_key_value_heads=2, max_position_embeddings=64,
                                         **_SIZES))
    return model.to(torch.get_default_device(), DT).eval()


@pytest.fixture(scope="module", params=["llama", "qwen2", "gpt2"])
def lm(request):
    return request.param, _build(request.param)


@pytest.fixture(scope="module")
def llama():
    return _build("llama")


def _token_input(mod, *args, **kw):
    """``mod.TextTokenInput(*args, **kw)``; Captum's is built on the CPU: with ``skip_tokens``
    it calls ``Tensor.map_``, which runs on CPU tensors only (its LLM fronts move the
    input to the model's device), while ours is built on the default device."""
    if mod is C:
        with torch.device("cpu"):
            return C.TextTokenInput(*args, **kw)
    return T.TextTokenInput(*args, **kw)


def _both(name, model, tokenizer, make_input, target=TARGET, seed=1, **kw):
    out = []
    for mod, extra in ((C, {"use_cached_outputs": False}), (T, {})):
        inp = make_input(mod)
        torch.manual_seed(seed)
        np.random.seed(seed)
        out.append(mod.LLMAttribution(getattr(mod, name)(model), tokenizer).attribute(
            inp, target=target, **extra, **kw))
    return out


def _same(ours, theirs, atol):
    assert ours.input_tokens == theirs.input_tokens
    assert ours.output_tokens == theirs.output_tokens
    torch.testing.assert_close(ours.seq_attr, theirs.seq_attr, rtol=0, atol=atol)
    if theirs.token_attr is None:
        assert ours.token_attr is None
    else:
        torch.testing.assert_close(ours.token_attr, theirs.token_attr, rtol=0, atol=atol)


def test_feature_ablation_equals_captums_on_every_architecture(lm, tokenizer):
    _, model = lm
    theirs, ours = _both("FeatureAblation", model, tokenizer,
                         lambda mod: _token_input(mod, PROMPT, tokenizer, skip_tokens=["<s>"]))
    _same(ours, theirs, 1e-6)  # Captum accumulates in float32
    assert ours.token_attr.shape == (3, 6)


@pytest.mark.parametrize("name, kw, prompt", [
    ("ShapleyValueSampling", {"n_samples": 3}, "the cat sat on"),
    ("ShapleyValues", {}, "the cat sat"),
    ("Lime", {"n_samples": 20}, "the cat sat on"),
    ("KernelShap", {"n_samples": 20}, "the cat sat on")])
def test_sampling_methods_equal_captums(llama, tokenizer, name, kw, prompt):
    theirs, ours = _both(name, llama, tokenizer,
                         lambda mod: _token_input(mod, prompt, tokenizer, baselines="a"), **kw)
    _same(ours, theirs, 2e-6)  # Captum's float32 sums and fits


def test_template_input_with_a_mask_and_prob_target_equals_captums(llama, tokenizer):
    def make(mod):
        return mod.TextTemplateInput("{who} sat on the {what} and {how}",
                                     {"who": "the cat", "what": "mat", "how": "it was"},
                                     baselines={"who": "a dog", "what": "", "how": "it is"},
                                     mask={"who": 0, "what": 1, "how": 0})
    out = []
    for mod, extra in ((C, {"use_cached_outputs": False}), (T, {})):
        la = mod.LLMAttribution(mod.FeatureAblation(llama), tokenizer, attr_target="prob")
        out.append(la.attribute(make(mod), target="very happy", **extra))
    _same(out[1], out[0], 1e-7)
    # the grouped values share one attribution
    assert out[1].seq_attr[0] == out[1].seq_attr[2]


def _log_probs(model, ids, target):
    with torch.no_grad():
        logits = model(torch.cat([ids, target.view(1, -1)], 1)).logits[0]
    n = ids.shape[1]
    return torch.log_softmax(logits[n - 1:-1], -1)[torch.arange(len(target)), target]


def test_ablation_by_hand(llama, tokenizer):
    """Ablating token i changes log p(t_k | .) by exactly the hand-computed amount."""
    inp = T.TextTokenInput("the cat sat", tokenizer, baselines=0)
    target = torch.tensor(tokenizer.encode(TARGET, add_special_tokens=False))
    res = T.LLMAttribution(T.FeatureAblation(llama), tokenizer).attribute(inp, target=TARGET)
    full = _log_probs(llama, inp.inp_tensor, target)
    for i in range(inp.n_itp_features):
        ids = inp.inp_tensor.clone()
        ids[0, i] = 0
        drop = full - _log_probs(llama, ids, target)
        torch.testing.assert_close(res.token_attr[:, i], drop.float(), rtol=0, atol=1e-6)
        torch.testing.assert_close(res.seq_attr[i], drop.sum().float(), rtol=0, atol=1e-6)


def test_generated_target_equals_captums(llama, tokenizer):
    gen = {"max_new_tokens": 3}
    out = []
    for mod, extra in ((C, {"use_cached_outputs": False}), (T, {})):
        inp = _token_input(mod, "the cat", tokenizer)
        out.append(mod.LLMAttribution(mod.FeatureAblation(llama), tokenizer).attribute(
            inp, gen_args=gen, **extra))
    _same(out[1], out[0], 1e-6)
    assert len(out[1].output_tokens) == 3


@pytest.mark.parametrize("layer_cls, kw", [("LayerIntegratedGradients", {"n_steps": 20}),
                                           ("LayerGradientXActivation", {})])
def test_gradient_attribution_equals_captums(lm, tokenizer, layer_cls, kw):
    _, model = lm
    out = []
    for mod in (C, T):
        inp = _token_input(mod, PROMPT, tokenizer, skip_tokens=["<s>"], baselines="a")
        method = getattr(mod, layer_cls)(model, model.get_input_embeddings())
        out.append(mod.LLMGradientAttribution(method, tokenizer).attribute(
            inp, target=TARGET, **kw))
    _same(out[1], out[0], 1e-9)  # Captum's float32 IG step sizes


def test_deeplift_token_attributions_are_complete(lm, tokenizer):
    """sum_i token_attr[k, i] = log p(t_k | x, t_<k) - log p(t_k | x~, t_<k), x~ the prompt
    with every explained token replaced by the baseline token; seq_attr sums to the change of
    the sequence's log-probability. The reference is the model's own float64 forward."""
    arch, model = lm
    inp = T.TextTokenInput("the cat sat", tokenizer, skip_tokens=["<s>"], baselines="a")
    method = T.LayerDeepLift(model, model.get_input_embeddings())
    with warnings.catch_warnings():
        if arch != "gpt2":  # RMSNorm computes in float32: the check's float64 tolerance
            warnings.simplefilter("ignore", CompletenessWarning)  # may warn; 1e-7 below
        res = T.LLMGradientAttribution(method, tokenizer).attribute(inp, target="is happy")
    target = torch.tensor(tokenizer.encode("is happy", add_special_tokens=False))
    base = inp.to_model_input(torch.zeros_like(inp.to_tensor()))
    change = _log_probs(model, inp.inp_tensor, target) - _log_probs(model, base, target)
    assert change.abs().min() > 1e-3  # a change to explain
    torch.testing.assert_close(res.token_attr.sum(1), change, rtol=0, atol=1e-7)
    torch.testing.assert_close(res.seq_attr.sum(), change.sum(), rtol=0, atol=2e-7)


def test_gradient_front_refuses_other_layers_and_methods(llama, tokenizer):
    with pytest.raises(NotImplementedError, match="input embeddings"):
        T.LLMGradientAttribution(T.LayerDeepLift(llama, llama.model.layers[0]), tokenizer)
    with pytest.raises(TypeError, match="LayerIntegratedGradients"):
        T.LLMGradientAttribution(T.IntegratedGradients(llama), tokenizer)
    with pytest.raises(TypeError, match="FeatureAblation"):
        T.LLMAttribution(T.IntegratedGradients(llama), tokenizer)
    with pytest.raises(NotImplementedError):
        T.LLMAttribution(T.FeatureAblation(llama), tokenizer).attribute_future()


def test_result_plots_draw_captums(llama, tokenizer, tmp_path):
    ours = T.LLMAttribution(T.FeatureAblation(llama), tokenizer).attribute(
        T.TextTokenInput("the cat sat", tokenizer), target=TARGET)
    theirs = C.LLMAttributionResult(input_tokens=ours.input_tokens,
                                    output_tokens=ours.output_tokens,
                                    seq_attr=ours.seq_attr, token_attr=ours.token_attr)
    (fo, ao), (_, at) = ours.plot_token_attr(), theirs.plot_token_attr()
    np.testing.assert_allclose(np.asarray(ao.images[0].get_array()),
                               np.asarray(at.images[0].get_array()), atol=1e-12)
    assert [t.get_text() for t in ao.texts] == [t.get_text() for t in at.texts]
    assert [t.get_text() for t in ao.get_xticklabels()] == \
        [t.get_text() for t in at.get_xticklabels()]
    fo.savefig(tmp_path / "tokens.png")
    (_, so), (_, st) = ours.plot_seq_attr(), theirs.plot_seq_attr()
    assert [p.get_height() for p in so.patches] == pytest.approx(
        [p.get_height() for p in st.patches])
    assert ours.seq_attr_dict == theirs.seq_attr_dict
    with pytest.raises(ValueError, match="token_attr"):
        T.LLMAttributionResult(input_tokens=["a"], output_tokens=["b", "c"],
                               seq_attr=[1.0], token_attr=[[1.0]])


class _CharTokenizer:
    """Captum's test tokenizer's interface: one character per token (its code point), <sos>
    first; offsets for the pretty tokens; no convert_tokens_to_ids."""

    pad_token_id = 0
    special: ClassVar[dict] = {0: "<sos>", 1: "<unk>"}

    def encode(self, text, add_special_tokens=True, return_tensors=None):
        ids = [ord(s[0]) if len(s) == 1 else (0 if s == "<sos>" else 1)
               for s in text.split(" ")]
        ids = [0, *ids] if add_special_tokens else ids
        return torch.tensor([ids]) if return_tensors else ids

    def convert_ids_to_tokens(self, ids):
        if isinstance(ids, int):
            return self.special.get(ids, chr(ids))
        return [self.special.get(i, chr(i)) for i in ids]

    def decode(self, ids):
        tokens = self.convert_ids_to_tokens(ids.tolist())
        return tokens if isinstance(tokens, str) else " ".join(tokens)

    def __call__(self, text=None, add_special_tokens=True, return_offsets_mapping=False):
        out = {"input_ids": self.encode(text, add_special_tokens=add_special_tokens)}
        if return_offsets_mapping:
            offsets, at = ([(0, 0)] if add_special_tokens else []), 0
            for word in text.split(" "):
                offsets.append((at - (0 if at == 0 else 1), at + len(word)))
                at += len(word) + 1
            out["offset_mapping"] = offsets
        return out


class _Output:
    def __init__(self, logits):
        self.logits = logits


class _CharLM(nn.Module):
    """A one-layer transformer over characters, causal or looking ahead (then the
    token-by-token forward and the joined sequence differ); no inputs_embeds."""

    def __init__(self, causal: bool):
        super().__init__()
        torch.manual_seed(0)
        self.causal = causal
        with torch.device("cpu"):  # the same weights on every device, then moved
            self.emb = nn.Embedding(256, 10)
            self.trans = nn.TransformerEncoderLayer(10, 2, batch_first=True, dropout=0.0)
            self.linear = nn.Linear(10, 256)
        self.to(torch.get_default_device())

    def forward(self, input_ids, *args, **kwargs):
        e = self.emb(input_ids)
        mask = nn.Transformer.generate_square_subsequent_mask(e.shape[1]).to(e.dtype) \
            if self.causal else None
        return _Output(self.linear(self.trans(e, src_mask=mask, is_causal=self.causal)))

    def generate(self, input_ids, *args, mock_response=None, **kwargs):
        response = _CharTokenizer().encode(mock_response)[1:]
        return torch.cat([input_ids, torch.tensor([response])], 1)


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("in_tokens", [True, False])
@pytest.mark.parametrize("name, kw", [("FeatureAblation", {}),
                                      ("ShapleyValueSampling", {"n_samples": 4}),
                                      ("KernelShap", {"n_samples": 25})])
def test_captums_own_test_model_equals_captums(causal, in_tokens, name, kw):
    """Captum's test setting (its tokenizer's interface, a template input, a model without
    inputs_embeds); a model that looks ahead tells the token-by-token forward from the
    joined one."""
    llm, tok = _CharLM(causal).to(DT).eval(), _CharTokenizer()
    out = []
    for mod in (C, T):
        torch.manual_seed(3)
        inp = mod.TextTemplateInput("{} b {} {} e {}", ["a", "c", "d", "f"])
        out.append(mod.LLMAttribution(getattr(mod, name)(llm), tok).attribute(
            inp, "m n o p q", use_cached_outputs=False, forward_in_tokens=in_tokens, **kw))
    # ablation and Shapley sampling difference the float64 log-probabilities, as Captum's,
    # and round once to float32 (two ulps below 1); KernelShap: Captum's float32 fit
    _same(out[1], out[0], 1e-6 if name == "KernelShap" else 1e-7)
    assert out[1].output_tokens == ["m", "n", "o", "p", "q"]


@pytest.mark.parametrize("layer_cls", ["LayerIntegratedGradients", "LayerGradientXActivation"])
def test_gradient_front_on_any_layer_equals_captums(layer_cls):
    """Captum's route (the layer method on the interpretable vector) for a model without
    inputs_embeds, skipped tokens and a generated target."""
    llm, tok = _CharLM(True).eval(), _CharTokenizer()
    for kw in ({"target": "m n o p q"}, {"gen_args": {"mock_response": "x y z"}}):
        out = []
        for mod in (C, T):
            inp = _token_input(mod, "a b c", tok, skip_tokens=[0])
            method = getattr(mod, layer_cls)(llm, llm.emb)
            out.append(mod.LLMGradientAttribution(method, tok).attribute(inp, **kw))
        _same(out[1], out[0], 1e-6)
        assert out[1].token_attr.shape[1] == 3


def test_the_readmes_llm_example_runs_and_is_complete():
    """The docs' end-to-end example (docs/captum.md): it runs, its DeepLIFT rows sum to the
    changes of the answer tokens' log-probabilities (the model's own forwards), and the text
    view shows one row per answer token."""
    from pathlib import Path

    text = (Path(__file__).parent.parent / "docs" / "captum.md").read_text()
    section = text.split("## Explaining a language model's answer", 1)[1]
    code = section.split("```python\n", 1)[1].split("```", 1)[0]
    scope: dict = {}
    exec(compile(code, "docs/captum.md example", "exec"), scope)  # noqa: S102 (the docs' own code)
    model, tokenizer, deeplift = scope["model"], scope["tokenizer"], scope["deeplift"]
    prompt = scope["prompt"]
    target = torch.tensor(tokenizer.encode("is happy", add_special_tokens=False))
    base = prompt.to_model_input(torch.zeros_like(prompt.to_tensor()))
    change = _log_probs(model, prompt.inp_tensor, target) - _log_probs(model, base, target)
    torch.testing.assert_close(deeplift.token_attr.sum(1), change, rtol=0, atol=1e-7)
    assert scope["html"].data.count("<tr><td>") == 2
    assert deeplift.output_tokens == ["is", "happy"]


def test_gradient_shap_front_equals_captums_layer_method_token_by_token():
    """LayerGradientShap through the front equals Captum's LayerGradientShap run by hand on
    each target token's forward (the same draws, in order). Captum's own front equals it for
    n_samples=1 only: its NoiseTunnel repeats the target-token tensor passed as an
    additional argument, so its rows after the first explain another token."""
    from taylorattr.captum.attr._llm import _PromptLogProb

    llm, tok = _CharLM(True).eval(), _CharTokenizer()
    base = (torch.tensor([[1, 0, 1, 0]]),)
    target = torch.tensor(tok.encode("m n o", add_special_tokens=False))
    for n in (1, 4):
        torch.manual_seed(3)
        np.random.seed(3)
        inp = T.TextTokenInput("a b c", tok)
        front = T.LLMGradientAttribution(T.LayerGradientShap(llm, llm.emb), tok)
        ours = front.attribute(inp, "m n o", baselines=base, n_samples=n)
        torch.manual_seed(3)
        np.random.seed(3)
        rows = []
        for k in range(3):
            f = _PromptLogProb(front, inp, target, k)
            a = C.LayerGradientShap(f, llm.emb).attribute(inp.to_tensor(), base, n_samples=n)
            rows.append((a[:, :-k] if k else a).sum(-1))
        torch.testing.assert_close(ours.token_attr, torch.cat(rows).detach(), rtol=0,
                                   atol=1e-6)
        if n == 1:
            torch.manual_seed(3)
            np.random.seed(3)
            theirs = C.LLMGradientAttribution(C.LayerGradientShap(llm, llm.emb), tok).attribute(
                C.TextTokenInput("a b c", tok), "m n o", baselines=base, n_samples=1)
            _same(ours, theirs, 1e-6)
