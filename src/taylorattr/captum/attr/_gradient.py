"""Captum's gradient methods and their ``Layer*`` variants over the native methods.

Each class maps Captum's constructor and ``attribute`` arguments onto one native call
(:class:`~taylorattr.captum._mapping.Call`); :mod:`taylorattr.captum.attr` documents the
deliberate differences.

Why one module: every ``Layer*`` class is its input class with ``layer=``, and the
reference-set classes (DeepLiftShap, GradientShap and their layer variants) share the
expansion of Captum's per-sample arguments to (sample, reference) rows; split by method they
would import each other both ways.
"""
from __future__ import annotations

import inspect

import numpy as np
import torch

from ... import methods as native
from ...baselines import ReferenceSet
from ...inputs import as_tuple, point_baselines
from ...methods.gradient_shap import GSDraws
from .._mapping import (
    Call,
    GradientAttribution,
    LayerAttribution,
    captum_noise,
    for_layers,
    layer_inputs,
    not_offered,
)

__all__ = ["DeepLift", "DeepLiftShap", "GradientShap", "GuidedBackprop", "InputXGradient",
           "IntegratedGradients", "LayerConductance", "LayerDeepLift", "LayerDeepLiftShap",
           "LayerGradientShap", "LayerGradientXActivation", "LayerIntegratedGradients",
           "Saliency"]


def _no(value, what: str, why: str) -> None:
    if value is not None:
        raise not_offered(what, why)


# torch.autograd.grad options that change no number here: unused inputs' gradients are
# zeros already (materialize_grads), and no graph is kept past a call (retain_graph)
_NEUTRAL_GRAD_KWARGS = {"materialize_grads", "retain_graph"}


def _grad_kwargs(value) -> None:
    """Captum's ``grad_kwargs`` (passed to ``torch.autograd.grad``): the options that change
    no number are accepted; others (``create_graph`` for differentiable attributions, ...)
    are refused."""
    if value is None:
        return
    if not isinstance(value, dict):
        raise TypeError(f"grad_kwargs must be a dict, got {type(value).__name__}")
    other = sorted(set(value) - _NEUTRAL_GRAD_KWARGS)
    if other:
        raise not_offered(f"grad_kwargs {other}", "the native methods take their gradients "
                          "themselves; only materialize_grads and retain_graph (which change "
                          "no number) are accepted")


class IntegratedGradients(GradientAttribution):
    """Captum's ``IntegratedGradients``: :class:`taylorattr.methods.IntegratedGradients`."""

    def __init__(self, forward_func, multiply_by_inputs: bool = True) -> None:
        super().__init__(forward_func)
        self._multiply_by_inputs = multiply_by_inputs
        self._native = native.IntegratedGradients(forward_func)

    def _call(self, inputs, baselines=None, target=None, additional_forward_args=None,
              n_steps: int = 50, method: str = "gausslegendre", internal_batch_size=None,
              return_convergence_delta: bool = False, *, layer=None,
              attribute_to_layer_input: bool = False):
        options = {"n_steps": n_steps, "method": method,
                   "internal_batch_size": internal_batch_size,
                   "multiply_by_inputs": self._multiply_by_inputs}
        if layer is not None:
            options.update(layer=layer, attribute_to_layer_input=attribute_to_layer_input)
        return Call(self._native, inputs, baselines, target, additional_forward_args,
                    return_convergence_delta, options)

    def attribute(self, inputs, baselines=None, target=None, additional_forward_args=None,
                  n_steps: int = 50, method: str = "gausslegendre", internal_batch_size=None,
                  return_convergence_delta: bool = False):
        return self._call(inputs, baselines, target, additional_forward_args, n_steps, method,
                          internal_batch_size, return_convergence_delta).run()


