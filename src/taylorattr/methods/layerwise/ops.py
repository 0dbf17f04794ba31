"""What kind of operation a captured (core ATen) node is, for the layer-wise rules.

One principle per kind, so that coverage follows from the graph, not from a list of
modules (the defining property of each kind, then how it is recognised):

===============  ========================================================================
kind             operations
===============  ========================================================================
``linear``       linear in its input-dependent arguments: views, permutes, slicing,
                 ``cat``/``stack``/``unbind``/``split``, padding, upsampling, sums, ``+``,
                 ``-``, scaling by a constant, dtype copies, ``where`` with a fixed mask,
                 writes at fixed places (``index_put``, ``masked_scatter``, ``*_scatter``)
``weighted``     linear layers with parameters: ``convolution``, ``addmm``, ``mm``/``bmm``
                 with one input-dependent operand
``norm``         batch normalisation in eval mode (affine per channel)
``avg_pool``     averages: average pooling, adaptive average pooling, ``mean``
``max_pool``     selection of a maximum/minimum: max pooling, ``amax``, ``max.dim``
``activation``   elementwise in one input-dependent tensor and not linear (every op
                 tagged ``torch.Tag.pointwise``, plus the activations kept whole)
``product``      bilinear in two input-dependent tensors: ``mul``, ``mm``, ``bmm``
                 (gates, attention scores and values, SE units)
``binary``       elementwise in two input-dependent tensors, not bilinear: ``div``,
                 ``maximum``, ``minimum``, ``pow``
``softmax``      ``softmax``, ``log_softmax``
``layer_norm``   layer normalisation, group normalisation
===============  ========================================================================

Nodes whose output is not a floating tensor (shapes, comparisons, indices) or does not
depend on the input values (``zeros_like``) carry no relevance.
"""
from __future__ import annotations

import operator

import torch
from torch import fx

from .graph import KEPT_WHOLE, first_output  # graph registers taylorattr::elementwise

__all__ = ["KINDS", "classify", "live_positions"]

aten = torch.ops.aten


def _packets(*names):
    return frozenset(getattr(aten, n) for n in names if hasattr(aten, n))


_STRUCTURE = _packets(
    "view", "_unsafe_view", "reshape", "permute", "transpose", "t", "expand", "clone",
    "contiguous", "alias", "squeeze", "unsqueeze", "slice", "select", "cat", "stack",
    "split", "split_with_sizes", "unbind", "narrow", "flip", "roll", "repeat",
    "index_select", "index", "gather", "constant_pad_nd", "reflection_pad1d",
    "reflection_pad2d", "reflection_pad3d", "replication_pad1d", "replication_pad2d",
    "replication_pad3d", "upsample_nearest1d", "upsample_nearest2d", "upsample_nearest3d",
    "upsample_bilinear2d", "upsample_linear1d", "upsample_trilinear3d", "_to_copy", "copy",
    "slice_scatter", "select_scatter", "pixel_shuffle", "pixel_unshuffle", "diagonal",
    "as_strided", "unfold", "sum", "cumsum", "add", "sub", "neg", "lift_fresh_copy",
    "expand_copy", "view_copy", "permute_copy", "squeeze_copy", "unsqueeze_copy",
    "_unsafe_index", "col2im", "im2col", "where", "masked_fill", "positive", "movedim",
    "repeat_interleave", "tile", "flatten", "unflatten", "chunk", "tensor_split",
    "channel_shuffle", "index_put", "masked_scatter", "diagonal_scatter", "upsample_bicubic2d",
    "rsub")
_SHAPE_ONLY = _packets("full_like", "zeros_like", "ones_like", "empty_like", "new_zeros",
                       "new_ones", "new_full", "new_empty", "sym_size", "sym_numel",
                       "sym_stride", "detach", "empty_strided", "scalar_tensor")
_SCALING = _packets("mul", "div")
_WEIGHTED = _packets("convolution", "addmm", "mm", "bmm", "matmul", "baddbmm", "linear")
_AVG = _packets("avg_pool1d", "avg_pool2d", "avg_pool3d", "_adaptive_avg_pool1d",
                "_adaptive_avg_pool2d", "_adaptive_avg_pool3d", "adaptive_avg_pool1d",
                "mean")
_MAX = _packets("amax", "amin", "max", "min", "max_pool2d_with_indices",
                "max_pool3d_with_indices", "adaptive_max_pool2d", "adaptive_max_pool3d",
                "max_pool1d", "max_pool2d", "max_pool3d")
_BINARY = _packets("div", "maximum", "minimum", "pow", "atan2", "fmax", "fmin", "hypot")
_SOFTMAX = _packets("_softmax", "_log_softmax", "_safe_softmax", "softmax", "log_softmax")
_LAYER_NORM = _packets("native_layer_norm", "native_group_norm", "layer_norm", "group_norm")
_BATCH_NORM_EVAL = _packets("_native_batch_norm_legit_no_training")
_BATCH_NORM_TRAIN = _packets("_native_batch_norm_legit", "native_batch_norm",
                             "_native_batch_norm_legit_functional", "batch_norm")
_KEPT = frozenset(op.overloadpacket for op in KEPT_WHOLE)

