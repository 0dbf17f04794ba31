"""The two engines' tables of operations agree (issue 47): Taylor mode's rules
(``taylor/mode/rules/``, looked up by :func:`taylorattr.taylor.mode.registry.lookup`) and
the layer-wise planner's kinds (``methods/layerwise/ops.py``, :func:`classify`), compared
over every core ATen operation (torch's ``Tag.core`` set) and every operation either table
names. An operation one engine handles and the other does not, or that they read as kinds
that cannot be the same map, is a disagreement; the only ones allowed are listed in
:data:`DIFFERENCES`, each with its reason (a stale entry fails too). The rules added to
close the gaps are checked against independent routes: Taylor mode's against float64
nested autograd, the layer-wise engine's against Captum's DeepLift.
"""
from __future__ import annotations

import math
import warnings

import pytest
import torch
import torch.nn.functional as F
from captum.attr import DeepLift as CaptumDeepLift
from torch import fx, nn

import taylorattr.taylor.mode  # noqa: F401  (registers the built-in rules)
from taylorattr.capture import DEFAULT_KEEP, VERSION_GAPS, capture
from taylorattr.methods import DeepLift
from taylorattr.methods.layerwise import ops as layerwise_ops
from taylorattr.methods.layerwise.graph import KEPT_WHOLE
from taylorattr.taylor.mode import registry as taylor_rules
from taylorattr.taylor.mode.core import propagate_core

pytestmark = pytest.mark.filterwarnings("error")

aten = torch.ops.aten
DT = torch.float64

#: Taylor-mode family -> the layer-wise kinds that are the same kind of map.
COMPATIBLE = {
    "shape": {"linear"},
    "affine": {"linear", "weighted", "avg_pool", "product", "binary"},
    "pointwise": {"activation", "binary"},
    "piecewise": {"activation", "max_pool", "binary"},
    "normalisation": {"norm", "layer_norm"},
    "attention": {"softmax"},
}

DECOMPOSED = ("not a core ATen operation and decomposed before either engine sees it "
              "(torch.export's default decompositions, CompositeImplicitAutograd, or the "
              "capture's VERSION_GAPS): the entry names a graph that never reaches it")
KEPT_BY_LAYERWISE = ("kept whole by the layer-wise capture only (graph.KEPT_WHOLE: one "
                     "activation rule for the module); the capture decomposes it for Taylor "
                     "mode into operations that have rules")
NO_SERIES = ("Taylor mode has no series recurrence for it yet (taylorattr.series); the "
             "layer-wise rules need only its values (DeepLIFT's rescale, LRP's pass-through), "
             "so every torch.Tag.pointwise op has one: a gap of Taylor mode, refused with "
             "UnsupportedOperation naming the op")
STEPS = ("piecewise constant (zero derivative off its steps): the layer-wise rules pass "
         "relevance through it as an activation; Taylor mode refuses it (its terms would be "
         "zero, not the model's change)")
INTEGER = ("takes integer or bool tensors only: its value is no floating tensor, so it "
           "carries no relevance in either engine (the meta run cannot tell from dtypes)")
STATISTIC = ("a statistic of its input (variance, vector norm): Taylor mode expands it "
             "exactly; no layer-wise rule (Zennit, lxt, Captum have none either) redistributes "
             "relevance through it outside the layer_norm kind, which keeps the whole "
             "normalisation")
BATCH_STATS = ("batch normalisation with the batch's own statistics (training mode): Taylor "
               "mode expands it exactly but refuses it for mixing samples (MIXING_ADVICE); "
               "the layer-wise engine refuses it as no fixed affine map")

