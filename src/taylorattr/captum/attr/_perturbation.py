"""Captum's perturbation methods over the native ones: Occlusion, FeatureAblation,
LayerFeatureAblation, ShapleyValueSampling, ShapleyValues, KernelShap.

Captum's ``perturbations_per_eval`` counts perturbed copies of the batch per model call;
the native option counts rows, so it is passed as ``perturbations_per_eval * B`` (it
changes only the speed). Feature masks: Captum's default gives every scalar feature its
own id, numbered across the inputs; masks pass as they are (the native methods take
Captum's forms: one per input, shared or per sample, 0-d).

Why one module: FeatureAblation is the base of Occlusion and FeaturePermutation, Lime of
KernelShap, and all share the mask, player and rows-per-call helpers; split by class they
would import each other both ways.
"""
from __future__ import annotations

import math
import warnings

import torch

from ... import methods as native
from ...inputs import as_tuple
from .._mapping import (
    Call,
    LayerAttribution,
    PerturbationAttribution,
    TensorOutput,
    for_layers,
    future_call,
    global_generator,
    layer_inputs,
    not_offered,
)
from ._lime import (
    LimeBase,
    SkLearnLassoModel,
    default_from_interp_rep_transform,
    default_perturb_func,
    general_lime,
    get_exp_kernel_similarity_function,
)

__all__ = ["FeatureAblation", "FeaturePermutation", "KernelShap", "LayerFeatureAblation",
           "LayerFeaturePermutation", "Lime", "Occlusion", "ShapleyValueSampling",
           "ShapleyValues"]



def _as_output(out) -> torch.Tensor:
    """A forward's output as a tensor: a tensor as it is (on its device), a number or a
    sequence of numbers on the default device (Captum's scalar-returning forwards)."""
    return out if isinstance(out, torch.Tensor) else torch.as_tensor(
        out, device=torch.get_default_device())

def _rows_per_call(perturbations_per_eval: int, inputs) -> int | None:
    if isinstance(perturbations_per_eval, bool) or not isinstance(perturbations_per_eval, int) \
            or perturbations_per_eval < 1:
        raise ValueError(f"perturbations_per_eval must be an int >= 1, got "
                         f"{perturbations_per_eval!r}")
    parts, _ = as_tuple(inputs)
    return perturbations_per_eval * max(1, parts[0].shape[0] if parts[0].dim() else 1)


def default_mask(parts) -> tuple:
    """Captum's default feature mask: every scalar feature its own id, across the inputs."""
    masks, offset = [], 0
    for p in parts:
        n = math.prod(p.shape[1:])
        masks.append((offset + torch.arange(n, device=p.device)).reshape((1,) + tuple(p.shape[1:])))
        offset += n
    return tuple(masks)


def players(feature_mask, parts) -> int:
    """Captum's number of players: the largest id + 1 (every feature alone by default)."""
    if feature_mask is None:
        return sum(math.prod(p.shape[1:]) for p in parts)
    return max(int(m.max()) for m in as_tuple(feature_mask, "feature_mask")[0]) + 1


def _float_where_baseline_is(parts: tuple, baselines, is_tuple: bool):
    """The inputs, an integer input made floating where its baseline is not an integer (a
    float such as 0.2, or a floating tensor): Captum writes the baseline into the ablated
    copies as it is, so ``x = 1`` against a baseline 0.2 gives ``f(1) - f(0.2)``."""
    bases = baselines if isinstance(baselines, tuple) else (baselines,) * len(parts)
    if len(bases) != len(parts):
        return parts if is_tuple else parts[0]
    out = []
    for p, b in zip(parts, bases):
        fractional = (isinstance(b, float) and not b.is_integer()) or \
            (isinstance(b, torch.Tensor) and b.is_floating_point())
        floating = p.is_floating_point() or p.dtype == torch.bool
        out.append(p.to(torch.get_default_dtype()) if fractional and not floating else p)
    return tuple(out) if is_tuple else out[0]


