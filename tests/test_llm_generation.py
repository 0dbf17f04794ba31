"""``explain_generation`` (issue 44): AttnLRP, DeepLIFT, IG and Taylor attribution of a
causal LM's answer, on tiny random Hugging Face models, and the examples of docs/llm.md
run as they are written.

Independent routes: the model's own forwards (DeepLIFT's completeness, the explained
values), epsilon-LRP run separately on each answer token's own prefix (the joined
sequence read at position n + k - 1 must give the same relevances), the prompts explained
one by one (a padded batch must give the same), the Taylor orders' own sum.
Warnings of this package fail these tests unless a test expects them.
"""
from __future__ import annotations

import re
import warnings
from pathlib import Path

import pytest
import torch
from test_captum_llm import _build, _log_probs, make_tokenizer
from torch import nn

from taylorattr.methods import EpsilonLRP
from taylorattr.methods.generation import explain_generation
from taylorattr.runtime.completeness import CompletenessWarning

pytestmark = pytest.mark.filterwarnings("error")
PROMPT, ANSWER = "the cat sat on the mat", "is very happy"


@pytest.fixture(scope="module")
def tokenizer():
    return make_tokenizer()


@pytest.fixture(scope="module")
def gpt2():
    return _build("gpt2")


def _answer_ids(tokenizer, text=ANSWER):
    return torch.tensor(tokenizer.encode(text, add_special_tokens=False))


def test_deeplift_rows_are_complete_against_the_models_own_forwards(gpt2, tokenizer):
    res = explain_generation(gpt2, tokenizer, PROMPT, "deeplift", answer=ANSWER)
    ids = torch.tensor([tokenizer.encode(PROMPT)])
    base = ids.clone()
    base[0, 1:] = tokenizer.pad_token_id  # <s> is special: it stays
    target = _answer_ids(tokenizer)
    full, at_base = _log_probs(gpt2, ids, target), _log_probs(gpt2, base, target)
    torch.testing.assert_close(res.outputs, full, rtol=0, atol=1e-12)
    torch.testing.assert_close(res.token_attr.sum(1), full - at_base, rtol=0, atol=1e-10)
    assert (full - at_base).abs().min() > 1e-3
    assert res.token_attr.shape == (3, ids.shape[1]) and not res.token_attr[:, 0].any()
    assert res.answer_tokens == ["is", "very", "happy"]


class _PrefixLogit(nn.Module):
    def __init__(self, model, token):
        super().__init__()
        self.model, self.token, self.training = model, token, False

    def forward(self, e):
        return self.model(inputs_embeds=e).logits[:, -1, self.token]


def test_attnlrp_on_the_joined_sequence_equals_each_prefix_alone(gpt2, tokenizer):
    res = explain_generation(gpt2, tokenizer, PROMPT, "attnlrp", answer=ANSWER)
    ids = tokenizer.encode(PROMPT)
    answer = _answer_ids(tokenizer).tolist()
    emb = gpt2.get_input_embeddings()
    for k, tok in enumerate(answer):
        e = emb(torch.tensor([ids + answer[:k]])).detach()
        r = EpsilonLRP(_PrefixLogit(gpt2, tok)).attribute(e)
        torch.testing.assert_close(res.token_attr[k], r.sum(-1)[0, :len(ids)], rtol=0,
                                   atol=1e-10)


def test_a_padded_batch_equals_the_prompts_one_by_one(gpt2, tokenizer):
    prompts = ["the cat sat", "a big red dog was very"]
    rows = [tokenizer.encode(p) for p in prompts]
    width = max(map(len, rows))
    ids = torch.tensor([[3] * (width - len(r)) + r for r in rows])  # left padding
    mask = (ids != 3).long()
    both = explain_generation(gpt2, tokenizer, ids, "ig", attention_mask=mask,
                              answer=["is happy", "sad"], n_steps=16)
    for p, a, got in zip(prompts, ["is happy", "sad"], both):
        alone = explain_generation(gpt2, tokenizer, p, "ig", answer=a, n_steps=16)
        torch.testing.assert_close(got.token_attr, alone.token_attr, rtol=0, atol=1e-12)
        assert got.prompt_tokens == alone.prompt_tokens


def test_taylor_reports_its_convergence_and_warns_when_the_series_diverges(gpt2, tokenizer):
    with pytest.warns(CompletenessWarning, match="does not converge.*'ig'.*'deeplift'"):
        res = explain_generation(gpt2, tokenizer, "the cat sat", "taylor", answer="is",
                                 order=3)
    change = res.outputs - res.baseline_outputs
    left = (change.view(-1, 1) - res.orders.cumsum(1)).abs() / change.abs().view(-1, 1)
    torch.testing.assert_close(res.convergence, left, rtol=0, atol=1e-12)
    # the attributions sum to the series' own partial sum g_K (Theorem 5), not the change
    torch.testing.assert_close(res.token_attr.sum(1), res.orders.sum(1), rtol=0, atol=1e-10)
    assert res.convergence[:, -1].max() > 0.1
    # the warning's threshold is the tolerance: shares below it pass silently
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        near = explain_generation(gpt2, tokenizer, "the cat", "taylor", answer="is",
                                  order=4, tolerance=2.0)
    assert near.convergence.shape == (1, 4) and (near.convergence[:, -1] <= 2.0).all()


def test_bad_arguments_are_refused_with_what_to_do(gpt2, tokenizer):
    with pytest.raises(ValueError, match="method must be one of"):
        explain_generation(gpt2, tokenizer, PROMPT, "gradcam")
    with pytest.raises(TypeError, match="takes no option"):
        explain_generation(gpt2, tokenizer, PROMPT, "deeplift", n_steps=3)
    with pytest.raises(TypeError, match="prompt must be"):
        explain_generation(gpt2, tokenizer, 3.5, "deeplift")
    gpt2.train()
    try:
        with pytest.raises(ValueError, match="eval"):
            explain_generation(gpt2, tokenizer, PROMPT, "deeplift")
    finally:
        gpt2.eval()


def _blocks():
    text = (Path(__file__).parent.parent / "docs" / "llm.md").read_text()
    return re.findall(r"```python\n(.*?)```", text, re.DOTALL)


def test_the_docs_examples_run_on_a_tiny_random_gpt2(gpt2, tokenizer):
    """docs/llm.md's three examples (each under 15 lines) on the tiny model: AttnLRP's rows
    are lxt's convention (the logit), DeepLIFT's gap is rounding, the Taylor example's
    warning is raised exactly when its convergence says so."""
    blocks = _blocks()
    assert len(blocks) == 3 and all(len(b.strip().splitlines()) < 15 for b in blocks)
    results = []
    for code in blocks:
        scope = {"model": gpt2, "tokenizer": tokenizer}
        exec(compile(code, "docs/llm.md", "exec"), scope)  # noqa: S102 (the docs' own code)
        results.append(scope)
    lrp, _, taylor = (s["res"] for s in results)
    assert lrp.output == "logit" and len(lrp.answer_tokens) == 3
    torch.testing.assert_close(lrp.outputs, torch.stack([
        gpt2(torch.tensor([tokenizer.encode("the capital of France is")
                           + lrp.answer_ids[:k].tolist()])).logits[0, -1, int(t)]
        for k, t in enumerate(lrp.answer_ids)]).detach(), rtol=0, atol=1e-12)
    assert results[1]["gap"] < 1e-10
    warned = any("does not converge" in m for m in [str(w.message) for w in
                                                    results[2]["caught"]])
    assert warned == bool((taylor.convergence[:, -1] > 0.1).any())
