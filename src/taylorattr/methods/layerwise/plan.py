"""Tracing a model and planning the layer-wise pass: which rule family each operation
belongs to, where epsilon factors go, and which BatchNorm folds into which layer.

``model.forward`` is traced once with ``torch.fx`` (modules declaring ``elementwise =
True`` kept whole). Every operation whose value depends on the input is matched to a
:class:`~taylorattr.methods.layerwise.rules.Family` of the method's rule set; anything
else raises :class:`UnsupportedModelError` listing each offending operation with its
source line and what to do. The engine never falls back to the plain gradient (Captum
does, silently, for nonlinearities it cannot see).

The plan also records, for the epsilon rule and for the per-layer records:

* ``fold``: a Linear/Conv whose only user is a BatchNorm of matching dimension (eval
  mode) is folded with it into one affine layer ``W' = W * gamma / sigma``,
  ``b' = (b - mu) * gamma / sigma + beta``: the layer's output carries no epsilon factor
  of its own and its record describes the folded layer (DeepLIFT is unchanged by
  folding: both are affine, propagated by their exact gradient);
* ``act_of``: the elementwise activation that is the only user of a layer's output;
* ``unfused``: layer outputs whose users are not all activations, so that the output
  carries the epsilon factor ``z / (z + eps s(z))`` itself (otherwise the activations'
  multiplier ``op(z) / (z + eps s(z))`` contains it).
"""
from __future__ import annotations

import weakref
from dataclasses import dataclass

from torch import fx, nn

from ... import _fx
from .rules import RuleSet
from .table import support_summary

__all__ = ["Plan", "UnsupportedModelError", "build_plan", "get_plan"]


class UnsupportedModelError(TypeError):
    """The model holds an operation the layer-wise rules cannot propagate through."""


_STATIC_METHODS = {"size", "dim"}  # results describe the shape, not the values
_STATIC_ATTRS = {"shape", "ndim", "dtype", "device"}
_EPSILON_KINDS = {"weighted", "norm", "avg_pool", "max_pool"}  # layers with an epsilon step
_FOLDS = {nn.Linear: nn.BatchNorm1d, nn.Conv1d: nn.BatchNorm1d, nn.Conv2d: nn.BatchNorm2d,
          nn.Conv3d: nn.BatchNorm3d}
_HINTS = {  # what to do about operations people often meet
    nn.LayerNorm: "normalises by statistics of its own input (not a fixed affine map)",
    nn.GroupNorm: "normalises by statistics of its own input (not a fixed affine map)",
    nn.Softmax: "mixes the entries it normalises (not elementwise)",
    nn.MultiheadAttention: "multiplies input-dependent tensors",
}
_WHAT_TO_DO = (
    "What to do: replace each listed operation by a supported one; give a custom "
    "elementwise activation module the class attribute `elementwise = True`; or explain "
    "the model with a method that needs no layer rules (IntegratedGradients, "
    "GradientInput, ExpectedGradients, Occlusion).")


def _signature(model: nn.Module):
    """Changes when submodules are replaced or ``forward`` is swapped (re-trace then)."""
    fwd = getattr(model.forward, "__func__", model.forward)
    return (fwd,) + tuple((name, id(m)) for name, m in model.named_modules())


@dataclass
class Plan:
    graph: fx.Graph
    signature: tuple
    kinds: dict            # node name -> family key ("weighted", "activation", ...)
    act_of: dict           # layer output node name -> its activation node (sole user)
    unfused: set           # layer output node names that carry the epsilon factor
    fold: dict             # weighted node name -> the BatchNorm node folded into it
    weighted_order: list   # weighted (Linear/Conv) node names in execution order
    targets: dict          # node name -> module path (call_module nodes)


def _trace(model: nn.Module, method: str) -> fx.Graph:
    try:
        return _fx.trace(model, method, UnsupportedModelError).graph
    except UnsupportedModelError as exc:
        raise UnsupportedModelError(f"{exc}\n{_WHAT_TO_DO}") from exc.__cause__


def _refusal(node: fx.Node, model: nn.Module, rules: RuleSet) -> str:
    if node.op == "call_module":
        hint = _HINTS.get(type(model.get_submodule(node.target)))
        if hint:
            return f"{hint}; no {rules.method} rule"
    return f"no {rules.method} rule for this operation"


