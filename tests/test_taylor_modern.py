"""Taylor mode on modern smooth blocks, against float64 repeated autograd.

Every rule is checked on a small model through ``ta.taylor_terms``: the per-order terms
``P_k`` must equal ``-h^(k)(0)/k!`` for ``h(t) = f(x - t delta)`` by nested autograd in t.
The acceptance models (a tiny vision transformer, a smooth ResNet-like CNN) are checked
in every field against an independent autograd computation of each field's definition.
"""
import math
from unittest import mock

import pytest
import torch
import torch.nn.functional as F
from test_taylor import DT, _autograd_orders
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel

import taylorattr as ta
from taylorattr import series as S
from taylorattr.taylor.mode import UnsupportedOperation, supported_ops_markdown

torch.manual_seed(0)


def _layer_norm_by_formula(x, normalized_shape, weight=None, bias=None, eps=1e-5):
    """``(x - mean) / sqrt(var + eps) * w + b`` in plain ops. PyTorch's own F.layer_norm has a
    wrong third derivative under autograd (its double backward is treated as final): at
    order 3 it disagrees with this formula, with F.group_norm on the same groups and with
    finite differences of the second derivative. References use this formula instead."""
    dims = tuple(range(-len(normalized_shape), 0))
    c = x - x.mean(dims, keepdim=True)
    y = c / torch.sqrt((c * c).mean(dims, keepdim=True) + eps)
    y = y if weight is None else y * weight
    return y if bias is None else y + bias


def _reference(f):
    """``f`` evaluated with :func:`_layer_norm_by_formula` in place of F.layer_norm and
    PyTorch's plain-math attention kernel (the fused CPU kernel has no double backward)."""
    def run(*args):
        with mock.patch.object(F, "layer_norm", _layer_norm_by_formula), \
                sdpa_kernel(SDPBackend.MATH):
            return f(*args)
    return run


def _check_orders(model, x, base, K=3, target=1, sample_model=None):
    """``sample_model(b)``: the model for sample ``b`` alone (when it holds per-sample data)."""
    terms = ta.taylor_terms(model, x, base, order=K, target=target)
    for b in range(x.shape[0]):
        one = model if sample_model is None else sample_model(b)
        ref = _reference(_autograd_orders)(lambda z, one=one: one(z[None])[0, target], x[b],
                                          x[b] - base[b], K)
        torch.testing.assert_close(terms.orders[b], ref, rtol=1e-9, atol=1e-13)
    return terms


def _pair(*shape):
    return torch.randn(2, *shape, dtype=DT), 0.5 * torch.randn(2, *shape, dtype=DT)


# ---------------------------------------------------------------- elementwise

