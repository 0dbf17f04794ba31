"""The engines' passes as generated straight-line code (issue 43): bitwise the same as the
same calls made node by node, and the generator itself.

Independent routes: :func:`taylorattr._codegen.interpret` (each node's call made from an
environment, as the engines did before code generation) must give bitwise the same
attributions and series (``torch.equal``) for DeepLIFT, DeepLiftShap, epsilon-LRP, a
composite LRP rule, AttnLRP (epsilon-LRP on transformers) and Taylor mode orders 1 to 3 on
a small CNN, a ResNet-like and a ViT-like network and a tiny Hugging Face Llama; the
generator against ``torch.fx``'s own generated ``forward``; DeepLIFT's completeness (the
model's own ``f(x) - f(x~)``) through the generated pass; float64 autograd for Taylor
mode's first coefficient (its
reverse mode, one output at a time).
"""
from __future__ import annotations

import operator

import pytest
import torch
from _builders import DT, normal
from torch import fx, nn

from taylorattr import _codegen
from taylorattr.capture import CoreGraph
from taylorattr.methods import DeepLift, DeepLiftShap, EpsilonLRP
from taylorattr.methods.lrp_rules import LRP
from taylorattr.taylor.mode import core as taylor_core
from taylorattr.taylor.mode import register_taylor_rule

pytestmark = [pytest.mark.filterwarnings("error"),
              pytest.mark.usefixtures("one_thread")]


class _Block(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(c, c, 3, padding=1), nn.BatchNorm2d(c)
        self.conv2, self.bn2 = nn.Conv2d(c, c, 3, padding=1), nn.BatchNorm2d(c)

    def forward(self, x):
        h = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(x + self.bn2(self.conv2(h)))


def _calibrated(model: nn.Module, shape, seed=7) -> nn.Module:
    """Random batch-norm statistics (not the identity), then eval mode."""
    gen = torch.Generator().manual_seed(seed)
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.copy_(0.1 * torch.randn(m.num_features, generator=gen, dtype=DT))
            m.running_var.copy_(0.5 + torch.rand(m.num_features, generator=gen, dtype=DT))
    return model.eval()


def small_cnn():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 6, 3), nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(6, 8, 3),
                          nn.Tanh(), nn.AdaptiveAvgPool2d(2), nn.Flatten(), nn.Linear(32, 5))
    return model.to(DT).eval(), (3, 12, 12)


def resnet_like():
    torch.manual_seed(1)
    model = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(),
                          _Block(4), _Block(4), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                          nn.Linear(4, 3)).to(DT)
    return _calibrated(model, (3, 8, 8)), (3, 8, 8)