def _one_value_per_batch_needs_one_per_eval(forward, parts: tuple, extra) -> None:
    """Captum's aggregate mode (an output whose first axis is not the batch: one value, or
    a few, for the whole batch) ablates one perturbation per call: refuse
    ``perturbations_per_eval > 1`` there, as Captum does (stacked copies would be read as
    one batch)."""
    extra = () if extra is None else (extra if isinstance(extra, tuple) else (extra,))
    with torch.no_grad():
        out = forward(*parts, *extra)
    batch = parts[0].shape[0] if parts[0].dim() else 1
    if not isinstance(out, torch.Tensor) or out.dim() == 0 or out.shape[0] != batch:
        raise AssertionError("perturbations_per_eval must be 1 when forward_func returns one "
                             "value (or a few) for the whole batch (Captum's aggregate "
                             "mode): pass perturbations_per_eval=1")


class FeatureAblation(PerturbationAttribution):
    """Captum's ``FeatureAblation``: :class:`taylorattr.methods.Occlusion` with
    ``feature_mask`` (every feature alone by default)."""

    def __init__(self, forward_func) -> None:
        super().__init__(forward_func)
        self._native = native.Occlusion(TensorOutput(forward_func))

    def _call(self, inputs, baselines=None, target=None, additional_forward_args=None,
              feature_mask=None, perturbations_per_eval: int = 1, show_progress: bool = False,
              **kwargs):
        if kwargs:
            raise TypeError(f"FeatureAblation.attribute got unexpected keyword argument(s) "
                            f"{sorted(kwargs)}")
        parts, is_tuple = as_tuple(inputs)
        if feature_mask is None:
            feature_mask = default_mask(parts)
            feature_mask = feature_mask if is_tuple else feature_mask[0]
        inputs = _float_where_baseline_is(parts, baselines, is_tuple)
        if perturbations_per_eval > 1:
            _one_value_per_batch_needs_one_per_eval(self._native.model, parts,
                                                    additional_forward_args)
        return Call(self._native, inputs, baselines, target, additional_forward_args, False,
                    {"feature_mask": feature_mask, "show_progress": show_progress,
                     "perturbations_per_eval": _rows_per_call(perturbations_per_eval, inputs)})

    def attribute(self, inputs, baselines=None, target=None, additional_forward_args=None,
                  feature_mask=None, perturbations_per_eval: int = 1, show_progress: bool = False,
                  **kwargs):
        return self._call(inputs, baselines, target, additional_forward_args, feature_mask,
                          perturbations_per_eval, show_progress, **kwargs).run()

    def attribute_future(self, inputs, baselines=None, target=None,
                         additional_forward_args=None, feature_mask=None,
                         perturbations_per_eval: int = 1, show_progress: bool = False,
                         **kwargs):
        """``attribute`` for a ``forward_func`` that returns ``torch.futures.Future``: a
        Future of the attributions (the forwards are waited for in turn)."""
        return future_call(self._native.model, lambda: self.attribute(
            inputs, baselines, target, additional_forward_args, feature_mask,
            perturbations_per_eval, show_progress, **kwargs))