class Gelus(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(5, 6)
        self.act = nn.GELU()
        self.act_tanh = nn.GELU(approximate="tanh")
        self.out = nn.Linear(6, 3)

    def forward(self, x):
        h = self.lin(x)
        h = self.act(h) + self.act_tanh(h) * F.gelu(h, approximate="tanh") + F.gelu(h)
        return self.out(torch.erf(h) + torch.special.erf(0.5 * h))


def test_gelu_both_forms_and_erf_against_autograd():
    x, base = _pair(5)
    _check_orders(Gelus().to(DT).eval(), 2 * x, base, K=4)


def test_layer_norm_third_order_against_finite_differences():
    """The formula the references use, checked where autograd of F.layer_norm is wrong."""
    x, v = torch.randn(1, 4, 3, dtype=DT), torch.randn(1, 1, 4, 3, dtype=DT)
    jet = ta.taylor_mode.propagate(nn.LayerNorm(3).to(DT), x, v, order=3)

    def second(s):  # d^2/dt^2 LN(x + t v) at t = s, by autograd on the formula
        t = torch.tensor(s, dtype=DT, requires_grad=True)
        y = _layer_norm_by_formula(x + t * v[:, 0], (3,)).sum()
        (g,) = torch.autograd.grad(y, t, create_graph=True)
        return torch.autograd.grad(g, t)[0]

    h = 1e-4
    third = (second(h) - second(-h)) / (2 * h)
    torch.testing.assert_close(6 * jet.series[2].sum(), third, rtol=1e-6, atol=1e-8)


def test_gelu_and_erf_series_against_closed_derivatives():
    """Scalar check of the recurrences against hand-written derivatives at a point."""
    x0 = torch.tensor([0.3, -1.2], dtype=DT)
    c = [x0, torch.ones_like(x0), torch.zeros_like(x0)]  # x(t) = x0 + t: y_k = phi^(k)(x0)/k!
    pdf = torch.exp(-x0**2 / 2) / math.sqrt(2 * math.pi)
    gelu = S.gelu(c)
    torch.testing.assert_close(gelu[1], 0.5 * (1 + torch.erf(x0 / math.sqrt(2))) + x0 * pdf)
    torch.testing.assert_close(gelu[2], (2 * pdf - x0**2 * pdf) / 2)
    erf = S.erf(c)
    torch.testing.assert_close(erf[2], -4 * x0 * torch.exp(-x0**2) / math.sqrt(math.pi) / 2)


# ---------------------------------------------------------------- normalisation and statistics

class Norms(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(2, 4, 3, padding=1)
        self.gn = nn.GroupNorm(2, 4)
        self.ln = nn.LayerNorm((4, 3))
        self.rms = nn.RMSNorm(3, eps=1e-3)
        self.lin = nn.Linear(12, 3)
        for p in (self.gn.weight, self.gn.bias, self.ln.weight, self.ln.bias, self.rms.weight):
            nn.init.normal_(p, 1.0, 0.3)

    def forward(self, x):
        h = torch.tanh(self.gn(self.conv(x)))  # [B, 4, 3, 3]
        h = h.mean(-1)  # [B, 4, 3]
        h = self.ln(h) + F.layer_norm(h, (3,), eps=1e-4)
        h = self.rms(h) + F.rms_norm(h, (4, 3)) + F.group_norm(h, 4)
        stats = h.var(1, keepdim=True) + h.std(dim=(1, 2), correction=0, keepdim=True) \
            + torch.var(h, -1, unbiased=False, keepdim=True).mean(1, keepdim=True)
        return self.lin((h * stats).flatten(1))


def test_layer_group_rms_norm_and_statistics_against_autograd():
    x, base = _pair(2, 3, 3)
    _check_orders(Norms().to(DT).eval(), x, base, K=3)


# ---------------------------------------------------------------- attention and products

class Attention(nn.Module):
    def __init__(self, mode):
        super().__init__()
        self.mode = mode
        self.qkv = nn.Linear(4, 12)
        self.out = nn.Linear(4 * 5, 3)
        self.pos = nn.Parameter(torch.randn(5, 4))
        self.bias = nn.Parameter(torch.randn(5, 5))
        keep = torch.rand(5, 5, generator=torch.Generator().manual_seed(1)) > 0.4
        self.register_buffer("keep", keep | torch.eye(5, dtype=torch.bool))

    def forward(self, x):  # x: [B, 5, 4]
        q, k, v = self.qkv(x + self.pos).chunk(3, dim=-1)
        q4, k4, v4 = (t.reshape(t.shape[0], 5, 2, 2).transpose(1, 2) for t in (q, k, v))
        if self.mode == "causal":
            h = F.scaled_dot_product_attention(q4, k4, v4, is_causal=True)
        elif self.mode == "bool":
            h = F.scaled_dot_product_attention(q4, k4, v4, attn_mask=self.keep)
        elif self.mode == "float":
            h = F.scaled_dot_product_attention(q4, k4, v4, attn_mask=self.bias, scale=0.3)
        else:  # by hand: einsum, bmm, softmax over a middle dim
            s = torch.einsum("bhqd,bhkd->bhqk", q4, k4) / 2
            w = torch.softmax(s, dim=2) + F.log_softmax(s, -2).exp()
            h = torch.cat([torch.bmm(w[:, i], v4[:, i]).unsqueeze(1) for i in range(2)], dim=1)
            h = h + torch.einsum("bhqd,de->bhqe", h, self.bias[:2, :2])
        h = h.transpose(1, 2).contiguous().view(x.shape[0], 5, 4)
        return self.out(torch.cat(h.split([2, 3], dim=1), dim=1).flatten(1))


@pytest.mark.parametrize("mode", ["causal", "bool", "float", "einsum"])
def test_scaled_dot_product_attention_and_products_against_autograd(mode):
    x, base = _pair(5, 4)
    _check_orders(Attention(mode).to(DT).eval(), x, base, K=3)


class MHA(nn.Module):
    def __init__(self, batch_first, kdim=None):
        super().__init__()
        self.batch_first = batch_first
        self.attn = nn.MultiheadAttention(4, 2, batch_first=batch_first, kdim=kdim, vdim=kdim)
        self.kv = nn.Linear(4, kdim or 4)
        self.head = nn.Linear(4 + 5, 2)

    def forward(self, x, key_padding_mask=None, attn_mask=None, need_weights=False):
        kv = torch.tanh(self.kv(x))
        q, kv = (x, kv) if self.batch_first else (x.transpose(0, 1), kv.transpose(0, 1))
        out, w = self.attn(q, kv, kv, key_padding_mask=key_padding_mask, attn_mask=attn_mask,
                           need_weights=need_weights)
        out = out if self.batch_first else out.transpose(0, 1)
        pooled = out.mean(1)
        extra = w.sum(1) if need_weights else torch.zeros_like(pooled[:, :1]).expand(-1, 5)
        return self.head(torch.cat([pooled, extra], dim=1))


@pytest.mark.parametrize("batch_first", [True, False], ids=["batch_first", "seq_first"])
@pytest.mark.parametrize("masks", ["none", "padding_bool", "attn_float_weights", "attn_bool_kdim"])
def test_multihead_attention_against_autograd(batch_first, masks):
    x, base = _pair(5, 4)
    kdim = 3 if masks == "attn_bool_kdim" else None
    model = MHA(batch_first, kdim).to(DT).eval()
    kwargs = {}
    if masks == "padding_bool":
        kwargs["key_padding_mask"] = torch.tensor([[False] * 4 + [True], [False] * 5])
    elif masks == "attn_float_weights":
        kwargs.update(attn_mask=torch.randn(5, 5, dtype=DT), need_weights=True)
    elif masks == "attn_bool_kdim":
        kwargs["attn_mask"] = torch.triu(torch.ones(5, 5, dtype=torch.bool), 1)

    class Bound(nn.Module):  # the masks are data, not inputs to explain
        def __init__(self, sample=None):
            super().__init__()
            self.inner = model
            self.kwargs = dict(kwargs)
            if sample is not None and "key_padding_mask" in kwargs:
                self.kwargs["key_padding_mask"] = kwargs["key_padding_mask"][sample:sample + 1]

        def forward(self, z):
            return self.inner(z, **self.kwargs)

    _check_orders(Bound().eval(), x, base, K=3, sample_model=lambda b: Bound(b).eval())


class SeqFirst(nn.Module):
    """Pointwise work on a sequence-first tensor [L, B, E], constants in that layout."""

    def __init__(self, norm_shape=(4,)):
        super().__init__()
        self.pos = nn.Parameter(torch.randn(5, 1, 4))  # [L, 1, E], as seq-first code writes it
        self.norm = nn.LayerNorm(norm_shape)
        self.lin = nn.Linear(4, 4)
        self.attn = nn.MultiheadAttention(4, 2)
        self.head = nn.Linear(4, 2)

    def forward(self, x):  # x: [B, 5, 4]
        h = x.transpose(0, 1) + self.pos
        h = F.gelu(self.lin(self.norm(h))) * 2.0 + torch.tanh(h)
        h = h + self.attn(h, h, h, need_weights=False)[0]
        return self.head(h.transpose(0, 1).mean(1))


def test_sequence_first_tensors_against_autograd_and_refusals():
    x, base = _pair(5, 4)
    _check_orders(SeqFirst().to(DT).eval(), x, base, K=3)
    with pytest.raises(UnsupportedOperation, match="LayerNorm.*mixes the samples"):
        ta.taylor_terms(SeqFirst((2, 4)).to(DT).eval(), x, base, order=2)


# ---------------------------------------------------------------- shapes, constants, tracing

class Shapes(nn.Module):
    def __init__(self):
        super().__init__()
        self.cls = nn.Parameter(torch.randn(1, 1, 3))
        self.pos = nn.Parameter(torch.randn(1, 5, 3))
        self.lin = nn.Linear(3 * 5, 2)

    def forward(self, x, extra=None, scale=1.0):  # x: [B, 4, 3]
        if extra is not None:
            x = x + extra
        h = torch.cat([self.cls.expand(x.shape[0], -1, -1), x], dim=1) + self.pos
        a, b = torch.chunk(torch.sigmoid(h), 3, dim=-1)[1], h.permute(0, 2, 1).unsqueeze(-1)
        h = h * a.expand_as(h) + b.squeeze(-1).transpose(1, 2).contiguous() * scale
        return self.lin(h.mean(dim=2, keepdim=True).expand(-1, -1, 3).reshape(x.shape[0], -1))


def test_shapes_constants_and_defaulted_forward_arguments():
    """`forward(x, extra=None, scale=1.0)` traces (defaults fixed) and is exact."""
    x, base = _pair(4, 3)
    _check_orders(Shapes().to(DT).eval(), x, base, K=3)


# ---------------------------------------------------------------- acceptance models

class Block(nn.Module):
    def __init__(self, dim, heads, batch_first, approximate):
        super().__init__()
        self.batch_first = batch_first
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.attn = nn.MultiheadAttention(dim, heads, batch_first=batch_first)
        self.mlp = nn.Sequential(nn.Linear(dim, 2 * dim), nn.GELU(approximate), nn.Linear(2 * dim, dim))

    def forward(self, x):
        h = self.norm1(x)
        if not self.batch_first:
            h = h.transpose(0, 1)
        h = self.attn(h, h, h, need_weights=False)[0]
        x = x + (h if self.batch_first else h.transpose(0, 1))
        return x + self.mlp(self.norm2(x))


class TinyViT(nn.Module):
    def __init__(self, channels=2, patch=2, dim=6, heads=2, tokens=4, classes=3):
        super().__init__()
        self.embed = nn.Conv2d(channels, dim, patch, stride=patch)
        self.cls = nn.Parameter(torch.randn(1, 1, dim))
        self.pos = nn.Parameter(0.5 * torch.randn(1, tokens + 1, dim))
        self.blocks = nn.Sequential(Block(dim, heads, True, "none"), Block(dim, heads, False, "tanh"))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, classes)

    def forward(self, x):
        h = self.embed(x).flatten(2).transpose(1, 2)
        h = torch.cat([self.cls.expand(h.shape[0], -1, -1), h], dim=1) + self.pos
        return self.head(self.norm(self.blocks(h))[:, 0])


class SmoothResNet(nn.Module):
    def __init__(self):
        super().__init__()
        def cbs(i, o, stride=1):
            return nn.Sequential(nn.Conv2d(i, o, 3, stride, 1, bias=False), nn.BatchNorm2d(o), nn.SiLU())
        self.stem = cbs(2, 4)
        self.block = nn.Sequential(cbs(4, 4), nn.Conv2d(4, 4, 3, padding=1), nn.BatchNorm2d(4))
        self.down = cbs(4, 6, stride=2)
        self.skip = nn.Sequential(nn.Conv2d(4, 6, 1, stride=2), nn.BatchNorm2d(6))
        self.act = nn.SiLU()
        self.head = nn.Linear(6, 3)
        for m in self.modules():
            if isinstance(m, nn.BatchNorm2d):  # non-trivial running statistics
                nn.init.uniform_(m.running_mean, -0.3, 0.3)
                nn.init.uniform_(m.running_var, 0.5, 1.5)
                nn.init.normal_(m.weight, 1.0, 0.2)
                nn.init.normal_(m.bias, 0.0, 0.2)

    def forward(self, x):
        h = self.stem(x)
        h = self.act(h + self.block(h))
        h = self.act(self.down(h) + self.skip(h))
        return self.head(F.adaptive_avg_pool2d(h, 1).flatten(1))


def _fields_by_autograd(f, x, base, K):
    """Every TaylorTerms field for one sample from its definition, by nested autograd."""
    delta = x - base
    orders = _autograd_orders(f, x, delta, K)

    def directional(z, j):  # D^j f(z)[delta^j] = d^j/dt^j f(z + t delta) at 0
        t = torch.zeros((), dtype=DT, requires_grad=True)
        cur = f(z + t * delta)
        for _ in range(j):
            (cur,) = torch.autograd.grad(cur, t, create_graph=True)
        return cur

    z = x.clone().requires_grad_(True)
    attribution = torch.zeros_like(x)
    for k in range(1, K + 1):
        (g,) = torch.autograd.grad(directional(z, k - 1), z)
        attribution += (-1) ** (k + 1) / math.factorial(k) * delta * g
    first = torch.autograd.grad(f(z), z)[0] * delta
    independent = torch.zeros(x.numel(), dtype=DT)
    for i in range(x.numel()):
        e = torch.zeros(x.numel(), dtype=DT)
        e[i] = delta.flatten()[i]
        independent[i] = _autograd_orders(f, x, e.view_as(x), K)[1:].sum()
    independent = independent.view_as(x)
    total = orders.sum()
    change = (f(x) - f(base)).detach()
    return {"first": first, "independent": independent,
            "interactive_ig": attribution - first - independent,
            "interactive": total - (first + independent).sum(), "total": total,
            "error": change - total}


@pytest.mark.parametrize("K", [2, 3])
@pytest.mark.parametrize("name", ["vit", "resnet"])
def test_acceptance_models_every_field_equals_autograd(name, K):
    torch.manual_seed(3)
    model = (TinyViT() if name == "vit" else SmoothResNet()).to(DT).eval()
    x, base = torch.randn(2, 2, 4, 4, dtype=DT), 0.3 * torch.randn(2, 2, 4, 4, dtype=DT)
    terms = ta.taylor_terms(model, x, base, order=K, target=2)
    for b in range(2):
        ref = _reference(_fields_by_autograd)(lambda z: model(z[None])[0, 2], x[b], base[b], K)
        for field, value in ref.items():
            got = getattr(terms, field)[b]
            scale = value.abs().max().clamp_min(1e-300)
            torch.testing.assert_close(got, value, rtol=1e-7, atol=1e-7 * float(scale),
                                       msg=lambda m, f=field: f"{name} K={K} {f}: {m}")
    assert terms.interactive.abs().min() > 0  # the models do interact


# ---------------------------------------------------------------- refusals (user rules: test_taylor_rules.py)

class MixesSamples(nn.Module):
    def __init__(self, how):
        super().__init__()
        self.how = how
        self.attn = nn.MultiheadAttention(4, 1, batch_first=False)

    def forward(self, x):  # x: [B, 3, 4]
        if self.how == "softmax":
            return torch.softmax(x, dim=0).flatten(1)
        if self.how == "einsum":
            return torch.einsum("bij,cij->bc", x, x)
        if self.how == "var":
            return x.var().expand(x.shape[0], 1)
        return self.attn(x, x, x)[0].flatten(1)  # batch-first tensor into a seq-first module


@pytest.mark.parametrize("how,match", [
    ("softmax", "_softmax.*mixes the samples"), ("einsum", "bmm.*mixes the samples"),
    ("var", "var.*mixes the samples"), ("mha", "mixes the samples")])
def test_ops_that_mix_samples_are_refused_with_line_and_advice(how, match):
    with pytest.raises(UnsupportedOperation, match=match) as info:
        ta.taylor_terms(MixesSamples(how).to(DT).eval(), torch.randn(2, 3, 4, dtype=DT), order=2,
                        target=0)
    message = str(info.value)
    assert "test_taylor_modern.py" in message and "ta.register_taylor_rule" in message
    assert "ta.smooth" in message


def test_untraceable_forward_names_the_line():
    class Branchy(nn.Module):
        def forward(self, x):
            if x.sum() > 0:
                return x
            return -x

    with pytest.raises(UnsupportedOperation, match=r"test_taylor_modern.py:\d+ \(if x.sum"):
        ta.taylor_terms(Branchy().to(DT).eval(), torch.randn(2, 3, dtype=DT))


def test_supported_ops_doc_is_generated_from_the_tables():
    from pathlib import Path

    doc = Path(__file__).resolve().parents[1] / "docs" / "supported_ops.md"
    assert doc.read_text() == supported_ops_markdown() + "\n", \
        "docs/supported_ops.md is stale: python -m taylorattr.taylor.mode > docs/supported_ops.md"
    for name in ("aten.native_layer_norm", "aten._softmax", "aten.convolution", "aten.gelu",
                 "aten.bmm", "aten.var", "SmoothMaxPool"):
        assert f"`{name}`" in doc.read_text()
