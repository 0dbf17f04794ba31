"""Taylor mode on captured core-ATen graphs (issue 25): the smallest models of the zoo
against float64 double backward, nn.TransformerEncoder with a padding mask at order 3
against a hand-written float64 encoder, a .pt2 program against the module, every
unsupported op in one error, the piecewise and degenerate-expansion warnings, beta='auto'."""
import math
import warnings

import pytest
import torch
import torch.nn.functional as F
from _builders import DT
from _zoo import build, check
from torch import nn

import taylorattr as ta
from taylorattr.taylor.mode import UnsupportedOperation


# mobilenet_v3_small: Hardswish/Hardsigmoid (decomposed to clamp), squeeze-excitation;
# squeezenet1_0: MaxPool2d(ceil_mode=True); timm vit_tiny: permute(2, 0, 3, 1, 4) + unbind
# moving the batch axis, LayerNorm, GELU
@pytest.mark.slow
@pytest.mark.parametrize("name", ["tv:mobilenet_v3_small", "tv:squeezenet1_0",
                                  "timm:vit_tiny_patch16_224"])
def test_zoo_group_terms_equal_double_backward(name):
    errors, _ = check(build(name))
    assert max(errors.values()) < 1e-10, errors


class Encoder(nn.Module):
    """nn.TransformerEncoder (GELU, post-norm) with a key padding mask, mean-pooled."""

    def __init__(self):
        super().__init__()
        layer = nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, activation="gelu",
                                           batch_first=True)
        self.enc = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.head = nn.Linear(8, 3)
        self.register_buffer("pad", torch.tensor([[False] * 5 + [True], [False] * 4 + [True] * 2]))

    def forward(self, x):
        h = self.enc(x, src_key_padding_mask=self.pad)
        keep = (~self.pad).unsqueeze(-1).to(h.dtype)
        return self.head((h * keep).sum(1) / keep.sum(1))


def _layer_norm(x, norm):  # by hand: torch's nested LayerNorm derivatives are wrong
    mu = x.mean(-1, keepdim=True)
    var = ((x - mu) ** 2).mean(-1, keepdim=True)
    return (x - mu) / torch.sqrt(var + norm.eps) * norm.weight + norm.bias


