"""Expected Gradients (Erion et al. 2021), the paper's IG averaged over baselines.

    a_i = E_{x~ ~ p, alpha ~ U(0,1)} [ (x_i - x~_i) * d_i f(x~ + alpha (x - x~)) ]
        ~ 1/n sum_k (x_i - x~_ik) * d_i f(x~_k + alpha_k (x - x~_k))

Baselines ``x~`` are drawn from a distribution (:mod:`taylorattr.baselines`): a
:class:`~taylorattr.baselines.ReferenceSet` (rows sampled with replacement; the data
distribution, as Erion et al.) or :class:`~taylorattr.baselines.Noise` around the input
(``noise_std = s``: ``N(x, s^2)``, the paper's wording) or around a fixed point. One ``alpha`` is drawn per (sample, draw). All
randomness comes from a ``torch.Generator`` seeded with ``seed`` on the CPU, in a fixed
order (baselines, then alphas), so the same seed gives bitwise the same attributions.
:func:`draw` exposes the draws, and ``attribute(..., draws=...)`` accepts them: with
Captum's draws this equals ``GradientShap`` (``stdevs=0``).

Cost: ``n_samples * B`` forward+backward rows, in chunks of ``internal_batch_size``.
The average over the draws is accumulated in float32 for float16/bfloat16 inputs (returned
in the inputs' dtype).
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Literal, overload

import torch

from .. import _validation as V
from .._validation import (
    broadcast_baselines,
    check_bool,
    check_inputs,
    check_positive_int,
    check_real,
)
from .._validation import check_seed as _check_seed
from ..baselines import Baseline, Noise, ReferenceSet
from ._base import Attributed, AttributionMethod
from ._call import CONSTRUCTED, Attributions, Baselines, Inputs, Target, given
from ._passes import (
    check_optional_positive_int,
    default_chunk_rows,
    gradient_pass_cost,
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

    The reference distribution is ``baselines``, one of
    :class:`~taylorattr.baselines.ReferenceSet` (rows drawn uniformly with replacement; a
    plain tensor ``[N, *inputs.shape[1:]]`` means the same) or
    :class:`~taylorattr.baselines.Noise` (``c + s * eps``, ``eps ~ N(0, I)``, ``c`` the
    input or a fixed point), or ``noise_std = s`` as a shorthand for ``Noise(s)`` around
    the input; exactly one must be given. Draws are made on the CPU from
    ``_validation.cpu_generator(seed)``: first the baselines, then ``alphas ~ U(0,1)``
    (in float64, then cast to the dtype and device of ``inputs``: the same draws on every
    device).
    """
    x = check_inputs(inputs).detach()
    n = check_positive_int(n_samples, "n_samples")
    seed = _check_seed(seed)
    dist = _distribution(baselines, noise_std)
    gen = V.cpu_generator(seed)
    batch, feat = x.shape[0], tuple(x.shape[1:])
    if isinstance(dist, Noise):
        eps = V.draw(torch.randn, (batch, n) + feat, generator=gen, device=x.device,
                   dtype=torch.float64)
        center = x if isinstance(dist.around, str) else broadcast_baselines(dist.around, x)
        xb = center.unsqueeze(1) + float(dist.std) * eps.to(x.device, x.dtype)
    else:
        ref = _reference_rows(dist.samples, x)
        idx = V.draw(torch.randint, ref.shape[0], (batch, n), generator=gen, device=ref.device)
        xb = ref[idx.to(ref.device)].to(x.device)
    alphas = V.draw(torch.rand, (batch, n), generator=gen, device=x.device,
                  dtype=torch.float64).to(x.dtype)
    return EGDraws(xb, alphas)


