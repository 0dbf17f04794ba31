"""Planning the layer-wise pass over a captured graph (:mod:`.graph`): the kind of each
operation (:mod:`.ops`), where epsilon factors go, which batch norm folds into which
layer.

Every operation whose value depends on the input is given a kind; a kind the method has
no rule for, or an operation no kind covers, goes into one short
:class:`UnsupportedModelError`: the distinct operations with their count and one source
location each, then what to do. The engine never falls back to the plain gradient
(Captum does, silently, for nonlinearities it cannot see).

The plan also records, for the epsilon rule and for the per-layer records:

* ``fold``: a convolution/linear node whose only user is an eval-mode batch norm is
  folded with it into one affine layer (the layer's output carries no epsilon factor);
* ``act_of``: the elementwise activation that is the only user of a layer's output;
* ``unfused``: layer outputs whose users are not all activations, so that the output
  carries the epsilon factor ``z / (z + eps s(z))`` itself (otherwise the activations'
  multiplier ``op(z) / (z + eps s(z))`` contains it);
* ``discrete``: input-dependent values that carry no relevance (``where``'s condition,
  indices, ``detach``-ed values): DeepLIFT holds them fixed, so it checks that they agree
  at the input and the baseline.
"""
from __future__ import annotations

import weakref
from collections import Counter
from dataclasses import dataclass, field

import torch
from torch import fx, nn

from ...capture import CoreGraph, where
from .fusion import fuse_elementwise
from .graph import cached_capture, module_path, op_name
from .ops import classify, live_positions
from .rules import RuleSet
from .table import support_summary

__all__ = ["Plan", "UnsupportedModelError", "build_plan", "get_plan"]


class UnsupportedModelError(TypeError):
    """The model holds an operation the layer-wise rules cannot propagate through."""


_EPSILON_KINDS = {"weighted", "norm", "avg_pool", "max_pool"}  # layers with an epsilon step
_LAYERS = (nn.Linear, nn.Conv1d, nn.Conv2d, nn.Conv3d)
_PLAIN_FORWARDS = tuple(t.forward for t in _LAYERS)
_WHAT_TO_DO = (
    "What to do: replace the listed operations by supported ones (the table below), or "
    "explain the model with a method that needs no layer rules (IntegratedGradients, "
    "GradientInput, ExpectedGradients, Occlusion).")


def _signature(model: nn.Module):
    """Changes when submodules are replaced, ``forward`` is swapped or a module changes
    between training and eval mode (capture again then)."""
    fwd = getattr(model.forward, "__func__", model.forward)
    return (fwd,) + tuple((name, id(m), m.training) for name, m in model.named_modules())


@dataclass
class Plan:
    graph: fx.Graph
    signature: tuple
    kinds: dict            # node name -> kind ("weighted", "activation", ...)
    positions: dict        # node name -> top-level indices of its input-dependent args
    act_of: dict           # layer output node name -> its activation node (sole user)
    unfused: set           # layer output node names that carry the epsilon factor
    fold: dict             # weighted node name -> the batch norm node folded into it
    weighted_order: list   # weighted nodes of Linear/Conv modules, in execution order
    targets: dict          # node name -> module path (weighted, norm, activation nodes)
    core: CoreGraph = None
    discrete: set = field(default_factory=set)
    live: set = field(default_factory=set)      # input-dependent node names
    modules: dict = field(default_factory=dict)  # weighted node -> enclosing Linear/Conv
    act_modules: dict = field(default_factory=dict)  # activation node -> its module


def _refusal(bad: list, rules: RuleSet, model: nn.Module) -> UnsupportedModelError:
    counts = Counter(op for op, _ in bad)
    first = {}
    for op, at in bad:
        first.setdefault(op, at)
    lines = [f"  - {op} (x{n}), first at {first[op]}" for op, n in counts.items()]
    return UnsupportedModelError(
        f"{rules.method} cannot propagate through {len(counts)} kind(s) of operation of "
        f"{type(model).__name__} ({sum(counts.values())} occurrence(s)):\n" + "\n".join(lines)
        + f"\n{_WHAT_TO_DO}\nSupported by {rules.method} (taylorattr.methods.layerwise."
        f"supported_operations()):\n{support_summary(rules)}")


_EVAL_ONLY = (nn.modules.batchnorm._BatchNorm, nn.Dropout, nn.Dropout1d, nn.Dropout2d,
              nn.Dropout3d, nn.AlphaDropout)


def _check_eval(model: nn.Module) -> None:
    for path, m in model.named_modules():
        if isinstance(m, _EVAL_ONLY) and m.training and (
                not isinstance(m, nn.modules.batchnorm._BatchNorm) or m.track_running_stats):
            raise ValueError(f"model: {type(m).__name__} module '{path}' is in training mode; "
                             "call model.eval() before attributing")


