"""Softmax, multilinear products (matmul, bmm, einsum) and attention.

    softmax(x)_i = e_i / sum_j e_j,  e = exp(x - max x)     (exp recurrence, quotient)
    log_softmax(x) = x - max x - log(sum_j e_j)
    (A B)_k = sum_j A_j B_{k-j}                              (Cauchy product of matmuls)
    attention(Q, K, V) = softmax(Q K^T * scale + M) V        (M: additive mask, -inf = masked)

``nn.MultiheadAttention`` is its input projections, per-head attention and the output
projection; with ``batch_first=False`` it takes the sequence-first tensors that
``x.transpose(0, 1)`` makes (:class:`~taylorattr.taylor.mode.jet.BatchSecond`).
"""
from __future__ import annotations

import math
import operator
import string

import torch
import torch.nn.functional as F
from torch import nn

from ... import series as S
from .jet import BatchSecond, Jet, UnsupportedOperation, batch_dim, is_jet, multilinear
from .registry import builtin
from .rules_affine import linear

# ---------------------------------------------------------------- softmax


def _softmax_parts(x: Jet, dim: int):
    if dim is None:
        raise UnsupportedOperation("softmax without a dim (name the dim)")
    d = batch_dim(dim, x.primal.dim(), "softmax")
    shift = x.primal.amax(d, keepdim=True).detach()
    shift = torch.where(torch.isfinite(shift), shift, torch.zeros_like(shift))
    e = Jet(x.primal - shift, x.series).unary(S.exp)
    return e, e.linear(lambda t: t.sum(d, keepdim=True)), shift


def _check_dtype(x: Jet, dtype):
    if dtype is not None and dtype != x.primal.dtype:
        raise UnsupportedOperation(f"softmax with dtype={dtype} on a {x.primal.dtype} tensor")


@builtin(F.softmax, torch.softmax, "Tensor.softmax", family="attention")
def softmax(x: Jet, dim=None, _stacklevel=3, dtype=None) -> Jet:
    _check_dtype(x, dtype)
    e, total, _ = _softmax_parts(x, dim)
    return e / total


@builtin(F.log_softmax, torch.log_softmax, "Tensor.log_softmax", family="attention")
def log_softmax(x: Jet, dim=None, _stacklevel=3, dtype=None) -> Jet:
    _check_dtype(x, dtype)
    _, total, shift = _softmax_parts(x, dim)
    return x - shift - total.unary(S.log)


builtin(nn.Softmax, family="attention")(lambda m, x: softmax(x, m.dim))
builtin(nn.LogSoftmax, family="attention")(lambda m, x: log_softmax(x, m.dim))

# ---------------------------------------------------------------- multilinear products


def _like(*operands) -> Jet:
    return next(o for o in operands if is_jet(o))


@builtin(torch.matmul, operator.matmul, "Tensor.matmul", family="attention")
def matmul(a, b) -> Jet:
    if is_jet(a) and not is_jet(b) and b.dim() <= 2:  # x @ W: linear in x
        return a.linear(lambda t: torch.matmul(t, b))
    for o in (a, b):
        if is_jet(o) and o.primal.dim() < 3:
            raise UnsupportedOperation("matmul that uses a [B, n] input-dependent tensor as one "
                                       "matrix (it would mix samples)")
    return multilinear(torch.matmul, [a, b], _like(a, b))


builtin(torch.bmm, "Tensor.bmm", family="attention")(matmul)


@builtin(torch.einsum, family="attention")
def einsum(equation: str, *operands) -> Jet:
    """Each Jet operand's first subscript is the batch; the output must keep it first.
    A fresh subscript for the direction axis goes after the batch in Jet operands and output;
    constant operands keep their own subscripts."""
    if len(operands) == 1 and isinstance(operands[0], (list, tuple)):
        operands = tuple(operands[0])
    eq = equation.replace(" ", "")
    if "..." in eq or "->" not in eq:
        raise UnsupportedOperation(f"einsum {equation!r}: write every subscript and the output "
                                   "explicitly (no '...', with '->')")
    inputs, output = eq.split("->")
    subs = inputs.split(",")
    batch = {s[:1] for s, o in zip(subs, operands) if is_jet(o)}
    if len(batch) != 1 or not output.startswith(next(iter(batch))):
        raise UnsupportedOperation(f"einsum {equation!r}: every input-dependent operand must "
                                   "start with the same batch subscript, and so must the output")
    fresh = next(c for c in string.ascii_letters if c not in eq)
    with_dir = [s[0] + fresh + s[1:] if is_jet(o) else s for s, o in zip(subs, operands)]
    new_eq = ",".join(with_dir) + "->" + output[0] + fresh + output[1:]
    return multilinear(lambda *args: torch.einsum(new_eq, *args), list(operands), _like(*operands),
                       raw_constants=True)


# ---------------------------------------------------------------- attention


def attention(q, k, v, mask: torch.Tensor | None, scale: float, need_weights: bool = False):
    """``softmax(q k^T * scale + mask) v`` and the attention weights; ``mask`` is additive."""
    like = _like(q, k, v)
    kt = k.linear(lambda t: t.transpose(-2, -1)) if is_jet(k) else k.transpose(-2, -1)
    scores = multilinear(torch.matmul, [q, kt], like) if is_jet(q) or is_jet(k) else q @ kt
    scores = scores * scale
    if mask is not None:
        scores = scores + mask
    weights = softmax(scores, -1) if is_jet(scores) else torch.softmax(scores, -1)
    out = multilinear(torch.matmul, [weights, v], like)
    return out, (weights if need_weights else None)


