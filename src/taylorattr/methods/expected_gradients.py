"""Expected Gradients (Erion et al. 2021), the paper's IG averaged over baselines.

    a_i = E_{x~ ~ p, alpha ~ U(0,1)} [ (x_i - x~_i) * d_i f(x~ + alpha (x - x~)) ]
        ~ 1/n sum_k (x_i - x~_ik) * d_i f(x~_k + alpha_k (x - x~_k))

Baselines ``x~`` are drawn either from a reference tensor ``[N, ...]`` (rows sampled with
replacement; the data distribution, as Erion et al.) or, with ``noise_std = s``, from
``N(x, s^2)`` (the paper's choice). One ``alpha`` is drawn per (sample, draw). All
randomness comes from a ``torch.Generator`` seeded with ``seed`` on the CPU, in a fixed
order (baselines, then alphas), so the same seed gives bitwise the same attributions.
:func:`draw` exposes the draws, and ``attribute(..., draws=...)`` accepts them: with
Captum's draws this equals ``GradientShap`` (``stdevs=0``).

Cost: ``n_samples * B`` forward+backward rows, in chunks of ``internal_batch_size``.
"""
from __future__ import annotations

from dataclasses import dataclass
from numbers import Real

import torch

from .._validation import check_bool, check_inputs, check_positive_int
from .._validation import check_seed as _check_seed
from ._base import (
    AttributionMethod,
    check_optional_positive_int,
    default_chunk_rows,
    grid_blocks,
    target_gradient,
)

__all__ = ["EGDraws", "ExpectedGradients", "draw"]


@dataclass(frozen=True)
class EGDraws:
    """The random draws of Expected Gradients for a batch of ``B`` inputs.

    ``baselines``: ``[B, n, ...]`` (draw ``k`` of sample ``b``); ``alphas``: ``[B, n]``.
    """

    baselines: torch.Tensor
    alphas: torch.Tensor

    @property
    def n_samples(self) -> int:
        return self.alphas.shape[1]


def draw(inputs: torch.Tensor, baselines=None, n_samples: int = 50, noise_std=None,
         seed: int = 0) -> EGDraws:
    """Draw ``n_samples`` baselines and path positions per sample of ``inputs``.

    Exactly one of ``baselines`` (a reference tensor ``[N, *inputs.shape[1:]]``, rows
    drawn uniformly with replacement) and ``noise_std`` (baselines ``x + noise_std * eps``,
    ``eps ~ N(0, I)``) must be given. Draws are made on the CPU from
    ``torch.Generator().manual_seed(seed)``: first the baselines, then ``alphas ~ U(0,1)``
    (in float64, then cast to the dtype of ``inputs``).
    """
    x = check_inputs(inputs).detach()
    n = check_positive_int(n_samples, "n_samples")
    seed = _check_seed(seed)
    if (baselines is None) == (noise_std is None):
        raise ValueError("give exactly one of baselines (a reference tensor [N, ...] to draw "
                         "baselines from) and noise_std (baselines drawn from N(x, noise_std^2))")
    gen = torch.Generator(device="cpu").manual_seed(seed)
    batch, feat = x.shape[0], tuple(x.shape[1:])
    if noise_std is not None:
        if isinstance(noise_std, bool) or not isinstance(noise_std, Real):
            raise TypeError(f"noise_std must be a real number, got {type(noise_std).__name__}")
        if not (noise_std > 0 and noise_std < float("inf")):
            raise ValueError(f"noise_std must be finite and > 0, got {noise_std}")
        eps = torch.randn((batch, n) + feat, generator=gen, dtype=torch.float64)
        xb = x.unsqueeze(1) + float(noise_std) * eps.to(x.device, x.dtype)
    else:
        if not isinstance(baselines, torch.Tensor):
            raise TypeError("baselines must be a reference tensor [N, ...] for Expected "
                            f"Gradients, got {type(baselines).__name__}")
        if baselines.dim() != x.dim() or tuple(baselines.shape[1:]) != feat:
            raise ValueError(f"baselines must have shape [N, {', '.join(map(str, feat))}] "
                             f"(reference rows like the inputs' samples), got "
                             f"{tuple(baselines.shape)}")
        if baselines.shape[0] == 0:
            raise ValueError("baselines must hold at least one reference row, got none")
        if baselines.dtype not in (torch.float32, torch.float64):
            raise TypeError(f"baselines must have dtype float32 or float64, got {baselines.dtype}")
        ref = check_inputs(baselines.to(x.dtype), "baselines").detach()
        idx = torch.randint(ref.shape[0], (batch, n), generator=gen)
        xb = ref[idx.to(ref.device)].to(x.device)
    alphas = torch.rand((batch, n), generator=gen, dtype=torch.float64).to(x.device, x.dtype)
    return EGDraws(xb, alphas)


