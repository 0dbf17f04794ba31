"""Element-wise subgraphs of one tensor are one activation for the layer-wise rules
(``methods/layerwise/fusion.py``, issue 44).

Independent routes: the same network with the activation as one operation (``F.gelu``
with ``approximate="tanh"``, ``F.silu``, ``F.softplus``, kept whole by the capture), a
float64 closed form of AttnLRP's identity rule on a two-layer network, DeepLIFT's
completeness against the model's own outputs, and lxt 2.1's AttnLRP (its own rule
functions, patched into stock Hugging Face GPT-2 and Phi as lxt's patches do).
"""
from __future__ import annotations

import contextlib
import math
import sys
import types
import warnings

import pytest
import torch
import torch.nn.functional as F
from _builders import DT
from torch import nn

from taylorattr.methods import DeepLift, EpsilonLRP
from taylorattr.methods.layerwise import get_plan
from taylorattr.methods.layerwise.rules import epsilon_rule
from taylorattr.runtime.completeness import CompletenessWarning

pytestmark = pytest.mark.filterwarnings("error")


def gelu_new(x):  # GPT-2's, as transformers writes it
    return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x.pow(3))))


def silu_by_hand(x):
    return x * torch.sigmoid(x)


def softplus_by_hand(x):
    return torch.log(1 + torch.exp(x))


def gelu_erf_by_hand(x):
    return x * 0.5 * (1.0 + torch.erf(x / math.sqrt(2.0)))


WRITTEN = {"gelu_new": (gelu_new, lambda x: F.gelu(x, approximate="tanh")),
           "silu": (silu_by_hand, F.silu),
           "softplus": (softplus_by_hand, F.softplus),
           "gelu": (gelu_erf_by_hand, F.gelu)}


class _Act(nn.Module):
    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, x):
        return self.fn(x)


def _mlp(fn, seed=0):
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(6, 8), _Act(fn), nn.Linear(8, 3)).to(DT).eval()


def _pair(name):
    written, one_op = WRITTEN[name]
    a, b = _mlp(written), _mlp(one_op)
    b.load_state_dict(a.state_dict())
    return a, b


@pytest.mark.parametrize("name", list(WRITTEN))
def test_written_out_activation_takes_the_activations_rule(name):
    """AttnLRP (epsilon-LRP) and DeepLIFT of the written-out network equal those of the
    same network with the activation as one operation; the LRP map equals the float64
    closed form of the identity rule, ``x * W1^T (phi(a) / a * W2[t])``; DeepLIFT is
    complete."""
    written, one_op = _pair(name)
    x = torch.randn(4, 6, dtype=DT, generator=torch.Generator().manual_seed(1))
    base = torch.full_like(x, 0.3)
    for t in range(3):
        lrp = EpsilonLRP(written, epsilon=1e-14).attribute(x, target=t)
        torch.testing.assert_close(lrp, EpsilonLRP(one_op, epsilon=1e-14).attribute(
            x, target=t), rtol=0, atol=1e-12)
        lin1, lin2 = written[0], written[2]
        a = lin1(x).detach()
        f = (lin2(WRITTEN[name][1](a)))[:, t].detach()
        g_h = lin2.weight[t].detach() * (f / (f + 1e-14 * f.sign())).unsqueeze(1)
        g_a = g_h * WRITTEN[name][1](a) / (a + 1e-14 * a.sign())
        torch.testing.assert_close(lrp, x * (g_a @ lin1.weight.detach()), rtol=0, atol=1e-12)
        dl = DeepLift(written).attribute(x, base, target=t)
        torch.testing.assert_close(dl, DeepLift(one_op).attribute(x, base, target=t), rtol=0,
                                   atol=1e-12)
        change = (written(x) - written(base))[:, t].detach()
        torch.testing.assert_close(dl.sum(1), change, rtol=0, atol=1e-12)


