"""LRP with Zennit's rules and composites: z-plus (Deep Taylor), alpha-beta, gamma, flat,
w-square, epsilon, and per-layer composites such as epsilon-plus-flat.

Relevance starts as the explained output ``f(x)`` and flows down layer by layer; each
Linear/Conv layer ``z = L(y)`` redistributes ``R_z`` to its inputs by its rule, e.g. the
z-plus rule (Deep Taylor decomposition on ReLU networks)

    R_i = sum_j x_i w+_ji / (sum_i' x_i' w+_ji' + b+_j) R_j        (for x >= 0)

(all rules and how other operations pass relevance:
:mod:`taylorattr.methods.layerwise.relevance`). The attribution is the relevance at the
input. ``rule`` names one rule for every Linear/Conv (``"z_plus"``, ``"alpha2_beta1"``,
``"alpha1_beta0"``, ``"gamma"``, ``"flat"``, ``"w_square"``, ``"epsilon"``) or a composite
(``"epsilon_plus"``: z-plus on convolutions, epsilon on dense layers;
``"epsilon_plus_flat"``: the same with flat on the first layer; ``"epsilon_alpha2_beta1"``,
``"epsilon_alpha2_beta1_flat"``), as Zennit's composites of those names assign them
(first layer = the first Linear/Conv in module order). A BatchNorm directly after a
Linear/Conv is folded into it, as Zennit's ``SequentialMergeBatchNorm`` canonizer does
(equal to Zennit's EpsilonPlusFlat with its ResNet/VGG canonizers to 1e-13); residual
sums and means split relevance in proportion (Zennit's ``Norm``), and transformer
operations use the relevance form of epsilon-LRP's rules (:mod:`.layerwise.relevance`).

Taylor reformulation: none is registered. These rules are layer-wise like epsilon-LRP
(Thm 4 and the supplement), but z-plus, alpha-beta and gamma split each neuron's relevance
by the *signs* of its contributions and flat/w-square ignore the input values, so their
per-layer terms are not the Taylor terms of ``f`` at one reference point (Deep Taylor's
root point depends on the neuron); they do not satisfy completeness with biases either.

Precision: a float16/bfloat16 model's relevance pass runs in float32 on its own weights
and inputs (widened exactly) and the relevances are rounded once to the input dtype
(:mod:`taylorattr.methods.layerwise.engine`): the rules divide by forward sums,
``R_a = a / s(a + b) R`` at a residual sum, and the flat and w-square rules send relevance
to inputs whatever their values, so that where bfloat16 rounds ``a + b`` to zero the
stabiliser multiplies relevance by ``1e6`` (ResNet-18: relative errors 1.5e5 and 2e6);
float16 overflows there. The result equals the float32 model's with the same weights to
one rounding (``2^-8`` relative in bfloat16, ``2^-11`` in float16).
"""
from __future__ import annotations

from functools import cache
from typing import Any, Literal, overload

import torch

from .._validation import check_nonnegative_real
from ._base import Attributed, ImplicitBaselineMethod
from ._call import CONSTRUCTED, Attributions, Inputs, Target, given
from .layerwise import LayerwiseMethod, get_plan, propagate
from .layerwise.relevance import COMPOSITES, RULES, composite_rules

__all__ = ["LRP", "rule_class"]