def _classify(graph: fx.Graph, model: nn.Module, rules: RuleSet) -> dict:
    live: set[str] = set()      # nodes whose value depends on the input
    kinds: dict[str, str] = {}
    bad: list[str] = []
    families = rules.families
    for node in graph.nodes:
        if node.op == "placeholder":
            live.add(node.name)
            continue
        if node.op in ("get_attr", "output"):
            continue
        live_args = [a for a in _fx.node_args(node) if isinstance(a, fx.Node) and a.name in live]
        if not live_args:
            continue  # a constant of the model (e.g. a function of the parameters)
        if node.op == "call_method" and node.target in _STATIC_METHODS:
            continue
        if node.op == "call_function" and node.target is getattr \
                and node.args[1] in _STATIC_ATTRS:
            continue
        live.add(node.name)
        family = next((f for f in families if f.matches(node, model)), None)
        reason = _refusal(node, model, rules) if family is None \
            else family.problem(node, model, live_args)
        if reason:
            bad.append(f"{_fx.describe(node, model)}: {reason}")
        else:
            kinds[node.name] = family.key
    if bad:
        listing = "\n  - ".join(bad)
        raise UnsupportedModelError(
            f"{rules.method} cannot propagate through {len(bad)} operation(s) of "
            f"{type(model).__name__}:\n  - {listing}\n"
            f"Supported by {rules.method} (taylorattr.methods.layerwise."
            f"supported_operations()):\n{support_summary(rules)}\n{_WHAT_TO_DO}")
    return kinds


def build_plan(model: nn.Module, rules: RuleSet) -> Plan:
    """Trace ``model`` and classify every operation that depends on the input."""
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be an nn.Module for {rules.method}, "
                        f"got {type(model).__name__}")
    graph = _trace(model, rules.method)
    # inputs without a default (defaulted ones were fixed at their defaults while tracing)
    placeholders = [n for n in graph.nodes if n.op == "placeholder" and not n.args]
    if len(placeholders) != 1:
        raise UnsupportedModelError(
            f"{rules.method} needs a model whose forward takes exactly one tensor, "
            f"{type(model).__name__}.forward takes {len(placeholders)} arguments")
    kinds = _classify(graph, model, rules)

    def sole_act(node):
        users = list(node.users)
        if len(users) == 1 and kinds.get(users[0].name) == "activation" \
                and users[0].args[0] is node:
            return users[0]
        return None

    targets = {n.name: n.target for n in graph.nodes if n.op == "call_module"}
    fold, act_of, unfused, weighted_order = {}, {}, set(), []
    for node in graph.nodes:
        kind = kinds.get(node.name)
        if kind == "weighted":
            weighted_order.append(node.name)
            users = list(node.users)
            if len(users) == 1 and kinds.get(users[0].name) == "norm" \
                    and users[0].args[0] is node:
                bn = model.get_submodule(users[0].target)
                if type(bn) is _FOLDS.get(type(model.get_submodule(node.target))):
                    fold[node.name] = users[0].name
        if kind not in _EPSILON_KINDS:
            continue
        act = sole_act(node)
        if act is not None:
            act_of[node.name] = act.name
        users = list(node.users)
        all_acts = bool(users) and all(
            kinds.get(u.name) == "activation" and u.args[0] is node for u in users)
        if not all_acts and node.name not in fold:
            unfused.add(node.name)
    return Plan(graph, _signature(model), kinds, act_of, unfused, fold, weighted_order,
                targets)


_PLANS: weakref.WeakKeyDictionary[nn.Module, dict] = weakref.WeakKeyDictionary()


def get_plan(model: nn.Module, rules: RuleSet) -> Plan:
    """The traced plan of ``model`` under ``rules``, cached per model and re-traced when
    its submodules or its ``forward`` change (tracing costs milliseconds).
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be an nn.Module for {rules.method}, "
                        f"got {type(model).__name__}")
    plans = _PLANS.setdefault(model, {})
    plan = plans.get(rules.name)
    if plan is None or plan.signature != _signature(model):
        plan = plans[rules.name] = build_plan(model, rules)
    return plan
