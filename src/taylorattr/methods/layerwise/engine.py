"""The modified-gradient engine: runs a :class:`~.plan.Plan` with a rule set.

One pass computes ``g``, the gradient of the explained output ``f`` with every planned
operation's backward replaced by its rule (:mod:`.rules`)::

    g_y = rule(op)^T g_z   for z = op(y),   attribution  (x - x~) * g_x  (DeepLIFT)
                                                          x * g_x        (epsilon-LRP)

Rules that compare with the baseline (DeepLIFT's Rescale and max-pool rules) read
``(y~, op(y~))`` from a plain forward pass at the baseline run first. With
``records=True`` the pass also returns one :class:`~.records.LayerRecord` per weighted
layer.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import fx, nn

from ..._validation import model_output, resolve_target, select_output
from ...runtime.progress import report_rows
from .plan import Plan, get_plan
from .records import LayerRecord, fold_batchnorm
from .rules import RuleSet

__all__ = ["LayerwiseMethod", "Propagation", "propagate"]

_RECORDED = {"weighted", "norm"}


def _callable(interp: fx.Interpreter, node: fx.Node, args, kwargs):
    """``y -> op(y, *other args)`` for a single-input node, and a label for it; in-place
    operations work on a copy (the rules evaluate ``op`` more than once)."""
    rest = args[1:]
    if node.op == "call_module":
        m = interp.fetch_attr(node.target)
        inplace = getattr(m, "inplace", False) is True
        fn, label = m, node.target
    elif node.op == "call_function":
        inplace = kwargs.get("inplace") is True or any(r is True for r in rest)
        f = node.target
        fn = (lambda y: f(y, *rest, **kwargs)) if (rest or kwargs) else f
        label = getattr(node.target, "__name__", str(node.target))
    else:
        meth = getattr(torch.Tensor, node.target)
        inplace = node.target.endswith("_")
        fn = lambda y: meth(y, *rest, **kwargs)
        label = f"Tensor.{node.target}"
    if inplace:
        inner = fn
        fn = lambda y: inner(y.clone())
    return fn, label


class _Pass(fx.Interpreter):
    """Runs the traced graph on the live model, applying the rules at planned nodes.

    ``reference=None``: the baseline pass (plain forward; remembers ``(y, op(y))`` of the
    nodes whose rule needs it). Otherwise the main pass, with the rules' backward.
    """

    def __init__(self, model, plan: Plan, rules: RuleSet, reference: dict | None,
                 record: bool):
        super().__init__(model, garbage_collect_values=True, graph=plan.graph)
        self.plan, self.rules, self.reference, self.record = plan, rules, reference, record
        self.saved: dict = {}     # node -> (y, op(y)) [baseline pass]
        self.acts: dict = {}      # activation node -> (output, multiplier) [main pass]
        self.layers: dict = {}    # weighted/norm node -> (input, output)
        self.act_fns: dict = {}   # activation node -> (callable, label)

    def run(self, *args, **kwargs):
        out = super().run(*args, **kwargs)
        report_rows(self.module, args[0])  # a plan never calls the model's forward hooks
        return out

    def run_node(self, n: fx.Node):
        kind = self.plan.kinds.get(n.name)
        if kind is None:
            return super().run_node(n)
        family, rule = self.rules.family(kind), self.rules.rules[kind]
        with self._set_current_node(n):
            args, kwargs = self.fetch_args_kwargs_from_env(n)
            if family.eval_only and self.fetch_attr(n.target).training:
                raise ValueError(
                    f"model: {type(self.fetch_attr(n.target)).__name__} module '{n.target}' "
                    "is in training mode; call model.eval() before attributing")
            if not family.single_input:
                return getattr(self, n.op)(n.target, args, kwargs)
            y = args[0]
            fn, label = _callable(self, n, args, kwargs)
            if self.reference is None:
                out = fn(y)
                if rule.needs_reference:
                    self.saved[n.name] = (y, out)
                wrapped, m = out, None
            else:
                wrapped, m = rule.apply(fn, y, self.reference.get(n.name),
                                        n.name in self.plan.unfused)
            if kind == "activation":
                self.acts[n.name] = (wrapped, m)
                self.act_fns[n.name] = (fn, label)
            elif kind in _RECORDED and self.record:
                self.layers[n.name] = (y, wrapped)
            return wrapped


@dataclass
class Propagation:
    """What :func:`propagate` returns."""

    gradient: torch.Tensor           # modified gradient at the input, [B, ...]
    output: torch.Tensor             # explained output f(x), [B]
    ref_output: torch.Tensor | None  # f(x~) (rules needing the baseline run), [B]
    target: torch.Tensor | None
    records: list | None


def propagate(model: nn.Module, plan: Plan, rules: RuleSet, x: torch.Tensor,
              x_ref: torch.Tensor | None, target, records: bool = False) -> Propagation:
    """One modified backward pass (plus a baseline forward pass where a rule needs it)."""
    ref_pass, ref_out = None, None
    if rules.needs_reference:
        ref_pass = _Pass(model, plan, rules, None, records)
        with torch.no_grad():
            ref_out = model_output(ref_pass.run, x_ref, name="model (at the baselines)")
    main = _Pass(model, plan, rules, ref_pass.saved if ref_pass else {}, records)
    xg = x.detach().requires_grad_(True)
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
    grad = torch.zeros_like(x) if grads[0] is None else grads[0]
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

    def _get_plan(self) -> Plan:
        return get_plan(self.model, self._rules)

    def _propagate_cost(self, rows: int):
        """The :class:`~taylorattr.runtime.cost.Cost` of :func:`propagate` on ``rows`` rows (without
        records): a row is one sample run through the plan. When a rule compares with the
        baseline (DeepLIFT's Rescale), the baselines' rows are run forward first (no
        gradient); then the inputs' rows run forward and are swept back once by the
        modified gradient (a rule's own evaluations of a layer inside that sweep, as LRP's
        z-plus, gamma or flat make, belong to the row's backward). Runs no model."""
        from ...runtime.cost import Cost

        forward = rows * (2 if self._rules.needs_reference else 1)
        return Cost(forward_rows=forward, backward_rows=rows)