def test_fused_plan_has_one_activation_and_products_stay_products():
    """gelu_new becomes one activation node; a product of two different tensors (a gate)
    and a residual sum of x with a function of x that is used elsewhere are not fused."""
    written, _ = _pair("gelu_new")
    x = torch.randn(2, 6, dtype=DT)
    plan = get_plan(written, epsilon_rule(1e-9), x)
    kinds = list(plan.kinds.values())
    assert kinds.count("activation") == 1 and "product" not in kinds

    class Gated(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Linear(6, 4), nn.Linear(6, 4)

        def forward(self, x):
            h = torch.tanh(self.a(x))
            return torch.cat([h * self.b(x), h], 1)

    gated = Gated().to(DT).eval()
    kinds = list(get_plan(gated, epsilon_rule(1e-9), x).kinds.values())
    assert kinds.count("product") == 1 and kinds.count("activation") == 1


# --- Hugging Face configs ---------------------------------------------------------------
def _lxt():
    """lxt.efficient's rules and patches. ``import lxt.efficient`` imports its BERT patch,
    which fails with transformers 5; a stand-in module takes its place (BERT is not used)."""
    bert = types.ModuleType("lxt.efficient.models.bert")
    bert.modeling_bert, bert.attnLRP = types.ModuleType("modeling_bert_unavailable"), {}
    sys.modules.setdefault("lxt.efficient.models.bert", bert)
    from lxt.efficient import patches, rules
    return patches, rules


@contextlib.contextmanager
def _patched(changes):
    """Set ``(owner, name) -> value`` for the block, then restore (lxt's monkey_patch
    changes classes for good)."""
    old = {key: getattr(*key) for key in changes}
    try:
        for (owner, name), value in changes.items():
            setattr(owner, name, value)
        yield
    finally:
        for (owner, name), value in old.items():
            setattr(owner, name, value)


class _Last(nn.Module):
    """Next-token logits of a causal LM on input embeddings."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, e):
        return self.model(inputs_embeds=e).logits[:, -1, :]


def _lxt_relevance(model, e, target):
    e = e.clone().requires_grad_(True)
    model(inputs_embeds=e).logits[0, -1, target].backward()
    return (e * e.grad).detach()


_SIZES = {"vocab_size": 40, "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0}


def _hf(name):
    from transformers import (
        GemmaConfig,
        GemmaForCausalLM,
        GPT2Config,
        GPT2LMHeadModel,
        GPTNeoXConfig,
        GPTNeoXForCausalLM,
        MistralConfig,
        MistralForCausalLM,
        PhiConfig,
        PhiForCausalLM,
    )
    small = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
             "num_attention_heads": 4, "max_position_embeddings": 64, **_SIZES}
    torch.manual_seed(0)
    if name == "gpt2":
        model = GPT2LMHeadModel(GPT2Config(n_embd=32, n_layer=2, n_head=4, n_positions=64,
                                           **_SIZES))
    elif name == "phi":
        model = PhiForCausalLM(PhiConfig(**small, hidden_act="gelu_new"))
    elif name == "gpt_neox":
        model = GPTNeoXForCausalLM(GPTNeoXConfig(**small, hidden_act="gelu_new"))
    elif name == "gemma":
        model = GemmaForCausalLM(GemmaConfig(**small, num_key_value_heads=2, head_dim=8,
                                             hidden_activation="gelu_pytorch_tanh"))
    else:
        model = MistralForCausalLM(MistralConfig(**small, num_key_value_heads=2,
                                                 hidden_act="silu"))
    model.config._attn_implementation = "eager"
    return model.to(DT).eval()


def _embeddings(model):
    ids = torch.tensor([[3, 7, 11, 2, 9, 4]])
    return model.get_input_embeddings()(ids).detach()


def test_stock_gpt2_attnlrp_equals_lxt():
    """GPT-2's default gelu_new (written out in Python) takes the identity rule: equal to
    lxt 2.1's AttnLRP patches (identity on the MLP's activation, LayerNorm's std held,
    attention's matmuls uniform) to 1e-6 of the largest relevance."""
    from transformers.models.gpt2 import modeling_gpt2

    patches, _ = _lxt()
    model = _hf("gpt2")
    e = _embeddings(model)
    target = int(_Last(model)(e)[0].argmax())
    ours = EpsilonLRP(_Last(model).eval(), epsilon=1e-10).attribute(e, target=target)
    from lxt.efficient.models import gpt2 as lxt_gpt2
    with _patched({(modeling_gpt2.GPT2MLP, "forward"): lxt_gpt2.mlp_forward,
                   (nn.LayerNorm, "forward"): patches.layer_norm_forward,
                   (modeling_gpt2, "eager_attention_forward"):
                       patches.wrap_attention_forward(modeling_gpt2.eager_attention_forward)}):
        theirs = _lxt_relevance(model, e, target)
    scale = theirs.abs().max()
    assert (ours - theirs).abs().max() <= 1e-6 * scale
    assert abs(ours.sum() - theirs.sum()) <= 1e-6 * theirs.abs().sum()


def test_phi_attnlrp_equals_lxts_rules():
    """Phi (gelu_new, LayerNorm, partial rotary attention): lxt's rule functions patched
    in as lxt patches GPT-2 (lxt ships no Phi map)."""
    from transformers.models.phi import modeling_phi

    patches, rules = _lxt()
    model = _hf("phi")
    e = _embeddings(model)
    target = int(_Last(model)(e)[0].argmax())
    ours = EpsilonLRP(_Last(model).eval(), epsilon=1e-10).attribute(e, target=target)

    def mlp_forward(self, x):
        return self.fc2(rules.identity_rule_implicit(self.activation_fn, self.fc1(x)))
    with _patched({(modeling_phi.PhiMLP, "forward"): mlp_forward,
                   (nn.LayerNorm, "forward"): patches.layer_norm_forward,
                   (modeling_phi, "eager_attention_forward"):
                       patches.wrap_attention_forward(modeling_phi.eager_attention_forward)}):
        theirs = _lxt_relevance(model, e, target)
    assert (ours - theirs).abs().max() <= 1e-6 * theirs.abs().max()


@pytest.mark.slow
@pytest.mark.parametrize("name", ["gpt2", "phi", "gpt_neox", "gemma", "mistral"])
def test_hf_configs_fused_and_deeplift_complete(name):
    """Every MLP activation is one activation node (no product left inside it), and
    DeepLIFT on the input embeddings is complete against the model's own outputs."""
    model = _hf(name)
    e = _embeddings(model)
    wrapped = _Last(model).eval()
    base = torch.zeros_like(e)
    target = int(wrapped(e)[0].argmax())
    with warnings.catch_warnings():
        if name in ("gemma", "mistral"):  # RMSNorm computes in float32: float32 rounding
            warnings.simplefilter("ignore", CompletenessWarning)
        a = DeepLift(wrapped).attribute(e, base, target=target)
    with torch.no_grad():
        change = wrapped(e)[0, target] - wrapped(base)[0, target]
    assert abs(float(change)) > 1e-3
    torch.testing.assert_close(a.sum(), change, rtol=0, atol=1e-5 if name in ("gemma", "mistral") else 1e-9)
    plan = get_plan(wrapped, epsilon_rule(1e-9), e)
    fused = [n for n in plan.graph.nodes if n.name in plan.kinds and
             "taylorattr.elementwise" in str(n.target)]
    assert len(fused) >= (2 if name in ("gpt2", "phi", "gpt_neox") else 0)