class LayerIntegratedGradients(LayerAttribution, GradientAttribution):
    """Captum's ``LayerIntegratedGradients``: the native method with ``layer=`` (a list of
    layers gives a list of attributions)."""

    def __init__(self, forward_func, layer, device_ids=None,
                 multiply_by_inputs: bool = True) -> None:
        super().__init__(forward_func, layer, device_ids)
        self._ig = IntegratedGradients(forward_func, multiply_by_inputs)
        self._multiply_by_inputs = multiply_by_inputs

    def _call(self, inputs, baselines=None, target=None, additional_forward_args=None,
              n_steps: int = 50, method: str = "gausslegendre", internal_batch_size=None,
              return_convergence_delta: bool = False, attribute_to_layer_input: bool = False,
              grad_kwargs=None, *, layer=None):
        _grad_kwargs(grad_kwargs)
        return self._ig._call(inputs, baselines, target, additional_forward_args, n_steps,
                              method, internal_batch_size, return_convergence_delta,
                              layer=self.layer if layer is None else layer,
                              attribute_to_layer_input=attribute_to_layer_input)

    def attribute(self, inputs, baselines=None, target=None, additional_forward_args=None,
                  n_steps: int = 50, method: str = "gausslegendre", internal_batch_size=None,
                  return_convergence_delta: bool = False, attribute_to_layer_input: bool = False,
                  grad_kwargs=None):
        args = (inputs, baselines, target, additional_forward_args, n_steps, method,
                internal_batch_size, return_convergence_delta, attribute_to_layer_input,
                grad_kwargs)
        return for_layers(self.layer, lambda m: self._call(*args, layer=m).run(),
                          return_convergence_delta)


class Saliency(GradientAttribution):
    """Captum's ``Saliency``: :class:`taylorattr.methods.Saliency`."""

    def __init__(self, forward_func) -> None:
        super().__init__(forward_func)
        self._native = native.Saliency(forward_func)

    def has_convergence_delta(self) -> bool:
        return False

    def _call(self, inputs, target=None, abs: bool = True, additional_forward_args=None):
        return Call(self._native, inputs, None, target, additional_forward_args, False,
                    {"abs": abs})

    def attribute(self, inputs, target=None, abs: bool = True, additional_forward_args=None):
        return self._call(inputs, target, abs, additional_forward_args).run()


class _ImplicitBaseline(GradientAttribution):
    """A method without baselines: ``attribute(inputs, target, additional_forward_args)``."""

    _native_cls: type = native.GradientInput

    def __init__(self, forward_func) -> None:
        super().__init__(forward_func)
        self._native = self._native_cls(forward_func)

    def has_convergence_delta(self) -> bool:
        return False

    def _call(self, inputs, target=None, additional_forward_args=None):
        return Call(self._native, inputs, None, target, additional_forward_args)

    def attribute(self, inputs, target=None, additional_forward_args=None):
        return self._call(inputs, target, additional_forward_args).run()


class InputXGradient(_ImplicitBaseline):
    """Captum's ``InputXGradient``: :class:`taylorattr.methods.GradientInput`."""

    _multiply_by_inputs = True


class LayerGradientXActivation(LayerAttribution, GradientAttribution):
    """Captum's ``LayerGradientXActivation``: Gradient*Input at the layer
    (``multiply_by_inputs=False``: the signed gradient at the layer, Saliency)."""

    def __init__(self, forward_func, layer, device_ids=None, multiply_by_inputs: bool = True,
                 memory_efficient: bool = False) -> None:
        super().__init__(forward_func, layer, device_ids)
        self._multiply_by_inputs = multiply_by_inputs
        self._native = native.GradientInput(forward_func) if multiply_by_inputs else \
            native.Saliency(forward_func)

    def has_convergence_delta(self) -> bool:
        return False

    def _call(self, inputs, target=None, additional_forward_args=None,
              attribute_to_layer_input: bool = False, grad_kwargs=None, *, layer=None):
        _grad_kwargs(grad_kwargs)
        options = {"layer": self.layer if layer is None else layer,
                   "attribute_to_layer_input": attribute_to_layer_input}
        if not self._multiply_by_inputs:
            options["abs"] = False
        return Call(self._native, inputs, None, target, additional_forward_args, False, options)

    def attribute(self, inputs, target=None, additional_forward_args=None,
                  attribute_to_layer_input: bool = False, grad_kwargs=None):
        args = (inputs, target, additional_forward_args, attribute_to_layer_input, grad_kwargs)
        return for_layers(self.layer, lambda m: self._call(*args, layer=m).run())


class GuidedBackprop(_ImplicitBaseline):
    """Captum's ``GuidedBackprop``: :class:`taylorattr.methods.GuidedBackprop`."""

    _native_cls = native.GuidedBackprop

    def __init__(self, model) -> None:
        super().__init__(model)
        self.model = model


