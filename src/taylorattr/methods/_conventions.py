"""Calls a method's arithmetic does not see: integer inputs, outputs beyond ``[B, C]`` with
tuple targets, and models whose output is one value for the whole batch.

Every method computes on float rows and explains one scalar per row
(:mod:`taylorattr.methods._base`). Three conventions of Captum users are mapped onto that
here, once for all methods, by wrapping the model for the call:

* **Integer and bool inputs** (token ids, categorical features), perturbation methods only
  (:attr:`~taylorattr.methods.AttributionMethod.perturbation`: they only put input or
  baseline values into copies). The inputs are carried as float64 (exact for integers up to
  ``2**53``) and cast back to their dtype in every model call, so the model sees exactly the
  values it would; attributions have the model output's dtype (integer outputs are carried
  as float64 and their drops, exact integers, cast back, as Captum returns them).
* **Outputs beyond two dimensions** ``[B, d_1, ..., d_k]``: the model is seen with its output
  flattened to ``[B, d_1 * ... * d_k]`` and a target ``(i_1, ..., i_k)`` (or a list of such
  tuples, one per sample) becomes the flat column ``ravel_multi_index((i_1, ..., i_k))``.
* **Aggregate outputs** (Captum's aggregate mode of the perturbation methods): a model whose
  output for the batch ``X = (x_1, ..., x_B)`` is a scalar or a tensor of ``k`` values that is
  not one row per sample, ``g(X)``. A feature ``j`` (or group, or window) is then removed in
  every sample at once,

      a_{o, j} = g_o(X) - g_o(X with feature j := baseline in every sample),

  for each of the ``k`` outputs ``o``; attributions are ``[k, *feature shape]`` (``[1, ...]``
  for a scalar), as Captum's. The method runs on the whole batch as one sample ``[1, B, ...]``
  whose groups span the batch axis, one model call per occluded copy of the batch.
  ``target`` must be None; masks must be shared by the samples (first dimension 1); no
  convergence delta. A model returning ``[B]`` or ``[B, C]`` is read per sample (for
  ``B = 1`` both readings agree). The mode is entered when the per-sample call refuses the
  output (no extra forward pass for per-sample models).

Inputs ``[B]`` (one feature per sample) need no wrapper: :class:`~taylorattr.inputs.Layout`
shows them to the method as ``[B, 1]``.
"""
from __future__ import annotations

import numpy as np
import torch
from torch import nn

from .._validation import check_inputs, flat_target, tuple_target
from ..groups import window_shape
from ..inputs import (
    ModelWrapper,
    as_tuple,
    check_additional_args,
    check_batch,
    follow_mode,
    point_baselines,
)

__all__ = ["adapt", "after_refusal"]

_EXACT = 2 ** 53


def _discrete(t: torch.Tensor) -> bool:
    return not (t.is_floating_point() or t.is_complex())


def adapt(method, inputs, baselines, target, extra, layer, options, want_delta):
    """A :class:`_Call` running ``method`` through a wrapped model, or None when the call
    needs no wrapper. The model runs once here (probe) only when a convention may apply."""
    if getattr(method, "_adapting", False):
        return None
    parts, is_tuple = as_tuple(inputs)
    discrete = layer is None and any(_discrete(p) for p in parts)
    ragged = len({p.shape[0] if p.dim() else None for p in parts}) > 1
    if not (discrete or ragged or tuple_target(target)):
        return None  # a whole-batch output is found when the call refuses it (:func:`after_refusal`)
    if discrete and not method.perturbation:
        i = next(i for i, p in enumerate(parts) if _discrete(p))
        name = f"inputs[{i}]" if is_tuple else "inputs"
        raise TypeError(f"{name} must be float32/float64 for {type(method).__name__} (it "
                        "differentiates the model or follows its layers); integer and bool "
                        "inputs are taken by the perturbation methods (Occlusion, "
                        "ShapleyValues, KernelShap, Lime); for token ids attribute to the "
                        "embedding with layer=")
    for i, p in enumerate(parts):
        if _discrete(p) and p.dtype != torch.bool and p.numel() and int(p.abs().max()) >= _EXACT:
            raise ValueError(f"inputs[{i}] holds integers beyond 2**53, which float64 cannot "
                             "carry exactly")
    try:
        batch, uneven = check_batch(parts, floats=False), None
    except ValueError as exc:  # inputs of different lengths: only a whole-batch output reads them
        if not (method.perturbation and layer is None) or parts[0].dim() == 0:
            raise
        batch, uneven = parts[0].shape[0], exc
    extra_t = check_additional_args(extra, batch)
    try:
        with torch.no_grad():
            out = method._model(*parts, *extra_t)
    except (RuntimeError, IndexError) as exc:
        raise ValueError(
            f"model failed on inputs of dtype(s) {', '.join(str(p.dtype) for p in parts)} "
            f"(integer and bool inputs reach the model as they are: does it take them?): "
            f"{type(exc).__name__}: {exc}") from exc
    if not isinstance(out, torch.Tensor):
        return None  # model_output refuses it with its message
    aggregate = method.perturbation and layer is None and (out.dim() == 0 or out.shape[0] != batch)
    if aggregate:
        return _Aggregate(parts, is_tuple, baselines, target, extra_t, options, out, want_delta)
    if uneven is not None:
        raise uneven
    flat = out.dim() > 2
    if flat or tuple_target(target):
        target = flat_target(target, out)
    if not (discrete or flat):
        return None
    return _Call(parts, is_tuple, baselines, target, extra, layer, options, discrete, flat,
                 out.dtype, want_delta)


