"""
Causal language model: the answer's tokens, explained by the prompt's
=====================================================================

Captum's ``LLMAttribution`` front, from ``taylorattr.captum.attr``, on a small Llama with
random weights (it stands in for ``AutoModelForCausalLM.from_pretrained(...)``).
``LayerDeepLift`` on the input embeddings is complete: row ``k`` of ``token_attr`` sums
to the change of ``log p(answer_k | prompt, answer_<k)`` when the prompt's tokens are
replaced by the baseline token.
"""
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from taylorattr.captum.attr import (
    FeatureAblation,
    LayerDeepLift,
    LLMAttribution,
    LLMGradientAttribution,
    TextTokenInput,
)

words = ["<unk>", "<s>", "</s>", "the", "cat", "sat", "on", "mat", "is", "happy", "sad"]
tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
tok.post_processor = processors.TemplateProcessing(single="<s> $A",
                                                   special_tokens=[("<s>", 1)])
tok.decoder = decoders.WordPiece()
tokenizer = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>",
                                    unk_token="<unk>")
torch.manual_seed(0)
model = LlamaForCausalLM(LlamaConfig(
    vocab_size=len(words), hidden_size=16, intermediate_size=32, num_hidden_layers=2,
    num_attention_heads=4, num_key_value_heads=2, bos_token_id=1, eos_token_id=2))
model = model.double().eval()

prompt = TextTokenInput("the cat sat on the mat", tokenizer, skip_tokens=["<s>"])
answer = "is happy"

# %%
# Feature ablation (Captum's perturbation front) and DeepLIFT on the embeddings.
ablation = LLMAttribution(FeatureAblation(model), tokenizer).attribute(prompt, target=answer)
deeplift = LLMGradientAttribution(LayerDeepLift(model, model.get_input_embeddings()),
                                  tokenizer).attribute(prompt, target=answer)
print(deeplift.output_tokens, deeplift.input_tokens)
print(deeplift.token_attr.sum(1))   # per answer token: its log-probability's change

# %%
fig, ax = deeplift.plot_token_attr()
