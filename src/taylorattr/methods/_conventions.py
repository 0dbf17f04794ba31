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
  ``B = 1`` both readings agree).

Which convention applies is decided once per call from the inputs' dtypes and the shape of
the model's output at the inputs, from the one forward every call runs to resolve the
target (:meth:`~taylorattr.methods.AttributionMethod.prepare`): no call is retried.

Inputs ``[B]`` (one feature per sample) need no wrapper: :class:`~taylorattr.inputs.Layout`
shows them to the method as ``[B, 1]``.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import torch
from torch import nn

from .._validation import check_inputs
from ..groups import window_shape
from ..inputs import ModelWrapper, follow_mode, point_baselines

__all__ = ["Aggregate", "Reading", "check_discrete", "discrete", "lift_options", "run_aggregate"]

_EXACT = 2 ** 53


def discrete(t: torch.Tensor) -> bool:
    """Integer or bool (not float, not complex)."""
    return not (t.is_floating_point() or t.is_complex())


def check_discrete(method, parts: tuple, is_tuple: bool) -> None:
    """Integer and bool inputs: perturbation methods only, integers float64 carries exactly."""
    if not method.perturbation:
        i = next(i for i, p in enumerate(parts) if discrete(p))
        name = f"inputs[{i}]" if is_tuple else "inputs"
        raise TypeError(f"{name} must be float32/float64 for {type(method).__name__} (it "
                        "differentiates the model or follows its layers); integer and bool "
                        "inputs are taken by the perturbation methods (Occlusion, "
                        "ShapleyValues, KernelShap, Lime); for token ids attribute to the "
                        "embedding with layer=")
    for i, p in enumerate(parts):
        if discrete(p) and p.dtype != torch.bool and p.numel() and int(p.abs().max()) >= _EXACT:
            raise ValueError(f"inputs[{i}] holds integers beyond 2**53, which float64 cannot "
                             "carry exactly")


@dataclass(frozen=True)
class Reading:
    """The model's output at the inputs as a call reads it: ``aggregate`` (one output for
    the whole batch), else the resolved ``target``, the explained ``fx`` ``[B]``, whether the
    output is seen ``flat`` and the inputs carried from integers (``discrete``)."""

    out: torch.Tensor
    target: torch.Tensor | None = None
    fx: torch.Tensor | None = None
    flat: bool = False
    discrete: bool = False
    aggregate: bool = False

    def wrap(self, model, dtypes: tuple):
        """``model`` as the method's passes see it: integer inputs cast back to ``dtypes``,
        the output flattened; the model itself when neither applies."""
        return _Recast(model, dtypes, self.flat) if self.flat or self.discrete else model


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


@dataclass(frozen=True)
class Aggregate:
    """Captum's aggregate mode (module docstring): the user's ``model``, the inputs as given
    (each its own length), their ``baselines``, the tensors of ``extra`` and ``out``, the
    model's output for the whole batch (integers carried as float64), ``dtype`` that of the
    attributions."""

    model: object
    parts: tuple
    is_tuple: bool
    baselines: object
    extra: tuple
    out: torch.Tensor
    dtype: torch.dtype

    @classmethod
    def of(cls, model, parts, is_tuple, baselines, extra, out, target,
           want_delta) -> Aggregate:
        if target is not None:
            raise ValueError("target must be None for a model whose output is not one row per "
                             f"sample (it returned shape {tuple(out.shape)} for "
                             f"{parts[0].shape[0]} samples): every output value is explained")
        if want_delta:
            raise ValueError("return_convergence_delta is not available for a model whose "
                             "output is not one row per sample (aggregate mode)")
        if out.is_complex():
            raise TypeError(f"model must return a real tensor, got dtype {out.dtype}")
        dtype = out.dtype  # of the attributions (exact drops of an integer output)
        out = (out if out.is_floating_point() else out.double()).detach()
        return cls(model, parts, is_tuple, baselines, extra, out, dtype)


def run_aggregate(method, call):
    """The attributions of an aggregate-mode call: the method on the whole batch as one
    sample ``[1, B, ...]`` (its groups spanning the batch axis) through :class:`_WholeBatch`,
    once per output value ``o`` (target ``o``)."""
    agg = call.aggregate
    parts = agg.parts  # each input's own length (the batch axis need not agree)
    shapes = tuple(tuple(p.shape[1:]) for p in parts)
    dtypes = tuple(p.dtype for p in parts)  # cast back (see _Recast)
    floats = tuple(p.double() if discrete(p) else p for p in parts)
    for i, f in enumerate(floats):
        check_inputs(f.reshape(f.shape[0], -1), "inputs" if len(parts) == 1 else f"inputs[{i}]")
    whole = tuple(f.reshape((1, f.shape[0]) + (s or (1,))) for f, s in zip(floats, shapes))
    base = point_baselines(0.0 if agg.baselines is None else agg.baselines, floats)
    base = tuple(b.reshape(w.shape) for b, w in zip(base, whole))
    k = agg.out.numel()
    values = agg.out.reshape(1, -1)  # what _WholeBatch returns for the batch as one row
    inner = method.prepare(whole if agg.is_tuple else whole[0],
                           base if agg.is_tuple else base[0], None,
                           options=lift_options(method, call.options, shapes, agg.is_tuple),
                           show_progress=call.show_progress,
                           model=_WholeBatch(agg.model, shapes, dtypes, agg.extra, k),
                           output=values[:, 0] if k == 1 else values)
    values = values[0].to(inner.fx.dtype)
    per_output = []
    for o in range(k):
        t = None if k == 1 else torch.full((1,), o, dtype=torch.long, device=inner.fx.device)
        ex = method.run(replace(inner, target=t, fx=values[o:o + 1]))
        per_output.append(ex.attributions if agg.is_tuple else (ex.attributions,))
    result = tuple(torch.stack([a[i][0, 0].reshape(s) for a in per_output]).to(agg.dtype)
                   for i, s in enumerate(shapes))
    return type(ex)(result if agg.is_tuple else result[0], None,  # an Explanation
                    agg.out.reshape(-1), None, None)


def lift_options(method, options, shapes, is_tuple):
    """Masks and windows spanning the batch axis: masks ``[1, ...]`` gain a batch axis of
    1; an int window becomes its tuple; without a mask or window every feature is a
    player shared by the samples."""
    options = dict(options)
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
        options["feature_mask"] = tuple(ids) if is_tuple else ids[0]
    return options
