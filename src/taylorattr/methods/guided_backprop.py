"""Guided Backpropagation (Springenberg et al. 2015).

The gradient of the explained output, with every ReLU's backward pass replaced by

    grad_in = relu(grad_out * 1[z > 0])            (z: the ReLU's input)

so only positive signals pass back through a ReLU, and only where the ReLU was open;
every other operation keeps its true derivative. As Captum's ``GuidedBackprop``, the
attribution is that modified gradient itself (not multiplied by the input), and the
gating applies to ``nn.ReLU`` modules. ReLUs called as functions (``F.relu``,
``torch.relu``, ``x.relu()``) cannot be gated by module hooks, and Captum would silently
leave them ungated; here they are found by torch.fx and refused with a ``TypeError``
naming them (replace them by ``nn.ReLU`` modules). A model without any ReLU gets its
plain gradient (nothing to gate).

Taylor view: none. The gating rule changes the backward pass of each ReLU by the sign of
the signal coming back, which is not a weight on the monomials of the expansion of ``f``
(for a ReLU network every monomial of order >= 2 vanishes almost everywhere, and the
gated gradient is not the first-order term either), so there is no Taylor reformulation.
"""
from __future__ import annotations

import warnings
import weakref
from typing import Any, Literal, overload

import torch
import torch.nn.functional as F
from torch import nn

from .. import _fx
from ._base import Attributed, ImplicitBaselineMethod
from ._call import CONSTRUCTED, Attributions, Inputs, Target, given
from ._passes import gradient_pass_cost, target_gradient

__all__ = ["GuidedBackprop", "functional_relus", "relu_modules"]

_RELU_FUNCTIONS = (F.relu, torch.relu, torch.relu_, F.relu_)
_RELU_METHODS = ("relu", "relu_")


class _GuidedReLU(torch.autograd.Function):
    """``relu`` forward; backward ``relu(grad * 1[z > 0])``."""

    @staticmethod
    def forward(ctx, z):
        ctx.save_for_backward(z)
        return z.clamp(min=0)

    @staticmethod
    def backward(ctx, grad):
        (z,) = ctx.saved_tensors
        return (grad * (z > 0).to(grad.dtype)).clamp(min=0)


#: per model: (its modules' identities and classes, the functional ReLUs found)
_FOUND: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def functional_relus(model: nn.Module) -> list[str]:
    """Descriptions of the ReLUs ``model`` calls as functions or tensor methods (found by
    torch.fx; ``nn.ReLU`` modules are not listed). Raises TypeError if fx cannot trace it.

    Cached per model while its modules stay the same objects of the same classes: the
    trace costs tens of milliseconds (ResNet-50: about 3x a GPU's whole Guided Backprop
    call at batch 16), and a constructor called per batch would pay it every time."""
    modules = tuple((id(m), type(m)) for m in model.modules())
    cached = _FOUND.get(model)
    if cached is not None and cached[0] == modules:
        return list(cached[1])
    graph = _fx.trace(model, "finding functional ReLU calls (Guided Backprop)",
                      leaf_modules=(nn.ReLU,))
    found = [_fx.describe(n, model) for n in graph.graph.nodes
             if (n.op == "call_function" and n.target in _RELU_FUNCTIONS)
             or (n.op == "call_method" and n.target in _RELU_METHODS)]
    _FOUND[model] = (modules, tuple(found))
    return found


#: per model: (its modules' identities and classes, its ``nn.ReLU`` modules, each once)
_RELUS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _structure(model: nn.Module) -> tuple[list, list]:
    """The identities and the classes of ``model``'s modules, walked through their
    ``_modules`` (a shared module as often as it is reached; 4x cheaper than
    ``model.modules()``): what a list of its modules stays valid for."""
    found, stack = [model], list(model._modules.values())
    while stack:
        m = stack.pop()
        if m is not None:
            found.append(m)
            stack.extend(m._modules.values())
    return list(map(id, found)), list(map(type, found))


def relu_modules(model: nn.Module) -> tuple[nn.ReLU, ...]:
    """The ``nn.ReLU`` modules of ``model`` (each once), cached per model object (weakly)
    while its modules stay the same objects of the same classes: a second call of a small
    model skips the search, another model or a changed structure searches afresh. (The
    cached ReLUs are held, so no identity in the key is reused while the entry lives.)"""
    structure = _structure(model)
    cached = _RELUS.get(model)
    if cached is not None and cached[0] == structure:
        return cached[1]
    relus = tuple(m for m in model.modules() if isinstance(m, nn.ReLU))
    _RELUS[model] = (structure, relus)
    return relus


class GuidedBackprop(ImplicitBaselineMethod):
    """Guided Backpropagation: the gradient with each ``nn.ReLU`` gated on the way back;
    one forward and one backward pass. Equals Captum's ``GuidedBackprop``.

    The model is checked once, at construction, for ReLUs called as functions (refused,
    see the module docstring); a model torch.fx cannot trace is used with a warning that
    this check could not run.
    """

    name = "guided_backprop"

    def __init__(self, model) -> None:
        super().__init__(model)
        try:
            found = functional_relus(model)
        except TypeError as exc:
            warnings.warn(f"GuidedBackprop could not check {type(model).__name__} for ReLUs "
                          f"called as functions (they would not be gated): "
                          f"{str(exc).splitlines()[0]}", stacklevel=2)
            found = []
        if found:
            raise TypeError("model: Guided Backprop gates nn.ReLU modules only, but the model "
                            "calls ReLU as a function at " + "; ".join(found) +
                            " (replace these calls by nn.ReLU modules)")

    #: the ReLU's replacement in the backward pass (Deconvolution: its own rule)
    relu_function: type[torch.autograd.Function] | None = None

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
        """GuidedBackprop: attributions shaped like ``inputs`` (with
        ``return_convergence_delta=True`` and the delta ``[B]``); its options are
        ``_attribute``'s, the shared arguments :data:`~taylorattr.methods._call.SHARED_DOC`."""
        return self.explain(**given(locals())).result()

    def _attribute(self, call, x, baselines, target, fx, *, show_progress: bool = False):
        relus = relu_modules(call.model)
        function = self.relu_function or _GuidedReLU
        inputs = []  # each in-place ReLU call's own input z (calls do not nest: a stack)

        def keep(module, args):  # an in-place ReLU rectifies a copy: z keeps its values
            inputs.append(args[0])
            return (args[0].clone(),)

        def gate(module, args, output):
            # the ReLU's output recomputed from z through the modified function, so the
            # gradient reaches z by the modified rule alone (an in-place ReLU applied to z
            # itself would have put its own backward, the mask 1[z > 0], after it: right
            # for Guided Backprop by idempotence, wrong for Deconvolution)
            return function.apply(inputs.pop() if module.inplace else args[0])

        hooks = [m.register_forward_pre_hook(keep) for m in relus if m.inplace]
        hooks += [m.register_forward_hook(gate) for m in relus]
        try:
            grad, _ = target_gradient(call.model, x.clone(), target)
        finally:
            for h in hooks:
                h.remove()
        return Attributed(grad, torch.zeros_like(x).unsqueeze(1))

    def _cost(self, x, options):
        """One forward and one (gated) backward row per sample; the zero input is the one
        reference."""
        return gradient_pass_cost(x.shape[0]), 1
