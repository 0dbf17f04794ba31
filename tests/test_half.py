"""Half precision (issue 34): sums over many terms are accumulated in float32.

Oracle: the same bfloat16 gradients (one autograd pass over the same rows) summed by hand,
once in float32 and once in bfloat16; the library's result is the float32 sum rounded once
to bfloat16, and nearer to it than the bfloat16 running sum is.
"""
from __future__ import annotations

import torch
from torch import nn

from taylorattr.methods import IntegratedGradients
from taylorattr.methods.integrated_gradients import quadrature

BF = torch.bfloat16


def test_integrated_gradients_sums_its_quadrature_in_float32():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 3)).to(BF).eval()
    x = torch.randn(2, 16, generator=torch.Generator().manual_seed(1)).to(BF)
    n = 64
    # one step (2 rows) per chunk: 64 additions into the running total
    ours = IntegratedGradients(model).attribute(x, 0.0, target=0, n_steps=n,
                                                internal_batch_size=2)
    alphas, weights = quadrature("gausslegendre", n)  # a float64 table on the CPU
    alphas, weights = alphas.to(x.device), weights.to(x.device)  # as the method moves them
    grads = []
    for k in range(n):  # the same rows, one step per call, as the chunks run them
        rows = torch.addcmul(torch.zeros_like(x), alphas[k].to(BF), x).requires_grad_(True)
        (g,) = torch.autograd.grad(model(rows)[:, 0].sum(), rows)
        grads.append(g)
    grad = torch.stack(grads)
    in_32 = (weights.float().view(-1, 1, 1) * grad.float()).sum(0) * x.float()
    in_16 = torch.zeros_like(x)
    for k in range(n):
        in_16 = in_16 + weights[k].to(BF) * grad[k]
    in_16 = in_16 * x
    assert ours.dtype == BF
    eps = torch.finfo(BF).eps
    # one rounding of the float32 sum: within half an ulp (plus float32's own reordering)
    assert ((ours.float() - in_32).abs() <= eps * in_32.abs() + 1e-30).all()
    assert (ours.float() - in_32).abs().sum() < (in_16.float() - in_32).abs().sum()
