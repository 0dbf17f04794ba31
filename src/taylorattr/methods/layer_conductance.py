"""Layer conductance (Dhamdhere et al. 2018), as Captum's ``LayerConductance``.

The conductance of a neuron ``h_j`` of a layer is the part of Integrated Gradients' path
integral that flows through it: with ``x(a) = x~ + a (x - x~)``,

    a_j = int_0^1 dF/dh_j (x(a)) * d h_j(x(a)) / da  da
        ~ sum_{k=0}^{n-1} g_j(a_k) (h_j(a_{k+1}) - h_j(a_k))

on the ``n + 1`` nodes ``a_0 < ... < a_n`` of ``method`` with ``n_steps + 1`` points
(Captum's partition; the quadrature weights are not used), ``g = dF/dh`` at the path point.
The conductances of a layer every path crosses sum to ``f(x(a_n)) - f(x(a_0))``, close to
``f(x) - f(x~)`` (the convergence delta measures the gap). Attributions have the layer's
shape (its input with ``layer_input=True``); the layer is ``conductance_layer=`` (or
``layer=``). Tuple inputs and ``additional_forward_args`` run through one joined tensor
(the path is the straight line of every input at once).

Taylor view: none is registered. Summed over a layer, conductance is Integrated Gradients
through that layer (its total is IG's), but how it splits among the neurons depends on the
layer's parametrisation, not only on the monomials of the expansion of ``f`` in the input.

Cost: ``(n_steps + 1) * B`` forward+backward rows.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Any, Literal, overload

import torch
from torch import nn

from .._validation import check_bool, check_positive_int, select_output
from ..inputs import (
    Layout,
    ModelWrapper,
    as_tuple,
    check_additional_args,
    check_batch,
    point_baselines,
)
from ._base import Attributed, AttributionMethod, Request
from ._call import CONSTRUCTED, Attributions, Baselines, Inputs, Target, given
from ._passes import check_optional_positive_int, default_chunk_rows, gradient_pass_cost
from .integrated_gradients import quadrature

__all__ = ["LayerConductance"]


def _layer_and_gradient(model, layer, rows, target, layer_input):
    """The layer's output (input) at ``rows`` and the explained output's gradient w.r.t. it,
    each ``[R, n]`` (flattened; a layer returning several tensors: joined), the shapes of
    the layer's tensors (one sample each) and whether it gave a tuple."""
    seen = []

    def keep(module, args, output):
        seen.append((args if len(args) > 1 else args[0]) if layer_input else output)

    handle = layer.register_forward_hook(keep)
    try:
        with torch.enable_grad():
            rows = rows.detach().requires_grad_(True)
            out = select_output(model(rows), target)
            if len(seen) != 1:
                raise ValueError(f"conductance_layer must run once per forward pass; it ran "
                                 f"{len(seen)} times")
            parts = seen[0] if isinstance(seen[0], tuple) else (seen[0],)
            if not all(isinstance(p, torch.Tensor) for p in parts):
                raise ValueError("conductance_layer must give a tensor or a tuple of them, it "
                                 f"gave a {type(seen[0]).__name__}")
            grads = torch.autograd.grad(out.sum(), parts)
    finally:
        handle.remove()
    return (torch.cat([p.detach().flatten(1) for p in parts], 1),
            torch.cat([g.flatten(1) for g in grads], 1),
            tuple(tuple(p.shape[1:]) for p in parts), isinstance(seen[0], tuple))


class _Joined(ModelWrapper):
    """The model on the joined rows of tuple inputs (:class:`~taylorattr.inputs.Layout`),
    the per-sample tensors of ``additional_forward_args`` tiled over the path points (the
    rows are point-major: point ``k`` of sample ``b`` is row ``k * B + b``)."""

    def __init__(self, model, layout: Layout, extra: tuple, batch: int):
        super().__init__(model)
        self.layout, self.extra, self.batch = layout, extra, batch

    def forward(self, rows):
        sample = torch.arange(rows.shape[0], device=rows.device) % self.batch
        extra = tuple(a[sample.to(a.device)]
                      if isinstance(a, torch.Tensor) and a.dim() and a.shape[0] == self.batch
                      else a for a in self.extra)
        return self.model(*self.layout.split(rows), *extra)


def _joined(method, request: Request) -> Request:
    """LayerConductance's route (:attr:`~taylorattr.methods._call.Traits.route`): tuple
    inputs and ``additional_forward_args`` become the joined rows of one tensor, the model
    :class:`_Joined` over them (the path is the straight line of every input at once)."""
    inputs, extra = request.inputs, request.shared["additional_forward_args"]
    if isinstance(inputs, torch.Tensor) and inputs.dim() >= 2 and extra is None:
        return request
    parts, is_tuple = as_tuple(inputs)
    batch = check_batch(parts, vectors=True)
    layout = Layout.of(parts, is_tuple)
    base = 0.0 if request.baselines is None else request.baselines
    model = method.model if request.model is None else request.model
    return replace(request, inputs=layout.join(parts),
                   baselines=layout.join(point_baselines(base, parts)),
                   model=_Joined(model, layout, check_additional_args(extra, batch), batch),
                   shared={**request.shared, "additional_forward_args": None})