class LRP(LayerwiseMethod, ImplicitBaselineMethod):
    """LRP with a rule or composite (Zennit's); equals Zennit's rule or composite (with its
    canonizers) on the same ReLU MLP/CNN/ResNet/VGG with relevance ``f(x)`` at the output
    (see the module docstring).

    Args:
        model: the network (any the layer-wise engine captures; see
            :func:`taylorattr.methods.layerwise.supported_operations`).
        rule: a rule or composite name (module docstring); default ``"epsilon_plus_flat"``.
        epsilon: the epsilon rule's stabiliser (Zennit's default ``1e-6``).
        stabilizer: the other rules' stabiliser (``1e-6``).
        gamma: the gamma rule's ``gamma`` (``0.25``).
        layer_rules: rules of single Linear/Conv layers over ``rule``'s choice: a dict from
            module names (as ``model.named_modules()`` gives them) to a rule name or a
            :class:`~taylorattr.methods.layerwise.relevance.LayerRule` (e.g.
            ``{"features.0": "flat", "classifier": LayerEpsilon(1e-9)}``; Captum's per-layer
            ``module.rule``).
        layer: attribute the relevance reaching this submodule's output (its input with
            ``attribute_to_layer_input=True``) instead of the input (Captum's ``LayerLRP``).
    """

    name = "lrp"
    #: the rule used when ``rule`` is not given (see :func:`rule_class`)
    default_rule = "epsilon_plus_flat"

    def __init__(self, model, rule: str | None = None, epsilon: float = 1e-6,
                 stabilizer: float = 1e-6, gamma: float = 0.25, layer_rules=None, *,
                 layer=None, attribute_to_layer_input: bool = False) -> None:
        rule = self.default_rule if rule is None else rule
        if not isinstance(rule, str) or (rule not in RULES and rule not in COMPOSITES):
            raise ValueError(f"rule must be one of {sorted(RULES) + sorted(COMPOSITES)}, "
                             f"got {rule!r}")
        for value, label in ((epsilon, "epsilon"), (stabilizer, "stabilizer"), (gamma, "gamma")):
            check_nonnegative_real(value, label)
        super().__init__(model, layer=layer, attribute_to_layer_input=attribute_to_layer_input)
        self._check_plan()
        self.rule = rule
        self._rules = composite_rules(model, rule, epsilon=float(epsilon),
                                      stabilizer=float(stabilizer), gamma=float(gamma),
                                      layer_rules=layer_rules)

    @overload
    def attribute(self, inputs: Inputs, target: Target = ..., *,
                  return_convergence_delta: Literal[False] = ..., show_progress: bool = ...,
                  strict: bool = ..., additional_forward_args: Any = ..., layer: Any = ...,
                  attribute_to_layer_input: Any = ..., layer_baselines: Any = ...,
                  layer_delta: str = ...) -> Attributions: ...

    @overload
    def attribute(self, inputs: Inputs, target: Target = ..., *,
                  return_convergence_delta: Literal[True], show_progress: bool = ...,
                  strict: bool = ..., additional_forward_args: Any = ..., layer: Any = ...,
                  attribute_to_layer_input: Any = ..., layer_baselines: Any = ...,
                  layer_delta: str = ...) -> tuple[Attributions, torch.Tensor]: ...

    def attribute(self, inputs: Inputs, target: Target = None, *,
                  return_convergence_delta: bool = False, show_progress: bool = False,
                  strict: bool = False, additional_forward_args: Any = None,
                  layer: Any = CONSTRUCTED, attribute_to_layer_input: Any = CONSTRUCTED,
                  layer_baselines: Any = None,
                  layer_delta: str = "layer") -> Attributions | tuple[Attributions, torch.Tensor]:
        """LRP: attributions shaped like ``inputs`` (with
        ``return_convergence_delta=True`` and the delta ``[B]``); its options are
        ``_attribute``'s, the shared arguments :data:`~taylorattr.methods._call.SHARED_DOC`."""
        return self.explain(**given(locals())).result()

    def _attribute(self, call, x, base, t, fx, *, show_progress=False):
        """Relevances of ``f(x)``; the convergence delta is ``sum(a) - f(x)``."""
        prop = propagate(call.model, get_plan(call.model, self._rules, x), self._rules, x, None, t,
                         False, upcast=True)
        scale = prop.output.view((-1,) + (1,) * (x.dim() - 1))
        return Attributed((prop.gradient * scale).to(x.dtype), None)

    def _cost(self, x, options):
        """One pass through the plan (:meth:`_propagate_cost`): ``B`` rows forward and swept
        back (no rule needs a baseline pass); no references (the delta needs no forward)."""
        return self._propagate_cost(x.shape[0]), 0


@cache
def rule_class(rule: str) -> type[LRP]:
    """The :class:`LRP` subclass whose default rule is ``rule`` (one registry row per rule:
    ``METHODS["lrp_z_plus"](model, x)`` uses the z-plus rule)."""
    if rule not in RULES and rule not in COMPOSITES:
        raise ValueError(f"rule must be one of {sorted(RULES) + sorted(COMPOSITES)}, got {rule!r}")
    return type(f"LRP_{rule}", (LRP,), {"default_rule": rule, "name": f"lrp_{rule}",
                                        "__doc__": f"LRP with the {rule!r} rule by default.",
                                        "__module__": __name__})
