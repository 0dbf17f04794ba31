"""Captum's ``LRP`` and its rule classes over the native LRP methods.

A model whose layers carry no ``rule`` (Captum's default, epsilon ``1e-9`` on every layer)
or the same :class:`EpsilonRule` everywhere is :class:`taylorattr.methods.EpsilonLRP`;
any other choice is :class:`taylorattr.methods.LRP` with one native rule per Linear/Conv
layer (``layer_rules``): Captum's rules are the epsilon rule with modified weights
(gamma: ``W + gamma W+``; alpha-1-beta-0: ``W+``; the bias kept or zeroed), the identity
rule passes relevance unchanged. Captum's own rule objects (``captum.attr._utils.lrp_rules``)
are read as these, with their parameters. Captum's delta is ``f(x) - sum(R)``, the
opposite sign of the native ``sum(R) - f(x)``; this class returns Captum's.
"""
from __future__ import annotations

from torch import nn

from ... import methods as native
from ...methods.layerwise.relevance import Identity, LayerEpsilon
from .._mapping import Call, GradientAttribution, LayerAttribution, for_layers, not_offered

__all__ = ["LRP", "Alpha1_Beta0_Rule", "EpsilonRule", "GammaRule", "IdentityRule", "LayerLRP",
           "PropagationRule"]


class PropagationRule:
    """Captum's rule base class (set ``module.rule = EpsilonRule(...)``)."""

    def layer_rule(self):  # pragma: no cover - every rule below defines it
        raise NotImplementedError


def _zero(b):
    return b * 0


class EpsilonRule(PropagationRule):
    def __init__(self, epsilon: float = 1e-9) -> None:
        self.epsilon = epsilon

    def layer_rule(self):
        return LayerEpsilon(self.epsilon)


class GammaRule(PropagationRule):
    def __init__(self, gamma: float = 0.25, set_bias_to_zero: bool = False) -> None:
        self.gamma, self.set_bias_to_zero = gamma, set_bias_to_zero

    def layer_rule(self):
        g = self.gamma
        return LayerEpsilon(_STABILITY, weight=lambda w: w + g * w.clamp(min=0),
                            bias=_zero if self.set_bias_to_zero else None,
                            label=f"Captum's gamma (gamma={g:g})")


class Alpha1_Beta0_Rule(PropagationRule):
    def __init__(self, set_bias_to_zero: bool = False) -> None:
        self.set_bias_to_zero = set_bias_to_zero

    def layer_rule(self):
        return LayerEpsilon(_STABILITY, weight=lambda w: w.clamp(min=0),
                            bias=_zero if self.set_bias_to_zero else None,
                            label="Captum's alpha-1-beta-0")


class IdentityRule(EpsilonRule):
    """Captum's identity rule (relevance passed through unchanged)."""

    def layer_rule(self):
        return Identity()


#: Captum's stabiliser of the rules without an epsilon of their own
_STABILITY = 1e-9
_WEIGHTED = (nn.Linear, nn.Conv1d, nn.Conv2d, nn.Conv3d)

#: Captum's own rule classes (``captum.attr._utils.lrp_rules``) as this module's, with their
#: parameters (Captum's epsilon is its ``STABILITY_FACTOR``)
_CAPTUM_RULES = "captum.attr._utils.lrp_rules"
_FROM_CAPTUM = {
    "EpsilonRule": lambda r: EpsilonRule(r.STABILITY_FACTOR),
    "IdentityRule": lambda r: IdentityRule(r.STABILITY_FACTOR),
    "GammaRule": lambda r: GammaRule(r.gamma, r.set_bias_to_zero),
    "Alpha1_Beta0_Rule": lambda r: Alpha1_Beta0_Rule(r.set_bias_to_zero),
}


