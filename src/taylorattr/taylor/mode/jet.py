"""The :class:`Jet` (a truncated Taylor series of one intermediate tensor) and the
arithmetic every rule shares.

A Jet stands for ``x(t) = x_0 + sum_{k=1..K} x_k t^k`` with ``x_0 = primal`` (``[B, *s]``)
and ``x_k = series[k-1]`` (``[K, B, m, *s]``, ``m`` directions per sample). Products of
two Jets are Cauchy products ``(ab)_k = sum_j a_j b_{k-j}``; a map that is linear in the
Jet acts on every coefficient (its constant part on the primal only).
"""
from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import fx

from ... import series as S

__all__ = ["BatchSecond", "Jet", "SeriesArithmetic", "UnsupportedOperation"]


class UnsupportedOperation(TypeError):
    """An operation the Taylor-mode interpreter has no exact rule for."""


class SeriesArithmetic:
    """``+ - * /`` of a series with a series or a constant, on both sides: each goes to the
    class's ``_binary(a, b, op)`` (``op`` one of ``"add"``, ``"sub"``, ``"mul"``, ``"div"``)."""

    _binary: Callable

    def __add__(self, other):
        return self._binary(self, other, "add")

    def __radd__(self, other):
        return self._binary(other, self, "add")

    def __sub__(self, other):
        return self._binary(self, other, "sub")

    def __rsub__(self, other):
        return self._binary(other, self, "sub")

    def __mul__(self, other):
        return self._binary(self, other, "mul")

    def __rmul__(self, other):
        return self._binary(other, self, "mul")

    def __truediv__(self, other):
        return self._binary(self, other, "div")

    def __rtruediv__(self, other):
        return self._binary(other, self, "div")


@dataclass
class Jet(SeriesArithmetic):
    """Truncated Taylor series of an intermediate tensor.

    ``primal``: ``[B, *s]``, the value at ``t = 0``; ``series``: ``[K, B, m, *s]``, the
    coefficients of ``t^1..t^K`` for ``m`` directions per sample. ``affine``: the tensor is
    affine in ``t`` (coefficients 2..K are zero), as everything is between the input and
    the first nonlinearity; affine layers then skip those zeros.

    Arithmetic (``+ - * /`` with Jets, tensors or numbers) is exact, so a user rule can be
    written as ``lambda m, x: x * x.unary(series.sigmoid)``.
    """

    _binary = staticmethod(lambda a, b, op: binary(a, b, op))  # the module's, below

    primal: torch.Tensor
    series: torch.Tensor
    affine: bool = False

    @property
    def order(self) -> int:
        return self.series.shape[0]

    def coeffs(self) -> list[torch.Tensor]:
        """``[x_0 as [B, 1, *s], x_1, ..., x_K]``, ready for :mod:`taylorattr.series`."""
        return [self.primal.unsqueeze(1)] + list(self.series.unbind(0))

    @classmethod
    def from_coeffs(cls, coeffs: list[torch.Tensor], like: Jet) -> Jet:
        """A Jet from ``[x_0 as [B, 1, *s], x_1, ..., x_K]`` (coefficients may broadcast)."""
        primal = coeffs[0].squeeze(1)
        shape = (like.series.shape[1], like.series.shape[2]) + tuple(primal.shape[1:])
        return cls(primal, torch.stack([c.expand(shape) for c in coeffs[1:]]))

    def linear(self, fn: Callable, fn_series: Callable | None = None) -> Jet:
        """Apply a map that is affine in this tensor: ``fn`` on the primal and ``fn_series``
        (``fn`` without its constant part, by default ``fn``) on all coefficients at once,
        with the ``(K, B, m)`` axes merged into one batch axis."""
        primal = fn(self.primal)
        K, B, m = self.series.shape[:3]
        if self.affine and K > 1:  # only the first coefficient is non-zero
            first = (fn_series or fn)(self.series[0].reshape(B * m, *self.series.shape[3:]))
            out = torch.cat([first.unsqueeze(0), first.new_zeros((K - 1,) + first.shape)])
            return Jet(primal, out.reshape(K, B, m, *first.shape[1:]), affine=True)
        flat = self.series.reshape(K * B * m, *self.series.shape[3:])
        out = (fn_series or fn)(flat)
        return Jet(primal, out.reshape(K, B, m, *out.shape[1:]), affine=self.affine)

    def unary(self, rule: Callable[[list[torch.Tensor]], list[torch.Tensor]]) -> Jet:
        """Apply a series rule (a function of the coefficient list, e.g. ``series.tanh``)."""
        return Jet.from_coeffs(rule(self.coeffs()), self)

    def __neg__(self):
        return self.linear(torch.neg)


