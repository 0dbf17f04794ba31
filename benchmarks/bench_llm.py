"""Language-model attribution beside the tools it replaces (issue 44): a hidden-256,
4-layer random Llama (float32, eager attention) at prompt lengths L = 16, 64, 256, warm
calls (the capture made before timing), one answer token:

* DeepLIFT: ``taylorattr.captum.attr.LLMGradientAttribution(LayerDeepLift)`` (complete)
  vs Captum's ``LayerDeepLift`` on the input embeddings (Captum's LLM front takes no
  DeepLift);
* AttnLRP: ``taylorattr.methods.EpsilonLRP`` on the input embeddings vs lxt 2.1's patched
  Llama (input times gradient);
* LayerIntegratedGradients (50 steps): the two ``LLMGradientAttribution`` fronts.

Times are medians of interleaved repeats where the peers can share a process state; lxt
patches the Llama classes for good, so it is timed after the others. Ratios are ours /
peer (below 1: ours faster).
"""
from __future__ import annotations

import argparse
import sys
import types
import warnings

import torch
from _timing import dump_json, interleaved_medians, median_time, print_table
from torch import nn

warnings.filterwarnings("ignore")


def _tokenizer(n_words: int):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, "<pad>": 3} | {f"w{i}": i + 4 for i in range(n_words)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>",
                                   unk_token="<unk>", pad_token="<pad>")


def _llama(vocab: int):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(hidden_size=256, intermediate_size=688, num_hidden_layers=4,
                         num_attention_heads=4, num_key_value_heads=4, vocab_size=vocab,
                         max_position_embeddings=512, bos_token_id=1, eos_token_id=2,
                         pad_token_id=3)
    config._attn_implementation = "eager"
    return LlamaForCausalLM(config).eval()


class _LogProb(nn.Module):
    """``log p(token | ids)`` of the model on token ids (Captum's layer methods' forward)."""

    def __init__(self, model, token: int):
        super().__init__()
        self.model, self.token = model, token

    def forward(self, ids):
        return torch.log_softmax(self.model(ids).logits[:, -1], -1)[:, self.token]


class _Logit(nn.Module):
    def __init__(self, model, token: int):
        super().__init__()
        self.model, self.token = model, token

    def forward(self, e):
        return self.model(inputs_embeds=e).logits[:, -1, self.token:self.token + 1]


def _lxt_patch():
    """lxt's AttnLRP patches on transformers' Llama (its BERT patch, which fails to import
    with transformers 5, stood in for; the attention table kept, eager attention patched)."""
    bert = types.ModuleType("lxt.efficient.models.bert")
    bert.modeling_bert, bert.attnLRP = types.ModuleType("modeling_bert_unavailable"), {}
    sys.modules.setdefault("lxt.efficient.models.bert", bert)
    from lxt.efficient import monkey_patch
    from transformers.models.llama import modeling_llama

    table = modeling_llama.ALL_ATTENTION_FUNCTIONS
    monkey_patch(modeling_llama, verbose=False)
    modeling_llama.ALL_ATTENTION_FUNCTIONS = table


def _time_length(L: int, model, tok, repeats: int):
    """Warm medians of the four calls at prompt length ``L``, and the inputs lxt reuses."""
    from captum import attr as C

    from taylorattr.captum import attr as T
    from taylorattr.methods import EpsilonLRP

    emb = model.get_input_embeddings()
    prompt = " ".join(f"w{(7 * i) % 1000}" for i in range(L - 1))  # + <s>: L tokens
    target = "w5"
    token = tok.convert_tokens_to_ids(target)
    inp = T.TextTokenInput(prompt, tok, baselines=3)
    ids = inp.inp_tensor
    base_ids = torch.full_like(ids, 3)
    ours_dl = T.LLMGradientAttribution(T.LayerDeepLift(model, emb), tok)
    theirs_dl = C.LayerDeepLift(_LogProb(model, token).eval(), emb)
    ours_ig = T.LLMGradientAttribution(T.LayerIntegratedGradients(model, emb), tok)
    theirs_ig = C.LLMGradientAttribution(C.LayerIntegratedGradients(model, emb), tok)
    c_inp = C.TextTokenInput(prompt, tok, baselines=3)
    e = emb(ids).detach()
    lrp = EpsilonLRP(_Logit(model, token).eval())
    fns = {
        "dl_ours": lambda: ours_dl.attribute(inp, target=target),
        "dl_captum": lambda: theirs_dl.attribute(ids, base_ids),
        "ig_ours": lambda: ours_ig.attribute(inp, target=target),
        "ig_captum": lambda: theirs_ig.attribute(c_inp, target=target),
        "lrp_ours": lambda: lrp.attribute(e, target=0),
    }
    t = interleaved_medians(fns, repeats)
    print(f"L={L}: " + ", ".join(f"{k} {v * 1e3:.0f} ms" for k, v in t.items()), flush=True)
    return {"L": L, **t}, (e, token)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true")
    p.add_argument("--json")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    lengths = (16, 64, 256)
    repeats = 2 if args.quick else 5
    tok = _tokenizer(1000)
    model = _llama(len(tok))
    rows, lrp_inputs = [], {}
    for L in lengths:
        row, lrp_inputs[L] = _time_length(L, model, tok, repeats)
        rows.append(row)
    _lxt_patch()
    for row in rows:
        e, token = lrp_inputs[row["L"]]

        def lxt_call(e=e, token=token):
            x = e.clone().requires_grad_(True)
            model(inputs_embeds=x).logits[0, -1, token].backward()
            return x * x.grad
        row["lrp_lxt"] = median_time(lxt_call, repeats)
    table = []
    for r in rows:
        cells = [r["L"]]
        for ours, peer in (("dl_ours", "dl_captum"), ("lrp_ours", "lrp_lxt"),
                           ("ig_ours", "ig_captum")):
            cells += [f"{r[ours] * 1e3:.0f}", f"{r[peer] * 1e3:.0f}", f"{r[ours] / r[peer]:.2f}"]
        table.append(tuple(cells))
    print_table("LLM attribution, hidden-256 4-layer Llama, warm, 1 thread (ms; ratio "
                "ours/peer; goals DeepLIFT <= 1.2, AttnLRP <= 1.0, LIG <= 1.0)", table,
                ("L", "DL ours", "Captum", "ratio", "LRP ours", "lxt", "ratio", "LIG ours",
                 "Captum", "ratio"))
    dump_json(args.json, {"rows": rows})


if __name__ == "__main__":
    main()
