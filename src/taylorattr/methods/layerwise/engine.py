"""The modified-gradient engine: runs a :class:`~.plan.Plan` with a rule set.

One pass computes ``g``, the gradient of the explained output ``f`` with every planned
operation's backward replaced by its rule (:mod:`.rules`)::

    g_y = rule(op)^T g_z   for z = op(y),   attribution  (x - x~) * g_x  (DeepLIFT)
                                                          x * g_x        (epsilon-LRP)

Rules that compare with the baseline (DeepLIFT's Rescale and max-pool rules) read
``(y~, op(y~))`` from a plain forward pass at the baseline run first. With
``records=True`` the pass also returns one :class:`~.records.LayerRecord` per weighted
layer.

Precision: with ``upcast=True`` a float16/bfloat16 pass runs in float32
(:func:`~taylorattr._validation.accumulation_dtype`): the half-precision parameters,
buffers, constants and inputs are widened exactly, casts to a half type inside the graph
become float32, and the gradient comes back in float32 for the caller to round once. The
relevance rules divide by forward values (``R_a = a / s(a + b) R`` at a residual sum,
``z / (z + eps s(z))``), and half precision loses these where they cancel: bfloat16's
8 significant bits round ``a + b`` to 0 where float32 keeps ``|a + b| ~ 1e-5 |a|``, so
that the stabiliser ``1e-6`` multiplies relevance by ``1e6``; in float16 that ``1e6``
overflows (largest value 65504), and ``eps = 1e-9`` (below its smallest subnormal, 6e-8)
turns ``z / (z + eps)`` at ``z = 0`` into 0/0. In float32 the pass is that of the float32 model with the same
(half-precision) weights.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import fx, nn

from ..._codegen import STATE, Call, Constant, Generated, lifted_reader
from ..._validation import accumulation_dtype, model_output, resolve_target, select_output
from ...capture import where
from ...runtime.cost import Cost
from ...runtime.progress import report_rows
from .graph import op_name
from .plan import Plan, get_plan
from .records import LayerRecord, fold_batchnorm
from .rules import Gradient, RuleSet, scaled

__all__ = ["LayerwiseMethod", "Propagation", "propagate"]

_RECORDED = {"weighted", "norm"}


class _Call:
    """``v -> op(*args)`` with the input-dependent arguments at ``positions`` replaced
    by ``v`` (one or two of them); ``op`` is kept for the rules that ask for it."""

    module = None  # the Linear/Conv module of a weighted node (LRP composites)
    fold = None    # the arguments of a batch norm folded into it (LRP composites)

    def __init__(self, op, args, kwargs, positions):
        self.op, self.args, self.kwargs, self.positions = op, list(args), kwargs, positions

    def __call__(self, *values):
        args = list(self.args)
        for p, v in zip(self.positions, values):
            args[p] = v
        return self.op(*args, **self.kwargs)


def _widen(v, compute: torch.dtype | None):
    """``v`` in ``compute`` if it is a half-precision tensor or dtype (else ``v``)."""
    if compute is None:
        return v
    if isinstance(v, torch.dtype):
        return compute if accumulation_dtype(v) != v else v
    if isinstance(v, torch.Tensor) and accumulation_dtype(v.dtype) != v.dtype:
        return v.detach().to(compute)
    return v


def _widen_args(args, kwargs, compute):
    """The dtype arguments of a node (``_to_copy(dtype=)``, ``full(dtype=)``) widened."""
    if compute is None:
        return tuple(args), dict(kwargs)
    return (tuple(a if isinstance(a, (torch.Tensor, fx.Node)) else _widen(a, compute)
                  for a in args),
            {k: v if isinstance(v, (torch.Tensor, fx.Node)) else _widen(v, compute)
             for k, v in kwargs.items()})


def _zip_map(struct, values, live: set, wrap):
    """``values`` (a node's evaluated arguments, shaped as ``struct``, its fx arguments)
    with ``wrap`` applied to the tensors of input-dependent nodes."""
    if isinstance(struct, fx.Node):
        return wrap(values) if struct.name in live and isinstance(values, torch.Tensor) \
            else values
    if isinstance(struct, (tuple, list)):
        return type(values)(_zip_map(s, v, live, wrap) for s, v in zip(struct, values))
    if isinstance(struct, dict):
        return {k: _zip_map(struct[k], v, live, wrap) for k, v in values.items()}
    return values


def _contiguous(v):
    return v.contiguous() if isinstance(v, torch.Tensor) and not v.is_contiguous() else v


def _contiguous_of(target):
    def run(*args, **kwargs):
        return _contiguous(target(*args, **kwargs))
    return run


def _generated(plan: Plan, rules: RuleSet, compute: torch.dtype | None):
    """The pass over ``plan``'s graph as straight-line code (:mod:`taylorattr._codegen`),
    generated once per plan and ``compute`` dtype and kept on the plan: every node calls
    its operation or its rule kernel directly (:func:`_emit`)."""
    cache = plan.__dict__.setdefault("generated", {})
    code = cache.get(compute)
    if code is None:
        nodes = {n.name: n for n in plan.graph.nodes}
        code = cache[compute] = Generated(
            plan.graph, lambda n: _emit(n, plan, rules, compute, nodes), "layerwise_pass")
    return code


def _emit(n: fx.Node, plan: Plan, rules: RuleSet, compute, nodes: dict):
    """What computes node ``n`` in a pass (:class:`_Pass`): a capture constant, the
    operation itself, the operation then the discrete check, or the rule's kernel."""
    if n.op == "get_attr":
        return Constant(_widen(getattr(plan.core.module, n.target), compute))
    args, kwargs = _widen_args(n.args, n.kwargs, compute)
    kind = plan.kinds.get(n.name)
    target = n.target
    if kind is None:
        if n.name in plan.discrete and rules.needs_reference:
            def discrete(S, *a, **k):
                out = target(*a, **k)
                S.discrete(n, out)
                return out
            return Call(discrete, (STATE, *args), kwargs)
        return Call(target, args, kwargs)
    rule = rules.rules[kind]
    plain = rule.inner if getattr(rule, "converts", False) and rule.routes(target) else rule
    if isinstance(plain, Gradient) and kind != "activation":
        # the exact gradient in both passes: the op made contiguous, maybe recorded
        if kind in _RECORDED:
            pos, name = plan.positions[n.name][0], n.name

            def recorded(S, *a, **k):
                out = _contiguous(target(*a, **k))
                if S.record:
                    S.layers[name] = (a[pos], out)
                return out
            return Call(recorded, (STATE, *args), kwargs)
        if isinstance(n.meta.get("val"), torch.Tensor):  # one tensor out

            def gradient(*a, **k):
                out = target(*a, **k)
                return out if out.is_contiguous() else out.contiguous()
            return Call(gradient, args, kwargs)
        return Call(_contiguous_of(target), args, kwargs)
    fold = None
    if n.name in plan.fold:  # the batch norm folded into this layer
        bn = nodes[plan.fold[n.name]]
        fold = [*bn.args[1:5], bn.args[6]]

    def kernel(S, fold, *a, **k):
        return S.planned(n, kind, rule, fold, a, k)
    return Call(kernel, (STATE, fold, *args), kwargs)


class _Pass:
    """Runs the captured graph, applying the rules at planned nodes, through the code
    generated for the plan (:func:`_generated`); parameters and buffers are read from the
    live model. The pass object is the generated code's per-call state.

    ``reference=None``: the baseline pass (plain forward; remembers the inputs and output
    of the nodes whose rule needs them). Otherwise the main pass, with the rules' backward.
    ``compute``: the dtype half-precision values are widened to (the module docstring's
    ``upcast``), None to run in the model's own dtypes.
    """

    def __init__(self, model, plan: Plan, rules: RuleSet, reference: dict | None,
                 record: bool, compute: torch.dtype | None = None):
        self.module = model
        self.plan, self.rules, self.reference, self.record = plan, rules, reference, record
        self.compute = compute
        self.saved: dict = {}     # node -> (inputs, output) [baseline pass]
        self.acts: dict = {}      # activation node -> (output, multiplier) [main pass]
        self.layers: dict = {}    # weighted/norm node -> (input, output)
        self.act_fns: dict = {}   # activation node -> (callable, label)

    def run(self, x):
        plan, compute = self.plan, self.compute
        inputs = plan.__dict__.get("inputs")
        if inputs is None:  # the placeholders' names, and their reader (once per plan)
            inputs = plan.__dict__["inputs"] = (
                [n.name for n in plan.graph.nodes if n.op == "placeholder"],
                lifted_reader(plan.core))
        names, read = inputs
        lifted = read(self.module)
        out = _generated(plan, self.rules, compute)(
            self, [_widen(lifted[p], compute) if p in lifted else x for p in names])
        if isinstance(out, (tuple, list)) and len(out) == 1:
            out = out[0]  # the capture's output is a tuple
        report_rows(self.module, x)  # a plan never calls the model's forward hooks
        return out

    def discrete(self, n: fx.Node, out):
        """DeepLIFT's rules hold one selection fixed: an input-dependent mask, index or
        detached value must be the same at the input and at the baseline."""
        if self.reference is None:
            self.saved[n.name] = out
            return
        ref = self.reference.get(n.name)
        if isinstance(out, torch.Tensor) and isinstance(ref, torch.Tensor) and \
                out.shape == ref.shape and not torch.equal(out, ref):
            raise ValueError(
                f"{op_name(n.target)} at {where(n)}: this input-dependent mask, index or "
                f"detached value "
                f"differs between the inputs and the baselines, so {self.rules.method}'s "
                "rules (one fixed selection) would not be complete; choose baselines that "
                "select the same entries")

    def planned(self, n: fx.Node, kind: str, rule, fold, args, kwargs):
        """Node ``n`` of a planned ``kind`` on its evaluated ``args``: ``rule`` applied."""
        if getattr(rule, "converts", False) and self.reference is not None:
            if rule.routes(n.target):
                rule = rule.inner
            else:  # relevance form: R_y = y * G^T [R_z / s(z)], G the inner rule's
                args = _zip_map(tuple(n.args), args, self.plan.live,
                                lambda v: scaled(v, v.detach(), v.detach()))
                kwargs = _zip_map(dict(n.kwargs), kwargs, self.plan.live,
                                  lambda v: scaled(v, v.detach(), v.detach()))
                out = self._apply(n, kind, rule.inner, args, kwargs, fold)
                z = out.detach()
                return scaled(out, z, 1 / rule.stabilize(z))
        return self._apply(n, kind, rule, args, kwargs, fold)

    def _activation(self, n: fx.Node, args, kwargs, pos):
        """The activation of a record as a torch-level callable (its module, or the
        ``torch.nn.functional``/``torch`` function of the same name), so that Taylor mode
        can expand it; the ATen operation itself otherwise."""
        module = self.plan.act_modules.get(n.name)
        if module is not None:
            return module
        name = op_name(n.target).split(".")[1] if op_name(n.target).startswith("aten.") else ""
        f = getattr(F, name, None) or getattr(torch, name, None)
        if f is not None and pos == [0]:
            rest = tuple(args[1:])
            return (lambda y: f(y, *rest, **kwargs)) if rest or kwargs else f
        return _Call(n.target, args, kwargs, pos[:1])

    def _apply(self, n: fx.Node, kind: str, rule, args, kwargs, fold):
        pos = self.plan.positions[n.name]
        ys = [args[p] for p in pos[:rule.inputs]]
        if self.reference is None or isinstance(rule, Gradient):
            out = n.target(*args, **kwargs)
            if self.reference is None and rule.needs_reference:
                self.saved[n.name] = (ys[0] if rule.inputs == 1 else ys, out)
            wrapped, m = out, None
        elif getattr(rule, "wants_node", False):
            wrapped, m = rule.apply_node(n.target, args, ys[0], self.reference.get(n.name)), None
        else:
            fn = _Call(n.target, args, kwargs, pos[:rule.inputs])
            fn.module = self.plan.modules.get(n.name)
            fn.fold = fold
            wrapped, m = rule.apply(fn, ys[0] if rule.inputs == 1 else ys,
                                    self.reference.get(n.name), n.name in self.plan.unfused)
        if isinstance(wrapped, torch.Tensor) and not wrapped.is_contiguous():
            wrapped = wrapped.contiguous()  # the graph's views assume the op's own layout
        if kind == "activation":
            self.acts[n.name] = (wrapped, m)
            self.act_fns[n.name] = (self._activation(n, args, kwargs, pos),
                                    self.plan.targets.get(n.name))
        elif kind in _RECORDED and self.record:
            self.layers[n.name] = (ys[0], wrapped)
        return wrapped


@dataclass
class Propagation:
    """What :func:`propagate` returns."""

    gradient: torch.Tensor           # modified gradient at the input, [B, ...]
    output: torch.Tensor             # explained output f(x), [B] (both float32: upcast half)
    ref_output: torch.Tensor | None  # f(x~) (rules needing the baseline run), [B]
    target: torch.Tensor | None
    records: list | None


def propagate(model: nn.Module, plan: Plan, rules: RuleSet, x: torch.Tensor,
              x_ref: torch.Tensor | None, target, records: bool = False, *,
              upcast: bool = False) -> Propagation:
    """One modified backward pass (plus a baseline forward pass where a rule needs it).
    ``upcast``: a float16/bfloat16 pass runs in float32 and returns float32 (module
    docstring; not with ``records``, whose layers run in the model's dtype)."""
    compute = accumulation_dtype(x.dtype) if upcast else x.dtype
    if compute == x.dtype:
        compute = None
    elif records:
        raise ValueError("propagate: records=True runs the model's own layers; "
                         "pass upcast=False")
    ref_pass, ref_out = None, None
    if rules.needs_reference:
        ref_pass = _Pass(model, plan, rules, None, records, compute)
        with torch.no_grad():
            ref_out = model_output(ref_pass.run, x_ref if compute is None else x_ref.to(compute),
                                   name="model (at the baselines)")
    main = _Pass(model, plan, rules, ref_pass.saved if ref_pass else {}, records, compute)
    xg = (x if compute is None else x.to(compute)).detach().requires_grad_(True)
    with torch.enable_grad():
        out = model_output(main.run, xg)
        t = resolve_target(target, out)
        f = select_output(out, t)
        ref_f = None if ref_out is None else select_output(ref_out, t)
        units = [_unit(plan, main, name) for name in plan.weighted_order] if records else []
        grads = torch.autograd.grad(f.sum(), [xg] + [u[2] for u in units], allow_unused=True)
    recs = None
    if records:
        recs = [_record(model, plan, rules, main, ref_pass, unit, up)
                for unit, up in zip(units, grads[1:])]
    grad = torch.zeros_like(xg) if grads[0] is None else grads[0]
    return Propagation(grad, f.detach(), None if ref_f is None else ref_f.detach(), t, recs)


def _unit(plan: Plan, run: _Pass, name: str):
    """``(weighted node, output node (the folded BatchNorm or itself), post, act node)``
    where ``post`` is the tensor after the activation (or the output itself)."""
    out = plan.fold.get(name, name)
    act = plan.act_of.get(out)
    post = run.acts[act][0] if act else run.layers[out][1]
    return name, out, post, act


def _record(model, plan: Plan, rules: RuleSet, run: _Pass, ref_pass: _Pass | None,
            unit, up) -> LayerRecord:
    name, out, post, act = unit
    layer = model.get_submodule(plan.targets[name])
    folded = None
    if out != name:
        folded = plan.targets[out]
        layer = fold_batchnorm(layer, model.get_submodule(folded))
    inp, pre = run.layers[name][0], run.layers[out][1].detach()
    fn, label = run.act_fns[act] if act else (None, None)
    if ref_pass is not None:
        ref_inp, ref_pre = ref_pass.layers[name][0], ref_pass.layers[out][1]
        ref_post = ref_pass.saved[act][1] if act else ref_pre
    else:
        with torch.no_grad():
            ref_inp = torch.zeros_like(inp)
            ref_pre = layer(ref_inp)
            ref_post = fn(ref_pre) if act else ref_pre
    m = None
    if act:
        m = run.acts[act][1]
    elif out in plan.unfused:  # the factor the engine applied to this output
        m = rules.linear_factor(pre.detach())
    if m is None:
        m = torch.ones_like(pre)
    return LayerRecord(
        name=plan.targets[name], layer=layer, activation=fn, activation_name=label,
        inputs=inp.detach(), ref_inputs=ref_inp.detach(), pre=pre.detach(),
        ref_pre=ref_pre.detach(), post=post.detach(), ref_post=ref_post.detach(),
        multiplier=m.detach(), upstream=torch.zeros_like(post) if up is None else up.detach(),
        rule=rules.name, epsilon=rules.epsilon, folded=folded)


class LayerwiseMethod:
    """Mixin for DeepLift, EpsilonLRP and LRP: ``self._rules``, the traced plan and the
    rows one :func:`propagate` call runs through it."""

    _rules: RuleSet

    def _get_plan(self, x: torch.Tensor) -> Plan:
        return get_plan(self.model, self._rules, x)

    def _check_plan(self) -> None:
        """At construction only the model's type: the graph is captured at the first
        call's input shape (``torch.export`` needs an example input), refusals come then."""
        if not isinstance(self.model, nn.Module):
            raise TypeError(f"model must be an nn.Module for {type(self).__name__}, "
                            f"got {type(self.model).__name__}")

    def _propagate_cost(self, rows: int):
        """The :class:`~taylorattr.runtime.cost.Cost` of :func:`propagate` on ``rows`` rows (without
        records): a row is one sample run through the plan. When a rule compares with the
        baseline (DeepLIFT's Rescale), the baselines' rows are run forward first (no
        gradient); then the inputs' rows run forward and are swept back once by the
        modified gradient (a rule's own evaluations of a layer inside that sweep, as LRP's
        z-plus, gamma or flat make, belong to the row's backward). Runs no model."""

        forward = rows * (2 if self._rules.needs_reference else 1)
        return Cost(forward_rows=forward, backward_rows=rows)
