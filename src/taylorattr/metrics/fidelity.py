"""Fidelity of a reformulation: percentage change and approximation error (Table 3);
infidelity under perturbations is in :mod:`taylorattr.metrics.perturbation`.

Both are pure functions of tensors that return one value per sample (shape ``[B]``);
tables report the mean over samples. Sign convention as in ``docs/design.md``: attributions
explain the output drop, so a perturbation ``I`` that turns ``x`` into ``x_I`` should
satisfy ``sum(attribution * I) ~= f(x) - f(x_I)``.
"""
from __future__ import annotations

import warnings

import torch

from .._validation import (
    check_inputs,
)

__all__ = ["approximation_error", "percentage_change"]


def _acc_dtype(device: torch.device) -> torch.dtype:
    """float64 accumulation everywhere float64 exists (not on Apple's MPS)."""
    return torch.float32 if device.type == "mps" else torch.float64


def _paired(a: torch.Tensor, b: torch.Tensor, name_a: str, name_b: str):
    """``a`` and ``b`` (same shape, else a ValueError naming both) in the accumulation
    dtype, with the dtype the result is returned in."""
    if a.shape != b.shape:
        raise ValueError(f"{name_a} and {name_b} must have the same shape, got "
                         f"{tuple(a.shape)} and {tuple(b.shape)}")
    acc = a.detach().to(_acc_dtype(a.device))
    return acc, b.detach().to(acc), torch.promote_types(a.dtype, b.dtype)


def _ratio_or_nan(num: torch.Tensor, den: torch.Tensor, what: str, name: str) -> torch.Tensor:
    """``num / den`` per sample; NaN where ``den == 0``, with a warning naming those samples."""
    zero = den == 0
    if zero.any():
        idx = torch.nonzero(zero).flatten().tolist()
        warnings.warn(
            f"{what} is undefined for samples {idx}: {name} is zero there; those entries are "
            "NaN (average the rest with torch.nanmean).",
            RuntimeWarning,
            stacklevel=3,
        )
    return torch.where(zero, torch.full_like(num, float("nan")), num / torch.where(zero, 1.0, den))


# --------------------------------------------------------------------------------------
# percentage change and approximation error
# --------------------------------------------------------------------------------------


def percentage_change(original: torch.Tensor, reformulated: torch.Tensor) -> torch.Tensor:
    r"""Per-sample squared relative difference, in percent (the paper's Table 3 metric).

    .. math::

        d_i = \frac{\lVert a_o(i) - a_r(i) \rVert_2^2}{\lVert a_o(i) \rVert_2^2} \cdot 100

    with all non-batch dimensions flattened. The paper's table reports
    ``d = mean_i d_i``; take ``percentage_change(o, r).mean()`` (or ``torch.nanmean``,
    see below).

    Args:
        original: ``[B, ...]`` attributions of the original method ``a_o``.
        reformulated: ``[B, ...]`` its Taylor reformulation ``a_r``, the same shape.

    Returns:
        ``[B]`` tensor of percentages, dtype the promoted dtype of the two inputs.

    A sample whose original attribution is all zero has no defined relative change: its
    entry is NaN and a ``RuntimeWarning`` names the samples (never a silent 0 or inf).

    Raises:
        TypeError: a non-tensor or non-float argument.
        ValueError: shapes differ, an empty batch, or NaN/inf values.
    """
    original = check_inputs(original, "original")
    reformulated = check_inputs(reformulated, "reformulated")
    o, r, out_dtype = _paired(original, reformulated, "original", "reformulated")
    o, r = o.flatten(1), r.flatten(1)
    num = (o - r).pow(2).sum(1)
    den = o.pow(2).sum(1)
    d = _ratio_or_nan(num, den, "percentage_change", "the original attribution")
    return (d * 100.0).to(out_dtype)


def approximation_error(error: torch.Tensor, output_change: torch.Tensor) -> torch.Tensor:
    r"""Per-sample relative Taylor approximation error ``|eps_i| / |df_i|``.

    ``error`` is ``eps_K = df - g_K`` and ``output_change`` is ``df = f(x) - f(x~)``, as in
    :class:`taylorattr.TaylorTerms` (``terms.error``, ``terms.output_change``). The paper
    reports ``mean_i |eps_i| / |df_i|``: take ``.mean()`` of the result.

    Args:
        error: ``[B]`` float tensor.
        output_change: ``[B]`` float tensor.

    Returns:
        ``[B]`` tensor, dtype the promoted dtype. A sample with ``df = 0`` gives NaN and a
        ``RuntimeWarning`` (the relative error is undefined there).

    Raises:
        TypeError, ValueError: non-tensors, non-float dtypes, shapes other than the same
        ``[B]``, an empty batch, or NaN/inf values.
    """
    for name, t in (("error", error), ("output_change", output_change)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dtype not in (torch.float32, torch.float64):
            raise TypeError(f"{name} must have dtype float32 or float64, got {t.dtype}")
        if t.dim() != 1 or t.shape[0] == 0:
            raise ValueError(f"{name} must have shape [B] with B >= 1, got {tuple(t.shape)}")
        if not torch.isfinite(t).all():
            raise ValueError(f"{name} must be finite; it contains NaN or inf")
    e, df, out_dtype = _paired(error, output_change, "error", "output_change")
    return _ratio_or_nan(e.abs(), df.abs(), "approximation_error", "output_change").to(out_dtype)
