"""Per-layer records of a layer-wise pass and the per-edge terms of the paper.

A :class:`LayerRecord` describes one weighted layer ``l`` (Linear/Conv, with a directly
following eval-mode BatchNorm folded in) and the elementwise activation after it::

    y_j = sum_i z_ji + b_j,   z_ji = w_ji x_i^(l),   x_j^(l+1) = sigma(y_j)

with its baseline values (DeepLIFT: the baseline run; epsilon-LRP: ``x~^(l) = 0``, so
``y~ = b``, as in the paper's supplement), the rule's per-neuron multiplier ``m_j`` and
the upstream modified gradient. :func:`edge_terms`, :func:`denominator`,
:func:`local_relevance` (paper Thm 4: ``a_ji = (z_ji - z~_ji) / (y_j - y~_j) *
(x_j^(l+1) - x~_j^(l+1))``) and :func:`global_relevance` turn a record into per-edge
matrices.
"""
from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from .rules import stable_sign

__all__ = ["LayerRecord", "denominator", "edge_terms", "fold_batchnorm", "global_relevance",
           "local_relevance"]


def fold_batchnorm(layer: nn.Module, bn: nn.Module) -> nn.Module:
    """A copy of ``layer`` (Linear/Conv) computing ``bn(layer(x))`` (``bn`` in eval mode):
    ``W' = W * gamma / sigma``, ``b' = (b - mu) * gamma / sigma + beta``,
    ``sigma = sqrt(running_var + eps)``.
    """
    with torch.no_grad():
        scale = (bn.running_var + bn.eps).rsqrt()
        if bn.weight is not None:
            scale = scale * bn.weight
        bias = layer.bias if layer.bias is not None else torch.zeros_like(bn.running_mean)
        shift = (bias - bn.running_mean) * scale
        if bn.bias is not None:
            shift = shift + bn.bias
        folded = copy.deepcopy(layer)
        w = layer.weight
        folded.weight = nn.Parameter(w * scale.reshape((-1,) + (1,) * (w.dim() - 1)).to(w.dtype))
        folded.bias = nn.Parameter(shift.to(w.dtype))
    return folded


@dataclass(frozen=True)
class LayerRecord:
    """One weighted layer ``l`` (Linear/Conv, BatchNorm folded in) and the activation after it.

    ``y = layer(x^(l)) = sum_i z_ji + b_j`` with ``z_ji = w_ji x_i``;
    ``x^(l+1) = activation(y)``. Shapes: ``inputs``/``ref_inputs`` ``[B, *in]``, the
    others ``[B, *out]``. All tensors are detached.

    Attributes:
        name: the layer's module path in the model (e.g. ``"features.0"``).
        layer: the ``nn.Linear``/``nn.Conv*d`` module, or, where an eval-mode BatchNorm
            directly follows it, a folded copy computing both (:func:`fold_batchnorm`).
        folded: the module path of that BatchNorm (None when nothing was folded).
        activation: the elementwise activation applied to ``y`` (a callable), or None
            when the output is not followed by one (identity; the output layer).
        activation_name: its module path or function name (None for identity).
        inputs, ref_inputs: ``x^(l)`` and ``x~^(l)`` (zeros for epsilon-LRP).
        pre, ref_pre: ``y`` and ``y~ = layer(x~^(l))`` (``= b`` broadcast for LRP).
        post, ref_post: ``x^(l+1) = activation(y)`` and ``activation(y~)``.
        multiplier: the rule's per-neuron multiplier ``m_j`` (DeepLIFT:
            ``(post - ref_post) / (pre - ref_pre)``, or ``sigma'(y)`` where
            ``|pre - ref_pre| < 1e-10``; LRP: ``post / (pre + eps s(pre))``).
        upstream: modified gradient of the explained output w.r.t. ``post``
            (DeepLIFT's multiplier of ``x^(l+1)``; LRP's ``R_j / x_j^(l+1)``).
        rule: ``"deeplift"`` or ``"epsilon_lrp"``; epsilon: LRP's epsilon (else None).
    """

    name: str
    layer: nn.Module
    activation: Callable | None
    activation_name: str | None
    inputs: torch.Tensor
    ref_inputs: torch.Tensor
    pre: torch.Tensor
    ref_pre: torch.Tensor
    post: torch.Tensor
    ref_post: torch.Tensor
    multiplier: torch.Tensor
    upstream: torch.Tensor
    rule: str
    epsilon: float | None = None
    folded: str | None = None


def _neurons(record: LayerRecord, t: torch.Tensor) -> torch.Tensor:
    """``[B, out]`` for Linear, ``[B, C_out, L]`` (flattened positions) for conv layers."""
    if isinstance(record.layer, nn.Linear):
        return t
    return t.reshape(t.shape[0], t.shape[1], -1)