#: op name -> why the two engines differ on it (every entry checked to be a disagreement).
DIFFERENCES = {
    # composite or decomposed names that the layer-wise table lists for completeness
    **dict.fromkeys(("_safe_softmax", "softmax", "log_softmax", "layer_norm", "group_norm",
                     "linear", "max_pool1d", "max_pool2d", "max_pool3d", "flatten",
                     "unflatten", "positive", "dropout", "tensor_split", "expand_copy",
                     "squeeze_copy", "unsqueeze_copy", "var_mean", "linalg_vector_norm",
                     "native_batch_norm"), DECOMPOSED),
    **dict.fromkeys(("acos", "acosh", "asin", "asinh", "atan", "atan2", "atanh", "cos", "cosh",
                     "sin", "sinh", "tan", "elu", "hypot", "fmax", "fmin"), NO_SERIES),
    **dict.fromkeys(("_prelu_kernel", "celu", "hardsigmoid", "hardswish", "relu6", "selu"),
                    KEPT_BY_LAYERWISE),
    **dict.fromkeys(("ceil", "floor", "round", "sign", "trunc"), STEPS),
    **dict.fromkeys(("bitwise_and", "bitwise_not", "bitwise_or", "bitwise_xor"), INTEGER),
    "var": STATISTIC,
    "_native_batch_norm_legit": BATCH_STATS,
    "detach": ("a constant in both: Taylor mode's entry returns the value, the layer-wise "
               "engine reads it as carrying no relevance"),
    "native_dropout": ("identity in eval mode (torch.export of an eval model holds no dropout "
                       "node); Taylor mode's entry refuses training-mode dropout by name, the "
                       "layer-wise engine refuses it as an operation without a rule"),
}


def _packets() -> dict[str, torch._ops.OpOverloadPacket]:
    """Every core ATen operation and every ATen operation either table names."""
    out = {}
    for name in dir(aten):
        packet = getattr(aten, name, None)
        if isinstance(packet, torch._ops.OpOverloadPacket) and any(
                torch.Tag.core in getattr(packet, o).tags for o in packet.overloads()):
            out[name] = packet
    for names in taylor_rules.supported_ops().values():
        out |= {n[5:]: getattr(aten, n[5:]) for n in names if n.startswith("aten.")}
    tables = [v for k, v in vars(layerwise_ops).items() if k.startswith("_") and
              isinstance(v, frozenset) and all(isinstance(p, torch._ops.OpOverloadPacket)
                                               for p in v)]
    for table in tables:
        out |= {p.__name__: p for p in table}
    return out


def _overload(packet):
    names = packet.overloads()
    return getattr(packet, next((n for n in ("default", "Tensor", "self", "int", "dim")
                                 if n in names), names[0]))


def _arguments(op) -> list:
    """The positional arguments up to the first optional one: ``("T", name)`` for a tensor,
    ``("L", name)`` for a list of tensors, ``("V", value)`` for a plain value."""
    out = []
    for a in op._schema.arguments:
        kind = str(a.type)
        if a.kwarg_only or (a.has_default_value() and kind != "Tensor"):
            break
        if kind == "Tensor":
            out.append(("T", a.name))
        elif kind in ("List[Tensor]", "Tensor[]"):
            out.append(("L", a.name))
        elif "[]" in kind or "List" in kind:
            out.append(("V", [1]))
        elif "int" in kind.lower():
            out.append(("V", 0))
        elif "bool" in kind:
            out.append(("V", False))
        else:
            out.append(("V", 1.0))
    return out


def _floating_output(op) -> bool:
    """Whether ``op`` on float tensors gives a floating tensor (on the meta device; an op
    that cannot be called so is taken as floating)."""
    args = _arguments(op)
    meta = torch.empty(2, 3, 4, 4, device="meta")
    try:
        out = op(*[meta if k == "T" else [meta] if k == "L" else v for k, v in args])
    except Exception:  # noqa: BLE001 (any failure: the argument guess did not fit)
        return True
    outs = out if isinstance(out, (tuple, list)) else (out,)
    return any(isinstance(o, torch.Tensor) and o.is_floating_point() for o in outs)


def _layerwise_kind(op):
    """``classify`` of one node of ``op`` whose first tensor argument is the input-dependent
    one (the others constants), with a floating value: its kind, ``"constant"`` for a node
    that carries no relevance, None where no kind covers it; None too for an op without
    tensor arguments (nothing depends on the input)."""
    graph, args = fx.Graph(), []
    for kind, v in _arguments(op):
        node = graph.placeholder(v) if kind in "TL" else v
        args.append([node] if kind == "L" else node)
    node = graph.call_function(op, tuple(args))
    node.meta["val"] = torch.zeros(2)
    deps: list = []
    fx.node.map_arg(tuple(args), deps.append)
    if not deps:
        return "no input"
    kind, reason = layerwise_ops.classify(node, {deps[0].name})
    return kind if kind is not None or reason is not None else "constant"