class Occlusion(FeatureAblation):
    """Captum's ``Occlusion``: :class:`taylorattr.methods.Occlusion` with
    ``patch=sliding_window_shapes`` and ``stride=strides`` (windows over every feature
    dimension, overlapping windows averaged, as Captum)."""

    def _call(self, inputs, sliding_window_shapes, strides=None, baselines=None, target=None,
              additional_forward_args=None, perturbations_per_eval: int = 1,
              show_progress: bool = False):
        parts, is_tuple = as_tuple(inputs)
        windows = sliding_window_shapes
        if not is_tuple and not (windows and isinstance(windows[0], (tuple, list))):
            windows = (windows,)  # one input: a window, or a 1-tuple of it (Captum takes both)
        if not (isinstance(windows, tuple) and len(windows) == len(parts)):
            raise ValueError(f"sliding_window_shapes must give one tuple per input "
                             f"({len(parts)}), got {sliding_window_shapes!r}")
        per_input = isinstance(strides, tuple) and strides and (
            is_tuple or isinstance(strides[0], tuple))
        steps = strides if per_input else (strides,) * len(parts)
        for i, (w, p) in enumerate(zip(windows, parts)):
            if len(w) != p.dim() - 1:
                raise ValueError(f"sliding_window_shapes[{i}] must give one size per feature "
                                 f"dimension of the input ({p.dim() - 1}), got {tuple(w)}")
        patch = tuple(tuple(w) or 1 for w in windows)
        stride = tuple(1 if s is None else s for s in steps)
        return Call(self._native, inputs, baselines, target, additional_forward_args, False,
                    {"patch": patch if is_tuple else patch[0],
                     "stride": stride if is_tuple else stride[0], "show_progress": show_progress,
                     "perturbations_per_eval": _rows_per_call(perturbations_per_eval, inputs)})

    def attribute(self, inputs, sliding_window_shapes, strides=None, baselines=None,
                  target=None, additional_forward_args=None, perturbations_per_eval: int = 1,
                  show_progress: bool = False):
        return self._call(inputs, sliding_window_shapes, strides, baselines, target,
                          additional_forward_args, perturbations_per_eval, show_progress).run()

    def attribute_future(self, *args, **kwargs):
        raise NotImplementedError("attribute_future is not implemented for Occlusion")


class LayerFeatureAblation(LayerAttribution, PerturbationAttribution):
    """Captum's ``LayerFeatureAblation``: :class:`taylorattr.methods.Occlusion` with
    ``layer=`` and ``layer_baselines`` in the layer's space (0 by default)."""

    def __init__(self, forward_func, layer, device_ids=None) -> None:
        super().__init__(forward_func, layer, device_ids)
        self._native = native.Occlusion(forward_func)

    def attribute(self, inputs, layer_baselines=None, target=None, additional_forward_args=None,
                  layer_mask=None, attribute_to_layer_input: bool = False,
                  perturbations_per_eval: int = 1):
        def run(layer):
            options = {"layer": layer, "attribute_to_layer_input": attribute_to_layer_input,
                       "layer_baselines": 0.0 if layer_baselines is None else layer_baselines,
                       "perturbations_per_eval": _rows_per_call(perturbations_per_eval,
                                                                inputs)}
            if layer_mask is not None:
                options["feature_mask"] = layer_mask
            else:  # every neuron alone: a window of one element on every axis of the layer
                h, is_tuple = as_tuple(layer_inputs(self.forward_func, layer, inputs,
                                                    additional_forward_args,
                                                    attribute_to_layer_input))
                patches = tuple((1,) * max(1, t.dim() - 1) for t in h)
                options["patch"] = patches if is_tuple else patches[0]
            return Call(self._native, inputs, 0.0, target, additional_forward_args, False,
                        options).run()
        return for_layers(self.layer, run)


def _perturbation(method):
    method.perturbation = True  # integer inputs and aggregate outputs (native conventions)
    return method