def _encoder_by_hand(model: Encoder, x):
    pad = model.pad
    B, L, E = x.shape
    for layer in model.enc.layers:
        attn = layer.self_attn
        H = attn.num_heads
        q, k, v = F.linear(x, attn.in_proj_weight, attn.in_proj_bias).chunk(3, -1)
        q, k, v = (t.reshape(B, L, H, E // H).transpose(1, 2) for t in (q, k, v))
        scores = q @ k.transpose(-1, -2) / math.sqrt(E // H)
        scores = scores.masked_fill(pad[:, None, None, :], float("-inf"))
        a = (torch.softmax(scores, -1) @ v).transpose(1, 2).reshape(B, L, E)
        x = _layer_norm(x + F.linear(a, attn.out_proj.weight, attn.out_proj.bias), layer.norm1)
        ff = layer.linear2(F.gelu(layer.linear1(x)))
        x = _layer_norm(x + ff, layer.norm2)
    keep = (~pad).unsqueeze(-1).to(x.dtype)
    return model.head((x * keep).sum(1) / keep.sum(1))


def test_transformer_encoder_with_padding_mask_at_order_3():
    torch.manual_seed(0)
    model = Encoder().to(DT).eval()
    x = torch.randn(2, 6, 8, dtype=DT)
    base = x + 0.3 * torch.randn(2, 6, 8, dtype=DT)
    terms = ta.taylor_terms(model, x, base, target=1, order=3)
    # c_k = g^(k)(0) / k! for g_b(t) = f_b(x_b - t delta_b), one t per sample; P_k = -c_k
    t = torch.zeros(2, dtype=DT, requires_grad=True)
    g = _encoder_by_hand(model, x - t[:, None, None] * (x - base))[:, 1]
    torch.testing.assert_close(g, model(x)[:, 1])  # the hand-written encoder is the model
    derivs, d = [], g
    for k in range(1, 4):
        (d,) = torch.autograd.grad(d.sum(), t, create_graph=k < 3)
        derivs.append(-d / math.factorial(k))
    torch.testing.assert_close(terms.orders, torch.stack(derivs, 1).detach(), rtol=1e-10,
                               atol=1e-13)


def _smooth_cnn():
    torch.manual_seed(1)
    model = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4), nn.SiLU(),
                          nn.Conv2d(4, 4, 3, stride=2), nn.GELU(), nn.AdaptiveAvgPool2d(2),
                          nn.Flatten(), nn.Linear(16, 3))
    with torch.no_grad():
        model[1].running_mean.uniform_(-0.2, 0.2)
        model[1].running_var.uniform_(0.5, 1.5)
    return model.to(DT).eval()


def test_pt2_program_gives_the_module_terms(tmp_path):
    model = _smooth_cnn()
    x, base = torch.randn(2, 3, 9, 9, dtype=DT), 0.2 * torch.randn(2, 3, 9, 9, dtype=DT)
    path = tmp_path / "cnn.pt2"
    torch.export.save(torch.export.export(model, (x,)), str(path))
    from_file = ta.taylor_terms(str(path), x, base, target=0, order=2)
    from_module = ta.taylor_terms(model, x, base, target=0, order=2)
    for field in ("first", "independent", "interactive", "orders"):
        torch.testing.assert_close(getattr(from_file, field), getattr(from_module, field),
                                   rtol=1e-12, atol=1e-14)
    # and both are the derivatives: the order-2 term by float64 double backward
    z = x.clone().requires_grad_(True)
    delta = x - base
    (grad,) = torch.autograd.grad(model(z)[:, 0].sum(), z, create_graph=True)
    (hv,) = torch.autograd.grad((grad * delta).sum(), z)
    torch.testing.assert_close(from_file.orders[:, 1], -(hv * delta).flatten(1).sum(1) / 2,
                               rtol=1e-10, atol=1e-14)


def test_every_unsupported_op_is_listed_in_one_error():
    class Odd(nn.Module):
        def forward(self, x):
            return torch.atan(x) + torch.sinh(x) * torch.atan(2 * x) + torch.cosh(x)

    with pytest.raises(UnsupportedOperation) as info:
        ta.taylor_terms(Odd().to(DT).eval(), torch.randn(2, 3, dtype=DT), order=2, target=0)
    message = str(info.value)
    assert "3 operation(s)" in message
    for op in ("aten.atan.default (x2)", "aten.sinh.default (x1)", "aten.cosh.default (x1)"):
        assert op in message
    assert "test_taylor_zoo.py" in message and "ta.register_taylor_rule" in message


def test_piecewise_warning_once_per_model_and_auto_beta():
    torch.manual_seed(2)
    model = nn.Sequential(nn.Linear(5, 8), nn.Hardswish(), nn.Linear(8, 8), nn.ReLU(),
                          nn.Linear(8, 2)).to(DT).eval()
    x = torch.randn(4, 5, dtype=DT)
    with pytest.warns(UserWarning, match=r"(?s)piecewise-linear.*clamp.*relu.*beta='auto'"):
        ta.taylor_terms(model, x, order=2, target=0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once per model
        ta.taylor_terms(model, x, order=2, target=0)
    tolerance = 0.05
    smoothed = ta.smooth(model, "auto", inputs=x, tolerance=tolerance)
    with torch.no_grad():  # by direct calls: the gap of the chosen beta and of the one before
        df = (model(x) - model(torch.zeros_like(x))).abs().amax(1)
        chosen = ta.smooth(model, smoothed.beta)
        gap = (chosen(x) - model(x)).abs().amax(1)
        betas = ta.taylor.smoothing.AUTO_BETAS
        before = betas[betas.index(smoothed.beta) - 1]
        gap_before = (ta.smooth(model, before)(x) - model(x)).abs().amax(1)
    assert (gap <= tolerance * df).all() and not (gap_before <= tolerance * df).all()
    assert smoothed.output_gap == pytest.approx(float(gap.max()), rel=1e-12)
    assert "clamp" in " ".join(smoothed.replaced) or "Hardswish" in " ".join(smoothed.replaced)


def test_degenerate_expansion_is_flagged():
    # a bias-free conv followed by a normalisation is scale-invariant: expanding x towards
    # the zero baseline explains none of f(x) - f(0), which is f(x) - f(bias-only) here
    torch.manual_seed(3)
    model = nn.Sequential(nn.Conv2d(2, 4, 3, bias=False), nn.GroupNorm(1, 4), nn.Tanh(),
                          nn.Flatten(), nn.Linear(4 * 4 * 4, 2)).to(DT).eval()
    x = torch.randn(2, 2, 6, 6, dtype=DT)
    with pytest.warns(UserWarning, match="explains under 10%.*baseline"):
        terms = ta.taylor_terms(model, x, 0.0, order=2, target=0)
    assert terms.total.abs().max() < 1e-3 * terms.output_change.abs().max()  # eps: not exactly 0
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a baseline that is not a multiple of x
        ta.taylor_terms(model, x, x + 0.1 * torch.randn_like(x), order=2, target=0)


def test_user_rule_for_a_core_op():
    from taylorattr import series as S

    class Asinh(nn.Module):
        def forward(self, x):
            return torch.asinh(x).sum(1, keepdim=True)

    def rule(x):  # d/dx asinh(x) = (1 + x^2)^(-1/2)
        def series_fn(c):
            slope = S.power(S.polynomial(c, [1.0, 0.0, 1.0]), -0.5)
            return S.compose(c, torch.asinh(c[0]), lambda k, _: slope[k])
        return x.unary(series_fn)

    x = torch.randn(2, 3, dtype=DT)
    with pytest.raises(UnsupportedOperation, match="aten.asinh"):
        ta.taylor_terms(Asinh().to(DT).eval(), x, order=2, target=0)
    remove = ta.register_taylor_rule(torch.ops.aten.asinh.default, rule)
    try:
        orders = ta.taylor_terms(Asinh().to(DT).eval(), x, order=2, target=0).orders
    finally:
        remove()
    d1 = (1 + x**2) ** -0.5  # closed forms, baseline 0: P_1 = f' x, P_2 = -f'' x^2 / 2
    d2 = -x * (1 + x**2) ** -1.5
    torch.testing.assert_close(orders, torch.stack([(d1 * x).sum(1), -(d2 * x**2).sum(1) / 2], 1),
                               rtol=1e-12, atol=1e-14)
