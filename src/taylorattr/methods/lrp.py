"""epsilon-LRP (Bach et al. 2015), in its gradient form.

Relevance starts as the explained output ``f(x)`` and flows down; a Linear/Conv/
BatchNorm/pooling layer with inputs ``x_i`` and outputs ``y_j = sum_i z_ji + b_j`` sends

    R_i = sum_j z_ji / (y_j + eps * s(y_j)) * R_j,   z_ji = w_ji x_i,  s(v) = 1 if v >= 0 else -1

(max pooling: all of ``R_j`` to the arg-max, winner-take-all; an eval-mode BatchNorm
directly after a Linear/Conv is folded into it), a sum ``y = a + b`` splits relevance
in proportion, ``R_a = a / (y + eps s(y)) R_y``, and relevance passes elementwise
activations unchanged. The attribution is ``R`` at the input. Equivalently
``a = x * g`` with ``g`` the modified gradient of :mod:`taylorattr.methods.layerwise`
(:func:`~taylorattr.methods.layerwise.epsilon_rule`). On bias-free ReLU networks this
is Gradient*Input (up to ``eps``); in general ``sum(a) != f(x)`` because biases absorb
relevance.

Precision: for float16/bfloat16 models the pass runs in float32 and ``x * g`` is rounded
once to the input dtype (:mod:`taylorattr.methods.layerwise.engine`): ``z / (z + eps
s(z))`` needs the forward ``z`` to more digits than bfloat16 keeps (relative errors 0.17
on a bfloat16 ResNet-18 otherwise), and float16 cannot hold ``eps = 1e-9``, so that
``z = 0`` gave 0/0.
"""
from __future__ import annotations

from typing import Any, Literal, overload

import torch

from .._validation import check_inputs, check_nonnegative_real
from ._base import Attributed, ImplicitBaselineMethod
from ._call import CONSTRUCTED, Attributions, Inputs, Target, given
from .layerwise import LayerRecord, LayerwiseMethod, epsilon_rule, get_plan, propagate

__all__ = ["EpsilonLRP"]


class EpsilonLRP(LayerwiseMethod, ImplicitBaselineMethod):
    """epsilon-LRP with the same ``epsilon`` on every layer: one forward, one backward.

    Equals Captum's ``LRP`` with its default ``EpsilonRule`` on Linear, Conv2d,
    BatchNorm2d, max- and average-pooling layers (Captum only knows ReLU/Tanh/Dropout as
    activations; relevance passes every supported activation unchanged here), except at
    residual sums, where Captum passes the whole relevance of ``a + b`` to both summands
    and this class splits it in proportion. Captum puts a separate epsilon step on a
    BatchNorm's input, this class folds the BatchNorm into the layer before: the two
    differ by ``O(eps)``. On transformers it applies AttnLRP's rules (uniform rule on
    products and attention matmuls, softmax by its gradient, LayerNorm with the standard
    deviation held constant) and equals lxt's. Unsupported operations raise
    :class:`~taylorattr.methods.layerwise.UnsupportedModelError` at the first call; see
    :func:`taylorattr.methods.layerwise.supported_operations`.
    """

    name = "epsilon_lrp"

    def __init__(self, model, epsilon: float = 1e-9, *, layer=None,
                 attribute_to_layer_input: bool = False) -> None:
        check_nonnegative_real(epsilon, "epsilon")
        super().__init__(model, layer=layer, attribute_to_layer_input=attribute_to_layer_input)
        self.epsilon = float(epsilon)
        self._rules = epsilon_rule(self.epsilon)
        self._check_plan()

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
        """EpsilonLRP: attributions shaped like ``inputs`` (with
        ``return_convergence_delta=True`` and the delta ``[B]``); its options are
        ``_attribute``'s, the shared arguments :data:`~taylorattr.methods._call.SHARED_DOC`."""
        return self.explain(**given(locals())).result()

    def _attribute(self, call, x, base, t, fx, *, show_progress=False):
        """Relevances of ``f(x)`` itself. The convergence delta is ``sum(a) - f(x)`` (not zero
        with biases): the sign of the other methods here (attributions minus the explained
        change), the *opposite* of Captum's ``LRP.compute_convergence_delta``, which returns
        ``f(x) - sum(a)`` for LRP (while its DeepLift and IntegratedGradients return
        ``sum(a) - (f(x) - f(x~))`` like this library)."""
        prop = propagate(call.model, get_plan(call.model, self._rules, x), self._rules, x, None, t,
                         False, upcast=True)
        return Attributed((x * prop.gradient).to(x.dtype), None)

    def _cost(self, x, options):
        """One pass through the plan (:meth:`_propagate_cost`): ``B`` rows forward and swept
        back (no baseline pass); no references (the delta needs no extra forward)."""
        return self._propagate_cost(x.shape[0]), 0

    def layer_records(self, inputs: torch.Tensor, target=None) -> list[LayerRecord]:
        """One :class:`~taylorattr.methods.layerwise.LayerRecord` per Linear/Conv layer
        with the zero baseline of the paper's supplement (``x~^(l) = 0``, ``y~ = b``);
        see :func:`~taylorattr.methods.layerwise.local_relevance`.
        """
        x = check_inputs(inputs).detach()
        return propagate(self.model, get_plan(self.model, self._rules, x), self._rules, x, None, target,
                         True).records
