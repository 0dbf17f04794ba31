"""Pinned upstream bugs: torch gives a wrong derivative here, and the library works around it.

Each test asserts that the bug is **still present** (against an independent value: a
closed form or finite differences). When one fails, torch fixed it: remove the workaround
named in the message (and the test).
"""
import torch
import torch.nn.functional as F

FIXED = "if this fails, torch fixed it: remove the workaround ({})"


def _batch_norm_identity_gradient(batch: int):
    """Eval-mode batch norm with mean 0, variance 1 and eps 1e-300 is the identity
    (``1 + 1e-300 == 1`` in float64; torch 2.11 refuses eps 0 even in eval mode), so the
    input gradient of ``bn(z).flatten(2).transpose(1, 2)`` for the cotangent ``v`` is
    ``v.transpose(1, 2)`` reshaped: returns ``(autograd's, the closed form)``. On the CPU,
    whatever the default device: the bug pinned is the CPU kernel's (where LeViT met it)."""
    g = torch.Generator(device="cpu").manual_seed(0)
    cpu = {"dtype": torch.float64, "device": "cpu"}
    z = torch.randn(batch, 2, 1, 3, generator=g, **cpu).requires_grad_(True)
    out = F.batch_norm(z, torch.zeros(2, **cpu), torch.ones(2, **cpu), training=False,
                       eps=1e-300)
    t = out.flatten(2).transpose(1, 2)  # [B, 3, 2]: its gradient is not contiguous
    v = torch.randn(t.shape, generator=g, **cpu)
    (grad,) = torch.autograd.grad(t, z, v)
    return grad, v.transpose(1, 2).reshape(z.shape)


def test_batch_norm_backward_with_a_transposed_gradient_is_wrong_at_batch_1():
    # the LeViT case (timm levit_128s: ConvNorm, then x.flatten(2).transpose(1, 2)): the
    # completeness check recomputes a failing sample at batch 2 (methods/_pipeline.py,
    # self_check), where torch's result is right
    grad, expected = _batch_norm_identity_gradient(2)
    torch.testing.assert_close(grad, expected, rtol=0, atol=1e-15)  # batch 2: right
    grad, expected = _batch_norm_identity_gradient(1)
    assert (grad - expected).abs().max() > 0.5, FIXED.format(
        "the batch-2 recomputation in methods/_pipeline.py: self_check exists for it; "
        "keep the completeness check itself")


def _third_derivative(layer_norm):
    """``d^3/dt^3 sum(w * LN(x + t d))`` at 0 by nested reverse mode."""
    torch.manual_seed(0)
    x, d, w = (torch.randn(1, 4, dtype=torch.float64) for _ in range(3))
    t = torch.zeros((), dtype=torch.float64, requires_grad=True)
    y = (layer_norm(x + t * d) * w).sum()
    for _ in range(3):
        (y,) = torch.autograd.grad(y, t, create_graph=True)
    second = lambda s: _second(layer_norm, x, d, w, s)
    h = 1e-4
    return float(y.detach()), (second(h) - second(-h)) / (2 * h)


def _second(layer_norm, x, d, w, s):
    t = torch.tensor(s, dtype=torch.float64, requires_grad=True)
    y = (layer_norm(x + t * d) * w).sum()
    for _ in range(2):
        (y,) = torch.autograd.grad(y, t, create_graph=True)
    return float(y.detach())


def _by_hand(z):
    mu = z.mean(-1, keepdim=True)
    var = ((z - mu) ** 2).mean(-1, keepdim=True)
    return (z - mu) / torch.sqrt(var + 1e-5)


def test_nested_layer_norm_third_derivative_is_wrong():
    # the hand-written LayerNorm (composed of primitives) is right: its nested derivative
    # matches the finite difference of the second derivative (which torch gets right)
    nested, fd = _third_derivative(_by_hand)
    assert abs(nested - fd) < 1e-6 * max(1.0, abs(fd))
    nested, fd_torch = _third_derivative(lambda z: F.layer_norm(z, (4,), eps=1e-5))
    assert abs(fd_torch - fd) < 1e-6 * max(1.0, abs(fd))  # order 2 of torch's: right
    assert abs(nested - fd) > 0.1 * abs(fd), FIXED.format(
        "tests/test_taylor_zoo.py checks against a hand-written LayerNorm because of it; "
        "it may then use nn.LayerNorm")


def test_nested_forward_mode_layer_norm_second_derivative_is_wrong():
    # EfficientViT-B0 (timm efficientvit_b0): nested forward mode differed from Taylor mode
    # and reverse-over-reverse by 0.4 %, all of it from the head's LayerNorm (the rest of
    # the model agrees to float32 rounding: its LiteMLA computes attention in float32)
    from torch.func import jvp

    torch.manual_seed(0)
    x, d, w = (torch.randn(1, 4, dtype=torch.float64) for _ in range(3))
    one = torch.ones((), dtype=torch.float64)

    def second(layer_norm):
        along = lambda s: (layer_norm(x + s * d) * w).sum()
        first = lambda s: jvp(along, (s,), (one,))[1]
        return float(jvp(first, (torch.zeros((), dtype=torch.float64),), (one,))[1].detach())

    by_hand = second(_by_hand)
    h = 1e-4
    along = lambda s: float((_by_hand(x + s * d) * w).sum())
    fd = (along(h) - 2 * along(0.0) + along(-h)) / h ** 2
    assert abs(by_hand - fd) < 1e-5 * max(1.0, abs(fd))
    nested = second(lambda z: F.layer_norm(z, (4,), eps=1e-5))
    assert abs(nested - fd) > 0.1 * abs(fd), FIXED.format(
        "nothing in the library relies on nested forward mode; the EfficientViT verdict in "
        "the issue-35 report and tests/test_taylor_zoo.py's hand-written LayerNorm cite it")