#: (key, title, operations in words) of every kind the planner knows
KINDS: tuple[tuple[str, str, str], ...] = (
    ("linear", "linear operations",
     ("views, permute, slicing, cat/stack/unbind/split/chunk, pad, upsample, sum, a + b, "
      "a - b, scaling by a constant, dtype copies, where with a fixed mask, writes at fixed "
      "places (index_put, masked_scatter, slice/select/diagonal_scatter)")),
    ("weighted", "linear layers with parameters",
     ("convolution, addmm/mm/bmm with one input-dependent operand (Linear, Conv, "
      "F.linear, F.conv2d)")),
    ("norm", "batch normalisation (eval mode)", "BatchNorm modules, F.batch_norm"),
    ("avg_pool", "averages", "average pooling, adaptive average pooling, mean"),
    ("max_pool", "max/min selection", "max pooling, adaptive max pooling, amax, max.dim"),
    ("activation", "elementwise nonlinearities",
     ("every torch.Tag.pointwise op of one input-dependent tensor (relu, gelu, sigmoid, "
      "tanh, exp, rsqrt, clamp, ...), SiLU, Hardswish, Hardsigmoid, Mish, ELU, ReLU6")),
    ("product", "products of two input-dependent tensors",
     "a * b, matmul/bmm/mm (gates, SE units, GLU/SwiGLU, attention)"),
    ("binary", "other elementwise functions of two input-dependent tensors",
     "a / b, maximum, minimum, pow"),
    ("softmax", "softmax", "softmax, log_softmax (also inside scaled_dot_product_attention)"),
    ("layer_norm", "layer and group normalisation",
     "LayerNorm, F.layer_norm, GroupNorm, F.group_norm (RMSNorm is captured as products)"),
)


def _packet(node: fx.Node):
    target = node.target.op if isinstance(node.target, first_output) else node.target
    return getattr(target, "overloadpacket", None)


def _floating(val) -> bool:
    if isinstance(val, (list, tuple)):
        return any(_floating(v) for v in val)
    return isinstance(val, torch.Tensor) and val.is_floating_point()


def live_positions(node: fx.Node, live: set) -> tuple[list[int], bool]:
    """Top-level positional indices of the input-dependent arguments of ``node``, and
    whether any input-dependent argument sits inside a list or a keyword."""
    top = [i for i, a in enumerate(node.args) if isinstance(a, fx.Node) and a.name in live]
    nested = []
    for i, a in enumerate(node.args):
        if isinstance(a, (list, tuple)):
            fx.node.map_arg(a, nested.append)
    fx.node.map_arg(node.kwargs, nested.append)
    return top, any(n.name in live for n in nested)


def _is_pointwise(node: fx.Node) -> bool:
    target = node.target
    return isinstance(target, torch._ops.OpOverload) and (
        torch.Tag.pointwise in target.tags or target.overloadpacket in _KEPT
        or target.overloadpacket is torch.ops.taylorattr.elementwise)


def classify(node: fx.Node, live: set) -> tuple[str | None, str | None]:
    """``(kind, None)`` for a node whose value depends on the input and that a kind
    covers, ``(None, reason)`` for one no kind covers, ``(None, None)`` for a node that
    carries no relevance (it does not depend on the input, or it is not a floating
    tensor: shapes, comparisons, indices). ``live`` holds the input-dependent nodes so far.
    """
    if node.op == "placeholder" or node.op == "output" or node.op == "get_attr":
        return None, None
    args = [a for a in fx.node.map_aggregate((node.args, node.kwargs), lambda a: a)]
    deps: list = []
    fx.node.map_arg(args, deps.append)
    if not any(d.name in live for d in deps):
        return None, None
    if not _floating(node.meta.get("val")):
        return None, None
    if node.target is operator.getitem:
        return "linear", None
    packet = _packet(node)
    if packet in _SHAPE_ONLY:
        return None, None
    top, nested = live_positions(node, live)
    n_live = len(top) + nested
    if packet in _BATCH_NORM_EVAL:
        return ("norm", None) if top == [0] else \
            (None, "batch norm of input-dependent parameters")
    if packet in _BATCH_NORM_TRAIN:
        return None, ("batch normalisation with the statistics of its own batch (training "
                      "mode, or track_running_stats=False): not a fixed affine map; call "
                      "model.eval() or use running statistics")
    if packet in _LAYER_NORM:
        return ("layer_norm", None) if top == [0] and not nested else \
            (None, "normalisation with input-dependent weight or bias")
    if packet in _SOFTMAX:
        return "softmax", None
    if packet in _MAX and top == [0] and not nested:
        return "max_pool", None
    if packet in _AVG and top == [0] and not nested:
        return "avg_pool", None
    if packet in _WEIGHTED:
        return ("product", None) if n_live >= 2 else ("weighted", None)
    if packet in _SCALING:
        if n_live >= 2:
            return ("product", None) if packet is aten.mul else ("binary", None)
        if packet is aten.div and top != [0]:
            return "activation", None  # c / y: elementwise, not linear
        return "linear", None
    if packet in _STRUCTURE:
        if packet in (aten.index, aten.gather, aten._unsafe_index) and (top != [0] or nested):
            return None, "indexes with input-dependent indices into an input-dependent tensor"
        return "linear", None
    if _is_pointwise(node) or packet in _BINARY:
        if n_live == 1 and not nested:
            return "activation", None
        if n_live == 2 and not nested:
            return "binary", None
        return None, "elementwise function of more than two input-dependent tensors"
    return None, "no layer-wise rule for this operation"