class ExpectedGradients(AttributionMethod):
    """Expected Gradients: ``n_samples`` single-point IG estimates per sample, averaged.

    Equals Captum's ``GradientShap`` (``stdevs=0``) given the same baseline and alpha
    draws (see :func:`draw` and the ``draws`` argument).
    """

    name = "expected_gradients"

    @staticmethod
    def draw(inputs, baselines=None, n_samples=50, noise_std=None, seed=0) -> EGDraws:
        """Same as :func:`taylorattr.methods.expected_gradients.draw`."""
        return draw(inputs, baselines, n_samples, noise_std, seed)

    def attribute(self, inputs: torch.Tensor, baselines=None, target=None,
                  n_samples: int = 50, noise_std=None, seed: int = 0, *,
                  draws: EGDraws | None = None, internal_batch_size: int | None = None,
                  return_convergence_delta: bool = False, show_progress: bool = False):
        """Attributions ``[B, ...]``; with ``return_convergence_delta`` also
        ``sum(a) - mean_k (f(x) - f(x~_k))`` per sample (a Monte-Carlo error).

        Args:
            inputs: ``[B, ...]`` float32/float64 batch.
            baselines: reference tensor ``[N, ...]`` to draw baselines from, or None.
            target: None (argmax class), an int, or a ``[B]`` integer tensor.
            n_samples: draws per sample.
            noise_std: draw baselines from ``N(x, noise_std^2)`` instead.
            seed: seed of the generator of all draws.
            draws: precomputed :class:`EGDraws` (then give neither baselines nor noise_std).
            internal_batch_size: rows per forward+backward call; default automatic.
            show_progress: show a tqdm bar over the chunks.
        """
        check_bool(return_convergence_delta, "return_convergence_delta")
        check_bool(show_progress, "show_progress")
        chunk = check_optional_positive_int(internal_batch_size, "internal_batch_size")
        if draws is None:
            draws = draw(inputs, baselines, n_samples, noise_std, seed)
        else:
            if not isinstance(draws, EGDraws):
                raise TypeError(f"draws must be an EGDraws, got {type(draws).__name__}")
            if baselines is not None or noise_std is not None:
                raise ValueError("draws replaces baselines and noise_std; give only draws")
        x, t, fx = self._inputs_and_target(inputs, target)
        batch = x.shape[0]
        if draws.alphas.dim() != 2 or draws.alphas.shape[0] != batch or \
                tuple(draws.baselines.shape) != (batch, draws.alphas.shape[1]) + tuple(x.shape[1:]):
            raise ValueError(f"draws must hold baselines [{batch}, n, ...] and alphas "
                             f"[{batch}, n] for inputs of shape {tuple(x.shape)}, got "
                             f"{tuple(draws.baselines.shape)} and {tuple(draws.alphas.shape)}")
        n = draws.n_samples
        xb = draws.baselines.to(x.device, x.dtype)
        alphas = draws.alphas.to(x.device, x.dtype)
        chunk = chunk or default_chunk_rows(x, backward=True, model=self.model)
        feat = tuple(x.shape[1:])
        bcast = (1,) * len(feat)

        total = torch.zeros_like(x)
        for s0, s1, k0, k1 in grid_blocks(batch, n, chunk, show_progress, "expected gradients"):
            # rows (sample s, draw k), sample-major as in Captum's GradientShap
            ref = xb[s0:s1, k0:k1]
            diff = x[s0:s1, None] - ref
            a = alphas[s0:s1, k0:k1]
            rows = torch.addcmul(ref, a.view(a.shape + bcast), diff)
            tr = None if t is None else t[s0:s1].repeat_interleave(k1 - k0)
            grad, _ = target_gradient(self.model, rows.reshape((-1,) + feat), tr)
            total[s0:s1] += (grad.view(diff.shape) * diff).sum(1)
        attr = total / n
        if not return_convergence_delta:
            return self._finite(attr)
        tb = None if t is None else t.repeat_interleave(n)
        fb = self._explained(xb.reshape((-1,) + feat), tb).view(batch, n).mean(1)
        return self._with_delta(attr, fx - fb, True)
