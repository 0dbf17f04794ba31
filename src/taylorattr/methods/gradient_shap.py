"""GradientShap (Lundberg & Lee 2017, as Captum implements it): Expected Gradients with
noise added to the input.

    a_i = 1/n sum_k (x_ik - x~_ik) * d_i f(x~_k + alpha_k (x_k - x~_k)),
    x_k = x + s * eps_k,   eps_k ~ N(0, I)            (s: ``stdevs``)

For each of ``n_samples`` draws per sample: a noisy copy ``x_k`` of the input, a reference
``x~_k`` from the distribution and a path position ``alpha_k ~ U(0, 1)``. With
``stdevs = 0`` this is :class:`~taylorattr.methods.ExpectedGradients`. The references
and path positions are Expected Gradients' draws with the same ``seed``
(:func:`taylorattr.methods.expected_gradients.draw`; so ``stdevs = 0`` gives bitwise
Expected Gradients' attributions); the input noise comes from a second CPU
``torch.Generator`` seeded with :func:`noise_seed` ``(seed)``, in float64. :func:`draw`
returns all draws and ``attribute(..., draws=...)`` takes them: with Captum's draws
(its ``torch.normal`` noise, ``np.random.choice`` references, ``np.random.uniform``
positions) this equals Captum's ``GradientShap``.

Taylor view: each draw is a one-point estimate of Integrated Gradients from ``x~_k`` to
``x_k``, so the reformulation (:func:`reformulation`) is Theorem 5 expanded at each noisy
input ``x_k`` towards its reference, averaged over the same draws; it equals the method
integrated over the path positions (exactly on polynomial networks of degree <= K), not
the method's single-position estimate.

Cost: ``n_samples * B`` forward+backward rows, in chunks of ``internal_batch_size``.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Literal, overload

import torch

from .. import _validation as V
from .._validation import check_inputs, check_positive_int
from .._validation import check_seed as _check_seed
from ._base import Attributed, AttributionMethod
from ._call import CONSTRUCTED, Attributions, Baselines, Inputs, Target, given
from ._passes import check_optional_positive_int, gradient_pass_cost
from .expected_gradients import EGDraws, ExpectedGradients
from .expected_gradients import draw as eg_draw

__all__ = ["GSDraws", "GradientShap", "draw", "noise_seed", "noisy_rows"]

_LCG_A, _LCG_C = 6364136223846793005, 1442695040888963407


def noise_seed(seed: int) -> int:
    """The seed of the input-noise generator: one step of Knuth's MMIX linear congruential
    generator from ``seed``, mod ``2**63`` (so its stream differs from the references')."""
    return (_check_seed(seed) * _LCG_A + _LCG_C) % 2**63


@dataclass(frozen=True)
class GSDraws:
    """The draws of GradientShap for ``B`` inputs: ``noise`` ``[B, n, ...]`` (added to the
    input), ``baselines`` ``[B, n, ...]`` and ``alphas`` ``[B, n]``."""

    noise: torch.Tensor
    baselines: torch.Tensor
    alphas: torch.Tensor

    @property
    def n_samples(self) -> int:
        return self.alphas.shape[1]


def draw(inputs: torch.Tensor, baselines=None, n_samples: int = 50, stdevs: float = 0.0,
         noise_std=None, seed: int = 0) -> GSDraws:
    """``n_samples`` draws per sample: references and path positions as
    :func:`taylorattr.methods.expected_gradients.draw` with ``seed``, and input noise
    ``stdevs * eps`` (``eps ~ N(0, I)`` in float64 from a generator seeded with
    ``noise_seed(seed)`` on the CPU, then cast to the inputs' dtype and device)."""
    x = check_inputs(inputs).detach()
    n = check_positive_int(n_samples, "n_samples")
    s = V.check_nonnegative_real(stdevs, "stdevs")
    eg = eg_draw(x, baselines, n, noise_std, seed)
    gen = V.cpu_generator(noise_seed(seed))
    eps = V.draw(torch.randn, (x.shape[0], n) + tuple(x.shape[1:]), generator=gen,
                 device=x.device, dtype=torch.float64)
    return GSDraws((s * eps).to(x.device, x.dtype), eg.baselines, eg.alphas)


def _check_draws(draws, x) -> GSDraws:
    if not isinstance(draws, GSDraws):
        raise TypeError(f"draws must be a GSDraws, got {type(draws).__name__}")
    batch, n = x.shape[0], draws.alphas.shape[-1]
    shape = (batch, n) + tuple(x.shape[1:])
    if draws.alphas.shape != (batch, n) or tuple(draws.baselines.shape) != shape or \
            tuple(draws.noise.shape) != shape:
        raise ValueError(f"draws must hold noise and baselines {list(shape)} and alphas "
                         f"[{batch}, {n}] for inputs of shape {tuple(x.shape)}, got "
                         f"{tuple(draws.noise.shape)}, {tuple(draws.baselines.shape)} and "
                         f"{tuple(draws.alphas.shape)}")
    return draws


def noisy_rows(x, draws: GSDraws):
    """Noisy inputs, references and positions as ``B * n`` rows (sample-major)."""
    feat = tuple(x.shape[1:])
    noisy = (x.unsqueeze(1) + draws.noise.to(x.device, x.dtype)).reshape((-1,) + feat)
    refs = draws.baselines.to(x.device, x.dtype).reshape((-1,) + feat)
    return noisy, refs, draws.alphas.to(x.device, x.dtype).reshape(-1, 1)


class GradientShap(AttributionMethod):
    """GradientShap: Expected Gradients at ``n_samples`` noisy copies of the input (see the
    module docstring). Equals Captum's ``GradientShap`` given the same draws."""

    name = "gradient_shap"

    traits = replace(AttributionMethod.traits, baseline_kind="distribution")

    draw = staticmethod(draw)

    @overload
    def attribute(self, inputs: Inputs, baselines: Baselines = ..., target: Target = ..., *,
                  n_samples: int = ..., stdevs: float = ..., noise_std: Any = ...,
                  seed: int = ..., draws: GSDraws | None = ...,
                  internal_batch_size: int | None = ..., multiply_by_inputs: bool = ...,
                  return_convergence_delta: Literal[False] = ..., show_progress: bool = ...,
                  strict: bool = ..., additional_forward_args: Any = ..., layer: Any = ...,
                  attribute_to_layer_input: Any = ..., layer_baselines: Any = ...,
                  layer_delta: str = ...) -> Attributions: ...

    @overload
    def attribute(self, inputs: Inputs, baselines: Baselines = ..., target: Target = ..., *,
                  n_samples: int = ..., stdevs: float = ..., noise_std: Any = ...,
                  seed: int = ..., draws: GSDraws | None = ...,
                  internal_batch_size: int | None = ..., multiply_by_inputs: bool = ...,
                  return_convergence_delta: Literal[True], show_progress: bool = ...,
                  strict: bool = ..., additional_forward_args: Any = ..., layer: Any = ...,
                  attribute_to_layer_input: Any = ..., layer_baselines: Any = ...,
                  layer_delta: str = ...) -> tuple[Attributions, torch.Tensor]: ...

    def attribute(self, inputs: Inputs, baselines: Baselines = None, target: Target = None, *,
                  n_samples: int = 50, stdevs: float = 0.0, noise_std: Any = None,
                  seed: int = 0, draws: GSDraws | None = None,
                  internal_batch_size: int | None = None, multiply_by_inputs: bool = True,
                  return_convergence_delta: bool = False, show_progress: bool = False,
                  strict: bool = False, additional_forward_args: Any = None,
                  layer: Any = CONSTRUCTED, attribute_to_layer_input: Any = CONSTRUCTED,
                  layer_baselines: Any = None,
                  layer_delta: str = "layer") -> Attributions | tuple[Attributions, torch.Tensor]:
        """GradientShap: attributions shaped like ``inputs`` (with
        ``return_convergence_delta=True`` and the delta ``[B]``); its options are
        ``_attribute``'s, the shared arguments :data:`~taylorattr.methods._call.SHARED_DOC`."""
        return self.explain(**given(locals())).result()

    def _attribute(self, call, x, baselines, t, fx, *, n_samples: int = 50, stdevs: float = 0.0,
                   noise_std=None, seed: int = 0, draws: GSDraws | None = None,
                   internal_batch_size: int | None = None, multiply_by_inputs: bool = True,
                   show_progress: bool = False):
        """Options: ``n_samples`` (draws per sample, 50), ``stdevs`` (input noise, 0.0,
        Captum's default), ``noise_std`` (references from ``N(x, noise_std^2)``),
        ``seed`` (0), ``draws`` (precomputed :class:`GSDraws`; then give neither
        baselines nor noise_std), ``internal_batch_size`` (rows per call).
        ``baselines``: the reference distribution, as for
        :class:`~taylorattr.methods.ExpectedGradients`."""
        chunk = check_optional_positive_int(internal_batch_size, "internal_batch_size")
        if draws is None:
            draws = draw(x, baselines, n_samples, stdevs, noise_std, seed)
        elif baselines is not None or noise_std is not None:
            raise ValueError("draws replaces baselines and noise_std; give only draws")
        draws = _check_draws(draws, x)
        n = draws.n_samples
        noisy, refs, alphas = noisy_rows(x, draws)
        tr = None if t is None else t.repeat_interleave(n)
        # each row is a one-draw Expected Gradients estimate at its noisy input
        rows_attr = ExpectedGradients(call.model)._attribute(
            call, noisy, None, tr, None, draws=EGDraws(refs.unsqueeze(1), alphas),
            internal_batch_size=chunk, multiply_by_inputs=multiply_by_inputs,
            show_progress=show_progress).attributions
        attr = rows_attr.view(draws.baselines.shape).mean(1)
        return Attributed(attr, draws.baselines.to(x.device, x.dtype))

    def _cost(self, x, options):
        """One gradient row per (sample, draw) at its noisy input; the draws are the
        references."""
        draws = options.get("draws")
        n = draws.n_samples if isinstance(draws, GSDraws) else \
            check_positive_int(options.get("n_samples", 50), "n_samples")
        return gradient_pass_cost(n * x.shape[0]), n