def _rule_of(module: nn.Module, name: str):
    """``module.rule`` as a rule of this module: None (no rule), one of ours as it is, or one
    of Captum's own rule objects (set by the user, or left on the layers by a Captum ``LRP``
    call that raised before removing the rules it attached) mapped to ours with its
    parameters. Anything else, a subclass of Captum's rules included (what it changes would
    be lost), is refused naming the module and what to set."""
    rule = getattr(module, "rule", None)
    if rule is None or isinstance(rule, PropagationRule):
        return rule
    kind = type(rule)
    if kind.__module__ == _CAPTUM_RULES and kind.__name__ in _FROM_CAPTUM:
        return _FROM_CAPTUM[kind.__name__](rule)
    raise TypeError(f"the rule of module {name!r} must be a PropagationRule of "
                    f"taylorattr.captum.attr or Captum's own {', '.join(_FROM_CAPTUM)} "
                    f"(their exact classes), got {kind.__module__}.{kind.__qualname__}; set "
                    f"one of those (or `del module.rule` for the default EpsilonRule)")


def _native_lrp(model, layer=None, to_input: bool = False):
    """The native LRP of Captum's rules: each Linear/Conv's ``rule`` (Captum's default
    ``EpsilonRule()`` where none is set) as the native per-layer rule. On other modules the
    native LRP's own treatment is Captum's epsilon rule (sums and average pools split in
    proportion, max pools to the winner) or identity (activations, batch norm), so those
    two rules are taken there and the others refused."""
    layer_rules, uniform = {}, set()
    for name, m in model.named_modules():
        rule = _rule_of(m, name)
        if isinstance(m, _WEIGHTED):
            rule = rule or EpsilonRule()
            layer_rules[name] = rule.layer_rule()
            uniform.add((type(rule), getattr(rule, "epsilon", None)))
        elif rule is not None and not isinstance(rule, EpsilonRule):
            raise not_offered(f"{type(rule).__name__} on the {type(m).__name__} module "
                              f"{name!r}", "rules other than EpsilonRule and IdentityRule "
                              "are set on Linear/Conv layers")
    if len(uniform) <= 1 and all(t is EpsilonRule for t, _ in uniform):
        eps = next(iter(uniform))[1] if uniform else _STABILITY
        return native.EpsilonLRP(model, epsilon=eps, layer=layer,  # the gradient form
                                 attribute_to_layer_input=to_input)
    return native.LRP(model, rule="epsilon", epsilon=_STABILITY, layer_rules=layer_rules,
                      layer=layer, attribute_to_layer_input=to_input)


class LRP(GradientAttribution):
    """Captum's ``LRP``."""

    def __init__(self, model) -> None:
        super().__init__(model)
        self.model = model
        for name, m in model.named_modules():
            _rule_of(m, name)  # refuses a rule it cannot read

    def _call(self, inputs, target=None, additional_forward_args=None,
              return_convergence_delta: bool = False, verbose: bool = False):
        return Call(_native_lrp(self.model), inputs, None, target, additional_forward_args,
                    return_convergence_delta, {}, finish=lambda delta: -delta)

    def attribute(self, inputs, target=None, additional_forward_args=None,
                  return_convergence_delta: bool = False, verbose: bool = False):
        return self._call(inputs, target, additional_forward_args, return_convergence_delta,
                          verbose).run()


class LayerLRP(LayerAttribution, LRP):
    """Captum's ``LayerLRP``: the relevance reaching ``layer``'s output (its input with
    ``attribute_to_layer_input=True``) under the same rules; a list of layers gives a list
    of relevances (and of deltas, ``f(x) - sum(R)`` at each layer)."""

    def __init__(self, model, layer, device_ids=None) -> None:
        LRP.__init__(self, model)
        self.layer, self.device_ids = layer, device_ids

    def attribute(self, inputs, target=None, additional_forward_args=None,
                  return_convergence_delta: bool = False, attribute_to_layer_input: bool = False,
                  verbose: bool = False):
        def one(layer):
            return Call(_native_lrp(self.model, layer, attribute_to_layer_input), inputs, None,
                        target, additional_forward_args, return_convergence_delta, {},
                        finish=lambda delta: -delta).run()

        return for_layers(self.layer, one, return_convergence_delta)
