"""One capture whatever kernel the device picks (issue 34), tested on the CPU.

On CUDA, ``F.scaled_dot_product_attention`` is lowered to a fused kernel (efficient, flash,
cuDNN attention) and ``F.rms_norm`` to ``aten._fused_rms_norm``; a capture that kept them
whole was refused by every engine. The CPU never picks those kernels, so the tests make it
pick them: :func:`device_kernel` routes ``scaled_dot_product_attention`` (and ``rms_norm``)
to the chosen kernel, exactly as the CUDA dispatcher does, and gives the kernel a CPU
implementation written out here by hand (matmul/softmax; the kernel's own output layout,
read from its meta function). The captured graph must then hold only core operations the
engines have rules for and equal the model; DeepLIFT, epsilon-LRP and Taylor mode on it
must equal a hand-written float64 reference (the same block with attention and RMSNorm
written out). Programs that already hold a fused kernel (exported on a GPU) are made by
rewriting an exported graph's nodes by hand.
"""
import contextlib
import operator
import warnings

import pytest
import torch
import torch.nn.functional as F
from conftest import device_tolerance
from test_taylor import DT, _autograd_orders, _hessian_fields
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel

import taylorattr as ta
from taylorattr.capture import DEFAULT_KEEP, DEVICE_KERNELS, capture, op_name
from taylorattr.taylor.mode import UnsupportedOperation
from taylorattr.taylor.mode import core as taylor_core

aten = torch.ops.aten
L, D, H, E = 5, 8, 2, 4  # tokens, width, heads, head size

FUSED = {"efficient": aten._scaled_dot_product_efficient_attention.default,
         "flash": aten._scaled_dot_product_flash_attention.default,
         "cudnn": aten._scaled_dot_product_cudnn_attention.default,
         "overrideable": aten._scaled_dot_product_fused_attention_overrideable.default,
         "mps": aten._scaled_dot_product_attention_math_for_mps.default}
KERNELS = ["math", "flash_for_cpu", *FUSED]
#: the kernels the tests make the dispatcher pick (the CPU's flash kernel only where the
#: suite runs on another device: on the CPU, sdpa_kernel picks the real one)
SIMULATED = {"flash_for_cpu": aten._scaled_dot_product_flash_attention_for_cpu.default, **FUSED}
MASKS = ["none", "float", "bool", "causal", "gqa"]
#: the kernels whose output is laid out like the query (so the model may ``view`` it)
LAID_OUT = {"flash_for_cpu", "efficient", "flash", "cudnn", "overrideable"}


# --------------------------------------------------------------- references by hand

def attention_by_hand(q, k, v, mask=None, causal=False, scale=None):
    """softmax(q k^T s + B) v, written out; k and v heads repeated for grouped queries."""
    k, v = _repeat_heads(q, k, v)
    s = q @ k.transpose(-2, -1) * (q.shape[-1] ** -0.5 if scale is None else scale)
    if causal:  # on q's device: inside a kernel the default device does not apply
        mask = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.bool, device=q.device).tril()
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else s + mask
    return torch.softmax(s, dim=-1) @ v


def rms_norm_by_hand(x, dims, weight=None, eps=None):
    """x / sqrt(mean(x^2) + eps) * weight over the last ``len(dims)`` axes."""
    return _rms_by_hand(x, dims, weight, eps)[0]


def _rms_by_hand(x, dims, weight=None, eps=None):
    eps = torch.finfo(x.dtype).eps if eps is None else eps
    rstd = 1 / torch.sqrt((x * x).mean(tuple(range(-len(dims), 0)), keepdim=True) + eps)
    return (x * rstd if weight is None else x * rstd * weight), rstd