class ShapleyValueSampling(PerturbationAttribution):
    """Captum's ``ShapleyValueSampling``: :class:`taylorattr.methods.ShapleyValues` with
    Captum's orders (``torch.randperm`` of the players from the global generator, one per
    sample of ``n_samples``)."""

    _exact = False

    def __init__(self, forward_func) -> None:
        super().__init__(forward_func)
        self._native = _perturbation(native.ShapleyValues(TensorOutput(forward_func)))

    def _call(self, inputs, baselines=None, target=None, additional_forward_args=None,
              feature_mask=None, n_samples: int = 25, perturbations_per_eval: int = 1,
              show_progress: bool = False):
        parts, _ = as_tuple(inputs)
        options = {"show_progress": show_progress, "feature_mask": feature_mask,
                   "perturbations_per_eval": _rows_per_call(perturbations_per_eval, inputs)}
        if self._exact:
            options["method"] = "exact"
        else:
            G = players(feature_mask, parts)
            # Captum's draws, where Captum makes them: on the default device
            where = torch.get_default_device()
            options["permutations"] = torch.stack([torch.randperm(G, device=where)
                                                   for _ in range(n_samples)])
        if target is None:
            extra = additional_forward_args
            extra = () if extra is None else (extra if isinstance(extra, tuple) else (extra,))
            with torch.no_grad():
                out = _as_output(self._native.model(*parts, *extra))
            if out.dim() == 2 and out.shape[0] == parts[0].shape[0] and out.shape[1] > 1:
                # Captum's multi-task output: every column explained, [B, C, ...] (the same
                # orders for each)
                return _Columns([Call(self._native, inputs, baselines, c,
                                      additional_forward_args, False, options)
                                 for c in range(out.shape[1])])
        return Call(self._native, inputs, baselines, target, additional_forward_args, False,
                    options)

    def attribute(self, inputs, baselines=None, target=None, additional_forward_args=None,
                  feature_mask=None, n_samples: int = 25, perturbations_per_eval: int = 1,
                  show_progress: bool = False):
        return self._call(inputs, baselines, target, additional_forward_args, feature_mask,
                          n_samples, perturbations_per_eval, show_progress).run()

    def attribute_future(self, inputs, baselines=None, target=None,
                         additional_forward_args=None, feature_mask=None, n_samples: int = 25,
                         perturbations_per_eval: int = 1, show_progress: bool = False):
        """``attribute`` for a ``forward_func`` that returns ``torch.futures.Future``: a
        Future of the attributions (the forwards are waited for in turn)."""
        return future_call(self._native.model, lambda: self._call(
            inputs, baselines, target, additional_forward_args, feature_mask, n_samples,
            perturbations_per_eval, show_progress).run())


class ShapleyValues(ShapleyValueSampling):
    """Captum's ``ShapleyValues`` (all orders): the native exact enumeration."""

    _exact = True

    def attribute(self, inputs, baselines=None, target=None, additional_forward_args=None,
                  feature_mask=None, perturbations_per_eval: int = 1,
                  show_progress: bool = False):
        return self._call(inputs, baselines, target, additional_forward_args, feature_mask,
                          1, perturbations_per_eval, show_progress).run()


def _lasso(alpha: float):
    """Captum's default interpretable model: scikit-learn's ``Lasso(alpha)`` fitted on
    float32 arrays with the similarities as sample weights (as Captum's ``SkLearnLasso``)."""
    def fit(z, y, weights):
        try:
            from sklearn.linear_model import Lasso  # optional (oracle extra), heavy import
        except ImportError as exc:
            raise ImportError("taylorattr.captum.attr.Lime fits Captum's default model, "
                              "scikit-learn's Lasso: pip install scikit-learn (or the "
                              "taylorattr[oracle] extra)") from exc

        model = Lasso(alpha=alpha).fit(z.float().cpu().numpy(), y.float().cpu().numpy(),
                                       sample_weight=weights.float().cpu().numpy())
        return torch.as_tensor(model.coef_, dtype=torch.float32, device="cpu")
    return fit


def _captum_lasso(model) -> bool:
    """Whether ``model`` is Captum's ``SkLearnLasso(alpha=...)`` (scikit-learn's Lasso and
    nothing else set), which this Lime fits itself."""
    return getattr(model, "sklearn_module", None) == "linear_model.Lasso" and \
        set(getattr(model, "construct_kwargs", {None: 0})) <= {"alpha"}


