"""User rules of the one Taylor-mode engine: on a ``torch.library`` custom op (how a user
keeps a module of their own whole) and on ATen operations; checked against float64 nested
autograd on the equivalent plain model."""
from __future__ import annotations

import math

import pytest
import torch
from test_taylor import DT, _autograd_orders
from torch import nn

import taylorattr as ta
from taylorattr import series as S
from taylorattr.capture import capture
from taylorattr.taylor.mode import UnsupportedOperation, supported_ops


class GatedBlock(nn.Module):
    """The user's module: ``y = tanh(x W1^T) * sigmoid(x W2^T)``."""

    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(4, 5, bias=False), nn.Linear(4, 5, bias=False)

    def forward(self, x):
        return torch.tanh(self.a(x)) * torch.sigmoid(self.b(x))


@torch.library.custom_op("taylorattr_test::gated_block", mutates_args=())
def gated_block(x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor) -> torch.Tensor:
    return torch.tanh(x @ w1.T) * torch.sigmoid(x @ w2.T)


@gated_block.register_fake
def _(x, w1, w2):
    return x.new_empty(x.shape[0], w1.shape[0])


class Wrapped(nn.Module):
    """The block kept whole: its forward calls the custom op."""

    def __init__(self, block: GatedBlock):
        super().__init__()
        self.block = block

    def forward(self, x):
        return gated_block(x, self.block.a.weight, self.block.b.weight)


def _gated_rule(x, w1, w2):
    """The block's exact Taylor rule: linear maps, series recurrences, a Cauchy product."""
    return x.linear(lambda t: t @ w1.T).unary(S.tanh) * x.linear(lambda t: t @ w2.T).unary(S.sigmoid)


def _models():
    torch.manual_seed(0)
    block = GatedBlock().to(DT)
    head = nn.Linear(5, 3).to(DT)
    return nn.Sequential(Wrapped(block), head).eval(), nn.Sequential(block, head).eval()


def test_rule_on_a_custom_op_wrapping_a_module_equals_nested_autograd():
    wrapped, plain = _models()
    torch.manual_seed(1)
    x, base = torch.randn(2, 4, dtype=DT), 0.5 * torch.randn(2, 4, dtype=DT)
    targets = [str(n.target) for n in capture(wrapped, (x,)).nodes]
    assert "taylorattr_test.gated_block.default" in targets  # kept whole by torch.export
    with pytest.raises(UnsupportedOperation, match="taylorattr_test.gated_block"):
        ta.taylor_terms(wrapped, x, base, order=3, target=1)
    remove = ta.register_taylor_rule(gated_block, _gated_rule)
    try:
        assert "taylorattr_test.gated_block.default" in supported_ops()["user"]
        with pytest.raises(ValueError, match="replace=True"):
            ta.register_taylor_rule(gated_block, _gated_rule)
        terms = ta.taylor_terms(wrapped, x, base, order=3, target=1)
    finally:
        remove()
    assert "user" not in supported_ops()
    for b in range(2):  # the plain model, by nested float64 autograd
        ref = _autograd_orders(lambda z: plain(z[None])[0, 1], x[b], x[b] - base[b], 3)
        torch.testing.assert_close(terms.orders[b], ref, rtol=1e-10, atol=1e-13)
    assert terms.orders[:, 1:].abs().min() > 1e-6  # the higher orders are there to compare


def test_a_user_rule_on_an_aten_op_comes_before_the_built_in_one():
    calls = []

    def traced_tanh(x):
        calls.append(1)
        return x.unary(S.tanh)

    model = nn.Sequential(nn.Linear(3, 2), nn.Tanh()).to(DT).eval()
    x = torch.randn(2, 3, dtype=DT)
    before = ta.taylor_terms(model, x, order=3, target=0).orders
    remove = ta.register_taylor_rule(torch.ops.aten.tanh, traced_tanh)  # the packet
    try:
        after = ta.taylor_terms(model, x, order=3, target=0).orders
    finally:
        remove()
    assert calls
    torch.testing.assert_close(after, before, rtol=0, atol=0)


def test_register_rejects_bad_targets_and_rules():
    with pytest.raises(TypeError, match="torch.library custom op"):
        ta.register_taylor_rule(GatedBlock, _gated_rule)  # a module type: wrap it in a custom op
    with pytest.raises(TypeError, match="target must be an ATen operation"):
        ta.register_taylor_rule("Tensor.asinh", _gated_rule)
    with pytest.raises(TypeError, match="rule must be callable"):
        ta.register_taylor_rule(torch.ops.aten.asinh.default, None)
    with pytest.raises(TypeError, match="replace must be a bool"):
        ta.register_taylor_rule(torch.ops.aten.asinh.default, _gated_rule, replace=1)


class CosineAttentionRows(nn.Module):
    """Swin-V2's cosine attention in miniature: tokens zero-padded to a window (the padded
    keys are exactly 0: V2 zeroes the key bias), ``F.normalize`` of queries and keys, a
    clamped ``logit_scale`` through ``exp``, softmax over the window. ``pad=False``: the
    same function without the padded tokens, whose keys are 0 and whose normalised keys
    are 0, so their scores are 0 as well; they are kept as constant zero scores."""

    def __init__(self, pad: bool):
        super().__init__()
        self.pad = pad
        self.q, self.k = nn.Linear(3, 4), nn.Linear(3, 4, bias=False)
        self.logit_scale = nn.Parameter(torch.log(10 * torch.ones(1)))

    def forward(self, x):  # x: [B, 3 tokens, 3]
        scale = torch.clamp(self.logit_scale, max=math.log(100.0)).exp()
        if self.pad:
            x = nn.functional.pad(x, (0, 0, 0, 2))  # 2 zero tokens: a window of 5
            q, k = nn.functional.normalize(self.q(x), dim=-1), nn.functional.normalize(self.k(x), dim=-1)
            scores = q @ k.transpose(-2, -1) * scale
        else:  # the padded keys' scores are 0: append them as constants
            q = nn.functional.normalize(self.q(x), dim=-1)
            k = self.k(x) / self.k(x).norm(dim=-1, keepdim=True)
            q_pad = nn.functional.normalize(self.q.bias.expand(x.shape[0], 2, 4), dim=-1)
            q = torch.cat([q, q_pad], 1)
            scores = torch.cat([q @ k.transpose(-2, -1) * scale,
                                torch.zeros(x.shape[0], 5, 2, dtype=x.dtype)], 2)
        return scores.softmax(-1).sum((1, 2)).unsqueeze(1) + scores.softmax(-1)[:, 0, :3]


def test_normalize_at_zero_padded_tokens_is_finite_and_equals_nested_autograd():
    """Issue 35: Swin-V2 gave NaN in Taylor mode (its zero-padded keys have norm 0)."""

    torch.manual_seed(2)
    padded = CosineAttentionRows(pad=True).to(DT).eval()
    plain = CosineAttentionRows(pad=False).to(DT).eval()
    plain.load_state_dict(padded.state_dict())
    x, base = torch.randn(2, 3, 3, dtype=DT), 0.5 * torch.randn(2, 3, 3, dtype=DT)
    torch.testing.assert_close(padded(x), plain(x), rtol=1e-12, atol=1e-14)
    terms = ta.taylor_terms(padded, x, base, order=3, target=1)
    assert torch.isfinite(terms.orders).all()
    for b in range(2):
        ref = _autograd_orders(lambda z: plain(z[None])[0, 1], x[b], x[b] - base[b], 3)
        torch.testing.assert_close(terms.orders[b], ref, rtol=1e-9, atol=1e-12)