class Block(nn.Module):
    """Attention (mask: none / float / bool / causal; gqa: one key/value head for two
    query heads) and RMSNorm. ``view``: the attention output is ``view``-ed after its
    transpose, valid only for kernels laying their output out like the query (GPT-2's
    attention does this)."""

    def __init__(self, mask="none", view=False, kernel=""):
        super().__init__()
        self.mask, self.view, self.kernel = mask, view, kernel  # kernel: its own cache key
        self.kv_heads = 1 if mask == "gqa" else H
        self.q = nn.Linear(D, D)
        self.kv = nn.Linear(D, 2 * E * self.kv_heads)
        self.gain = nn.Parameter(1 + 0.3 * torch.randn(D))
        self.head = nn.Linear(L * D, 3)
        self.register_buffer("bias", torch.randn(L, L))
        self.register_buffer("keep", (torch.rand(L, L) > 0.4) | torch.eye(L, dtype=torch.bool))

    def _project(self, x):
        b = x.shape[0]
        q = self.q(x).view(b, L, H, E).transpose(1, 2)
        k, v = self.kv(x).view(b, L, 2 * self.kv_heads, E).transpose(1, 2).split(
            self.kv_heads, dim=1)
        return q, k, v, {"float": self.bias, "bool": self.keep}.get(self.mask)

    def _finish(self, x, h, rms, view=False):
        h = h.transpose(1, 2)
        h = h.view(x.shape[0], L, D) if view else h.reshape(x.shape[0], L, D)
        return self.head(torch.tanh(rms(h + x, (D,), self.gain, 1e-5)).flatten(1))

    def forward(self, x):  # [B, L, D]
        q, k, v, mask = self._project(x)
        h = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=0.0,
                                           is_causal=self.mask == "causal",
                                           enable_gqa=self.mask == "gqa")
        return self._finish(x, h, F.rms_norm, self.view)

    def by_hand(self, x):
        q, k, v, mask = self._project(x)
        return self._finish(x, attention_by_hand(q, k, v, mask, self.mask == "causal"),
                            rms_norm_by_hand)


class ByHand(nn.Module):
    """The block with attention and RMSNorm written out (no SDPA, no rms_norm call)."""

    def __init__(self, block):
        super().__init__()
        self.block = block

    def forward(self, x):
        return self.block.by_hand(x)


def _block(mask, kernel):
    torch.manual_seed(0)
    return Block(mask, view=kernel in LAID_OUT, kernel=kernel).to(DT).eval()


def _inputs(seed=1):
    g = torch.Generator(device=torch.get_default_device()).manual_seed(seed)
    x = torch.randn(2, L, D, dtype=DT, generator=g, device=g.device)
    return x, 0.5 * torch.randn(2, L, D, dtype=DT, generator=g, device=g.device)


# --------------------------------------------------------------- the device, simulated

def _meta(a):
    return torch.empty_strided(a.shape, a.stride(), dtype=a.dtype, device="meta") \
        if isinstance(a, torch.Tensor) else a


def _kernel_by_hand(op):
    """A CPU implementation of the fused attention kernel ``op``: the attention by hand,
    laid out as ``op``'s meta function lays out its output; the other outputs zeros."""
    schema = op._schema.arguments

    def impl(*args, **kwargs):
        values = {a.name: a.default_value for a in schema if a.has_default_value()}
        values.update({a.name: v for a, v in zip(schema, args)}, **kwargs)
        out = attention_by_hand(*args[:3], values.get("attn_mask", values.get("attn_bias")),
                                values["is_causal"], values.get("scale"))
        meta = op(*map(_meta, args), **{k: _meta(v) for k, v in kwargs.items()})
        first = torch.empty_strided(meta[0].shape, meta[0].stride(), dtype=out.dtype,
                                    device=out.device).copy_(out)
        return (first, *(torch.zeros(r.shape, dtype=r.dtype, device=out.device)
                         if isinstance(r, torch.Tensor) else r for r in meta[1:]))
    return impl