class Lime(LimeBase):
    """Captum's ``Lime``. With its defaults (uniform coalitions, the cosine exponential
    kernel of width 1, ``Lasso(alpha)``, alpha 0.01 or that of a given Captum
    ``SkLearnLasso(alpha=...)``): :class:`taylorattr.methods.Lime` with Captum's coalition
    draws (``torch.bernoulli`` per draw, sample by sample, then the draws of Captum's fit:
    its data loader's seed and the ``nn.Linear`` it builds). With another
    ``interpretable_model`` (Captum's interface: ``fit(data_loader)``,
    ``representation()``), ``similarity_func`` or ``perturb_func``: Captum's general
    framework (:func:`~taylorattr.captum.attr._lime.general_lime`)."""

    def __init__(self, forward_func, interpretable_model=None, similarity_func=None,
                 perturb_func=None) -> None:
        PerturbationAttribution.__init__(self, forward_func)
        self.interpretable_model, self.similarity_func, self.perturb_func = \
            interpretable_model, similarity_func, perturb_func  # as given (Captum's names)
        self._alpha = 0.01
        if _captum_lasso(interpretable_model):  # Captum's default model, another alpha
            self._alpha = float(interpretable_model.construct_kwargs.get("alpha", 1.0))
            interpretable_model = None
        self._general = any(v is not None for v in
                            (interpretable_model, similarity_func, perturb_func))
        self.perturb_interpretable_space = True
        self.from_interp_rep_transform = default_from_interp_rep_transform
        self.to_interp_rep_transform = None
        self._native = native.Lime(TensorOutput(forward_func))

    def _general_lime(self):
        """A LimeBase on this Lime's settings, the defaults filled in (a fresh default
        model per call)."""
        base = LimeBase.__new__(LimeBase)
        base.__dict__.update(self.__dict__)
        base.interpretable_model = self.interpretable_model or SkLearnLassoModel(self._alpha)
        base.similarity_func = self.similarity_func or get_exp_kernel_similarity_function()
        base.perturb_func = self.perturb_func or default_perturb_func
        base._name = self.get_name()
        return base

    def _call(self, inputs, baselines=None, target=None, additional_forward_args=None,
              feature_mask=None, n_samples: int = 25, perturbations_per_eval: int = 1,
              return_input_shape: bool = True, show_progress: bool = False):
        if return_input_shape is not True:
            raise not_offered("Lime(return_input_shape=False)",
                              "attributions come in the inputs' shape")
        parts, _ = as_tuple(inputs)
        G = players(feature_mask, parts)
        extra = additional_forward_args
        extra = () if extra is None else (extra if isinstance(extra, tuple) else (extra,))
        with torch.no_grad():  # Captum fits one model for a whole-batch (scalar) output
            whole = torch.as_tensor(self.forward_func(*parts, *extra), device="cpu").numel() == 1
        draws = []
        for _ in range(1 if whole else parts[0].shape[0]):
            where = torch.get_default_device()  # Captum's draws, where Captum makes them
            draws.append(torch.cat([torch.bernoulli(torch.ones(1, G, device=where) * 0.5)
                                    for _ in range(n_samples)]))
            torch.empty((), dtype=torch.int64, device=where).random_()  # its data loader seed
            torch.nn.Linear(G, 1, device=where)  # and the surrogate Captum builds after its fit
        options = {"coalitions": torch.stack(draws).bool(),
                   "interpretable_model": _lasso(self._alpha),
                   "show_progress": show_progress,
                   "perturbations_per_eval": _rows_per_call(perturbations_per_eval, inputs)}
        if feature_mask is not None:
            options["feature_mask"] = feature_mask
        return Call(self._native, inputs, baselines, target, additional_forward_args, False,
                    options)

    def attribute(self, inputs, baselines=None, target=None, additional_forward_args=None,
                  feature_mask=None, n_samples: int = 25, perturbations_per_eval: int = 1,
                  return_input_shape: bool = True, show_progress: bool = False, **kwargs):
        if getattr(self, "_general", False):
            return general_lime(self._general_lime(), inputs, baselines, target,
                                additional_forward_args, feature_mask, n_samples,
                                perturbations_per_eval, return_input_shape, show_progress,
                                **kwargs)
        if kwargs:
            raise TypeError(f"{type(self).__name__}.attribute got unexpected keyword "
                            f"argument(s) {sorted(kwargs)} (they go to a custom "
                            "perturb_func or similarity_func)")
        return self._call(inputs, baselines, target, additional_forward_args, feature_mask,
                          n_samples, perturbations_per_eval, return_input_shape,
                          show_progress).run()

    def attribute_future(self, *args, **kwargs):
        raise NotImplementedError(f"attribute_future is not implemented for "
                                  f"{type(self).__name__}")