def after_refusal(method, inputs, baselines, target, extra, layer, options, want_delta):
    """After a call refused the model's output: the call through the convention that reads
    it (one row per sample beyond ``[B, C]``: flattened; not one row per sample and a
    perturbation method: aggregate mode), or None (the refusal stands)."""
    if getattr(method, "_adapting", False) or layer is not None:
        return None
    parts, is_tuple = as_tuple(inputs)
    if not all(isinstance(p, torch.Tensor) and p.dim() for p in parts):
        return None
    try:  # the original error stands if the model cannot run on the inputs at all
        extra_t = check_additional_args(extra, parts[0].shape[0])
        with torch.no_grad():
            out = method._model(*parts, *extra_t)
    except Exception:  # noqa: BLE001
        return None
    if not isinstance(out, torch.Tensor):
        return None
    if out.dim() > 2 and out.shape[0] == parts[0].shape[0]:
        return _Call(parts, is_tuple, baselines, flat_target(target, out), extra, None,
                     options, flat=True, out_dtype=out.dtype, want_delta=want_delta)
    if method.perturbation and (out.dim() == 0 or out.shape[0] != parts[0].shape[0]):
        return _Aggregate(parts, is_tuple, baselines, target, extra_t, options, out, want_delta)
    return None


class _Recast(ModelWrapper):
    """The model seen by the method: its first ``len(dtypes)`` arguments cast back to their
    dtypes (None: unchanged), its output flattened to ``[B, -1]`` when ``flat``."""

    def __init__(self, model, dtypes: tuple, flat: bool):
        super().__init__(model)
        self.dtypes = dtypes
        self.flat = flat

    def forward(self, *args):
        cast = tuple(a if d is None else a.to(d) for a, d in zip(args, self.dtypes))
        out = self.model(*cast, *args[len(cast):])
        if isinstance(out, torch.Tensor) and not (out.is_floating_point() or out.is_complex()):
            out = out.double()  # integer outputs of integer inputs: exact in float64
        return out.flatten(1) if self.flat else out


class _Call:
    """The method run through :class:`_Recast` (discrete inputs carried as float64)."""

    def __init__(self, parts, is_tuple, baselines, target, extra, layer, options,
                 discrete=False, flat=False, out_dtype=None, want_delta=False):
        self.parts = tuple(p.double() if discrete and _discrete(p) else p for p in parts)
        # every input cast back to its dtype: a method joining a float32 input with the
        # float64 carrier of an integer one hands both back as float64
        self.dtypes = tuple(p.dtype if discrete else None for p in parts)
        self.carried = tuple(discrete and _discrete(p) for p in parts)
        self.is_tuple, self.baselines, self.target = is_tuple, baselines, target
        self.extra, self.layer, self.options = extra, layer, options
        self.flat, self.discrete, self.out_dtype = flat, discrete, out_dtype
        self.want_delta = want_delta

    def inputs(self):
        return self.parts if self.is_tuple else self.parts[0]

    def run(self, method, show_progress):
        options = {**self.options, "additional_forward_args": self.extra, "layer": self.layer}
        wrap = self.discrete or self.flat
        model = method._model
        method._adapting = True
        if wrap:
            method._model = _Recast(model, self.dtypes, self.flat)
        try:
            ex = method._run(self.inputs(), self.baselines, self.target, options, show_progress,
                             self.want_delta)
        finally:
            method._model = model
            method._adapting = False
        if not self.discrete:
            return ex
        attr = ex.attributions
        parts = attr if isinstance(attr, tuple) else (attr,)
        parts = tuple(a.to(self.out_dtype if c else d)
                      for a, c, d in zip(parts, self.carried, self.dtypes))
        return type(ex)(parts if isinstance(attr, tuple) else parts[0], ex.references,
                        ex.output, ex.target, ex.delta, ex.delta_of)


