"""Captum's ``LRP`` and its rule classes over the native LRP methods.

A model whose layers carry no ``rule`` (Captum's default, epsilon ``1e-9`` on every layer)
or the same :class:`EpsilonRule` everywhere is :class:`taylorattr.methods.EpsilonLRP`; the
same :class:`GammaRule` or :class:`Alpha1_Beta0_Rule` everywhere is
:class:`taylorattr.methods.LRP` with that rule. Captum's delta is ``f(x) - sum(R)``, the
opposite sign of the native ``sum(R) - f(x)``; this class returns Captum's.
"""
from __future__ import annotations

from ... import methods as native
from .._mapping import Call, GradientAttribution, not_offered

__all__ = ["LRP", "Alpha1_Beta0_Rule", "EpsilonRule", "GammaRule", "IdentityRule",
           "PropagationRule"]


class PropagationRule:
    """Captum's rule base class (set ``module.rule = EpsilonRule(...)``)."""


class EpsilonRule(PropagationRule):
    def __init__(self, epsilon: float = 1e-9) -> None:
        self.epsilon = epsilon


class GammaRule(PropagationRule):
    def __init__(self, gamma: float = 0.25, set_bias_to_zero: bool = False) -> None:
        self.gamma, self.set_bias_to_zero = gamma, set_bias_to_zero


class Alpha1_Beta0_Rule(PropagationRule):
    def __init__(self, set_bias_to_zero: bool = False) -> None:
        self.set_bias_to_zero = set_bias_to_zero


class IdentityRule(EpsilonRule):
    """Captum's identity rule (relevance passed through unchanged)."""


def _native_lrp(model):
    rules = [m.rule for m in model.modules() if getattr(m, "rule", None) is not None]
    kinds = {(type(r), getattr(r, "epsilon", None), getattr(r, "gamma", None)) for r in rules}
    if not rules:
        return native.EpsilonLRP(model, epsilon=1e-9)
    if len(kinds) > 1 or any(isinstance(r, IdentityRule) for r in rules):
        raise not_offered("LRP with different rules per layer or IdentityRule",
                          "one rule for every layer is mapped (the native LRP composites)")
    rule = rules[0]
    if type(rule) is EpsilonRule:
        return native.EpsilonLRP(model, epsilon=rule.epsilon)
    if isinstance(rule, GammaRule):
        return native.LRP(model, rule="gamma", gamma=rule.gamma)
    if isinstance(rule, Alpha1_Beta0_Rule):
        return native.LRP(model, rule="alpha1_beta0")
    raise not_offered(f"LRP with the rule {type(rule).__name__}",
                      "EpsilonRule, GammaRule and Alpha1_Beta0_Rule are mapped")


class LRP(GradientAttribution):
    """Captum's ``LRP``."""

    def __init__(self, model) -> None:
        super().__init__(model)
        self.model = model
        for name, m in model.named_modules():
            rule = getattr(m, "rule", None)
            if rule is not None and not isinstance(rule, PropagationRule):
                raise TypeError(f"the rule of module {name!r} must be a PropagationRule "
                                f"(EpsilonRule, GammaRule, ...), got {type(rule).__name__}")

    def _call(self, inputs, target=None, additional_forward_args=None,
              return_convergence_delta: bool = False, verbose: bool = False):
        return Call(_native_lrp(self.model), inputs, None, target, additional_forward_args,
                    return_convergence_delta, {}, finish=lambda delta: -delta)

    def attribute(self, inputs, target=None, additional_forward_args=None,
                  return_convergence_delta: bool = False, verbose: bool = False):
        return self._call(inputs, target, additional_forward_args, return_convergence_delta,
                          verbose).run()