def edge_terms(record: LayerRecord) -> torch.Tensor:
    """Per-edge contributions: DeepLIFT ``z_ji - z~_ji``, epsilon-LRP ``z_ji = w_ji x_i``.

    Linear layers (2-D inputs): ``[B, out, in]``, entry ``[b, j, i]``. Conv1d/Conv2d:
    only the edges that exist, ``[B, C_out, L, K]`` where ``L`` runs over the output
    positions (row-major, as ``pre.flatten(2)``) and ``K = C_in/groups * prod(kernel)``
    over the receptive field (as ``F.unfold``; zero padding gives zero edges). The sum
    over the last axis is ``y - y~`` (DeepLIFT) or ``y - b`` (LRP). Conv3d has no edge
    form (TypeError).
    """
    layer = record.layer
    d = record.inputs - record.ref_inputs if record.rule == "deeplift" else record.inputs
    w = layer.weight.detach().to(d.dtype)
    if isinstance(layer, nn.Linear):
        if d.dim() != 2:
            raise ValueError(f"edge_terms needs 2-D inputs to Linear layer '{record.name}', "
                             f"got shape {tuple(d.shape)}")
        return w.unsqueeze(0) * d.unsqueeze(1)
    if not isinstance(layer, (nn.Conv1d, nn.Conv2d)):
        raise TypeError(f"edge_terms supports Linear, Conv1d and Conv2d layers, not "
                         f"{type(layer).__name__} '{record.name}'")
    if layer.padding_mode != "zeros" or isinstance(layer.padding, str) and layer.padding != "valid":
        raise ValueError(f"edge_terms supports zero padding given as integers, layer "
                         f"'{record.name}' has padding={layer.padding!r}, "
                         f"padding_mode={layer.padding_mode!r}")
    pad = (0,) * len(layer.kernel_size) if layer.padding == "valid" else layer.padding
    kernel, stride, dil = layer.kernel_size, layer.stride, layer.dilation
    if isinstance(layer, nn.Conv1d):
        d = d.unsqueeze(2)
        kernel, stride, dil, pad = (1,) + kernel, (1,) + stride, (1,) + dil, (0,) + tuple(pad)
    cols = F.unfold(d, kernel, dilation=dil, padding=pad, stride=stride)  # [B, C_in*k, L]
    b, g, c_out = d.shape[0], layer.groups, w.shape[0]
    cols = cols.view(b, g, -1, cols.shape[-1])
    if g > 1:
        cols = cols.repeat_interleave(c_out // g, dim=1)
    else:
        cols = cols.expand(b, c_out, cols.shape[2], cols.shape[3])
    e = w.reshape(1, c_out, -1, 1) * cols  # [B, C_out, K, L]
    return e.transpose(2, 3)


def denominator(record: LayerRecord) -> torch.Tensor:
    """The rule's per-neuron denominator: DeepLIFT ``y - y~``; LRP ``y + eps s(y)``.

    Shaped like the neuron axes of :func:`edge_terms` (``[B, out]`` / ``[B, C_out, L]``).
    The per-edge ratio of the paper is ``edge_terms / denominator[..., None]``.
    """
    if record.rule == "deeplift":
        return _neurons(record, record.pre - record.ref_pre)
    return _neurons(record, record.pre + record.epsilon * stable_sign(record.pre))


def local_relevance(record: LayerRecord) -> torch.Tensor:
    """The local relevance ``a_ij^(l)`` of input ``i`` to neuron ``j`` (paper, Thm 4).

    DeepLIFT: ``(z_ji - z~_ji) / (y_j - y~_j) * (x_j^(l+1) - x~_j^(l+1))`` (computed as
    ``(z_ji - z~_ji) * m_j``, so where ``|y_j - y~_j| < 1e-10`` it is
    ``sigma'(y_j) (z_ji - z~_ji)``, as the engine propagates it); it sums over ``i`` to
    ``x_j^(l+1) - x~_j^(l+1)`` exactly (completeness per neuron).
    epsilon-LRP (supplement): ``z_ji / (y_j + eps s(y_j)) * (x_j^(l+1) - sigma(b_j))``;
    it sums to ``(y_j - b_j)/(y_j + eps s) * (x_j^(l+1) - sigma(b_j))``, which is the
    output change only for bias-free layers.
    Shape as :func:`edge_terms`.
    """
    e = edge_terms(record)
    if record.rule == "deeplift":
        factor = _neurons(record, record.multiplier)
    else:
        factor = _neurons(record, record.post - record.ref_post) / denominator(record)
    return e * factor.unsqueeze(-1)


def global_relevance(record: LayerRecord) -> torch.Tensor:
    """The relevance the full method sends along each edge: ``e_ji * m_j * upstream_j``.

    Summed over ``j`` (and, for conv layers, scattered back over positions) it is the
    method's attribution to the layer's input ``x^(l)``; for the first layer its total
    is the total attribution. Shape as :func:`edge_terms`.
    """
    e = edge_terms(record)
    factor = _neurons(record, record.multiplier * record.upstream)
    return e * factor.unsqueeze(-1)