class KernelShap(Lime):
    """Captum's ``KernelShap``: :class:`taylorattr.methods.KernelShap` with
    ``sampler="captum"`` (Captum's sampling and fit), drawing its coalitions from the
    global torch generator of the default device as Captum does (the same draws after
    ``torch.manual_seed``, on every device: :func:`~taylorattr.captum._mapping.global_generator`). A
    ``Lime``, as Captum's is."""

    def __init__(self, forward_func) -> None:
        PerturbationAttribution.__init__(self, forward_func)
        self._native = _perturbation(native.KernelShap(TensorOutput(forward_func)))

    def _call(self, inputs, baselines=None, target=None, additional_forward_args=None,
              feature_mask=None, n_samples: int = 25, perturbations_per_eval: int = 1,
              return_input_shape: bool = True, show_progress: bool = False):
        parts, is_tuple = as_tuple(inputs)
        # tuple inputs: the features' values in the inputs' shape, read back per player
        players_only = is_tuple and return_input_shape is False
        options = {"n_samples": n_samples, "show_progress": show_progress,
                   "seed": global_generator(), "sampler": "captum",
                   "feature_mask": feature_mask,
                   "return_input_shape": True if players_only else return_input_shape,
                   "perturbations_per_eval": _rows_per_call(perturbations_per_eval, inputs)}
        call = Call(self._native, inputs, baselines, target, additional_forward_args, False,
                    options)
        if not players_only:
            return call
        masks = default_mask(parts) if feature_mask is None else \
            as_tuple(feature_mask, "feature_mask")[0]
        return _PlayerValues(call, masks, players(feature_mask, parts))


def _permute_feature(x: torch.Tensor, feature_mask: torch.Tensor) -> torch.Tensor:
    """Captum's default ``perm_func``: the masked features of ``x`` taken from the samples of
    a ``torch.randperm`` of the batch that is not the identity."""
    n = x.shape[0]
    if n < 2:
        raise ValueError("FeaturePermutation needs at least 2 samples to permute features "
                         "across the batch")
    where = torch.get_default_device()  # Captum's draws, where Captum makes them
    perm = torch.randperm(n, device=where)
    while (perm == torch.arange(n, device=where)).all():
        perm = torch.randperm(n, device=where)
    mask = feature_mask.to(dtype=x.dtype)
    return x[perm] * mask + x * feature_mask.bitwise_not().to(dtype=x.dtype)


def _captum_select(out: torch.Tensor, target) -> torch.Tensor:
    """Captum's target selection: the output itself (None), column ``target`` of every
    sample (an int, a one-element tensor, a tuple indexing the trailing axes), or one column
    per sample (a list or a ``[B]`` tensor)."""
    if target is None:
        return out
    if isinstance(target, torch.Tensor) and target.numel() == 1:
        target = int(target)
    if isinstance(target, int):
        return out[:, target]
    if isinstance(target, tuple):
        return out[(slice(None),) + target]
    if isinstance(target, list) and target and isinstance(target[0], tuple):
        return torch.stack([out[(i,) + t] for i, t in enumerate(target)])
    index = torch.as_tensor(target, device=out.device).long().view(-1, 1)
    return out.gather(1, index).squeeze(1)


