"""LIME (Ribeiro et al. 2016) on the baseline-removal game, as Captum's ``Lime``.

Players are features or groups (``feature_mask``, as :mod:`.shapley_values`); a coalition
``z`` in ``{0, 1}^G`` keeps its players at the input and moves the others to the baseline,
``x_z = z * x + (1 - z) * x~`` (per player). For ``n_samples`` coalitions per sample,
drawn uniformly (each player kept with probability 1/2, Captum's default perturbation), the
attribution is the coefficient vector ``phi`` of the interpretable model fitted to the
model's outputs with similarity weights,

    min_{c, phi} sum_s pi(x, x_{z_s}) (f(x_{z_s}) - c - z_s . phi)^2   [+ penalty],
    pi(x, x') = exp(-d(x, x')^2 / (2 w^2)),   d = 1 - cos(x, x')       (``kernel_width`` w)

(Captum's default exponential kernel on the cosine distance between the flattened input
and its perturbed copy). The default interpretable model here is that weighted least-squares
fit with intercept (minimum-norm when under-determined); ``interpretable_model`` takes any
``fit(z [n, G], y [n], weights [n]) -> phi [G]`` (Captum's default is a Lasso with
``alpha=0.01``: :class:`taylorattr.captum.attr.Lime` passes scikit-learn's). Every
feature of a group carries its group's coefficient. Draws: a CPU ``torch.Generator``
seeded with ``seed`` (or ``coalitions`` ``[B, n, G]`` given). Cost: ``n_samples`` forward
rows per sample.

Taylor view: none is registered. The fit weights each coalition by the similarity kernel
(not the Shapley kernel of :class:`~.kernel_shap.KernelShap`), so a monomial of the
expansion of ``f`` shared by several players is split among them in proportions that depend
on the kernel width, the number of players and the draws, not by a fixed rule; only for
an additive model (no interaction monomials) does every coefficient equal the player's own
term ``f(x_i, x~_rest) - f(x~)``.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Any, Literal, overload

import torch

from .._validation import check_positive_int, check_real, check_seed, cpu_generator, draw
from ..runtime.cost import Cost
from ._base import Attributed, AttributionMethod
from ._call import CONSTRUCTED, Attributions, Baselines, Inputs, Target, given
from ._passes import check_optional_positive_int
from .kernel_shap import _captum_fit
from .shapley_values import coalition_values, player_ids

__all__ = ["Lime", "cosine_kernel", "draw_coalitions"]


def draw_coalitions(n_players: int, n_samples: int, batch: int, seed: int) -> torch.Tensor:
    """``[batch, n_samples, G]`` boolean coalitions (on the CPU), each player kept with
    probability 1/2."""
    gen = cpu_generator(check_seed(seed))
    return draw(torch.rand, batch, n_samples, n_players, generator=gen, device="cpu") < 0.5


def cosine_kernel(x: torch.Tensor, perturbed: torch.Tensor, kernel_width: float) -> torch.Tensor:
    """``exp(-(1 - cos(x_b, perturbed_bs))^2 / (2 w^2))`` for ``x [B, ...]`` and
    ``perturbed [B, n, ...]``: ``[B, n]``."""
    a = x.reshape(x.shape[0], 1, -1)
    p = perturbed.reshape(perturbed.shape[0], perturbed.shape[1], -1)
    cos = torch.nn.functional.cosine_similarity(a, p, dim=2)
    return torch.exp(-((1 - cos) ** 2) / (2 * kernel_width ** 2))


class Lime(AttributionMethod):
    """LIME: an interpretable linear model fitted to ``n_samples`` random coalitions,
    weighted by their similarity to the input (module docstring)."""

    name = "lime"
    traits = replace(AttributionMethod.traits, perturbation=True,
                     batch_options=("feature_mask", "coalitions"))

    @overload
    def attribute(self, inputs: Inputs, baselines: Baselines = ..., target: Target = ..., *,
                  feature_mask: Any = ..., n_samples: int = ..., seed: int = ...,
                  coalitions: Any = ..., kernel_width: float = ...,
                  interpretable_model: Any = ..., perturbations_per_eval: int | None = ...,
                  return_convergence_delta: Literal[False] = ..., show_progress: bool = ...,
                  strict: bool = ..., additional_forward_args: Any = ..., layer: Any = ...,
                  attribute_to_layer_input: Any = ..., layer_baselines: Any = ...,
                  layer_delta: str = ...) -> Attributions: ...

    @overload
    def attribute(self, inputs: Inputs, baselines: Baselines = ..., target: Target = ..., *,
                  feature_mask: Any = ..., n_samples: int = ..., seed: int = ...,
                  coalitions: Any = ..., kernel_width: float = ...,
                  interpretable_model: Any = ..., perturbations_per_eval: int | None = ...,
                  return_convergence_delta: Literal[True], show_progress: bool = ...,
                  strict: bool = ..., additional_forward_args: Any = ..., layer: Any = ...,
                  attribute_to_layer_input: Any = ..., layer_baselines: Any = ...,
                  layer_delta: str = ...) -> tuple[Attributions, torch.Tensor]: ...

    def attribute(self, inputs: Inputs, baselines: Baselines = 0.0, target: Target = None, *,
                  feature_mask: Any = None, n_samples: int = 50, seed: int = 0,
                  coalitions: Any = None, kernel_width: float = 1.0,
                  interpretable_model: Any = None, perturbations_per_eval: int | None = None,
                  return_convergence_delta: bool = False, show_progress: bool = False,
                  strict: bool = False, additional_forward_args: Any = None,
                  layer: Any = CONSTRUCTED, attribute_to_layer_input: Any = CONSTRUCTED,
                  layer_baselines: Any = None,
                  layer_delta: str = "layer") -> Attributions | tuple[Attributions, torch.Tensor]:
        """Lime: attributions shaped like ``inputs`` (with
        ``return_convergence_delta=True`` and the delta ``[B]``); its options are
        ``_attribute``'s, the shared arguments :data:`~taylorattr.methods._call.SHARED_DOC`."""
        return self.explain(**given(locals())).result()

    def _attribute(self, call, x, base, t, fx, *, feature_mask=None, n_samples: int = 50,
                   seed: int = 0, coalitions=None, kernel_width: float = 1.0,
                   interpretable_model=None, perturbations_per_eval: int | None = None,
                   show_progress: bool = False):
        """Options: ``feature_mask`` player ids (default: every feature a player);
        ``n_samples`` coalitions per sample; ``seed`` of the draws or ``coalitions``
        ``[B, n, G]`` (bool) to use instead; ``kernel_width`` of the similarity kernel;
        ``interpretable_model`` ``fit(z, y, weights) -> phi`` (default weighted least
        squares); ``perturbations_per_eval`` rows per model call."""
        chunk = check_optional_positive_int(perturbations_per_eval, "perturbations_per_eval")
        ids, G = player_ids(feature_mask, x, None, call.layout)  # [1 or B, n_features]
        batch = x.shape[0]
        if coalitions is None:
            coal = draw_coalitions(G, check_positive_int(n_samples, "n_samples"), batch, seed)
        else:
            coal = torch.as_tensor(coalitions, device=x.device).to(torch.bool)
            if coal.dim() != 3 or coal.shape[0] != batch or coal.shape[2] != G:
                raise ValueError(f"coalitions must be a [{batch}, n, {G}] boolean tensor (one "
                                 f"row of players per draw), got {tuple(coal.shape)}")
        check_real(kernel_width, "kernel_width", 0.0, strict=True)
        if interpretable_model is not None and not callable(interpretable_model):
            raise TypeError("interpretable_model must be None (weighted least squares) or a "
                            "callable fit(z, y, weights) -> coefficients, got "
                            f"{type(interpretable_model).__name__}")
        coal = coal.to(x.device)
        v = coalition_values(call.model, x, base, t, ids, coal, chunk, show_progress, "lime")
        index = ids[:, None, :].expand(batch, coal.shape[1], -1)
        keep = torch.gather(coal, 2, index).view(coal.shape[:2] + tuple(x.shape[1:]))
        sims = cosine_kernel(x, torch.where(keep, x[:, None], base[:, None]), kernel_width)
        if interpretable_model is None:
            phi = torch.stack([_captum_fit(coal[b:b + 1], v[b:b + 1], sims[b])[0]
                               for b in range(batch)])
        else:
            phi = torch.stack([torch.as_tensor(interpretable_model(
                coal[b].double(), v[b].double(), sims[b].double()), device=x.device).reshape(G)
                for b in range(batch)])
        phi = phi.to(x.device, x.dtype)
        return Attributed(phi.gather(1, ids.expand(batch, -1)).view_as(x), base.unsqueeze(1))

    def _cost(self, x, options):
        """``n_samples`` coalitions per sample; one reference."""

        n = check_positive_int(options.get("n_samples", 50), "n_samples")
        return Cost(forward_rows=x.shape[0] * n), 1