def _additive(mask: torch.Tensor | None, dtype, allowed_when_true: bool) -> torch.Tensor | None:
    """A float mask as it is; a boolean one as 0 / -inf (``True`` = attend if ``allowed_when_true``)."""
    if mask is None or mask.is_floating_point():
        return None if mask is None else mask.to(dtype)
    keep = mask if allowed_when_true else ~mask
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill(~keep, float("-inf"))


@builtin(F.scaled_dot_product_attention, family="attention")
def sdpa(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
         enable_gqa=False) -> Jet:
    like = _like(query, key, value)
    if dropout_p:
        raise UnsupportedOperation("scaled_dot_product_attention with dropout_p > 0 (pass 0.0 "
                                   "in eval mode)")
    if enable_gqa:
        raise UnsupportedOperation("scaled_dot_product_attention with enable_gqa=True")
    L, S_, E = _shape(query)[-2], _shape(key)[-2], _shape(query)[-1]
    dtype = like.primal.dtype
    mask = _additive(attn_mask, dtype, allowed_when_true=True)
    if is_causal:
        causal = _additive(torch.ones(L, S_, dtype=torch.bool, device=like.primal.device).tril(),
                           dtype, allowed_when_true=True)
        mask = causal if mask is None else mask + causal
    return attention(query, key, value, mask, 1 / math.sqrt(E) if scale is None else scale)[0]


@builtin(nn.MultiheadAttention, family="attention")
def multihead_attention(m: nn.MultiheadAttention, query, key, value, key_padding_mask=None,
                        need_weights=True, attn_mask=None, average_attn_weights=True,
                        is_causal=False):
    """Input projections, per-head :func:`attention`, output projection (as PyTorch's)."""
    if m.training and m.dropout > 0:
        raise UnsupportedOperation("MultiheadAttention with dropout in training mode (call "
                                   "model.eval())")
    if m.bias_k is not None or m.add_zero_attn:
        raise UnsupportedOperation("MultiheadAttention with add_bias_kv or add_zero_attn")
    q, k, v = (_batch_first(o, name, m.batch_first)
               for o, name in ((query, "query"), (key, "key"), (value, "value")))
    like = _like(q, k, v)
    E, H = m.embed_dim, m.num_heads
    if m._qkv_same_embed_dim:
        weights = m.in_proj_weight.chunk(3)
    else:
        weights = (m.q_proj_weight, m.k_proj_weight, m.v_proj_weight)
    biases = m.in_proj_bias.chunk(3) if m.in_proj_bias is not None else (None,) * 3
    q, k, v = (_heads(linear(o, w, b) if is_jet(o) else F.linear(o, w, b), H)
               for o, w, b in zip((q, k, v), weights, biases))
    B, L, S_ = like.primal.shape[0], _shape(q)[2], _shape(k)[2]
    dtype = like.primal.dtype
    mask = _additive(attn_mask, dtype, allowed_when_true=False)
    if mask is not None:
        mask = mask.view(1, 1, L, S_) if mask.dim() == 2 else mask.view(B, H, L, S_)
    elif is_causal:
        mask = _additive(torch.ones(L, S_, dtype=torch.bool, device=like.primal.device).tril(),
                         dtype, allowed_when_true=True)
    if key_padding_mask is not None:
        pad = _additive(key_padding_mask, dtype, allowed_when_true=False).view(B, 1, 1, S_)
        mask = pad if mask is None else mask + pad
    out, attn = attention(q, k, v, mask, 1 / math.sqrt(E // H), need_weights)
    out = out.linear(lambda t: t.transpose(1, 2))
    out = linear(out.linear(lambda t: t.reshape(t.shape[0], L, E)), m.out_proj.weight,
                 m.out_proj.bias)
    if attn is not None and average_attn_weights:
        attn = attn.linear(lambda t: t.mean(1)) if is_jet(attn) else attn.mean(1)
    return (out if m.batch_first else BatchSecond(out)), attn


multihead_attention.accepts_batch_second = True


def _shape(o):
    return o.primal.shape if is_jet(o) else o.shape


def _batch_first(o, name: str, batch_first: bool):
    """The batch-first Jet (or constant) behind an argument of MultiheadAttention."""
    if isinstance(o, BatchSecond):
        if batch_first:
            raise UnsupportedOperation(f"MultiheadAttention(batch_first=True) got a sequence-first "
                                       f"{name} (drop the transpose(0, 1))")
        return o.jet
    if is_jet(o):
        if not batch_first:
            raise UnsupportedOperation(
                f"MultiheadAttention(batch_first=False) got a batch-first input-dependent {name}; "
                "it would attend across samples: transpose(0, 1) it to (seq, batch, embed) or "
                "build the module with batch_first=True")
        if o.primal.dim() != 3:
            raise UnsupportedOperation(f"MultiheadAttention on an unbatched {name} (it would "
                                       "attend across samples)")
        return o
    return o if batch_first else o.transpose(0, 1)


def _heads(o, H: int):
    """``[B, L, E] -> [B, H, L, E / H]``."""
    if not is_jet(o):
        return o.view(o.shape[0], o.shape[1], H, -1).transpose(1, 2)
    return o.linear(lambda t: t.reshape(t.shape[0], t.shape[1], H, -1).transpose(1, 2))