class DeepLift(GradientAttribution):
    """Captum's ``DeepLift``: :class:`taylorattr.methods.DeepLift` (rescale rule);
    ``custom_attribution_func`` is called on the native multipliers
    (``multiply_by_inputs=False``), the inputs and the baselines, as Captum calls it."""

    def __init__(self, model, multiply_by_inputs: bool = True, eps: float = 1e-10) -> None:
        super().__init__(model)
        self.model = model
        self.eps = eps
        self._multiply_by_inputs = multiply_by_inputs
        self._deeplift = self._native = native.DeepLift(model)

    def _call(self, inputs, baselines=None, target=None, additional_forward_args=None,
              return_convergence_delta: bool = False, custom_attribution_func=None, *,
              layer=None, attribute_to_layer_input: bool = False):
        options = {"multiply_by_inputs": self._multiply_by_inputs}
        if layer is not None:  # Captum's delta: f(x) - f(x~) of the whole model
            options.update(layer=layer, attribute_to_layer_input=attribute_to_layer_input,
                           layer_delta="model")
        call = Call(self._deeplift, inputs, baselines, target, additional_forward_args,
                    return_convergence_delta, options)
        if custom_attribution_func is None:
            return call
        return _Custom(self, call, custom_attribution_func)

    def attribute(self, inputs, baselines=None, target=None, additional_forward_args=None,
                  return_convergence_delta: bool = False, custom_attribution_func=None):
        return self._call(inputs, baselines, target, additional_forward_args,
                          return_convergence_delta, custom_attribution_func).run()


class _Custom:
    """Captum's ``custom_attribution_func(multipliers[, inputs[, baselines]])`` on the
    multipliers of a DeepLIFT call (tuples, at the layer when ``layer`` is given: the
    layer's values at the inputs and at the baselines); the delta of what it returns."""

    def __init__(self, owner, call: Call, func):
        if not callable(func):
            raise TypeError(f"custom_attribution_func must be callable, got "
                            f"{type(func).__name__}")
        self.owner, self.call, self.func = owner, call, func

    def run(self):
        c = self.call
        want_delta, c.delta = c.delta, False
        c.options = {**c.options, "multiply_by_inputs": False}
        multipliers = c.run()
        parts, _ = as_tuple(c.inputs)
        base = point_baselines(0.0 if c.baselines is None else c.baselines, parts)
        layer = c.options.get("layer")
        ins, bas = parts, base
        if layer is not None:
            to_input = c.options.get("attribute_to_layer_input", False)
            ins = as_tuple(layer_inputs(self.owner.model, layer, parts,
                                        c.additional_forward_args, to_input))[0]
            bas = as_tuple(layer_inputs(self.owner.model, layer, base,
                                        c.additional_forward_args, to_input))[0]
        mult, is_tuple = as_tuple(multipliers)
        n = len(inspect.signature(self.func).parameters)
        out = self.func(*(mult, ins, bas)[:max(1, min(n, 3))])
        out = tuple(out) if isinstance(out, (tuple, list)) else (out,)
        result = out if is_tuple else out[0]
        if not want_delta:
            return result
        return result, self.owner.compute_convergence_delta(
            result, base, parts, c.target, c.additional_forward_args)


class LayerDeepLift(LayerAttribution, DeepLift):
    """Captum's ``LayerDeepLift``: the native DeepLift with ``layer=``."""

    def __init__(self, model, layer, multiply_by_inputs: bool = True) -> None:
        DeepLift.__init__(self, model, multiply_by_inputs)
        self.layer = layer
        self.device_ids = None

    def attribute(self, inputs, baselines=None, target=None, additional_forward_args=None,
                  return_convergence_delta: bool = False, attribute_to_layer_input: bool = False,
                  custom_attribution_func=None, grad_kwargs=None):
        _grad_kwargs(grad_kwargs)
        return self._call(inputs, baselines, target, additional_forward_args,
                          return_convergence_delta, custom_attribution_func, layer=self.layer,
                          attribute_to_layer_input=attribute_to_layer_input).run()


def _rows(value, n: int):
    """Captum's expansion of a per-sample value to ``n`` rows per sample (sample-major)."""
    if isinstance(value, torch.Tensor) and value.dim() >= 1:
        return value.repeat_interleave(n, 0)
    if isinstance(value, tuple):
        return tuple(_rows(v, n) for v in value)
    if isinstance(value, list) and value and isinstance(value[0], (int, tuple)):
        return [v for v in value for _ in range(n)]
    return value