def _permutation_importance(evaluate, parts: tuple, masks: tuple, perm_func, is_tuple: bool,
                            min_examples: int | None = 2):
    """Captum's permutation importance: for every feature id ``g`` (ascending), the drop
    ``evaluate(x) - evaluate(x with feature g permuted)``, where ``perm_func(x_i, mask)``
    permutes input ``i`` (drawn for every input holding ``g``, in input order, as Captum
    draws). ``evaluate`` gives the explained outputs flattened, ``[n]``: ``n = B`` for one
    value per sample, 1 for one value of the whole batch (Captum's aggregate mode); input
    ``i``'s attributions are ``[n, *x_i.shape[1:]]``, the drop at the features of each ``g``.
    A group holding an input of fewer than ``min_examples`` rows is skipped (zeros, with a
    warning unless all its inputs are empty), as Captum skips it."""
    with torch.no_grad():
        fx = evaluate(parts)
    totals = [torch.zeros((fx.numel(),) + tuple(p.shape[1:]),
                          dtype=torch.result_type(fx, 1.0), device=fx.device) for p in parts]
    ids = sorted(set().union(*(torch.unique(m).tolist() for m in masks)))
    skipped = []
    for g in ids:
        hits = [m == g for m in masks]
        held = [p for p, h in zip(parts, hits) if bool(h.any())]
        if min_examples is not None and any(p.shape[0] < min_examples for p in held):
            if any(p.numel() for p in held):
                skipped.append(g)
            continue
        permuted = []
        for p, hit in zip(parts, hits):
            if hit.dim() == 0:
                hit = hit.reshape((1,) * max(p.dim(), 1))
            permuted.append(perm_func(p, hit) if bool(hit.any()) else p)
        with torch.no_grad():
            drop = (fx - evaluate(tuple(permuted))).reshape(-1)
        for total, hit in zip(totals, hits):
            where = hit.reshape(hit.shape if hit.dim() else (1,)).to(fx.device)
            drop_rows = drop.view((-1,) + (1,) * (total.dim() - 1))
            total += torch.where(where, drop_rows.to(total.dtype), 0.0)
    if skipped:
        warnings.warn(f"FeaturePermutation skipped feature group(s) {skipped}: they hold an "
                      f"input of fewer than {min_examples} examples, which cannot be permuted "
                      "across the batch; their attributions are 0", stacklevel=4)
    return tuple(totals) if is_tuple else totals[0]


def _captum_forward(forward, target, extra):
    """``evaluate(parts)``: ``forward`` on the inputs and the extra arguments, Captum's
    target selected, flattened."""
    extra = () if extra is None else (extra if isinstance(extra, tuple) else (extra,))

    def evaluate(parts):
        out = _as_output(forward(*parts, *extra))
        return _captum_select(out, target).reshape(-1)
    return evaluate


class FeaturePermutation(FeatureAblation):
    """Captum's ``FeaturePermutation``: permutation feature importance (every feature, or
    group of ``feature_mask``, gets ``f(x) - f(x with it permuted across the batch)``,
    :func:`_permutation_importance`). ``perturbations_per_eval`` changes only the speed (one
    group per call here)."""

    def __init__(self, forward_func, perm_func=_permute_feature) -> None:
        super().__init__(forward_func)
        self.perm_func = perm_func
        self._min_examples_per_batch_grouped = 2

    def attribute(self, inputs, target=None, additional_forward_args=None, feature_mask=None,
                  perturbations_per_eval: int = 1, show_progress: bool = False, **kwargs):
        kwargs.pop("baselines", None)
        if kwargs:
            raise TypeError(f"FeaturePermutation.attribute got unexpected keyword argument(s) "
                            f"{sorted(kwargs)}")
        _rows_per_call(perturbations_per_eval, inputs)
        parts, is_tuple = as_tuple(inputs)
        masks = default_mask(parts) if feature_mask is None else \
            as_tuple(feature_mask, "feature_mask")[0]
        evaluate = _captum_forward(self._native.model, target, additional_forward_args)
        return _permutation_importance(evaluate, parts, masks, self.perm_func, is_tuple,
                                       self._min_examples_per_batch_grouped)

    def attribute_future(self, inputs, target=None, additional_forward_args=None,
                         feature_mask=None, perturbations_per_eval: int = 1,
                         show_progress: bool = False, **kwargs):
        """``attribute`` for a ``forward_func`` that returns ``torch.futures.Future``."""
        return future_call(self._native.model, lambda: self.attribute(
            inputs, target, additional_forward_args, feature_mask, perturbations_per_eval,
            show_progress, **kwargs))


