"""Softmax and log-softmax kept whole (attention decomposes into them and products):

    softmax(x)_i = e_i / sum_j e_j,  e = exp(x - s)     (exp recurrence, quotient)
    log_softmax(x) = x - s - log(sum_j e_j)

with ``s`` the maximum of the value along ``dim``, held constant: the result does not
depend on it, it only keeps ``exp`` in range (a fully masked row, ``s = -inf``, shifts by 0)."""
from __future__ import annotations

import torch

from .... import series as S
from ..core import CoreJet
from ..registry import rule

aten = torch.ops.aten



def _shifted_exp(x: CoreJet, dim: int):
    shift = x.primal.amax(dim, keepdim=True).detach()
    shift = torch.where(torch.isfinite(shift), shift, torch.zeros_like(shift))
    e = CoreJet(x.primal - shift, x.series, x.order, x.affine).unary(S.exp)
    return e, e.linear(lambda t: t.sum(dim, keepdim=True)), shift


@rule(aten._softmax, family="attention")
def _softmax(x, dim, half_to_float=False):
    e, total, _ = _shifted_exp(x, dim)
    return e / total


@rule(aten._log_softmax, family="attention")
def _log_softmax(x, dim, half_to_float=False):
    _, total, shift = _shifted_exp(x, dim)
    return (x - shift) - total.unary(S.log)


