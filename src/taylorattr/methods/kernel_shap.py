r"""KernelSHAP (Lundberg & Lee 2017): Shapley values as a kernel-weighted linear regression.

Players and coalitions as in :mod:`.shapley_values` (``v(z) = f(x_z, x~_rest)`` for a binary
coalition vector ``z`` of the ``G`` players). The Shapley values are the solution of

    min_phi  sum_z k(z) (v(z) - v(0) - z . phi)^2   subject to   sum_i phi_i = v(1) - v(0) = df,

over all coalitions ``0 < |z| < G``, with the Shapley kernel ``k(z) = (G - 1) / (C(G, |z|)
|z| (G - |z|))`` (the kernel's total weight of size ``s`` is ``K_s = (G - 1) / (s (G - s))``).
KernelSHAP estimates the weighted Gram matrix ``A = sum k z z^T`` and ``b = sum k z (v(z) -
v(0))`` from some coalitions and solves the constrained problem exactly (its KKT system), so
the attributions sum to ``df`` to float precision.

``sampler="paired"`` (default), per sample, with ``n_samples`` model rows (the baseline
``v(0)`` among them; ``v(1) = f(x)`` is the call's own forward): the exact enumeration of the heaviest sizes, then paired (antithetic: ``S`` with its
complement), size-stratified sampling of the others, weighted to an unbiased design
(:mod:`.kernel_design`). Paired sampling makes the estimate exact on games without
interactions of three or more players (a quadratic control variate changed the error by less
than 1e-14 relative): what error remains comes from those.

When ``n_samples >= 2^G - 1`` every coalition is enumerated and the result *is* the exact
Shapley value. Default ``n_samples``: ``min(2^G - 1, 2 G + 2048)`` (SHAP's rule). With
fewer than ``G + 1`` rows the fit is under-determined (the minimum-norm solution of the KKT
system is returned, with a warning).

Standard errors (``method.standard_error`` after the call): the sandwich (delta-method)
estimate ``Cov(phi) = M V M^T``, ``M`` the ``phi`` block of the inverse KKT matrix and ``V``
the between-pair covariance, within strata, of the pairs' estimating-equation terms
``t_u = sum_{z in u} w_z z (v(z) - v(0) - z . phi)`` (strata holding fewer than two pairs are
pooled with their neighbours); enumerated coalitions add no variance. The finite-population
factor of the strata drawn without replacement is left out: with it, 95% intervals held the
exact value in 91.5% of the test's cases, without it in 95.1%.

``num_features=k`` (optional, SHAP's ``l1_reg="num_features(k)"`` in spirit): keep the ``k``
players with the largest ``|phi|`` of the full fit and refit with the others at 0 (the
constraint kept); a selection by magnitude, not SHAP's LARS path.

``sampler="captum"``: Captum's ``KernelShap`` (``n_samples`` rows drawn as Captum draws them,
:func:`.kernel_design.draw_coalitions`; a least squares fit with intercept, weight ``10^6`` on
the end points); with the same seed it draws Captum's coalitions (``torch.manual_seed(seed)``
before Captum's call) and equals it, and with ``seed=torch.default_generator`` it draws from
the global generator as Captum does.

``return_input_shape=False`` returns the ``[B, G]`` player values instead of every feature
carrying its player's value (Captum's option).

Images: with no ``feature_mask`` and no ``patch``, the paired sampler on a ``[B, C, H, W]``
input of sides >= ``2 IMAGE_GRID`` groups its pixels into square patches, at most
:data:`IMAGE_GRID` x :data:`IMAGE_GRID` of them (all channels of a pixel together), as
SHAP's and Captum's image examples group superpixels: a player per feature would be a
``(C H W + 1)``-square solve per image (12,289 for 3x64x64). ``sampler="captum"`` keeps
Captum's default of a player per feature.

Out of reach: the fit solves a ``(G + 1)``-square system per sample (``sampler="captum"``: a
least-squares fit of ``n_samples x G``); from :data:`SOLVE_PLAYERS` players on, its cost
(``cost()``'s ``out_of_reach``, which a budget refuses) is beyond a CPU, and a call warns
before it runs a model row.
"""
from __future__ import annotations

