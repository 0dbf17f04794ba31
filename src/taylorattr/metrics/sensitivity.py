"""Max-sensitivity of an explanation (Yeh et al., NeurIPS 2019, "On the (In)fidelity and
Sensitivity of Explanations", eq. 4), relative to the explanation's size as Captum's
``sensitivity_max`` reports it:

    SENS_max(Phi, x) = max_k || Phi(x + u_k) - Phi(x) || / || Phi(x) ||,   u_k ~ U([-r, r]^d)

over ``n_perturb_samples`` draws ``u_k`` (a zero explanation divides by 1). ``Phi`` is any
explanation function: an attribution method's ``attribute`` with its options. The norm is
taken over every feature of every input (tuple inputs are one explanation).
"""
from __future__ import annotations

import torch

from .._validation import check_positive_int, check_real, check_seed, cpu_generator, draw
from ..inputs import as_tuple, check_batch, repeat_option

__all__ = ["max_sensitivity"]


def _flat(explanation, rows: int) -> torch.Tensor:
    parts, _ = as_tuple(explanation, "the explanation")
    return torch.cat([p.reshape(rows, -1).double() for p in parts], 1)


def max_sensitivity(explain, inputs, *, radius: float = 0.02, n_perturb_samples: int = 10,
                    perturbation=None, norm="fro", seed: int = 0,
                    batch_size: int | None = None, **options) -> torch.Tensor:
    """Max-sensitivity of ``explain`` at ``inputs``, one score per sample (module docstring).

    Args:
        explain: ``explain(inputs, **options)`` -> attributions of the inputs' structure
            (e.g. ``Saliency(model).attribute``).
        inputs: ``[B, ...]`` tensor or a tuple of them (``[B]``: one feature per sample).
        radius: half-width of the uniform draws (default perturbation).
        n_perturb_samples: draws per sample.
        perturbation: ``perturbation(rows, generator, k)`` -> perturbed rows: ``rows`` the
            inputs (their structure) repeated per draw (sample-major, ``B * m`` rows), ``k``
            the draw of every row. Default: ``u_k ~ U([-radius, radius]^d)`` added, drawn
            once for all ``n_perturb_samples`` and shared by the samples (a sample's score
            does not depend on its batch or on ``batch_size``).
        norm: ``"fro"`` (Euclidean over all features) or an order for
            ``torch.linalg.vector_norm`` (``1``, ``float("inf")``, ...).
        seed: seed of the CPU generator the draws come from.
        batch_size: the most perturbed rows per ``explain`` call (whole draws; at least one
            draw of every sample).
        **options: passed to ``explain``; per-sample tensors and lists (``B`` rows: targets,
            baselines, additional arguments) are repeated for the perturbed copies.

    Returns:
        ``[B]`` float tensor (the inputs' dtype).
    """
    parts, is_tuple = as_tuple(inputs)
    batch = check_batch(parts, vectors=True)
    n = check_positive_int(n_perturb_samples, "n_perturb_samples")
    per_call = n if batch_size is None else max(
        1, check_positive_int(batch_size, "batch_size") // batch)
    order = 2 if norm == "fro" else norm
    if not isinstance(order, (int, float)) or isinstance(order, bool):
        raise TypeError(f"norm must be 'fro' or a number (a vector norm order), got {norm!r}")
    generator = cpu_generator(check_seed(seed))
    if perturbation is None:
        check_real(radius, "radius")
        draws = tuple((draw(torch.rand, (n,) + tuple(p.shape[1:]), generator=generator,
                             device=p.device, dtype=torch.float64) * (2 * radius) - radius).to(p)
                      for p in parts)

        def perturbation(rows, _generator, k):
            moved = tuple(r + d[k.to(d.device)] for r, d in zip(as_tuple(rows)[0], draws))
            return moved if is_tuple else moved[0]
    elif not callable(perturbation):
        raise TypeError(f"perturbation must be callable, got {type(perturbation).__name__}")
    with torch.no_grad():
        base = _flat(explain(inputs, **options), batch)
        scale = torch.linalg.vector_norm(base, ord=order, dim=1)
        scale = torch.where(scale == 0, torch.ones_like(scale), scale)
        worst = torch.full((batch,), -torch.inf, dtype=torch.float64, device=base.device)
        for k0 in range(0, n, per_call):
            m = min(per_call, n - k0)
            rows = tuple(p.repeat_interleave(m, 0) for p in parts)
            k = torch.arange(k0, k0 + m, device=parts[0].device).repeat(batch)
            moved = perturbation(rows if is_tuple else rows[0], generator, k)
            moved = tuple(moved) if isinstance(moved, (tuple, list)) else moved
            expl = _flat(explain(moved, **{key: repeat_option(v, m, batch)
                                           for key, v in options.items()}), batch * m)
            change = torch.linalg.vector_norm(expl - base.repeat_interleave(m, 0), ord=order,
                                              dim=1)
            worst = torch.maximum(worst, (change / scale.repeat_interleave(m)).view(batch, m)
                                  .amax(1))
    return worst.to(parts[0].dtype)