def _distribution(baselines, noise_std) -> Baseline:
    if (baselines is None) == (noise_std is None):
        raise ValueError("give exactly one of baselines (a ReferenceSet or reference tensor "
                         "[N, ...] to draw baselines from, or a Noise) and noise_std (baselines "
                         "drawn from N(x, noise_std^2))")
    if noise_std is not None:
        check_real(noise_std, "noise_std", 0.0, strict=True)
        return Noise(float(noise_std))
    if isinstance(baselines, (Noise, ReferenceSet)):
        return baselines
    if isinstance(baselines, torch.Tensor):
        return ReferenceSet(baselines)
    raise TypeError("baselines must be a reference tensor [N, ...], a ReferenceSet or a Noise "
                    f"for Expected Gradients, got {type(baselines).__name__}")


def _reference_rows(ref: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    feat = tuple(x.shape[1:])
    if ref.dim() != x.dim() or tuple(ref.shape[1:]) != feat:
        raise ValueError(f"baselines must have shape [N, {', '.join(map(str, feat))}] "
                         f"(reference rows like the inputs' samples), got {tuple(ref.shape)}")
    if ref.shape[0] == 0:
        raise ValueError("baselines must hold at least one reference row, got none")
    if ref.dtype not in (torch.float32, torch.float64, torch.float16, torch.bfloat16):
        raise TypeError(f"baselines must have a floating dtype (float32, float64, float16 or "
                        f"bfloat16), got {ref.dtype}")
    return check_inputs(ref.to(x.dtype), "baselines").detach()


class ExpectedGradients(AttributionMethod):
    """Expected Gradients: ``n_samples`` single-point IG estimates per sample, averaged.

    Equals Captum's ``GradientShap`` (``stdevs=0``) given the same baseline and alpha
    draws (see :func:`draw` and the ``draws`` argument).
    """

    name = "expected_gradients"

    traits = replace(AttributionMethod.traits, baseline_kind="distribution")

    @staticmethod
    def draw(inputs, baselines=None, n_samples=50, noise_std=None, seed=0) -> EGDraws:
        """Same as :func:`taylorattr.methods.expected_gradients.draw`."""
        return draw(inputs, baselines, n_samples, noise_std, seed)

    @overload
    def attribute(self, inputs: Inputs, baselines: Baselines = ..., target: Target = ..., *,
                  n_samples: int = ..., noise_std: Any = ..., seed: int = ...,
                  draws: EGDraws | None = ..., internal_batch_size: int | None = ...,
                  multiply_by_inputs: bool = ...,
                  return_convergence_delta: Literal[False] = ..., show_progress: bool = ...,
                  strict: bool = ..., additional_forward_args: Any = ..., layer: Any = ...,
                  attribute_to_layer_input: Any = ..., layer_baselines: Any = ...,
                  layer_delta: str = ...) -> Attributions: ...

    @overload
    def attribute(self, inputs: Inputs, baselines: Baselines = ..., target: Target = ..., *,
                  n_samples: int = ..., noise_std: Any = ..., seed: int = ...,
                  draws: EGDraws | None = ..., internal_batch_size: int | None = ...,
                  multiply_by_inputs: bool = ..., return_convergence_delta: Literal[True],
                  show_progress: bool = ..., strict: bool = ...,
                  additional_forward_args: Any = ..., layer: Any = ...,
                  attribute_to_layer_input: Any = ..., layer_baselines: Any = ...,
                  layer_delta: str = ...) -> tuple[Attributions, torch.Tensor]: ...

    def attribute(self, inputs: Inputs, baselines: Baselines = None, target: Target = None, *,
                  n_samples: int = 50, noise_std: Any = None, seed: int = 0,
                  draws: EGDraws | None = None, internal_batch_size: int | None = None,
                  multiply_by_inputs: bool = True, return_convergence_delta: bool = False,
                  show_progress: bool = False, strict: bool = False,
                  additional_forward_args: Any = None, layer: Any = CONSTRUCTED,
                  attribute_to_layer_input: Any = CONSTRUCTED, layer_baselines: Any = None,
                  layer_delta: str = "layer") -> Attributions | tuple[Attributions, torch.Tensor]:
        """ExpectedGradients: attributions shaped like ``inputs`` (with
        ``return_convergence_delta=True`` and the delta ``[B]``); its options are
        ``_attribute``'s, the shared arguments :data:`~taylorattr.methods._call.SHARED_DOC`."""
        return self.explain(**given(locals())).result()

    def _attribute(self, call, x, baselines, t, fx, *, n_samples: int = 50, noise_std=None,
                   seed: int = 0, draws: EGDraws | None = None,
                   internal_batch_size: int | None = None, multiply_by_inputs: bool = True,
                   show_progress: bool = False):
        """Options: ``n_samples`` (draws per sample, 50), ``noise_std`` (shorthand for
        ``Noise(noise_std)`` around the input), ``seed`` (of all draws, 0), ``draws``
        (precomputed :class:`EGDraws`; then give neither baselines nor noise_std),
        ``internal_batch_size`` (rows per call; default automatic). ``baselines``: the
        reference distribution: a :class:`~taylorattr.baselines.ReferenceSet` or
        reference tensor ``[N, ...]``, a :class:`~taylorattr.baselines.Noise`, or None
        with ``noise_std`` (or ``draws``).

        ``multiply_by_inputs=False``: the gradients at the path points averaged, without
        the factor ``x - x~_k`` (Captum's option; not a share of the output change)."""
        check_bool(multiply_by_inputs, "multiply_by_inputs")
        chunk = check_optional_positive_int(internal_batch_size, "internal_batch_size")
        if draws is None:
            draws = draw(x, baselines, n_samples, noise_std, seed)
        else:
            if not isinstance(draws, EGDraws):
                raise TypeError(f"draws must be an EGDraws, got {type(draws).__name__}")
            if baselines is not None or noise_std is not None:
                raise ValueError("draws replaces baselines and noise_std; give only draws")
        batch = x.shape[0]
        if draws.alphas.dim() != 2 or draws.alphas.shape[0] != batch or \
                tuple(draws.baselines.shape) != (batch, draws.alphas.shape[1]) + tuple(x.shape[1:]):
            raise ValueError(f"draws must hold baselines [{batch}, n, ...] and alphas "
                             f"[{batch}, n] for inputs of shape {tuple(x.shape)}, got "
                             f"{tuple(draws.baselines.shape)} and {tuple(draws.alphas.shape)}")
        n = draws.n_samples
        xb = draws.baselines.to(x.device, x.dtype)
        alphas = draws.alphas.to(x.device, x.dtype)
        chunk = chunk or default_chunk_rows(x, backward=True, model=call.model)
        feat = tuple(x.shape[1:])
        bcast = (1,) * len(feat)

        total = torch.zeros_like(x, dtype=V.accumulation_dtype(x.dtype))  # float32 for halves
        for s0, s1, k0, k1 in grid_blocks(batch, n, chunk, show_progress, "expected gradients"):
            # rows (sample s, draw k), sample-major as in Captum's GradientShap
            ref = xb[s0:s1, k0:k1]
            diff = x[s0:s1, None] - ref
            a = alphas[s0:s1, k0:k1]
            rows = torch.addcmul(ref, a.view(a.shape + bcast), diff)
            tr = None if t is None else t[s0:s1].repeat_interleave(k1 - k0)
            grad, _ = target_gradient(call.model, rows.reshape((-1,) + feat), tr)
            grad = grad.reshape(diff.shape)
            total[s0:s1] += (grad * diff if multiply_by_inputs else grad).to(total.dtype).sum(1)
        return Attributed((total / n).to(x.dtype), xb)

    def _cost(self, x, options):
        """One gradient row per (sample, draw); the draws are the references."""
        draws = options.get("draws")
        n = draws.n_samples if isinstance(draws, EGDraws) else \
            check_positive_int(options.get("n_samples", 50), "n_samples")
        return gradient_pass_cost(n * x.shape[0]), n