def _reference_tuple(baselines, parts, what: str) -> tuple:
    """Captum's reference batch: one tensor ``[N, ...]`` per input (a callable is called)."""
    if callable(baselines):  # Captum calls it without arguments when it takes none
        takes = len(inspect.signature(baselines).parameters)
        baselines = baselines() if takes == 0 else (
            baselines(*parts) if len(parts) > 1 else baselines(parts[0]))
    refs, _ = as_tuple(baselines, "baselines")
    if len(refs) != len(parts):
        raise ValueError(f"baselines must give one reference tensor per input ({len(parts)}) "
                         f"for {what}, got {len(refs)}")
    return refs


class DeepLiftShap(DeepLift):
    """Captum's ``DeepLiftShap``: :class:`taylorattr.methods.DeepLiftShap` over every
    reference row; the delta ``[B * N]`` is DeepLIFT's on each (sample, reference) pair."""

    def __init__(self, model, multiply_by_inputs: bool = True) -> None:
        super().__init__(model, multiply_by_inputs)
        self._native = native.DeepLiftShap(model)

    def _call(self, inputs, baselines=None, target=None, additional_forward_args=None,
              return_convergence_delta: bool = False, custom_attribution_func=None, *,
              layer=None, attribute_to_layer_input: bool = False):
        parts, is_tuple = as_tuple(inputs)
        refs = _reference_tuple(baselines, parts, "DeepLiftShap")
        options = {"multiply_by_inputs": self._multiply_by_inputs}
        if layer is not None:
            options.update(layer=layer, attribute_to_layer_input=attribute_to_layer_input)
        n = refs[0].shape[0]
        rows = tuple(p.repeat_interleave(n, 0) for p in parts)
        tiled = tuple(r.repeat((p.shape[0],) + (1,) * (r.dim() - 1)) for r, p in zip(refs, parts))
        pairs = DeepLift._call(self, rows if is_tuple else rows[0],
                               tiled if is_tuple else tiled[0], _rows(target, n),
                               _rows(additional_forward_args, n), True, custom_attribution_func,
                               layer=layer, attribute_to_layer_input=attribute_to_layer_input)
        if custom_attribution_func is not None or layer is not None or return_convergence_delta:
            # Captum's mean over the pairs' attributions, whose delta is the pairs' own (a
            # layer's references: each pair's own, which may depend on the sample's
            # additional arguments)
            return _PairMean(pairs, parts[0].shape[0], n, return_convergence_delta)
        dist = refs if is_tuple else refs[0]
        return Call(self._native, inputs, ReferenceSet(dist) if isinstance(dist, torch.Tensor)
                    else dist, target, additional_forward_args, False, options)

    def attribute(self, inputs, baselines=None, target=None, additional_forward_args=None,
                  return_convergence_delta: bool = False, custom_attribution_func=None):
        return self._call(inputs, baselines, target, additional_forward_args,
                          return_convergence_delta, custom_attribution_func).run()


class _PairMean:
    """The attributions of the (sample, reference) pairs averaged per sample; the delta of
    every pair."""

    def __init__(self, pairs, batch: int, n: int, want_delta: bool):
        self.pairs, self.batch, self.n, self.want_delta = pairs, batch, n, want_delta

    def run(self):
        attrs, delta = self.pairs.run()
        parts, is_tuple = as_tuple(attrs)
        mean = tuple(a.reshape((self.batch, self.n) + tuple(a.shape[1:])).mean(1) for a in parts)
        result = mean if is_tuple else mean[0]
        return (result, delta) if self.want_delta else result


class _Both:
    """The attributions of one call and the (per-row) delta of another."""

    def __init__(self, attributions: Call, delta: Call):
        self.attributions, self.delta_call = attributions, delta

    def run(self):
        return self.attributions.run(), self.delta_call.run()[1]


class LayerDeepLiftShap(LayerAttribution, DeepLiftShap):
    """Captum's ``LayerDeepLiftShap``: the native DeepLiftShap with ``layer=``, the
    references mapped to the layer."""

    def __init__(self, model, layer, multiply_by_inputs: bool = True) -> None:
        DeepLiftShap.__init__(self, model, multiply_by_inputs)
        self.layer = layer
        self.device_ids = None

    def attribute(self, inputs, baselines=None, target=None, additional_forward_args=None,
                  return_convergence_delta: bool = False, attribute_to_layer_input: bool = False,
                  custom_attribution_func=None):
        return self._call(inputs, baselines, target, additional_forward_args,
                          return_convergence_delta, custom_attribution_func, layer=self.layer,
                          attribute_to_layer_input=attribute_to_layer_input).run()