import math
import warnings
from typing import Any, Literal, overload

import torch

from .._validation import check_bool, check_positive_int
from ..groups import player_ids
from ..runtime.cost import Cost
from ._base import Attributed
from ._call import CONSTRUCTED, Attributions, Baselines, Inputs, Target, given
from ._passes import check_optional_positive_int
from .kernel_design import draw_coalitions, paired_design, plan
from .shapley_values import SampledShapley, coalition_values

__all__ = ["END_POINT_WEIGHT", "IMAGE_GRID", "SAMPLERS", "SOLVE_PLAYERS", "KernelShap",
           "default_n_samples", "default_patch", "draw_coalitions", "out_of_reach",
           "paired_design"]

#: Regression weight of the all-players and no-player coalitions (Captum's ``inf_weight``).
END_POINT_WEIGHT = 1_000_000.0
SAMPLERS = ("paired", "captum")
#: SHAP's default budget: ``2 G + 2048`` rows, or every coalition when fewer.
_BASE_ROWS = 2048
#: Images get at most this many patches per side as players by default (module docstring).
IMAGE_GRID = 8
#: Players per sample from which the fit is out of reach: its ``(G + 1)``-square float64
#: system is 134 MB and a pseudo-inverse of ``G^3 = 7e10`` operations per sample at 4,096
#: (the 12,288 players of a 3x64x64 image ran over 10 minutes at 11 GB).
SOLVE_PLAYERS = 4096