def _repeat_heads(q, k, v):
    """``k`` and ``v`` with their heads repeated to ``q``'s (grouped-query attention)."""
    if k.shape[1] == q.shape[1]:
        return k, v
    return tuple(t.repeat_interleave(q.shape[1] // t.shape[1], dim=1) for t in (k, v))


def _dispatch_to(kernel):
    """``scaled_dot_product_attention`` as CUDA's dispatcher runs it when it picks
    ``kernel`` (boolean masks turned into additive ones for the kernels taking a bias)."""
    op = SIMULATED[kernel]

    def sdpa(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
             enable_gqa=False):
        if kernel == "mps":  # enable_gqa: an argument since torch 2.12 (not in 2.11)
            if "enable_gqa" in {a.name for a in op._schema.arguments}:
                return op(q, k, v, attn_mask, dropout_p, is_causal, None, scale=scale,
                          enable_gqa=enable_gqa)[0]
            k, v = _repeat_heads(q, k, v) if enable_gqa else (k, v)
            return op(q, k, v, attn_mask, dropout_p, is_causal, None, scale=scale)[0]
        if kernel == "flash_for_cpu":
            return op(q, k, v, dropout_p, is_causal, attn_mask=attn_mask, scale=scale)[0]
        if kernel == "flash":
            assert attn_mask is None, "the flash kernel takes no mask"
            return op(q, k, v, dropout_p, is_causal, False, scale=scale)[0]
        if enable_gqa:
            k, v = _repeat_heads(q, k, v)
        if attn_mask is not None and attn_mask.dtype == torch.bool:
            attn_mask = torch.zeros(attn_mask.shape, dtype=q.dtype, device=q.device).masked_fill(
                ~attn_mask, float("-inf"))
        if kernel == "overrideable":
            return op(q, k, v, attn_mask, dropout_p, is_causal, False, scale=scale)[0]
        if kernel == "cudnn":
            return op(q, k, v, attn_mask, False, dropout_p, is_causal, False, scale=scale)[0]
        return op(q, k, v, attn_mask, False, dropout_p, is_causal, scale=scale)[0]
    return sdpa


@contextlib.contextmanager
def device_kernel(kernel):
    """Run ``scaled_dot_product_attention`` through ``kernel`` (``math`` and, on the CPU,
    ``flash_for_cpu``: the real kernels, forced with ``sdpa_kernel``; the others as a GPU
    runs them, with the kernels by hand) and ``rms_norm`` through ``_fused_rms_norm``, as
    CUDA does."""
    if kernel == "math":
        with sdpa_kernel(SDPBackend.MATH):
            yield
        return
    key = torch.get_default_device().type.upper()  # "CPU" (or "CUDA" in the CUDA suite)
    if kernel == "flash_for_cpu" and key == "CPU":
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            yield
        return
    lib = torch.library.Library("aten", "IMPL")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "overriding a previously registered kernel"
            lib.impl(SIMULATED[kernel]._schema.name.split("::")[1],
                     _kernel_by_hand(SIMULATED[kernel]), key)
            lib.impl("scaled_dot_product_attention", _dispatch_to(kernel),
                     "CompositeImplicitAutograd")
            lib.impl("_fused_rms_norm", _rms_by_hand, key)
            lib.impl("rms_norm", lambda x, shape, weight=None, eps=None:
                     aten._fused_rms_norm(x, shape, weight, eps)[0], "CompositeImplicitAutograd")
        yield
    finally:
        lib._destroy()


def _fused_ops(graph):
    """The op names of the graph's nodes that are device kernels (should be none)."""
    names = {op_name(op) for op in DEVICE_KERNELS}
    return {op_name(n.target) for n in graph.nodes
            if op_name(n.target) in names or any(w in op_name(n.target) for w in
                                                ("scaled_dot_product", "fused", "cudnn",
                                                 "miopen", "flash", "efficient"))}


# --------------------------------------------------------------- the capture

def _cases():
    return [(k, m) for k in KERNELS for m in MASKS
            if not (k == "flash" and m in ("float", "bool"))]  # the flash kernel takes no mask


@pytest.mark.parametrize(("kernel", "mask"), _cases())
def test_the_capture_under_every_kernel_is_core_and_equals_the_model(kernel, mask):
    model = _block(mask, kernel)
    x, _ = _inputs()
    with device_kernel(kernel):
        eager = model(x)
        graph = capture(model, (x,))
    assert _fused_ops(graph) == set()
    taylor_core.check(graph)  # every input-dependent op has a Taylor-mode rule
    reference = model.by_hand(x)
    torch.testing.assert_close(eager, reference, rtol=1e-12, atol=1e-12)
    for batch in (x, _inputs(2)[0][:1], torch.cat([x, x])):  # one capture, any batch
        torch.testing.assert_close(graph.run(batch), model.by_hand(batch), rtol=1e-12,
                                   atol=1e-12)
    # the same operations as the math kernel's capture, but for the layout of the output
    layout = {"aten.clone.default", "aten.permute.default", "aten.transpose.int"}
    ops = set(graph.op_counts()) - layout
    assert ops == _math_ops(mask, x) - layout, (kernel, graph.op_counts())


@pytest.mark.parametrize("kernel", ["math", "efficient", "cudnn"])
def test_a_bfloat16_capture_holds_the_same_operations_and_rounds_like_the_model(kernel):
    torch.manual_seed(0)
    model = Block("causal", view=kernel in LAID_OUT, kernel=kernel).to(torch.bfloat16).eval()
    x = _inputs()[0].to(torch.bfloat16)
    with device_kernel(kernel):
        graph = capture(model, (x,))
    assert _fused_ops(graph) == set()
    taylor_core.check(graph)
    with device_kernel("math"):
        math_ops = set(capture(Block("causal").to(torch.bfloat16).eval(), (x,)).op_counts())
    layout = {"aten.clone.default", "aten.permute.default", "aten.transpose.int"}
    assert set(graph.op_counts()) - layout == math_ops - layout
    # against the block by hand in float64 on the same (bfloat16) weights and inputs: a few
    # bfloat16 roundings (eps 2^-8) of outputs below 0.5 (measured 9e-4)
    wide = ByHand(Block("causal")).to(DT)
    wide.block.load_state_dict({k: v.to(DT) for k, v in model.state_dict().items()})
    torch.testing.assert_close(graph.run(x).to(DT), wide(x.to(DT)), rtol=0, atol=5e-3)


_MATH_OPS: dict = {}


def _math_ops(mask, x):
    """The operations of the math kernel's capture of the block with ``mask``."""
    if mask not in _MATH_OPS:
        with device_kernel("math"):
            _MATH_OPS[mask] = set(capture(_block(mask, "math"), (x,)).op_counts())
    return _MATH_OPS[mask]


@pytest.mark.parametrize("kernel", list(FUSED))
def test_the_simulated_device_reaches_its_kernel_which_kept_whole_is_refused(kernel):
    """The simulation takes the GPU's route: keeping the kernel whole (as the capture did
    before) leaves it in the graph, and Taylor mode refuses it by name."""
    model = _block("causal", kernel)
    x, _ = _inputs()
    with device_kernel(kernel):
        graph = capture(model, (x,), keep=DEFAULT_KEEP + (FUSED[kernel],))
    assert op_name(FUSED[kernel]) in graph.op_counts()
    with pytest.raises(UnsupportedOperation, match=op_name(FUSED[kernel]).replace(".", r"\.")):
        taylor_core.check(graph)


# --------------------------------------------------------------- the engines

@pytest.mark.parametrize(("kernel", "mask"), [("efficient", "causal"), ("cudnn", "float"),
                                              ("flash", "gqa"), ("flash_for_cpu", "bool"),
                                              ("overrideable", "none")])
def test_engines_on_the_device_capture_equal_the_hand_written_reference(kernel, mask):
    model = _block(mask, kernel)
    reference = ByHand(model).eval()
    x, base = _inputs()
    target = 1
    with device_kernel(kernel):
        f = model(x)[:, target] - model(base)[:, target]
        deeplift = ta.DeepLift(model).attribute(x, base, target=target)
        lrp = ta.EpsilonLRP(model).attribute(x, target=target)
        terms = {K: ta.taylor_terms(model, x, base, order=K, target=target) for K in (2, 3)}
    # DeepLIFT: complete (checked here, not read from a returned delta), and the same
    # attributions as on the block written out by hand
    torch.testing.assert_close(deeplift.sum((1, 2)), f, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(deeplift, ta.DeepLift(reference).attribute(x, base, target=target),
                               rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(lrp, ta.EpsilonLRP(reference).attribute(x, target=target),
                               rtol=1e-10, atol=1e-12)
    # Taylor mode: every order against float64 nested autograd of the hand-written block,
    # the order-2 fields against its gradient and Hessian
    for b in range(x.shape[0]):
        def one(z, b=b):
            return reference(z[None])[0, target]
        orders = _autograd_orders(one, x[b], x[b] - base[b], 3)
        torch.testing.assert_close(terms[3].orders[b], orders, rtol=1e-9, atol=1e-12)
        torch.testing.assert_close(terms[2].orders[b], orders[:2], rtol=1e-9, atol=1e-12)
        fields = _hessian_fields(one, x[b], x[b] - base[b])
        for name in ("first", "independent", "interactive_ig"):
            torch.testing.assert_close(getattr(terms[2], name)[b], fields[name], rtol=1e-9,
                                       atol=1e-12)


# --------------------------------------------------------------- programs holding kernels

def _rewrite(program, old, new, arguments):
    """Each ``old`` node of ``program`` becomes ``getitem(new(*arguments(node)), 0)``: a
    fused kernel inserted by hand, as a program exported on a GPU holds it."""
    graph = program.graph_module.graph
    count = 0
    for node in list(graph.nodes):
        if node.op == "call_function" and node.target == old:
            with graph.inserting_before(node):
                args, kwargs = arguments(node)
                fused = graph.call_function(new, args, kwargs)
                first = graph.call_function(operator.getitem, (fused, 0))
            fused.meta = dict(node.meta)
            first.meta = dict(node.meta)
            fake_args, fake_kwargs = torch.utils._pytree.tree_map(
                lambda a: a.meta["val"] if isinstance(a, torch.fx.Node) else a, (args, kwargs))
            fused.meta["val"] = new(*fake_args, **fake_kwargs)
            node.replace_all_uses_with(first)
            graph.erase_node(node)
            count += 1
    assert count, f"no {old} node to rewrite"
    program.graph_module.recompile()
    return program


def _bound(node):
    """The node's arguments by name (defaults filled in from its op's schema)."""
    schema = node.target._schema.arguments
    values = {a.name: a.default_value for a in schema if a.has_default_value()}
    values.update({a.name: v for a, v in zip(schema, node.args)}, **node.kwargs)
    return values


def _sdpa_args(node):
    a = _bound(node)
    assert not a["enable_gqa"] and a["dropout_p"] == 0.0
    return (a["query"], a["key"], a["value"], a["attn_mask"], False, 0.0, a["is_causal"]), \
        {"scale": a["scale"]}


def _rms_args(node):
    a = _bound(node)
    return (a["input"], a["normalized_shape"], a["weight"], a["eps"]), {}


@pytest.mark.parametrize("mask", ["float", "causal"])
def test_a_program_holding_the_efficient_kernel_and_fused_rms_norm_is_decomposed(mask, tmp_path):
    model = _block(mask, "efficient")  # views the attention output (the kernel's layout)
    x, base = _inputs()
    # exported with the efficient kernel's output layout, which the view was traced against
    # (as on a GPU); without it the device's own kernel for float64 decides (the CPU's flash
    # kernel lays the output out like the query, CUDA's math kernel does not: the view fails)
    with device_kernel("efficient"):
        program = torch.export.export(model, (x,), strict=False)
    program = _rewrite(program, aten.scaled_dot_product_attention.default, FUSED["efficient"],
                       _sdpa_args)
    program = _rewrite(program, aten.rms_norm.default, aten._fused_rms_norm.default, _rms_args)
    ops = {op_name(n.target) for n in program.graph.nodes}
    assert {op_name(FUSED["efficient"]), "aten._fused_rms_norm.default"} <= ops
    for source in (program, _saved(program, tmp_path)):
        with device_kernel("efficient"):  # _fused_rms_norm has a kernel of its own, as on CUDA
            graph = capture(source)
        assert _fused_ops(graph) == set()
        taylor_core.check(graph)
        torch.testing.assert_close(graph.run(x), model.by_hand(x), rtol=1e-12, atol=1e-12)
    # Taylor mode on the program equals nested autograd on the block by hand
    terms = ta.taylor_terms(program, x, base, order=2, target=0)
    for b in range(2):
        ref = _autograd_orders(lambda z: model.by_hand(z[None])[0, 0], x[b], x[b] - base[b], 2)
        torch.testing.assert_close(terms.orders[b], ref, rtol=1e-9, atol=1e-12)


def _saved(program, tmp_path):
    path = tmp_path / "fused.pt2"
    torch.export.save(program, str(path))
    return str(path)


class Normed(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv1d(3, 4, 3)
        self.bn = nn.BatchNorm1d(4)
        self.head = nn.Linear(4, 2)

    def forward(self, x):
        return self.head(torch.tanh(self.bn(self.conv(x))).mean(-1))


@pytest.mark.parametrize("vendor", ["cudnn_batch_norm", "miopen_batch_norm"])
def test_vendor_batch_norm_becomes_the_core_eval_batch_norm(vendor):
    torch.manual_seed(0)
    model = Normed().to(DT).eval()
    with torch.no_grad():
        model.bn.running_mean.uniform_(-0.5, 0.5)
        model.bn.running_var.uniform_(0.5, 1.5)
        model.bn.weight.uniform_(0.5, 1.5)
    x = torch.randn(3, 3, 9, dtype=DT)
    program = torch.export.export(model, (x,), strict=False)
    op = getattr(aten, vendor).default
    _rewrite(program, aten.batch_norm.default, op, lambda n: (tuple(n.args[:8]), {}))
    graph = capture(program)
    assert _fused_ops(graph) == set()
    assert "aten._native_batch_norm_legit_no_training.default" in graph.op_counts()
    bn = model.bn
    by_hand = model.head(torch.tanh((model.conv(x) - bn.running_mean[:, None]) / torch.sqrt(
        bn.running_var[:, None] + bn.eps) * bn.weight[:, None] + bn.bias[:, None]).mean(-1))
    torch.testing.assert_close(graph.run(x), by_hand, rtol=1e-12, atol=1e-12)


def _cell_inputs(gates, width=3, batch=2):
    g = torch.Generator(device=torch.get_default_device()).manual_seed(7)
    draw = lambda *shape: torch.randn(*shape, dtype=DT, generator=g, device=g.device)
    return (draw(batch, 4), draw(batch, width), draw(batch, width), draw(gates * width, 4),
            draw(gates * width, width), draw(gates * width), draw(gates * width))


#: decompositions against torch's own op: the CPU's math route on the CPU; on CUDA the
#: fused kernel or cuDNN itself (other kernels: other roundings)
EXACT = device_tolerance(1e-14, 1e-15)


def test_cudas_fused_lstm_and_gru_cells_decompose_to_torchs_cells():
    """``nn.LSTMCell``/``nn.GRUCell`` on CUDA run ``_thnn_fused_lstm_cell`` /
    ``_thnn_fused_gru_cell`` on the gates ``x W_ih^T``, ``h W_hh^T``: their decompositions
    equal torch's own cells (the CPU's math) on the same weights, with and without biases."""
    x, h, c, w_ih, w_hh, b_ih, b_hh = _cell_inputs(4)
    lstm = DEVICE_KERNELS[aten._thnn_fused_lstm_cell.default]
    for biases in ((b_ih, b_hh), (None, None)):
        hy, cy, workspace = lstm(x @ w_ih.T, h @ w_hh.T, c, *biases)
        ref_h, ref_c = torch.lstm_cell(x, (h, c), w_ih, w_hh, *biases)
        torch.testing.assert_close(hy, ref_h, **EXACT)
        torch.testing.assert_close(cy, ref_c, **EXACT)
        assert workspace.shape == (2, 12)  # as the kernel's meta function: the gates' shape

    class FusedCell(nn.Module):  # a module calling the CUDA kernel, as LSTMCell does there
        def forward(self, x):
            return aten._thnn_fused_lstm_cell(x @ w_ih.T, h @ w_hh.T, c, b_ih, b_hh)[0]

    graph = capture(FusedCell(), (x,))
    assert _fused_ops(graph) == set() and "thnn" not in str(graph.op_counts())
    torch.testing.assert_close(graph.run(x), torch.lstm_cell(x, (h, c), w_ih, w_hh, b_ih, b_hh)[0],
                               **EXACT)
    x, h, _, w_ih, w_hh, b_ih, b_hh = _cell_inputs(3)
    gru = DEVICE_KERNELS[aten._thnn_fused_gru_cell.default]
    for biases in ((b_ih, b_hh), (None, None)):
        hy, workspace = gru(x @ w_ih.T, h @ w_hh.T, h, *biases)
        torch.testing.assert_close(hy, torch.gru_cell(x, h, w_ih, w_hh, *biases), **EXACT)
        assert workspace.shape == (2, 15)  # CUDA's: 5 gate widths


def test_cudnns_grid_sampler_is_bilinear_zero_padded_aligned_grid_sampling():
    g = torch.Generator(device=torch.get_default_device()).manual_seed(8)
    x = torch.randn(2, 3, 5, 6, dtype=DT, generator=g, device=g.device)
    grid = 1.2 * torch.rand(2, 4, 7, 2, dtype=DT, generator=g, device=g.device) - 0.6
    got = DEVICE_KERNELS[aten.cudnn_grid_sampler.default](x, grid)
    ref = F.grid_sample(x, grid, mode="bilinear", padding_mode="zeros", align_corners=True)
    torch.testing.assert_close(got, ref, **EXACT)


def test_every_attention_kernel_of_this_torch_is_decomposed():
    """Whatever ``_scaled_dot_product_*attention`` kernels this torch version has (the
    dispatcher's whole op list), each is in DEVICE_KERNELS; only the math kernel, the
    decompositions' own target, is not."""
    names = {n.split("::")[1].split(".")[0] for n in torch._C._dispatch_get_all_op_names()
             if n.startswith("aten::_scaled_dot_product_") and "backward" not in n}
    covered = {op_name(op).split(".")[1] for op in DEVICE_KERNELS}
    assert names - covered == {"_scaled_dot_product_attention_math"}, names - covered
    assert {"_scaled_dot_product_efficient_attention", "_scaled_dot_product_flash_attention",
            "_scaled_dot_product_cudnn_attention"} <= covered


def test_fused_dropout_is_the_core_random_dropout_every_engine_refuses():
    class Drop(nn.Module):
        def forward(self, x):
            return F.dropout(x, 0.25, training=True).sum(-1)

    x = torch.randn(2, 6, dtype=DT)
    program = torch.export.export(Drop(), (x,), strict=False)
    _rewrite(program, aten.dropout.default, aten._fused_dropout.default,
             lambda n: ((n.args[0], 1.0 - n.args[1]), {}))
    graph = capture(program)
    assert _fused_ops(graph) == set()
    drop = [n for n in graph.nodes if n.target == aten.native_dropout.default]
    assert len(drop) == 1 and drop[0].args[1:] == (0.25, True)  # the drop probability


@pytest.mark.parametrize("kernel", ["math", "efficient"])
def test_attention_dropout_is_the_same_random_op_on_every_kernel_and_refused(kernel):
    class Dropping(nn.Module):
        kernel_name = kernel

        def forward(self, x):
            q = x.view(x.shape[0], 2, 3, 2)
            return F.scaled_dot_product_attention(q, q, q, dropout_p=0.1).sum((2, 3))

    x = torch.randn(2, 12, dtype=DT)
    with device_kernel(kernel):
        graph = capture(Dropping().eval(), (x,))
        with pytest.raises(UnsupportedOperation, match=r"dropout in training mode.*eval"):
            ta.taylor_terms(Dropping().eval(), x, torch.zeros_like(x), order=2, target=0)
    assert _fused_ops(graph) == set()
    drop = [n for n in graph.nodes if n.target == aten.native_dropout.default]
    assert len(drop) == 1 and drop[0].args[1:] == (0.1, True)


# --------------------------------------------------------------- GPT-2 (issue 35)

def _gpt2():
    import transformers  # installed with lxt (the oracle extra)

    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=40, n_positions=16, n_embd=16, n_layer=1,
                                     n_head=2, bos_token_id=0, eos_token_id=0)
    gpt = transformers.GPT2LMHeadModel(config).to(DT).eval()

    class LastToken(nn.Module):
        def __init__(self):
            super().__init__()
            self.gpt = gpt

        def forward(self, ids):
            return self.gpt(input_ids=ids).logits[:, -1, :]

    return LastToken().eval(), gpt


def test_gpt2_at_its_embedding_layer_runs_every_engine_exactly():
    """GPT-2 views its attention output after a transpose: the decomposed attention must
    keep the kernel's layout (torch's own decomposition of the CPU flash kernel does not:
    "Cannot view a tensor with shape [2, 8, 16] and strides ...")."""
    model, gpt = _gpt2()
    g = torch.Generator(device=torch.get_default_device()).manual_seed(3)
    ids = torch.randint(1, 40, (2, 8), generator=g, device=g.device)
    zeros = torch.zeros_like(ids)
    wte, target = gpt.transformer.wte, 5
    with torch.no_grad():
        f = model(ids)[:, target] - model(zeros)[:, target]
    deeplift = ta.DeepLift(model).attribute(ids, zeros, target=target, layer=wte)
    torch.testing.assert_close(deeplift.sum((1, 2)), f, rtol=1e-9, atol=1e-10)
    lrp = ta.EpsilonLRP(model).attribute(ids, target=target, layer=wte)
    assert lrp.shape == (2, 8, 16) and torch.isfinite(lrp).all()
    terms = ta.taylor_terms(model, ids, zeros, order=2, target=target, layer=wte)

    def at_embedding(e):
        with sdpa_kernel(SDPBackend.MATH):  # the CPU flash kernel has no double backward
            return gpt(inputs_embeds=e[None]).logits[0, -1, target]

    e, e0 = wte(ids).detach(), wte(zeros).detach()
    for b in range(2):
        ref = _autograd_orders(at_embedding, e[b], e[b] - e0[b], 2)
        torch.testing.assert_close(terms.orders[b], ref, rtol=1e-9, atol=1e-12)