def _captum_draws(parts, refs, n_samples: int, stdevs):
    """Captum's GradientShap draws for every sample: ``(noise, references, alphas)``, the
    first two one ``[B, n, ...]`` per input, ``alphas`` ``[B * n]`` (sample-major): the
    reference of every input chosen separately (one ``np.random.choice`` each), the noise
    by ``torch.normal``, the path positions by ``np.random.uniform``."""
    batch = parts[0].shape[0]
    picked = tuple(r[torch.as_tensor(np.random.choice(r.shape[0], n_samples * batch),
                                     device=r.device)]
                   .reshape((batch, n_samples) + tuple(r.shape[1:])) for r in refs)
    noise = captum_noise(parts, stdevs, n_samples)
    # the dtype of the noisy input, as Captum's (an integer input plus float noise: float)
    alphas = torch.tensor(np.random.uniform(0.0, 1.0, batch * n_samples),
                          dtype=torch.result_type(parts[0], noise[0]), device=parts[0].device)
    return tuple(z.to(torch.result_type(p, z)) for z, p in zip(noise, parts)), picked, alphas


class GradientShap(GradientAttribution):
    """Captum's ``GradientShap``: :class:`taylorattr.methods.GradientShap` with Captum's
    draws (references by ``np.random.choice``, separately for every input of a tuple, input
    noise by ``torch.normal``, path positions by ``np.random.uniform``); the delta ``[B * n_samples]`` is that of every draw
    (the method on the draw's noisy input with that one draw)."""

    def __init__(self, forward_func, multiply_by_inputs: bool = True) -> None:
        super().__init__(forward_func)
        self._multiply_by_inputs = multiply_by_inputs
        self._native = native.GradientShap(forward_func)

    def _draws(self, parts, refs, n_samples, stdevs, flat: bool):
        batch = parts[0].shape[0]
        noise, picked, alphas = _captum_draws(parts, refs, n_samples, stdevs)
        if flat:
            def join(ts):
                return torch.cat([t.reshape(batch, n_samples, -1) for t in ts], 2)
            return GSDraws(join(noise), join(picked), alphas.view(batch, n_samples))
        return GSDraws(noise[0], picked[0], alphas.view(batch, n_samples))

    def _call(self, inputs, baselines, n_samples: int = 5, stdevs=0.0, target=None,
              additional_forward_args=None, return_convergence_delta: bool = False):
        parts, _ = as_tuple(inputs)
        refs = _reference_tuple(baselines, parts, "GradientShap")
        options = {"multiply_by_inputs": self._multiply_by_inputs}
        flat = len(parts) > 1 or parts[0].dim() == 1
        draws = self._draws(parts, refs, n_samples, stdevs, flat)
        call = Call(self._native, inputs, None, target, additional_forward_args, False,
                    {**options, "draws": draws})
        if not return_convergence_delta:
            return call
        return _Both(call, self._per_draw(inputs, draws, n_samples, target,
                                          additional_forward_args, options))

    def _per_draw(self, inputs, draws, n, target, extra, options):
        """Every draw as its own call: the noisy input with that draw (zero noise)."""
        parts, is_tuple = as_tuple(inputs)
        batch = parts[0].shape[0]
        sizes = [p[0].numel() for p in parts]
        noise = draws.noise.reshape(batch, n, -1).split(sizes, 2) if len(parts) > 1 or \
            parts[0].dim() == 1 else (draws.noise,)
        noisy = tuple(p.repeat_interleave(n, 0) + z.reshape((batch * n,) + tuple(p.shape[1:]))
                      for p, z in zip(parts, noise))
        one = GSDraws(torch.zeros_like(draws.noise).reshape((batch * n, 1) +
                                                            tuple(draws.noise.shape[2:])),
                      draws.baselines.reshape((batch * n, 1) + tuple(draws.baselines.shape[2:])),
                      draws.alphas.reshape(batch * n, 1))
        return Call(self._native, noisy if is_tuple else noisy[0], None, _rows(target, n),
                    _rows(extra, n), True, {**options, "draws": one})

    def attribute(self, inputs, baselines, n_samples: int = 5, stdevs=0.0, target=None,
                  additional_forward_args=None, return_convergence_delta: bool = False):
        return self._call(inputs, baselines, n_samples, stdevs, target, additional_forward_args,
                          return_convergence_delta).run()