def _disagreements() -> dict[str, tuple]:
    out = {}
    for name, packet in sorted(_packets().items()):
        op = _overload(packet)
        layer = _layerwise_kind(op)
        if layer == "no input":
            continue
        entry = taylor_rules.lookup(op)
        taylor = None if entry is None else entry.family
        if taylor is None and (layer in (None, "constant") or not _floating_output(op)):
            continue  # neither handles it, or its value carries no relevance
        if taylor is None or layer is None or layer == "constant" or \
                layer not in COMPATIBLE[taylor]:
            out[name] = (taylor, layer)
    return out


def test_the_two_tables_agree_on_every_core_aten_operation():
    found = _disagreements()
    unexplained = {k: v for k, v in found.items() if k not in DIFFERENCES}
    assert not unexplained, f"(taylor family, layer-wise kind) of each: {unexplained}"
    stale = sorted(set(DIFFERENCES) - set(found))
    assert not stale, f"listed as differences but the engines agree now: {stale}"
    core = {n for n, p in _packets().items()
            if any(torch.Tag.core in getattr(p, o).tags for o in p.overloads())}
    assert len(core) > 150 and {"col2im", "index_put", "masked_scatter"} <= core


def test_the_decomposed_differences_are_decomposed():
    """Each DECOMPOSED entry is not core ATen, and every overload the engines could meet is
    in torch.export's default decompositions, CompositeImplicitAutograd or VERSION_GAPS;
    each KEPT_BY_LAYERWISE entry is kept whole by the layer-wise capture and decomposed by
    Taylor mode's."""
    table = torch.export.default_decompositions()
    for name, why in DIFFERENCES.items():
        if why == KEPT_BY_LAYERWISE:
            op = _overload(getattr(aten, name))
            assert op in KEPT_WHOLE and op in table and op not in DEFAULT_KEEP, name
        if why != DECOMPOSED:
            continue
        packet = getattr(aten, name)
        op = _overload(packet)
        assert torch.Tag.core not in op.tags, name
        assert op in table or op in VERSION_GAPS or op.has_kernel_for_dispatch_key(
            torch._C.DispatchKey.CompositeImplicitAutograd), name


# ---- the new Taylor-mode rules, against float64 nested autograd ---------------------------

class OpNet(nn.Module):
    """``sum(w * tanh(op(x))^2)`` per sample: the op between nonlinear maps, so every order
    of the expansion goes through it."""

    def __init__(self, op, width: int):
        super().__init__()
        self.op = op
        self.w = nn.Parameter(torch.linspace(-1.0, 1.0, width, dtype=DT))

    def forward(self, x):
        y = torch.tanh(self.op(x * x + x)).flatten(1)
        return (self.w * y * y).sum(1, keepdim=True)


def _nested_autograd(f, x, v, order):
    """``d^k/dt^k f(x + t v) / k!`` at 0 for k = 1..order (f of one sample)."""
    t = torch.zeros((), dtype=DT, requires_grad=True)
    cur, out = f(x + t * v), []
    for k in range(1, order + 1):
        (cur,) = torch.autograd.grad(cur, t, create_graph=True)
        out.append(cur.detach() / math.factorial(k))
    return torch.stack(out)


def _idx(*size):
    return torch.arange(math.prod(size)).reshape(size) % size[-1]


TAYLOR_CASES = {
    "_unsafe_index": (aten._unsafe_index.Tensor,
                      lambda x: aten._unsafe_index.Tensor(x, [None, torch.tensor([2, 0, 0, 1])]),
                      (2, 3), 4),
    "im2col": (aten.im2col.default, lambda x: aten.im2col.default(x, [2, 2], [1, 1], [0, 0],
                                                                   [1, 1]), (2, 1, 3, 3), 16),
    "col2im": (aten.col2im.default, lambda x: aten.col2im.default(x, [3, 3], [2, 2], [1, 1],
                                                                   [0, 0], [1, 1]), (2, 4, 4), 9),
    "repeat_interleave": (aten.repeat_interleave.self_int,
                          lambda x: aten.repeat_interleave.self_int(x, 2, 1), (2, 3), 6),
    "adaptive_max_pool2d": (aten.adaptive_max_pool2d.default,
                            lambda x: aten.adaptive_max_pool2d.default(x, [2, 2])[0],
                            (2, 1, 4, 4), 4),
    "permute_copy": (aten.permute_copy.default,
                     lambda x: aten.permute_copy.default(x, [0, 2, 1]), (2, 2, 3), 6),
    "view_copy": (aten.view_copy.default, lambda x: aten.view_copy.default(x, [-1, 6]),
                  (2, 3, 2), 6),
}