@dataclass
class BatchSecond:
    """``jet.transpose(0, 1)`` kept lazily: a sequence-first tensor ``[L, B, ...]`` (as
    ``nn.MultiheadAttention(batch_first=False)`` takes) whose Jet stays batch-first."""

    jet: Jet


# ---------------------------------------------------------------- helpers for rules

def is_jet(value) -> bool:
    return isinstance(value, Jet)


def any_jet(args, kwargs) -> bool:
    """Whether any argument (nested in lists/tuples/dicts) is a Jet or a BatchSecond."""
    found = []
    fx.node.map_aggregate((args, kwargs), lambda v: found.append(v)
                          if isinstance(v, (Jet, BatchSecond)) else None)
    return bool(found)


def const_coeff(value, like: Jet):
    """A constant as coefficient 0: a ``[B, ...]`` tensor (as many dims as the primal)
    gets the direction axis; lower-rank tensors and numbers broadcast as they are."""
    if isinstance(value, torch.Tensor) and value.dim() == like.primal.dim():
        return value.unsqueeze(1)
    if isinstance(value, torch.Tensor) and value.dim() > like.primal.dim():
        raise UnsupportedOperation(
            f"a constant of shape {tuple(value.shape)} broadcasts an input-dependent tensor of "
            f"shape {tuple(like.primal.shape)} to more dimensions, moving its batch axis")
    return value


def as_coeffs(value, like: Jet) -> list:
    """Coefficients of a Jet, or of a constant (a tensor or number with zero series)."""
    if is_jet(value):
        return value.coeffs()
    zero = torch.zeros((), dtype=like.primal.dtype, device=like.primal.device)
    return [const_coeff(value, like)] + [zero] * like.order


def batch_dim(dim: int, ndim: int, what: str) -> int:
    """Normalise ``dim`` of a per-sample op; refuse the batch axis."""
    d = dim % ndim
    if d == 0:
        raise UnsupportedOperation(f"{what} over the batch dimension (dim={dim}) mixes samples")
    return d


def binary(a, b, op: str) -> Jet:
    """``a op b`` for ``op`` in add/sub/mul/div, at least one of them a Jet."""
    jet = a if is_jet(a) else b
    if op in ("add", "sub"):
        fn = getattr(torch, op)
        if is_jet(a) and is_jet(b):
            return Jet(fn(a.primal, b.primal), fn(a.series, b.series), affine=a.affine and b.affine)
        if is_jet(a):
            const_coeff(b, a)
            return Jet(fn(a.primal, b), a.series, affine=a.affine)
        const_coeff(a, b)
        return Jet(fn(a, b.primal), -b.series if op == "sub" else b.series, affine=b.affine)
    if op == "mul":
        if is_jet(a) and is_jet(b):
            return Jet.from_coeffs(S.mul(a.coeffs(), b.coeffs()), jet)
        c = const_coeff(b if is_jet(a) else a, jet)
        return Jet.from_coeffs([t * c for t in jet.coeffs()], jet)
    if op == "div":
        if is_jet(b):
            return Jet.from_coeffs(S.div(as_coeffs(a, jet), b.coeffs()), jet)
        c = const_coeff(b, jet)
        return Jet.from_coeffs([t / c for t in a.coeffs()], jet)
    raise AssertionError(op)


def multilinear(fn: Callable, operands: list, like: Jet, raw_constants: bool = False) -> Jet:
    """``fn(*operands)`` for ``fn`` linear in each operand (matmul, einsum):
    ``c_k = sum_{j_1+..+j_n=k} fn(a_j1, ..., a_jn)`` over the Jet operands. Constants get
    the direction axis (:func:`const_coeff`) unless ``raw_constants`` (einsum names axes)."""
    coeffs = [o.coeffs() if is_jet(o) else None for o in operands]
    live = [i for i, c in enumerate(coeffs) if c is not None]
    consts = [None if c is not None else (o if raw_constants else const_coeff(o, like))
              for o, c in zip(operands, coeffs)]
    K = like.order
    out = []
    for k in range(K + 1):
        total = None
        for split in itertools.product(range(k + 1), repeat=len(live)):
            if sum(split) != k:
                continue
            args = list(consts)
            for i, j in zip(live, split):
                args[i] = coeffs[i][j]
            term = fn(*args)
            total = term if total is None else total + term
        out.append(total)
    return Jet.from_coeffs(out, like)


def series_dim(dim: int, ndim: int, what: str) -> int:
    """The axis of the ``[K, B, m, *s]`` series that primal axis ``dim`` (not 0) maps to."""
    return batch_dim(dim, ndim, what) + 2