class LayerGradientShap(LayerAttribution, GradientShap):
    """Captum's ``LayerGradientShap``: for every draw (noisy input ``x'``, reference ``x~``,
    position ``alpha``: Captum's draws) the layer's gradient at the input-space point
    ``x~ + alpha (x' - x~)`` (:class:`taylorattr.methods.Saliency` with ``layer=``, signed)
    times ``h(x') - h(x~)`` (``multiply_by_inputs``), averaged over the draws; the delta
    ``[B * n_samples]`` of every draw. Captum interpolates in the input space here (its
    ``LayerIntegratedGradients`` in the layer's); so does this class."""

    def __init__(self, forward_func, layer, device_ids=None,
                 multiply_by_inputs: bool = True) -> None:
        GradientShap.__init__(self, forward_func, multiply_by_inputs)
        self.layer = layer
        self.device_ids = device_ids
        self._gradient = native.Saliency(forward_func)

    def attribute(self, inputs, baselines, n_samples: int = 5, stdevs=0.0, target=None,
                  additional_forward_args=None, return_convergence_delta: bool = False,
                  attribute_to_layer_input: bool = False):
        parts, is_tuple = as_tuple(inputs)
        refs = _reference_tuple(baselines, parts, "LayerGradientShap")
        n, batch = n_samples, parts[0].shape[0]
        noise, picked, alphas = _captum_draws(parts, refs, n, stdevs)

        def rows(ts):
            return tuple(t.reshape((batch * n,) + tuple(t.shape[2:])) for t in ts)

        noisy = tuple(p.repeat_interleave(n, 0) + z for p, z in zip(parts, rows(noise)))
        base = rows(picked)
        points = tuple(a * x + (1.0 - a) * b for x, b, a in
                       ((x, b, alphas.view((-1,) + (1,) * (b.dim() - 1)))
                        for x, b in zip(noisy, base)))  # Captum's expression and rounding
        target_n, extra_n = _rows(target, n), _rows(additional_forward_args, n)
        grads = Call(self._gradient, points if is_tuple else points[0], None, target_n,
                     extra_n, False, {"abs": False, "layer": self.layer,
                                      "attribute_to_layer_input": attribute_to_layer_input}
                     ).run()
        grads, layer_tuple = as_tuple(grads)
        attrs = grads
        if self._multiply_by_inputs:
            h = as_tuple(layer_inputs(self.forward_func, self.layer, noisy, extra_n,
                                      attribute_to_layer_input))[0]
            h_ref = as_tuple(layer_inputs(self.forward_func, self.layer, base, extra_n,
                                          attribute_to_layer_input))[0]
            attrs = tuple(g * (a - r) for g, a, r in zip(grads, h, h_ref))
        mean = tuple(a.reshape((batch, n) + tuple(a.shape[1:])).mean(1) for a in attrs)
        result = mean if layer_tuple else mean[0]
        if not return_convergence_delta:
            return result
        per_draw = attrs if layer_tuple else attrs[0]
        delta = self.compute_convergence_delta(per_draw, base if is_tuple else base[0],
                                               noisy if is_tuple else noisy[0], target_n,
                                               extra_n)
        return result, delta


class LayerConductance(LayerAttribution, GradientAttribution):
    """Captum's ``LayerConductance``: :class:`taylorattr.methods.LayerConductance`."""

    def __init__(self, forward_func, layer, device_ids=None) -> None:
        super().__init__(forward_func, layer, device_ids)
        self._native = native.LayerConductance(forward_func)
        self._multiply_by_inputs = True

    def attribute(self, inputs, baselines=None, target=None, additional_forward_args=None,
                  n_steps: int = 50, method: str = "gausslegendre", internal_batch_size=None,
                  return_convergence_delta: bool = False, attribute_to_layer_input: bool = False,
                  grad_kwargs=None):
        _grad_kwargs(grad_kwargs)
        return Call(self._native, inputs, baselines, target, additional_forward_args,
                    return_convergence_delta,
                    {"conductance_layer": self.layer, "layer_input": attribute_to_layer_input,
                     "n_steps": n_steps, "method": method,
                     "internal_batch_size": internal_batch_size}).run()
