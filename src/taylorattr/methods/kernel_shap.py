"""KernelSHAP (Lundberg & Lee 2017), as Captum's ``KernelShap`` computes it.

Players and coalitions as in :mod:`.shapley_values` (``feature_mask`` groups features;
``v(z) = f(x_z, x~_rest)`` for a binary coalition vector ``z`` of the ``G`` players).
Per sample, ``n_samples`` coalitions are drawn: all players, none, then coalitions whose
size ``k`` follows ``p(k) ~ (G - 1) / (k (G - k))`` (``k = 1..G-1``), uniform among those of
that size (the top ``k`` of ``G`` normal draws); this sampling *is* the Shapley kernel's
weighting, so the regression weights are 1, except ``10^6`` on the two end points
(which pins ``v(all)`` and ``v(none)``). The attribution is the coefficient vector of the
weighted least-squares fit with intercept,

    min_{c, phi} sum_s w_s (v(z_s) - c - z_s . phi)^2

(minimum-norm solution on centred data when under-determined, as scikit-learn's
``LinearRegression``, which Captum uses). All draws come from one CPU generator seeded
with ``seed`` in Captum's order (per sample: ``multinomial`` for ``k``, ``randn`` for the
ranking), so after ``torch.manual_seed(seed)`` Captum's ``KernelShap`` draws the same
coalitions. Every feature of a group carries its group's coefficient. Cost: ``n_samples``
forward rows per sample.
"""
from __future__ import annotations

import torch

from .._validation import check_positive_int, check_seed
from ._base import AttributionMethod
from ._passes import check_optional_positive_int
from .shapley_values import coalition_values, player_ids

__all__ = ["END_POINT_WEIGHT", "KernelShap", "draw_coalitions"]

#: Regression weight of the all-players and no-player coalitions (Captum's ``inf_weight``).
END_POINT_WEIGHT = 1_000_000.0


def draw_coalitions(n_players: int, n_samples: int, batch: int, seed: int) -> torch.Tensor:
    """``[batch, n_samples, G]`` boolean coalitions, Captum's sampling (module docstring)."""
    G = n_players
    gen = torch.Generator().manual_seed(check_seed(seed))
    sizes = torch.arange(G, dtype=torch.float)
    probs = torch.tensor(G - 1) / (sizes * (G - sizes))  # Captum's float32 arithmetic
    probs[0] = 0.0
    probs = (probs / probs.sum(-1, keepdim=True)).reshape(1, -1)
    out = torch.zeros(batch, n_samples, G, dtype=torch.bool)
    for b in range(batch):
        out[b, 0] = True
        for s in range(2, n_samples):
            k = int(torch.multinomial(probs, 1, True, generator=gen))
            vals = torch.randn(1, G, generator=gen)
            threshold = torch.kthvalue(vals, G - k).values.item()
            out[b, s] = (vals > threshold)[0]
        # Captum's fit of each sample takes draws from the same (global) generator: its
        # DataLoader's base seed and the default initialisation of an nn.Linear(G, 1)
        # surrogate. Take them too, so that batches stay in step with Captum.
        torch.empty((), dtype=torch.int64).random_(generator=gen)
        torch.empty(1, G).uniform_(generator=gen)
        torch.empty(1).uniform_(generator=gen)
    return out


def _weighted_fit(z: torch.Tensor, y: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """Coefficients of ``y ~ c + z . phi`` by weighted least squares, per sample:
    ``z [B, S, G]``, ``y [B, S]``, ``w [S]`` -> ``[B, G]`` (float64)."""
    z, y, w = z.double(), y.double(), w.double()
    wn = w / w.sum()
    zc = z - (wn[None, :, None] * z).sum(1, keepdim=True)
    yc = y - (wn[None, :] * y).sum(1, keepdim=True)
    sw = w.sqrt()
    a = zc * sw[None, :, None]
    rhs = (yc * sw[None, :]).unsqueeze(-1)
    return torch.linalg.lstsq(a.cpu(), rhs.cpu(), driver="gelsd").solution.squeeze(-1)


class KernelShap(AttributionMethod):
    """KernelSHAP: Shapley values estimated by a kernel-weighted linear regression on
    ``n_samples`` sampled coalitions; equals Captum's ``KernelShap`` with the same draws
    (see the module docstring)."""

    name = "kernel_shap"

    def _attribute(self, x, base, t, fx, *, feature_mask=None, patch=None, n_samples: int = 25,
                   seed: int = 0, perturbations_per_eval: int | None = None,
                   show_progress: bool = False):
        """Options: ``feature_mask`` player ids (default: every feature a player), or
        ``patch``: square windows as players (Occlusion's layout);
        ``n_samples`` coalitions per sample (25, Captum's default; at least 2); ``seed`` of
        the draws; ``perturbations_per_eval`` rows per model call."""
        chunk = check_optional_positive_int(perturbations_per_eval, "perturbations_per_eval")
        n = check_positive_int(n_samples, "n_samples")
        if n < 2:
            raise ValueError(f"n_samples must be >= 2 (the all- and no-player coalitions come "
                             f"first), got {n_samples}")
        ids, G = player_ids(feature_mask, x, patch)
        coal = draw_coalitions(G, n, x.shape[0], seed).to(x.device)
        v = coalition_values(self.model, x, base, t, ids, coal, chunk, show_progress,
                             "kernel shap")
        w = torch.ones(n, dtype=torch.float64)
        w[:2] = END_POINT_WEIGHT
        phi = _weighted_fit(coal, v, w).to(x.device, x.dtype)
        return phi[:, ids].view_as(x), base.unsqueeze(1)

    def _cost(self, x, options):
        """``n_samples`` coalitions per sample; one reference."""
        from ..runtime.cost import Cost

        n = check_positive_int(options.get("n_samples", 25), "n_samples")
        return Cost(forward_rows=x.shape[0] * n), 1
