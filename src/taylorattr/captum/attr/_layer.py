"""Captum's ``LayerActivation``, ``InternalInfluence`` and ``NeuronConductance``.

Both path methods walk the straight input-space path ``x(a) = x~ + a (x - x~)`` at the
nodes ``a_k`` and weights ``w_k`` of Captum's rule
(:func:`taylorattr.methods.integrated_gradients.quadrature`):

    InternalInfluence_j (x) = sum_k w_k  d f / d h_j (x(a_k))
    NeuronConductance_i (x) = (x_i - x~_i) sum_k w_k  d f / d n (x(a_k))  d n / d x_i (x(a_k))

with ``h`` the layer's output (input), ``n`` the selected neuron of it; without
``multiply_by_inputs`` the factor ``x_i - x~_i`` is left out. Every gradient is
:class:`taylorattr.methods.Saliency` (signed): with ``layer=`` for ``d f / d h``, on
:class:`taylorattr.inputs.NeuronView` for ``d n / d x``.
"""
from __future__ import annotations

import warnings

import torch

from ... import methods as native
from ...inputs import NeuronView, as_tuple, point_baselines
from ...methods.integrated_gradients import quadrature
from .._mapping import (
    Call,
    GradientAttribution,
    LayerAttribution,
    NeuronAttribution,
    for_layers,
    layer_inputs,
)
from ._gradient import _grad_kwargs, _rows

__all__ = ["InternalInfluence", "LayerActivation", "NeuronConductance"]

class LayerActivation(LayerAttribution):
    """Captum's ``LayerActivation``: the layer's output (``attribute_to_layer_input``: its
    input) on ``inputs``, detached; a tuple for a layer returning several tensors, a list
    for a list of layers."""

    _multiply_by_inputs = True  # Captum's LayerActivation says so

    def attribute(self, inputs, additional_forward_args=None,
                  attribute_to_layer_input: bool = False):
        return for_layers(self.layer, lambda m: layer_inputs(
            self.forward_func, m, inputs, additional_forward_args, attribute_to_layer_input))


class _Path:
    """The path points of every sample, sample-major: ``points`` (the structure of the
    inputs, ``[B * n, ...]``), ``weights`` ``[B * n]`` and the per-row target and
    additional arguments."""

    def __init__(self, inputs, baselines, target, extra, n_steps: int, method: str):
        self.parts, self.is_tuple = as_tuple(inputs)
        self.base = point_baselines(0.0 if baselines is None else baselines, self.parts)
        alphas, w = quadrature(method, n_steps)
        self.batch, self.n = self.parts[0].shape[0], n_steps
        pts = []
        for x, b in zip(self.parts, self.base):
            a = alphas.to(x.device, x.dtype).view((1, -1) + (1,) * (x.dim() - 1))
            pts.append((b.unsqueeze(1) + a * (x - b).unsqueeze(1)).reshape(
                (-1,) + tuple(x.shape[1:])))
        self.points = tuple(pts) if self.is_tuple else pts[0]
        self.weights = w.to(self.parts[0].device).repeat(self.batch)
        self.target, self.extra = _rows(target, n_steps), _rows(extra, n_steps)

    def integrate(self, rows: torch.Tensor) -> torch.Tensor:
        """``sum_k w_k rows[b, k]`` for every sample ``b``."""
        w = self.weights.to(rows.device, rows.dtype).view((-1,) + (1,) * (rows.dim() - 1))
        return (w * rows).reshape((self.batch, self.n) + tuple(rows.shape[1:])).sum(1)


