"""Typed baselines: what an attribution explains the output change against.

Every method explains ``f(x) - f(x~)`` for some reference ``x~`` (docs/design.md,
``docs/design.md``). References come in three kinds, and a method says which kind it
takes (``AttributionMethod.baseline_kind``):

=================  ===================================================================
``Point(v)``       one reference per sample: a scalar, a tensor broadcastable to the
                   inputs, or one baseline per sample (Occlusion, DeepLIFT, IG)
``ReferenceSet(r)`` references drawn uniformly with replacement from the rows of
                   ``r`` ``[N, ...]`` (the data distribution; Expected Gradients after
                   Erion et al.)
``Noise(s, around)`` references ``x~ = c + s * eps``, ``eps ~ N(0, I)``, with ``c`` the
                   input itself (``around="input"``, the paper's wording for Expected
                   Gradients) or a fixed point (``around=0.0``: noise around the black
                   image that the square-removal metric uses)
=================  ===================================================================

Methods with an implicit reference (Gradient*Input, epsilon-LRP: the zero input) take
no baseline at all. :func:`as_baseline` turns a raw scalar or tensor into a
:class:`Point`, so existing calls ``baselines=0.0`` keep their meaning.
"""
from __future__ import annotations

from dataclasses import dataclass
from numbers import Real

import torch

__all__ = ["Baseline", "Noise", "Point", "ReferenceSet", "as_baseline", "describe"]


class Baseline:
    """Base of the three baseline kinds."""

    #: ``"point"`` or ``"distribution"``.
    kind: str = ""


@dataclass(frozen=True, eq=False)
class Point(Baseline):
    """One reference per sample: ``value`` is a scalar or a tensor broadcastable to the inputs."""

    value: float | torch.Tensor = 0.0
    kind = "point"

    def __post_init__(self):
        v = self.value
        if isinstance(v, bool) or not isinstance(v, (Real, torch.Tensor)):
            raise TypeError(f"Point value must be a real number or a tensor, got "
                            f"{type(v).__name__}")

    def is_zero(self) -> bool:
        v = self.value
        return bool((v == 0).all()) if isinstance(v, torch.Tensor) else float(v) == 0.0


@dataclass(frozen=True, eq=False)
class ReferenceSet(Baseline):
    """References drawn uniformly with replacement from the rows of ``samples`` ``[N, ...]``."""

    samples: torch.Tensor
    kind = "distribution"

    def __post_init__(self):
        if not isinstance(self.samples, torch.Tensor):
            raise TypeError(f"ReferenceSet samples must be a tensor [N, ...], got "
                            f"{type(self.samples).__name__}")


@dataclass(frozen=True, eq=False)
class Noise(Baseline):
    """References ``c + std * eps`` with ``c`` the input (``around="input"``) or a fixed point."""

    std: float
    around: str | float | torch.Tensor = "input"
    kind = "distribution"

    def __post_init__(self):
        s = self.std
        if isinstance(s, bool) or not isinstance(s, Real):
            raise TypeError(f"Noise std must be a real number, got {type(s).__name__}")
        if not (0 < s < float("inf")):
            raise ValueError(f"Noise std must be finite and > 0, got {s}")
        a = self.around
        if isinstance(a, str) and a != "input":
            raise ValueError(f"Noise around must be 'input' or a point (scalar or tensor), got {a!r}")
        if isinstance(a, bool) or not isinstance(a, (str, Real, torch.Tensor)):
            raise TypeError(f"Noise around must be 'input' or a point (scalar or tensor), got "
                            f"{type(a).__name__}")


def as_baseline(value) -> Baseline:
    """``value`` as a :class:`Baseline`: baselines pass through, scalars and tensors become points."""
    if isinstance(value, Baseline):
        return value
    return Point(value)


def describe(baseline: Baseline) -> str:
    """A short human-readable description (for tables and reports)."""
    if isinstance(baseline, Point):
        v = baseline.value
        return f"point {float(v):g}" if not isinstance(v, torch.Tensor) else \
            f"point tensor {tuple(v.shape)}"
    if isinstance(baseline, ReferenceSet):
        if type(baseline) is not ReferenceSet:  # a named source (e.g. TrainingDigits)
            return f"references drawn from {baseline!r}"
        return f"reference set of {baseline.samples.shape[0]} rows"
    around = baseline.around
    where = "the input" if isinstance(around, str) else (
        f"{float(around):g}" if not isinstance(around, torch.Tensor) else "a point tensor")
    return f"N({where}, {baseline.std:g}^2)"