@pytest.mark.parametrize("name", sorted(TAYLOR_CASES))
def test_new_taylor_rule_equals_nested_autograd(name):
    """Taylor mode runs the op kept whole in the captured graph (``keep``: the capture
    would otherwise decompose it) and its orders 1..3 equal float64 nested autograd."""
    op, fn, shape, width = TAYLOR_CASES[name]
    net = OpNet(fn, width).eval()
    torch.manual_seed(0)
    x = torch.randn(shape, dtype=DT)
    v = torch.randn((shape[0], 2) + shape[1:], dtype=DT)
    graph = capture(net, (x,), keep=tuple(DEFAULT_KEEP) + (op,))
    assert any(n.target == op for n in graph.nodes), f"{op} was not kept whole"
    jet = propagate_core(graph, x, v, order=3)  # series [K, B, m, 1]
    for b in range(shape[0]):
        for r in range(2):
            ref = _nested_autograd(lambda z: net(z[None])[0, 0], x[b], v[b, r], 3)
            torch.testing.assert_close(jet.series[:, b, r, 0], ref, rtol=1e-10, atol=1e-12)
    assert jet.series.abs().amax() > 1e-3


# ---- the new layer-wise entries, against Captum's DeepLift --------------------------------

class Writes(nn.Module):
    """Linear -> an op that writes at fixed places -> Tanh -> Linear (Captum's DeepLift
    rescales the Tanh module; the op in between is linear)."""

    def __init__(self, kind: str):
        super().__init__()
        self.kind = kind
        self.a, self.act, self.b = nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 3)
        self.c = nn.Linear(6, 4)

    def forward(self, x):
        h, g = self.a(x), self.c(x)
        if self.kind == "index_put":
            h = torch.ops.aten.index_put.default(h, [None, torch.tensor([1, 4, 6, 7])], g)
        elif self.kind == "masked_scatter":
            mask = torch.tensor([True, False, True, False, False, True, False, True])
            h = torch.masked_scatter(h, mask.expand_as(h), g)  # row b takes g[b]
        elif self.kind == "diagonal_scatter":
            square = h[:, :4].reshape(-1, 2, 2)
            h = torch.cat([torch.diagonal_scatter(square, g[:, :2], 0, 1, 2).flatten(1),
                           h[:, 4:]], 1)
        elif self.kind == "channel_shuffle":
            h = F.channel_shuffle(h.view(-1, 4, 2, 1), 2).flatten(1)
        elif self.kind == "upsample_bicubic2d":
            h = torch.ops.aten.upsample_bicubic2d.default(h.view(-1, 2, 2, 2), [2, 2], False)
            h = h.flatten(1)
        return self.b(self.act(h))


@pytest.mark.parametrize("kind", ["index_put", "masked_scatter", "diagonal_scatter",
                                  "channel_shuffle", "upsample_bicubic2d"])
def test_new_layerwise_entry_equals_captum_deeplift(kind):
    torch.manual_seed(1)
    net = Writes(kind).to(DT).eval()
    x, base = torch.randn(3, 6, dtype=DT), 0.3 * torch.randn(3, 6, dtype=DT)
    graph = capture(net, (x,))
    packet = getattr(aten, kind)
    kinds = {layerwise_ops.classify(n, {m.name for m in graph.nodes})[0]
             for n in graph.nodes if getattr(n.target, "overloadpacket", None) is packet}
    # channel_shuffle and upsample_bicubic2d reach the engine decomposed by torch.export
    # (their entries are for a graph that keeps them whole); the others as themselves
    whole = kind not in ("channel_shuffle", "upsample_bicubic2d")
    assert kinds == ({"linear"} if whole else set())
    ours = DeepLift(net).attribute(x, baselines=base, target=2)
    with warnings.catch_warnings():  # Captum's notice about its hooks (not this package's)
        warnings.simplefilter("ignore", UserWarning)
        theirs = CaptumDeepLift(net).attribute(x.clone().requires_grad_(), baselines=base,
                                               target=2)
    torch.testing.assert_close(ours, theirs, rtol=1e-9, atol=1e-11)
    change = net(x)[:, 2] - net(base)[:, 2]
    torch.testing.assert_close(ours.sum(1), change, rtol=1e-9, atol=1e-11)