class InternalInfluence(LayerAttribution, GradientAttribution):
    """Captum's ``InternalInfluence``: the layer gradient integrated along the input path
    (module docstring)."""

    def has_convergence_delta(self) -> bool:
        return False

    def __init__(self, forward_func, layer, device_ids=None) -> None:
        super().__init__(forward_func, layer, device_ids)
        self._gradient = native.Saliency(forward_func)

    def attribute(self, inputs, baselines=None, target=None, additional_forward_args=None,
                  n_steps: int = 50, method: str = "gausslegendre", internal_batch_size=None,
                  attribute_to_layer_input: bool = False, grad_kwargs=None):
        """``internal_batch_size`` changes only the memory Captum needs; the path's rows run
        together here."""
        _grad_kwargs(grad_kwargs)
        path = _Path(inputs, baselines, target, additional_forward_args, n_steps, method)

        def run(layer):
            grads = Call(self._gradient, path.points, None, path.target, path.extra, False,
                         {"abs": False, "layer": layer,
                          "attribute_to_layer_input": attribute_to_layer_input}).run()
            grads, many = as_tuple(grads)
            out = tuple(path.integrate(g) for g in grads)
            return out if many else out[0]
        return for_layers(self.layer, run)


def _selected_gradient(grads, selector) -> torch.Tensor:
    """Captum's selection of the neuron from the layer's gradient ``[R, ...]`` (a callable
    is applied to the gradient itself, as Captum applies it; slices are summed)."""
    parts, many = as_tuple(grads)
    if callable(selector):
        return selector(parts if many else parts[0])
    if many:
        raise ValueError("neuron_selector: the layer gives several tensors; pass a callable "
                         "that selects the neuron from them")
    index = (selector,) if isinstance(selector, int) else tuple(selector)
    if len(index) > parts[0].dim() - 1:
        raise ValueError(f"neuron_selector {selector!r} has more indices than the layer's "
                         f"output has axes per sample, shape {tuple(parts[0].shape[1:])}")
    picked = parts[0][(slice(None),) + index]
    if any(isinstance(i, slice) for i in index):
        return picked.reshape(picked.shape[0], -1).sum(1)
    return picked


class NeuronConductance(NeuronAttribution, GradientAttribution):
    """Captum's ``NeuronConductance``: the conductance of the inputs through one neuron
    (module docstring); ``method`` defaults to ``riemann_trapezoid``, as Captum's."""

    def __init__(self, forward_func, layer, device_ids=None,
                 multiply_by_inputs: bool = True) -> None:
        super().__init__(forward_func, layer, device_ids)
        self._multiply_by_inputs = multiply_by_inputs
        self._gradient = native.Saliency(forward_func)

    def has_convergence_delta(self) -> bool:
        return False

    def attribute(self, inputs, neuron_selector, baselines=None, target=None,
                  additional_forward_args=None, n_steps: int = 50,
                  method: str = "riemann_trapezoid", internal_batch_size=None,
                  attribute_to_neuron_input: bool = False, grad_kwargs=None):
        _grad_kwargs(grad_kwargs)
        if callable(neuron_selector):
            warnings.warn("The neuron_selector provided is a callable. Please ensure that "
                          "this function only selects neurons from the given layer; "
                          "aggregating or performing other operations on the tensor may "
                          "lead to inaccurate results.", stacklevel=2)
        path = _Path(inputs, baselines, target, additional_forward_args, n_steps, method)
        outer = Call(self._gradient, path.points, None, path.target, path.extra, False,
                     {"abs": False, "layer": self.layer,
                      "attribute_to_layer_input": attribute_to_neuron_input}).run()
        mid = _selected_gradient(outer, neuron_selector).reshape(-1)
        if mid.shape[0] != path.batch * path.n:
            raise ValueError("neuron_selector must select one neuron (one value per sample) "
                             f"of the layer's gradient, got {mid.shape[0] // path.n} per "
                             "sample")
        view = NeuronView(self.forward_func, self.layer, neuron_selector,
                          attribute_to_neuron_input)
        inner = Call(native.Saliency(view), path.points, None, None, path.extra, False,
                     {"abs": False}).run()
        inner, _ = as_tuple(inner)
        out = []
        for g, x, b in zip(inner, path.parts, path.base):
            total = path.integrate(g * mid.to(g.dtype).view((-1,) + (1,) * (g.dim() - 1)))
            out.append(total * (x - b) if self._multiply_by_inputs else total)
        return tuple(out) if path.is_tuple else out[0]