def _describe(node: fx.Node, reason: str) -> tuple[str, str]:
    return f"{op_name(node.target)}: {reason}", where(node)


def build_plan(model: nn.Module, rules: RuleSet, x: torch.Tensor) -> Plan:
    """Capture ``model`` at ``x`` and classify every operation that depends on the input."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be an nn.Module for {rules.method}, "
                        f"got {type(model).__name__}")
    _check_eval(model)
    signature = _signature(model)
    captured = cached_capture(model, x, signature, UnsupportedModelError)
    graph = captured.module.graph
    if len(captured.inputs) != 1:
        raise UnsupportedModelError(
            f"{rules.method} needs a model whose forward takes exactly one tensor, "
            f"{type(model).__name__}.forward takes {len(captured.inputs)} arguments")
    fuse_elementwise(captured.module, captured.inputs[0].name)  # one rule per activation
    live = {captured.inputs[0].name}
    kinds, positions, discrete, bad = {}, {}, set(), []
    for node in graph.nodes:
        kind, reason = classify(node, live)
        if kind is None and reason is None:
            deps: list = []
            fx.node.map_arg((node.args, node.kwargs), deps.append)
            val = node.meta.get("val")
            if node.op == "call_function" and any(d.name in live for d in deps) and \
                    isinstance(val, torch.Tensor):
                discrete.add(node.name)  # an input-dependent mask or index, a detached value
            continue
        live.add(node.name)
        rule = rules.rules.get(kind) if kind else None
        if kind and rule is None:
            reason = f"no {rules.method} rule for {rules.family(kind).title}"
        elif rule is not None:
            reason = rule.refuses(node.target)
        if reason:
            bad.append(_describe(node, reason))
            continue
        kinds[node.name] = kind
        positions[node.name] = live_positions(node, live)[0]
    plan = _finish(Plan(graph, signature, kinds, positions, {}, set(), {}, [], {},
                        captured, discrete, live), model)
    if bad:
        raise _refusal(bad, rules, model)
    return plan


def _finish(plan: Plan, model: nn.Module) -> Plan:
    kinds, graph = plan.kinds, plan.graph
    modules = dict(model.named_modules())

    def module_of(node, types):
        path = module_path(node)[0]
        m = modules.get(path)
        return path if isinstance(m, types) else None

    def is_act_of(user, node):
        return kinds.get(user.name) == "activation" and plan.positions[user.name] == [0] \
            and user.args[0] is node

    for node in graph.nodes:
        kind = kinds.get(node.name)
        if kind == "weighted":
            path = module_of(node, _LAYERS)
            if path is not None:
                plan.modules[node.name] = modules[path]
                if type(modules[path]).forward not in _PLAIN_FORWARDS:
                    path = None  # e.g. a Conv2d that pads first: no record of the module
            if path is not None:
                plan.weighted_order.append(node.name)
                plan.targets[node.name] = path
            users = list(node.users)
            if len(users) == 1 and kinds.get(users[0].name) == "norm" \
                    and users[0].args[0] is node:
                bn = module_of(users[0], nn.modules.batchnorm._BatchNorm)
                if bn is not None and path is not None:
                    plan.fold[node.name] = users[0].name
                    plan.targets[users[0].name] = bn
        elif kind == "activation":
            path = module_path(node)[0]
            plan.targets[node.name] = path or op_name(node.target)
            m = modules.get(path) if path else None
            if m is not None and (getattr(m, "elementwise", False) is True
                                  or type(m).__module__ == "torch.nn.modules.activation"):
                plan.act_modules[node.name] = m
        if kind not in _EPSILON_KINDS:
            continue
        users = list(node.users)
        if len(users) == 1 and is_act_of(users[0], node):
            plan.act_of[node.name] = users[0].name
        all_acts = bool(users) and all(is_act_of(u, node) for u in users)
        if not all_acts and node.name not in plan.fold:
            plan.unfused.add(node.name)
    return plan


_PLANS: weakref.WeakKeyDictionary[nn.Module, dict] = weakref.WeakKeyDictionary()


def get_plan(model: nn.Module, rules: RuleSet, x: torch.Tensor) -> Plan:
    """The plan of ``model`` under ``rules`` for inputs like ``x``: one per capture
    (:func:`~.graph.cached_capture`: one for every batch size and sequence length the
    model lets export keep dynamic), planned again when its submodules, its ``forward`` or
    a module's training flag change (capturing costs about a second)."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be an nn.Module for {rules.method}, "
                        f"got {type(model).__name__}")
    _check_eval(model)
    signature = _signature(model)
    core = cached_capture(model, x, signature, UnsupportedModelError)
    plans = _PLANS.setdefault(model, {})
    key = (rules.name, id(rules), id(core))
    plan = plans.get(key)
    if plan is None or plan.signature != signature or plan.core is not core:
        plan = plans[key] = build_plan(model, rules, x)
    return plan