class _ViT(nn.Module):
    """Patch embedding, two pre-norm encoder layers (softmax attention, GELU), a head."""

    def __init__(self, dim=16, patch=4, size=8):
        super().__init__()
        self.embed = nn.Conv2d(3, dim, patch, stride=patch)
        self.pos = nn.Parameter(0.1 * torch.randn(1, (size // patch) ** 2, dim))
        self.layers = nn.ModuleList(nn.TransformerEncoderLayer(
            dim, 2, 2 * dim, dropout=0.0, activation="gelu", batch_first=True, norm_first=True)
            for _ in range(2))
        self.norm, self.head = nn.LayerNorm(dim), nn.Linear(dim, 4)

    def forward(self, x):
        h = self.embed(x).flatten(2).transpose(1, 2) + self.pos
        for layer in self.layers:
            h = layer(h)
        return self.head(self.norm(h).mean(1))


def vit_like():
    torch.manual_seed(2)
    return _ViT().to(DT).eval(), (3, 8, 8)


class _Llama(nn.Module):
    """A tiny Hugging Face Llama on its input embeddings: the last position's logits (in
    float32: its RMSNorm computes in float32 whatever the model's dtype)."""

    def __init__(self):
        super().__init__()
        from transformers import LlamaConfig, LlamaForCausalLM

        torch.manual_seed(3)
        self.lm = LlamaForCausalLM(LlamaConfig(
            vocab_size=12, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32))

    def forward(self, embeds):
        return self.lm(inputs_embeds=embeds, use_cache=False).logits[:, -1]


def tiny_llama():
    return _Llama().eval(), (5, 16)


MODELS = {"cnn": small_cnn, "resnet": resnet_like, "vit": vit_like, "llama": tiny_llama}
_BUILT: dict = {}


def _model(name):
    if name not in _BUILT:
        _BUILT[name] = MODELS[name]()
    return _BUILT[name]


def _inputs(model, shape, seed=4):
    x, base = normal((2, *shape), seed=seed, n=2,
                     dtype=next(model.parameters()).dtype)
    return x, 0.3 * base


def _both(run):
    """``run()`` through the generated passes and through the reference interpreter."""
    compiled = run()
    with _codegen.interpreting():
        interpreted = run()
    return compiled, interpreted


METHODS = {
    "deeplift": lambda m, x, b: DeepLift(m).attribute(x, b, target=1),
    "deeplift_shap": lambda m, x, b: DeepLiftShap(m).attribute(
        x, torch.cat([b, 0.5 * b, torch.zeros_like(b[:1])]), target=1),
    "epsilon_lrp": lambda m, x, b: EpsilonLRP(m).attribute(x, target=1),
    "lrp_epsilon_plus": lambda m, x, b: LRP(m, "epsilon_plus").attribute(x, target=1),
}


@pytest.mark.parametrize("model", ["cnn", "resnet", "vit"])
@pytest.mark.parametrize("method", sorted(METHODS))
def test_layerwise_engine_compiled_equals_interpreted_bitwise(model, method):
    m, shape = _model(model)
    x, base = _inputs(m, shape)
    compiled, interpreted = _both(lambda: METHODS[method](m, x, base))
    assert torch.equal(compiled, interpreted)
    assert compiled.abs().sum() > 0


@pytest.mark.parametrize("method", ["deeplift", "epsilon_lrp"])
def test_llama_deeplift_and_attnlrp_compiled_equal_interpreted_bitwise(method):
    """AttnLRP is epsilon-LRP on a transformer (uniform rule on products, softmax as
    gradient times input, the normaliser of RMSNorm held constant)."""
    m, shape = _model("llama")
    x, base = _inputs(m, shape)
    compiled, interpreted = _both(lambda: METHODS[method](m, x, base))
    assert torch.equal(compiled, interpreted)
    if method == "deeplift":  # complete through the generated pass: the model's own change
        with torch.no_grad():
            df = m(x)[:, 1] - m(base)[:, 1]
        torch.testing.assert_close(compiled.flatten(1).sum(1), df, rtol=1e-4, atol=1e-5)


def test_layerwise_half_precision_upcast_compiled_equals_interpreted():
    """The float32 pass of a bfloat16 model (its dtype constants widened in the generated
    code) is the interpreter's."""
    m, shape = small_cnn()
    m = m.to(torch.bfloat16)
    x, base = (t.to(torch.bfloat16) for t in _inputs(small_cnn()[0], shape))
    compiled, interpreted = _both(lambda: DeepLift(m).attribute(x, base, target=1))
    assert torch.equal(compiled, interpreted)


@pytest.mark.parametrize("model", ["cnn", "resnet", "vit", "llama"])
def test_taylor_mode_compiled_equals_interpreted_bitwise(model):
    """Against the interpreter of the capture (``CoreGraph.run`` with the node handler the
    engine used before code generation) and against the reference of the generator."""
    m, shape = _model(model)
    x, _ = _inputs(m, shape)
    directions = normal((2, 3, *shape), seed=9, dtype=x.dtype)
    tight = {"rtol": 1e-9, "atol": 1e-11} if x.dtype == DT else {"rtol": 1e-4, "atol": 1e-5}
    graph = taylor_core.trace(m).graph(x)
    for order in (1, 2, 3):
        compiled, interpreted = _both(lambda o=order: taylor_core.propagate(m, x, directions, o))
        jet = taylor_core.CoreJet(x, directions.transpose(0, 1).unsqueeze(0), order,
                                  affine=True)
        with torch.no_grad():
            handled = graph.run(jet, handler=taylor_core._handle)
        for other in (interpreted, taylor_core.Jet(handled.primal,
                                                   handled.full().transpose(1, 2))):
            assert torch.equal(compiled.primal, other.primal)
            assert torch.equal(compiled.series, other.series)
    # the first coefficient is the directional derivative: the Jacobian (reverse mode, a
    # row per output) applied to each direction
    xg = x.clone().requires_grad_(True)
    with torch.enable_grad():
        out = m(xg)
        rows = torch.stack([torch.autograd.grad(out[:, c].sum(), xg, retain_graph=True)[0]
                            for c in range(out.shape[1])], 1)  # [B, C, *s]
    jvp = torch.einsum("bcs,brs->brc", rows.flatten(2), directions.flatten(2))
    torch.testing.assert_close(compiled.series[0], jvp, **tight)
    with torch.no_grad():
        torch.testing.assert_close(compiled.primal, m(x), **tight)


def test_warm_calls_run_no_interpreter(monkeypatch):
    """After the first call, a call dispatches no node through an interpreter
    (``fx.Interpreter.run_node``, ``CoreGraph.run``): the passes are the generated code."""
    m, shape = _model("cnn")
    x, base = _inputs(m, shape)
    directions = normal((2, 1, *shape), seed=9)
    DeepLift(m).attribute(x, base, target=1)
    taylor_core.propagate(m, x, directions, 2)
    calls = []
    monkeypatch.setattr(fx.Interpreter, "run_node", lambda *a, **k: calls.append("fx"))
    monkeypatch.setattr(CoreGraph, "run", lambda *a, **k: calls.append("core"))
    DeepLift(m).attribute(x, base, target=1)
    EpsilonLRP(m).attribute(x, target=1)
    taylor_core.propagate(m, x, directions, 2)
    assert calls == []


def test_a_rule_registered_later_reaches_the_generated_pass():
    """The Taylor pass binds each node's rule when it is generated: registering a rule
    generates it again (here a wrong rule, tanh's value for sigmoid's, must show)."""
    torch.manual_seed(5)
    m = nn.Sequential(nn.Linear(3, 4), nn.Sigmoid(), nn.Linear(4, 2)).to(DT).eval()
    x = normal((2, 3), seed=1)
    d = normal((2, 1, 3), seed=2)
    before = taylor_core.propagate(m, x, d, 1)
    remove = register_taylor_rule(torch.ops.aten.sigmoid.default,
                                  lambda y: y.unary(lambda c: [torch.tanh(c[0])] + c[1:]))
    try:
        wrong = taylor_core.propagate(m, x, d, 1)
    finally:
        remove()
    after = taylor_core.propagate(m, x, d, 1)
    with torch.no_grad():
        tanh_model = m[2](torch.tanh(m[0](x)))
    torch.testing.assert_close(wrong.primal, tanh_model, rtol=1e-12, atol=1e-12)
    assert torch.equal(after.primal, before.primal)
    assert torch.equal(after.series, before.series)


def test_generated_code_equals_fx_forward_and_frees_values():
    """The generator on a plain traced module (literals, a dtype constant, a list argument,
    a getitem of a multi-output op) against torch.fx's own generated ``forward``; each
    value is dropped after its last use."""
    class Net(nn.Module):
        def forward(self, x, y):
            a = torch.relu(x) * 2.5 - y
            b = torch.cat([a, x], dim=1).to(torch.float64)
            top = torch.max(b, dim=1)
            return top[0] + b.sum(1), a.mean()

    gm = fx.symbolic_trace(Net())
    x, y = normal((3, 4), seed=1, n=2, dtype=torch.float32)
    fn = _codegen.generate(gm.graph, lambda n: _codegen.Call(
        getattr(torch.Tensor, n.target) if n.op == "call_method" else n.target,
        tuple(n.args), dict(n.kwargs)))
    got, want = fn(None, [x, y]), gm(x, y)
    assert all(torch.equal(g, w) for g, w in zip(got, want))
    assert "del " in fn.__source__ and "torch.float64" not in fn.__source__
    ref = _codegen.interpret(gm.graph, lambda n: _codegen.Call(
        getattr(torch.Tensor, n.target) if n.op == "call_method" else n.target,
        tuple(n.args), dict(n.kwargs)), None, [x, y])
    assert all(torch.equal(g, r) for g, r in zip(got, ref))
    assert operator.getitem in fn.__globals__.values()


def test_state_reaches_the_kernels():
    """:data:`_codegen.STATE` among a call's arguments is the state the function is given."""
    graph = fx.Graph()
    x = graph.placeholder("x")
    y = graph.call_function(torch.neg, (x,))
    graph.output(y)
    seen = []

    def emit(n):
        return _codegen.Call(lambda s, v: seen.append(s) or -v, (_codegen.STATE, x))

    fn = _codegen.generate(graph, emit)
    t = torch.arange(3.0)
    assert torch.equal(fn("state", [t]), -t) and seen == ["state"]


def test_the_generated_passes_read_the_live_parameters():
    """Parameters are read from the model at every call (their paths resolved once): a
    parameter replaced by a new one, or changed in place, gives what a fresh copy of the
    changed model gives (its own capture and plan)."""
    import copy

    m, shape = small_cnn()
    x, base = _inputs(m, shape)
    d = normal((2, 2, *shape), seed=9)
    DeepLift(m).attribute(x, base, target=1)
    taylor_core.propagate(m, x, d, 2)
    with torch.no_grad():
        m[0].weight = nn.Parameter(2 * m[0].weight)
        m[3].bias.add_(0.5)
    fresh = copy.deepcopy(m)
    assert torch.equal(DeepLift(m).attribute(x, base, target=1),
                       DeepLift(fresh).attribute(x, base, target=1))
    ours, theirs = taylor_core.propagate(m, x, d, 2), taylor_core.propagate(fresh, x, d, 2)
    assert torch.equal(ours.series, theirs.series)
    with torch.no_grad():
        torch.testing.assert_close(ours.primal, m(x), rtol=1e-12, atol=1e-12)


def test_new_method_objects_of_the_same_settings_reuse_plans_and_code(monkeypatch):
    """``EpsilonLRP(model)`` or ``LRP(model, rule)`` made anew for each call (as a Captum
    user writes it) find the plan and generated passes of the first object; another
    epsilon or another layer rule makes its own."""
    m, shape = small_cnn()
    x, _ = _inputs(m, shape)
    first = {"eps": EpsilonLRP(m, 1e-6).attribute(x, target=1),
             "plus": LRP(m, "epsilon_plus").attribute(x, target=1)}
    made = []
    real = _codegen.generate
    monkeypatch.setattr(_codegen, "generate", lambda *a, **k: made.append(1) or real(*a, **k))
    assert torch.equal(EpsilonLRP(m, 1e-6).attribute(x, target=1), first["eps"])
    assert torch.equal(LRP(m, "epsilon_plus").attribute(x, target=1), first["plus"])
    assert made == []
    other = EpsilonLRP(m, 1e-3).attribute(x, target=1)
    assert len(made) == 1 and not torch.equal(other, first["eps"])
    flat = LRP(m, "epsilon_plus", layer_rules={"0": "flat"}).attribute(x, target=1)
    assert len(made) == 2 and not torch.equal(flat, first["plus"])
