"""DeepLIFT with the Rescale rule (Shrikumar et al. 2017), in its gradient form.

    a_i = (x_i - x~_i) * m_i,   m = modified gradient of f, each nonlinearity's local
                                derivative replaced by (sigma(y) - sigma(y~)) / (y - y~)

Max pooling follows Captum's rule (multiplier of the pool input: the output change
routed to the arg-max at ``x`` and at ``x~``, over ``x - x~``). Complete by construction:
``sum_i a_i = f(x) - f(x~)``. Layer-wise, neuron ``j`` of layer ``l`` sends ``a_ij = (z_ji - z~_ji) / (y_j - y~_j) * (x_j^(l+1) - x~_j^(l+1))`` to input
``i`` (paper Thm 4); see :meth:`DeepLift.layer_records` and
:mod:`taylorattr.methods.layerwise` for what is supported and for the per-layer terms.

Precision: for float16/bfloat16 models the pass runs in float32 on the model's own
(half-precision) weights and inputs, widened exactly (``propagate(upcast=True)``,
:mod:`taylorattr.methods.layerwise.engine`), and the attributions are rounded once to the
input dtype. Rescale divides ``(sigma(y) - sigma(y~)) / (y - y~)``, and in half precision
``y - y~`` and the residual sums lose their digits (bfloat16 ResNet-18: 1.1e-1 relative to
float64 on the same weights; float16's pass gave non-finite attributions). The completeness check and the convergence delta are judged at the float32 values
before that rounding,

    delta = sum_i a32_i - (f32(x) - f32(x~)),   tolerance of float32,

``f32`` the pass's own float32 forward of the half weights: the rules are exact to float32
rounding there, whereas the half model's own ``f(x)`` differs from ``f32(x)`` by its
half-precision forward rounding, against which half precision's tolerance
(``1000 eps = 7.8 max(1, |f|)`` in bfloat16) would pass any attributions. The delta is
returned rounded to the input dtype.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Any, Literal, overload

import torch

from .._validation import broadcast_baselines, check_bool, check_inputs
from ..runtime.completeness import downcasts
from ._base import Attributed, AttributionMethod
from ._call import CONSTRUCTED, Attributions, Baselines, Inputs, Target, given
from .layerwise import DEEPLIFT_RESCALE, LayerRecord, LayerwiseMethod, get_plan, propagate

__all__ = ["DeepLift"]


class DeepLift(LayerwiseMethod, AttributionMethod):
    """DeepLIFT (Rescale): one baseline forward, one forward and one backward pass.

    Runs on the model's captured graph of core ATen operations with one rule per kind of
    operation (:mod:`taylorattr.methods.layerwise`): Rescale on elementwise
    nonlinearities, the exact two-player Shapley split on products of two input-dependent
    tensors (gates, attention), softmax and LayerNorm/GroupNorm composed of those rules,
    Captum's max-pool rule; complete to rounding on CNNs and transformers alike. Equals
    Captum's ``DeepLift`` (``multiply_by_inputs=True``, ``eps=1e-10``) on the models
    Captum handles correctly (ReLU CNNs with BatchNorm, pooling, concatenation, residual
    sums). The graph is captured at the first call (``torch.export`` needs an input);
    an operation without a rule raises
    :class:`~taylorattr.methods.layerwise.UnsupportedModelError` then, where Captum would
    silently use the plain gradient. The supported operations:
    :func:`taylorattr.methods.layerwise.supported_operations`.
    """

    name = "deeplift"
    traits = replace(AttributionMethod.traits, complete=True, incomplete_cause=(
        "an operation whose rule is not exact to rounding here (please "
        "report the model), or a wrong gradient from torch's reverse mode "
        "(seen at batch 1 on timm levit_128s: tests/test_upstream_bugs.py)"))

    _rules = DEEPLIFT_RESCALE

    def __init__(self, model, *, layer=None, attribute_to_layer_input: bool = False) -> None:
        super().__init__(model, layer=layer, attribute_to_layer_input=attribute_to_layer_input)
        self._check_plan()

    @overload
    def attribute(self, inputs: Inputs, baselines: Baselines = ..., target: Target = ..., *,
                  multiply_by_inputs: bool = ...,
                  return_convergence_delta: Literal[False] = ..., show_progress: bool = ...,
                  strict: bool = ..., additional_forward_args: Any = ..., layer: Any = ...,
                  attribute_to_layer_input: Any = ..., layer_baselines: Any = ...,
                  layer_delta: str = ...) -> Attributions: ...

    @overload
    def attribute(self, inputs: Inputs, baselines: Baselines = ..., target: Target = ..., *,
                  multiply_by_inputs: bool = ..., return_convergence_delta: Literal[True],
                  show_progress: bool = ..., strict: bool = ...,
                  additional_forward_args: Any = ..., layer: Any = ...,
                  attribute_to_layer_input: Any = ..., layer_baselines: Any = ...,
                  layer_delta: str = ...) -> tuple[Attributions, torch.Tensor]: ...

    def attribute(self, inputs: Inputs, baselines: Baselines = 0.0, target: Target = None, *,
                  multiply_by_inputs: bool = True, return_convergence_delta: bool = False,
                  show_progress: bool = False, strict: bool = False,
                  additional_forward_args: Any = None, layer: Any = CONSTRUCTED,
                  attribute_to_layer_input: Any = CONSTRUCTED, layer_baselines: Any = None,
                  layer_delta: str = "layer") -> Attributions | tuple[Attributions, torch.Tensor]:
        """DeepLift: attributions shaped like ``inputs`` (with
        ``return_convergence_delta=True`` and the delta ``[B]``); its options are
        ``_attribute``'s, the shared arguments :data:`~taylorattr.methods._call.SHARED_DOC`."""
        return self.explain(**given(locals())).result()

    def _attribute(self, call, x, b, t, fx, *, multiply_by_inputs: bool = True, show_progress=False):
        """``multiply_by_inputs=False``: the multipliers ``m`` themselves (Captum's option;
        DeepLIFT's "hypothetical contributions" start from them), not ``(x - x~) * m``.
        Half-precision ``x``: the float32 attributions, rounded after the pipeline's
        completeness check (the module docstring's precision note)."""
        check_bool(multiply_by_inputs, "multiply_by_inputs")
        plan = get_plan(call.model, self._rules, x)
        prop = propagate(call.model, plan, self._rules, x, b, t, False, upcast=True)
        g = prop.gradient  # float32 for half x (the pass widened), else x's dtype
        if not multiply_by_inputs:
            return Attributed(g.to(x.dtype), b.unsqueeze(1))
        # complete: checked by the pipeline (f(x~) from this pass, at the precision of the
        # plan's graph: its casts below x's dtype; none below float32 in a widened pass,
        # whose check reads f32(x), the pass's own float32 forward, and rounds after it)
        widened = g.dtype != x.dtype
        return Attributed((x.to(g.dtype) - b.to(g.dtype)) * g, b.unsqueeze(1),
                          reference_outputs=prop.ref_output,
                          casts=() if widened else downcasts(plan.core, x.dtype),
                          pass_output=prop.output if widened else None)

    def _cost(self, x, options):
        """One pass through the plan (:meth:`_propagate_cost`): ``B`` baseline rows forward,
        ``B`` input rows forward and swept back. The delta's reference output ``f(x~)`` comes
        from that pass (no extra forward), except with ``multiply_by_inputs=False``."""
        return self._propagate_cost(x.shape[0]), int(not options.get("multiply_by_inputs", True))

    def layer_records(self, inputs: torch.Tensor, baselines=0.0, target=None
                      ) -> list[LayerRecord]:
        """One :class:`~taylorattr.methods.layerwise.LayerRecord` per Linear/Conv layer
        (a directly following eval-mode BatchNorm folded in), in execution order:
        ``x^(l), x~^(l), y, y~, x^(l+1), x~^(l+1)``, the activation, the Rescale multipliers and the upstream multipliers. Feed a record to
        :func:`~taylorattr.methods.layerwise.local_relevance` for the ``[B, out, in]``
        local relevances ``a_ij^(l)``.
        """
        x = check_inputs(inputs).detach()
        return self._propagate(self.model, x, broadcast_baselines(baselines, x), target,
                               True).records

    def _propagate(self, model, x, b, target, records):
        return propagate(model, get_plan(model, self._rules, x), self._rules, x, b, target,
                         records)