class LayerFeaturePermutation(LayerAttribution, FeaturePermutation):
    """Captum's ``LayerFeaturePermutation``: :class:`FeaturePermutation` of the layer's
    output (``layer_mask`` groups its neurons; every neuron alone by default), the model run
    with the layer's output replaced by the permuted values."""

    def __init__(self, forward_func, layer, device_ids=None) -> None:
        LayerAttribution.__init__(self, forward_func, layer, device_ids)
        self.perm_func = _permute_feature
        self._min_examples_per_batch_grouped = 2

    def attribute(self, inputs, target=None, additional_forward_args=None, layer_mask=None,
                  perturbations_per_eval: int = 1):
        _rows_per_call(perturbations_per_eval, inputs)
        parts, _ = as_tuple(inputs)

        def one(layer):
            h, is_tuple = as_tuple(layer_inputs(self.forward_func, layer, inputs,
                                                additional_forward_args, False))
            masks = default_mask(h) if layer_mask is None else \
                as_tuple(layer_mask, "layer_mask")[0]

            def at_layer(*values):
                # the layer's output replaced by ``values`` while the model runs on the inputs
                swap = values if is_tuple else values[0]
                handle = layer.register_forward_hook(lambda m, i, o: swap)
                try:
                    return self.forward_func(*parts, *values[len(h):])
                finally:
                    handle.remove()
            extra = additional_forward_args
            extra = () if extra is None else (extra if isinstance(extra, tuple) else (extra,))
            evaluate = _captum_forward(at_layer, target, extra)
            return _permutation_importance(evaluate, h, masks, self.perm_func, is_tuple,
                                           self._min_examples_per_batch_grouped)
        return for_layers(self.layer, one)

    def attribute_future(self, *args, **kwargs):
        raise NotImplementedError("attribute_future is not implemented for "
                                  "LayerFeaturePermutation")


class _Columns:
    """Calls of one method on the columns of a ``[B, C]`` output, their attributions stacked
    on a new axis 1 (Captum's multi-task ``[B, C, ...]``)."""

    def __init__(self, calls: list):
        self.calls = calls

    def run(self):
        outs = [c.run() for c in self.calls]
        if isinstance(outs[0], tuple):
            return tuple(torch.stack(parts, 1) for parts in zip(*outs))
        return torch.stack(outs, 1)


class _PlayerValues:
    """Captum's ``return_input_shape=False`` on tuple inputs: one ``[B, G]`` tensor, player
    ``g``'s value read from the features of group ``g`` (each holds it)."""

    def __init__(self, call: Call, masks: tuple, n_players: int):
        self.call, self.masks, self.n_players = call, masks, n_players

    def run(self):
        attrs = self.call.run()
        batch = attrs[0].shape[0]
        out = attrs[0].new_zeros(batch, self.n_players)
        for a, m in zip(attrs, self.masks):
            ids = torch.broadcast_to(m.to(a.device), a.shape).reshape(batch, -1).long()
            out.scatter_(1, ids, a.reshape(batch, -1))
        return out