def default_patch(x: torch.Tensor, feature_mask, patch, sampler: str) -> int | None:
    """The patch side of the default image players (module docstring), else ``patch``."""
    if patch is not None or feature_mask is not None or sampler != "paired" or x.dim() != 4:
        return patch
    h, w = x.shape[-2:]
    if min(h, w) < 2 * IMAGE_GRID:
        return None
    return -(-max(h, w) // IMAGE_GRID)


def out_of_reach(G: int, sampler: str) -> str:
    """Why the fit of ``G`` players cannot run here ("" when it can)."""
    if G < SOLVE_PLAYERS:
        return ""
    what = (f"a least-squares fit over {G:,} players per sample" if sampler == "captum"
            else f"a {G + 1:,}-square solve per sample ({8 * (G + 1) ** 2 / 1e9:.1f} GB, "
                 f"about {float(G) ** 3:.1e} operations)")
    return (f"KernelShap with {G:,} players: {what}, beyond a CPU from {SOLVE_PLAYERS:,} "
            "players; group the features (patch=8, or a feature_mask of superpixels)")


def default_n_samples(n_players: int) -> int:
    """``min(2^G - 1, 2 G + 2048)``: model rows per sample when ``n_samples`` is not given."""
    full = 2 ** n_players - 1 if n_players < 40 else math.inf
    return int(min(full, 2 * n_players + _BASE_ROWS))


def _kkt_solve(A: torch.Tensor, b: torch.Tensor, df: torch.Tensor, keep: torch.Tensor | None):
    """``phi`` minimising the weighted squares with ``sum phi = df``, and the ``phi`` block
    ``M`` of the inverse KKT matrix; ``keep [B, G]`` bool: players allowed a non-zero value.
    The least-squares solution of the KKT system (minimum norm when under-determined)."""
    B, G = b.shape
    ones = torch.ones(B, G, 1, dtype=A.dtype, device=A.device)
    if keep is not None:  # players outside keep: phi_i = 0 (row i of the system is e_i)
        drop = ~keep
        A = torch.where(drop[:, :, None] | drop[:, None, :], torch.zeros((), dtype=A.dtype, device=A.device), A)
        A = A + torch.diag_embed(drop.to(A.dtype))
        b = torch.where(drop, torch.zeros((), dtype=b.dtype, device=b.device), b)
        ones = ones * keep[..., None].to(A.dtype)
    top = torch.cat([A, ones], 2)
    bottom = torch.cat([ones.transpose(1, 2), torch.zeros(B, 1, 1, dtype=A.dtype, device=A.device)], 2)
    kkt = torch.cat([top, bottom], 1)
    rhs = torch.cat([b, df[:, None]], 1)
    inverse = torch.linalg.pinv(kkt, hermitian=True)
    phi = (inverse @ rhs[..., None])[:, :G, 0]
    if keep is not None:
        phi = phi * keep  # exactly 0 (the pseudo-inverse leaves rounding there)
    return phi, inverse[:, :G, :G]


def _pooled_strata(stratum: torch.Tensor, n_units: int) -> torch.Tensor:
    """One sample's pairs' variance groups: consecutive strata pooled until each group holds
    at least two pairs (``stratum [U]`` of the pairs, sorted by stratum id)."""
    group = torch.empty_like(stratum)
    values, counts = torch.unique(stratum, return_counts=True)
    g, held, label = 0, 0, {}
    for value, count in zip(values.tolist(), counts.tolist()):
        label[value] = g
        held += count
        if held >= 2:
            g, held = g + 1, 0
    if held and g > 0:  # a last group with a single pair joins the one before it
        label = {value: min(lab, g - 1) for value, lab in label.items()}
    for value, lab in label.items():
        group[stratum == value] = lab
    return group


def _standard_errors(z, w, resid, unit, stratum, inverse) -> torch.Tensor:
    """Sandwich standard errors ``sqrt(diag(M V M^T))`` per sample (module docstring)."""
    B, _, G = z.shape
    out = torch.zeros(B, G, dtype=torch.float64, device=z.device)
    for b in range(B):
        sampled = unit[b] >= 0
        if not bool(sampled.any()):
            continue
        terms = (w[b, sampled] * resid[b, sampled])[:, None] * z[b, sampled].double()
        U = int(unit[b, sampled].max()) + 1
        t = torch.zeros(U, G, dtype=torch.float64, device=z.device).index_add_(0, unit[b, sampled], terms)
        pair_stratum = torch.zeros(U, dtype=torch.long, device=z.device)
        pair_stratum[unit[b, sampled]] = stratum[b, sampled]
        group = _pooled_strata(pair_stratum, U)
        n_groups = int(group.max()) + 1
        count = torch.bincount(group, minlength=n_groups).to(torch.float64)
        mean = torch.zeros(n_groups, G, dtype=torch.float64, device=z.device).index_add_(0, group, t)
        mean = mean / count[:, None]
        centred = t - mean[group]
        factor = (count / (count - 1).clamp(min=1))[group]
        V = (centred * factor[:, None]).T @ centred
        out[b] = torch.diagonal(inverse[b] @ V @ inverse[b].T).clamp(min=0).sqrt()
    return out


def _captum_fit(z: torch.Tensor, y: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """Coefficients of ``y ~ c + z . phi`` by weighted least squares, per sample:
    ``z [B, S, G]``, ``y [B, S]``, ``w [S]`` -> ``[B, G]`` (float64; minimum norm on centred
    data when under-determined, as scikit-learn's ``LinearRegression``, which Captum uses)."""
    z, y, w = z.double(), y.double(), w.double()
    wn = w / w.sum()
    zc = z - (wn[None, :, None] * z).sum(1, keepdim=True)
    yc = y - (wn[None, :] * y).sum(1, keepdim=True)
    sw = w.sqrt()
    a = zc * sw[None, :, None]
    rhs = (yc * sw[None, :]).unsqueeze(-1)
    return torch.linalg.lstsq(a.cpu(), rhs.cpu(), driver="gelsd").solution.squeeze(-1)


class KernelShap(SampledShapley):
    """KernelSHAP: Shapley values estimated by the kernel-weighted regression on ``n_samples``
    coalitions per sample, paired and stratified, with the efficiency constraint exact
    (module docstring); ``sampler="captum"`` is Captum's ``KernelShap`` with the same draws.
    After a call, ``standard_error`` holds the standard error of every attribution."""

    name = "kernel_shap"

    @overload
    def attribute(self, inputs: Inputs, baselines: Baselines = ..., target: Target = ..., *,
                  feature_mask: Any = ..., patch: Any = ..., n_samples: int | None = ...,
                  seed: int = ..., sampler: str = ..., num_features: int | None = ...,
                  return_input_shape: bool = ..., perturbations_per_eval: int | None = ...,
                  return_convergence_delta: Literal[False] = ..., show_progress: bool = ...,
                  strict: bool = ..., additional_forward_args: Any = ..., layer: Any = ...,
                  attribute_to_layer_input: Any = ..., layer_baselines: Any = ...,
                  layer_delta: str = ...) -> Attributions: ...

    @overload
    def attribute(self, inputs: Inputs, baselines: Baselines = ..., target: Target = ..., *,
                  feature_mask: Any = ..., patch: Any = ..., n_samples: int | None = ...,
                  seed: int = ..., sampler: str = ..., num_features: int | None = ...,
                  return_input_shape: bool = ..., perturbations_per_eval: int | None = ...,
                  return_convergence_delta: Literal[True], show_progress: bool = ...,
                  strict: bool = ..., additional_forward_args: Any = ..., layer: Any = ...,
                  attribute_to_layer_input: Any = ..., layer_baselines: Any = ...,
                  layer_delta: str = ...) -> tuple[Attributions, torch.Tensor]: ...

    def attribute(self, inputs: Inputs, baselines: Baselines = 0.0, target: Target = None, *,
                  feature_mask: Any = None, patch: Any = None, n_samples: int | None = None,
                  seed: int = 0, sampler: str = "paired", num_features: int | None = None,
                  return_input_shape: bool = True, perturbations_per_eval: int | None = None,
                  return_convergence_delta: bool = False, show_progress: bool = False,
                  strict: bool = False, additional_forward_args: Any = None,
                  layer: Any = CONSTRUCTED, attribute_to_layer_input: Any = CONSTRUCTED,
                  layer_baselines: Any = None,
                  layer_delta: str = "layer") -> Attributions | tuple[Attributions, torch.Tensor]:
        """KernelShap: attributions shaped like ``inputs`` (with
        ``return_convergence_delta=True`` and the delta ``[B]``); its options are
        ``_attribute``'s, the shared arguments :data:`~taylorattr.methods._call.SHARED_DOC`."""
        return self._keep(self.explain(**given(locals())))

    def _attribute(self, call, x, base, t, fx, *, feature_mask=None, patch=None,
                   n_samples: int | None = None, seed: int = 0, sampler: str = "paired",
                   num_features: int | None = None, return_input_shape: bool = True,
                   perturbations_per_eval: int | None = None, show_progress: bool = False):
        """Options: ``feature_mask`` player ids (Captum's convention: shared or per sample,
        one per input for tuple inputs; default: every feature a player), or ``patch``:
        square windows as players (Occlusion's layout); ``n_samples`` model rows per sample
        (default ``min(2^G - 1, 2 G + 2048)``); ``seed`` of the draws (with
        ``sampler="captum"`` also a ``torch.Generator`` to draw from); ``sampler``
        ``"paired"`` | ``"captum"``; ``num_features`` players kept by the selection step
        (paired sampler; default all); ``return_input_shape`` False: ``[B, G]`` player
        values; ``perturbations_per_eval`` rows per model call."""
        chunk = check_optional_positive_int(perturbations_per_eval, "perturbations_per_eval")
        check_bool(return_input_shape, "return_input_shape")
        if sampler not in SAMPLERS:
            raise ValueError(f"sampler must be one of {list(SAMPLERS)}, got {sampler!r}")
        if num_features is not None:  # checked before any model row runs
            check_positive_int(num_features, "num_features")
        layout = call.layout
        if not return_input_shape and layout is not None and layout.flat:
            raise ValueError("return_input_shape=False gives one [B, G] tensor of player values; "
                             "it is for one-tensor inputs (tuple inputs get their input shapes)")
        if layout is None or not layout.flat:  # one tensor input
            patch = default_patch(x, feature_mask, patch, sampler)
        ids, G = player_ids(feature_mask, x, patch, layout)
        why = out_of_reach(G, sampler)
        if why:  # before any model row runs
            warnings.warn(f"{why}; this call may run for hours and exhaust memory",
                          RuntimeWarning, stacklevel=4)
        n = self._budget(n_samples, G, sampler)
        if sampler == "captum":
            if num_features is not None:
                raise ValueError("num_features is for sampler='paired'")
            coal = draw_coalitions(G, n, x.shape[0], seed).to(x.device)
            v = coalition_values(call.model, x, base, t, ids, coal, chunk, show_progress,
                                 "kernel shap")
            w = torch.ones(n, dtype=torch.float64, device=x.device)
            w[:2] = END_POINT_WEIGHT
            phi = _captum_fit(coal, v, w).to(x.device, x.dtype)
            se = None
        else:
            phi, se = self._paired(call.model, x, base, t, fx, ids, G, n, seed, num_features, chunk,
                                   show_progress)
        return Attributed(self._spread(phi, ids, x, return_input_shape), base.unsqueeze(1),
                          standard_errors=se if se is None else self._spread(se, ids, x,
                                                                             return_input_shape))

    @staticmethod
    def _spread(values, ids, x, return_input_shape):
        if not return_input_shape:
            return values
        return values.gather(1, ids.expand(x.shape[0], -1)).view_as(x)

    @staticmethod
    def _budget(n_samples, G: int, sampler: str) -> int:
        if n_samples is None:
            return default_n_samples(G)
        n = check_positive_int(n_samples, "n_samples")
        if sampler == "captum" and n < 2:
            raise ValueError(f"n_samples must be >= 2 with sampler='captum' (the all- and "
                             f"no-player coalitions come first), got {n_samples}")
        if n < G + 1:
            warnings.warn(f"KernelShap: n_samples={n} model rows per sample are fewer than the "
                          f"G + 1 = {G + 1} a determined fit of {G} players needs; the "
                          "attributions are a minimum-norm solution, not an estimate of the "
                          "Shapley values. Raise n_samples or group features.", stacklevel=4)
        return n

    def _paired(self, model, x, base, t, fx, ids, G, n, seed, num_features, chunk, show_progress):
        batch = x.shape[0]
        z, w, unit, stratum = paired_design(G, max(n - 1, 0), batch, seed)
        z = torch.cat([torch.zeros(batch, 1, G, dtype=torch.bool, device="cpu"), z], 1).to(x.device)
        v = coalition_values(model, x, base, t, ids, z, chunk, show_progress,
                             "kernel shap").double().cpu()
        z, v0 = z[:, 1:].cpu(), v[:, 0]
        y = v[:, 1:] - v0[:, None]
        df = fx.detach().double().cpu() - v0
        zd = z.double()
        A = torch.einsum("bs,bsi,bsj->bij", w, zd, zd)
        b = torch.einsum("bs,bsi,bs->bi", w, zd, y)
        # a player without features (of a sample) has value 0: fixed, not estimated
        keep = torch.zeros(batch, G, dtype=torch.bool, device="cpu").scatter_(
            1, ids.cpu().expand(batch, -1), True)
        if num_features is not None:
            k = num_features  # checked in _attribute
            if k < G:
                full, _ = _kkt_solve(A, b, df, keep)
                top = full.abs().topk(k, 1).indices
                keep &= torch.zeros(batch, G, dtype=torch.bool, device="cpu").scatter_(1, top, True)
        phi, inverse = _kkt_solve(A, b, df, None if bool(keep.all()) else keep)
        resid = y - (zd @ phi[..., None])[..., 0]
        se = _standard_errors(z, w, resid, unit, stratum, inverse)
        return phi.to(x.device, x.dtype), se.to(x.device, x.dtype)

    def _cost(self, x, options):
        """``n_samples`` model rows per sample (default ``min(2^G - 1, 2 G + 2048)``; the
        paired sampler may leave one row unused); one reference."""

        sampler = options.get("sampler", "paired")
        if sampler not in SAMPLERS:
            raise ValueError(f"sampler must be one of {list(SAMPLERS)}, got {sampler!r}")
        mask = options.get("feature_mask")
        _, G = player_ids(mask, x, default_patch(x, mask, options.get("patch"), sampler))
        n = options.get("n_samples")
        n = default_n_samples(G) if n is None else check_positive_int(n, "n_samples")
        why = out_of_reach(G, sampler)
        if sampler == "paired":
            enumerated, _, U = plan(G, max(n - 1, 0))
            n = 1 + sum(math.comb(G, s) for s in enumerated) + 2 * U
        return Cost(forward_rows=x.shape[0] * n, out_of_reach=why), 1