class _WholeBatch(nn.Module):
    """``g(X)`` seen as a model of one row per copy of the batch: rows ``[R, B, ...]`` (each
    input), one call of the user's model per row, outputs ``[R, k]`` (``[R]`` for ``k = 1``)."""

    def __init__(self, model, shapes, dtypes, extra, k):
        super().__init__()
        follow_mode(self, model)
        self.inner = _Recast(model, dtypes, False)
        self.shapes, self.extra, self.k = shapes, extra, k

    def forward(self, *rows):
        outs = []
        for r in range(rows[0].shape[0]):
            args = tuple(z[r].reshape((z.shape[1],) + s) for z, s in zip(rows, self.shapes))
            outs.append(self.inner(*args, *self.extra).reshape(-1))
        out = torch.stack(outs)
        if out.shape[1] != self.k:
            raise ValueError(f"model returned {out.shape[1]} values for an occluded copy of "
                             f"the batch but {self.k} for the batch itself")
        return out[:, 0] if self.k == 1 else out


class _Aggregate:
    """Captum's aggregate mode (module docstring)."""

    def __init__(self, parts, is_tuple, baselines, target, extra, options, out, want_delta):
        if target is not None:
            raise ValueError("target must be None for a model whose output is not one row per "
                             f"sample (it returned shape {tuple(out.shape)} for "
                             f"{parts[0].shape[0]} samples): every output value is explained")
        if want_delta:
            raise ValueError("return_convergence_delta is not available for a model whose "
                             "output is not one row per sample (aggregate mode)")
        if out.is_complex():
            raise TypeError(f"model must return a real tensor, got dtype {out.dtype}")
        self.dtype = out.dtype  # of the attributions (exact drops of an integer output)
        out = out if out.is_floating_point() else out.double()  # as _Recast carries it
        self.parts, self.is_tuple = parts, is_tuple
        self.baselines, self.extra, self.options, self.out = baselines, extra, options, out

    def run(self, method, show_progress):
        parts = self.parts  # each input's own length (the batch axis need not agree)
        shapes = tuple(tuple(p.shape[1:]) for p in parts)
        dtypes = tuple(p.dtype for p in parts)  # cast back (see _Call)
        floats = tuple(p.double() if _discrete(p) else p for p in parts)
        for i, f in enumerate(floats):
            check_inputs(f.reshape(f.shape[0], -1), "inputs" if len(parts) == 1 else f"inputs[{i}]")
        whole = tuple(f.reshape((1, f.shape[0]) + (s or (1,))) for f, s in zip(floats, shapes))
        base = point_baselines(0.0 if self.baselines is None else self.baselines, floats)
        base = tuple(b.reshape(w.shape) for b, w in zip(base, whole))
        k = self.out.numel()
        options = self._options(method, shapes)
        model = method._model
        method._model = _WholeBatch(model, shapes, dtypes, self.extra, k)
        method._adapting = True
        try:
            per_output = []
            for o in range(k):
                ex = method._run(whole if self.is_tuple else whole[0],
                                 base if self.is_tuple else base[0], None if k == 1 else o,
                                 options, show_progress, False)
                attr = ex.attributions if self.is_tuple else (ex.attributions,)
                per_output.append(attr)
        finally:
            method._model = model
            method._adapting = False
        result = tuple(torch.stack([a[i][0, 0].reshape(s) for a in per_output]).to(self.dtype)
                       for i, s in enumerate(shapes))
        return type(ex)(result if self.is_tuple else result[0], None,  # an Explanation
                        self.out.detach().reshape(-1), None, None)

    def _options(self, method, shapes):
        """Masks and windows spanning the batch axis: masks ``[1, ...]`` gain a batch axis of
        1; an int window becomes its tuple; without a mask or window every feature is a
        player shared by the samples."""
        options = dict(self.options)
        mask = options.get("feature_mask")
        if mask is not None:
            masks = mask if isinstance(mask, (tuple, list)) else (mask,)
            for m in masks:
                if isinstance(m, torch.Tensor) and m.dim() == len(shapes[0]) + 1 and m.shape[0] > 1:
                    raise ValueError("feature_mask must be shared by the samples (first "
                                     "dimension 1) for a model whose output is not one row "
                                     "per sample")
            lifted = tuple(m.reshape((1, 1) + (tuple(m.shape[1:]) or (1,)))
                           if isinstance(m, torch.Tensor) else m for m in masks)
            options["feature_mask"] = lifted if isinstance(mask, (tuple, list)) else lifted[0]
        elif "patch" in options or ("patch" in method.options()
                                    and method.options()["patch"].default is not None):
            for key in ("patch", "stride"):
                value = options.get(key, method.options()[key].default)
                if isinstance(value, int) and not isinstance(value, bool):
                    options[key] = window_shape(value, max(1, len(shapes[0])))
        elif "feature_mask" in method.options():
            ids, offset = [], 0
            for s in shapes:
                n = int(np.prod(s)) if s else 1
                ids.append(torch.arange(offset, offset + n, device="cpu").reshape((1, 1) + (s or (1,))))
                offset += n
            options["feature_mask"] = tuple(ids) if self.is_tuple else ids[0]
        return options