class LayerConductance(AttributionMethod):
    """Conductance of a layer's neurons along the straight path (module docstring). Equals
    Captum's ``LayerConductance`` with the same ``n_steps`` and ``method``."""

    name = "layer_conductance"

    #: ``layer=`` names ``conductance_layer``; tuple inputs and ``additional_forward_args``
    #: run as one joined tensor (:func:`_joined`)
    traits = replace(AttributionMethod.traits,
                     layer_option=("conductance_layer", "layer_input"), route=_joined)

    @overload
    def attribute(self, inputs: Inputs, baselines: Baselines = ..., target: Target = ..., *,
                  conductance_layer: Any = ..., layer_input: bool = ..., n_steps: int = ...,
                  method: str = ..., internal_batch_size: int | None = ...,
                  return_convergence_delta: Literal[False] = ..., show_progress: bool = ...,
                  strict: bool = ..., additional_forward_args: Any = ..., layer: Any = ...,
                  attribute_to_layer_input: Any = ..., layer_baselines: Any = ...,
                  layer_delta: str = ...) -> Attributions: ...

    @overload
    def attribute(self, inputs: Inputs, baselines: Baselines = ..., target: Target = ..., *,
                  conductance_layer: Any = ..., layer_input: bool = ..., n_steps: int = ...,
                  method: str = ..., internal_batch_size: int | None = ...,
                  return_convergence_delta: Literal[True], show_progress: bool = ...,
                  strict: bool = ..., additional_forward_args: Any = ..., layer: Any = ...,
                  attribute_to_layer_input: Any = ..., layer_baselines: Any = ...,
                  layer_delta: str = ...) -> tuple[Attributions, torch.Tensor]: ...

    def attribute(self, inputs: Inputs, baselines: Baselines = 0.0, target: Target = None, *,
                  conductance_layer: Any = None, layer_input: bool = False, n_steps: int = 50,
                  method: str = "gausslegendre", internal_batch_size: int | None = None,
                  return_convergence_delta: bool = False, show_progress: bool = False,
                  strict: bool = False, additional_forward_args: Any = None,
                  layer: Any = CONSTRUCTED, attribute_to_layer_input: Any = CONSTRUCTED,
                  layer_baselines: Any = None,
                  layer_delta: str = "layer") -> Attributions | tuple[Attributions, torch.Tensor]:
        """LayerConductance: attributions shaped like ``inputs`` (with
        ``return_convergence_delta=True`` and the delta ``[B]``); its options are
        ``_attribute``'s, the shared arguments :data:`~taylorattr.methods._call.SHARED_DOC`."""
        return self.explain(**given(locals())).result()

    def _attribute(self, call, x, base, t, fx, *, conductance_layer=None, layer_input: bool = False,
                   n_steps: int = 50, method: str = "gausslegendre",
                   internal_batch_size: int | None = None, show_progress: bool = False):
        """Options: ``conductance_layer`` (a submodule), ``layer_input`` (its input instead
        of its output), ``n_steps`` (intervals; ``n_steps + 1`` path points), ``method``
        (the nodes' rule), ``internal_batch_size`` (rows per call)."""
        if not isinstance(conductance_layer, nn.Module) or \
                not any(m is conductance_layer for m in call.model.modules()):
            raise ValueError("conductance_layer must be a submodule of the model (the layer "
                             "whose neurons' conductance is computed)")
        check_bool(layer_input, "layer_input")
        n = check_positive_int(n_steps, "n_steps")
        chunk = check_optional_positive_int(internal_batch_size, "internal_batch_size")
        alphas, _ = quadrature(method, n + 1)
        alphas = alphas.to(x.device, x.dtype)
        batch = x.shape[0]
        per = max(1, (chunk or default_chunk_rows(x, backward=True, model=call.model)) // batch)
        hs, gs = [], []
        for k0 in range(0, n + 1, per):
            a = alphas[k0:k0 + per].view((-1,) + (1,) * x.dim())
            rows = (base[None] + a * (x - base)[None]).reshape((-1,) + tuple(x.shape[1:]))
            tr = None if t is None else t.repeat(a.shape[0])
            h, g, shapes, several = _layer_and_gradient(call.model, conductance_layer, rows,
                                                        tr, layer_input)
            hs.append(h.view(a.shape[0], batch, -1))
            gs.append(g.view(a.shape[0], batch, -1))
        h, g = torch.cat(hs), torch.cat(gs)
        attr = (g[:-1] * (h[1:] - h[:-1])).sum(0)
        if not several:
            attr = attr.view((batch,) + shapes[0])
        # a layer of several tensors: joined here, split in the result (layer_shapes)
        return Attributed(attr.to(x.dtype), base.unsqueeze(1),
                          layer_shapes=shapes if several else None)

    def _cost(self, x, options):
        """``n_steps + 1`` gradient rows per sample; one reference."""
        n = check_positive_int(options.get("n_steps", 50), "n_steps")
        return gradient_pass_cost((n + 1) * x.shape[0]), 1
