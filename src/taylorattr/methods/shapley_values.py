"""Shapley values (Shapley 1953; Strumbelj & Kononenko 2010), exact or by permutation sampling.

Players are features, or groups of features (``feature_mask``: integer ids ``0..G-1``
broadcastable to one sample, like Captum's). A coalition ``S`` keeps its players at the
input and moves the others to the baseline, ``v(S) = f(x_S, x~_{not S})``, and

    phi_i = sum_{S not containing i} |S|! (G - |S| - 1)! / G! * (v(S + i) - v(S))

so ``sum_i phi_i = v(all) - v(none) = f(x) - f(x~)`` (the library's ``df``); every
feature of a group carries its group's value (Captum's convention).

* ``method="exact"``: all ``2^G`` coalitions (``G <= 16``; ``2^G`` forward rows per sample).
* ``method="sampling"``: Captum's ``ShapleyValueSampling``: ``n_samples`` random orders of
  the players (one order shared by the whole batch, drawn with ``torch.randperm`` from a
  CPU generator seeded with ``seed``); along each order the players join one by one,
  starting from the baseline, and each gets its marginal contribution; the average over
  orders is unbiased. ``G * n_samples`` forward rows per sample (plus one). With the same
  orders (``torch.manual_seed(seed)`` before Captum's call, or ``permutations=``) it equals
  Captum's ``ShapleyValueSampling``. ``antithetic=True`` follows every order by its reverse
  (Mitchell et al. 2022): the pair's estimate is exact on games without interactions of three
  or more players. The standard error (``standard_error`` after the call) is the spread of
  the orders' (pairs') contributions over the square root of their number.
* ``method="auto"`` (default): exact for ``G <= 16``, sampling beyond (the audit's
  principle-3 probe has 256 features: it is explained by sampling there).

Taylor reformulation (DESIGN.md 7): expanding ``f`` at ``x``, the removal game of the
order-K polynomial is a sum of unanimity games, one per monomial, so the Shapley value
gives each monomial ``phi(kappa)`` in equal shares ``1 / |S|`` to the players of its
support: :func:`taylorattr.taylor.shapley_rule.shapley_attribution` (exact for ``K <= 4``).
"""
from __future__ import annotations

import math
from dataclasses import replace
from typing import Any, Literal, overload

import torch

from .._validation import (
    check_bool,
    check_positive_int,
    check_seed,
    cpu_generator,
    draw,
    select_output,
)
from ..groups import player_ids
from ..runtime.cost import Cost
from ._base import Attributed, AttributionMethod
from ._call import CONSTRUCTED, Attributions, Baselines, Inputs, Target, given
from ._passes import check_optional_positive_int, chunk_ranges, default_chunk_rows

__all__ = ["MAX_EXACT_PLAYERS", "SampledShapley", "ShapleyValues", "coalition_values"]

#: The most players the exact enumeration takes (``2^16`` coalitions per sample).
MAX_EXACT_PLAYERS = 16
_METHODS = ("auto", "exact", "sampling")


def coalition_values(model, x, base, target, ids, coalitions, chunk: int | None = None,
                     show_progress: bool = False, desc: str = "coalitions") -> torch.Tensor:
    """``v(S) = f(x_S, x~_rest)`` for boolean coalitions ``[B, R, G]`` (or ``[R, G]``, shared by
    the batch): returns ``[B, R]``, the explained output of every coalition's input. ``ids``:
    the player of every feature, ``[n]`` or ``[1 or B, n]`` (:func:`~taylorattr.groups.player_ids`)."""
    batch, feat = x.shape[0], tuple(x.shape[1:])
    if coalitions.dim() == 2:
        coalitions = coalitions.unsqueeze(0).expand(batch, -1, -1)
    ids = ids[None] if ids.dim() == 1 else ids
    n_rows = coalitions.shape[1]
    chunk = chunk or default_chunk_rows(x, backward=False)
    out = torch.empty(batch, n_rows, dtype=x.dtype, device=x.device)
    xf, bf = x.reshape(batch, 1, -1), base.reshape(batch, 1, -1)
    per = max(1, chunk // batch)
    with torch.no_grad():
        for r0, r1 in chunk_ranges(n_rows, per, show_progress, desc):
            part = coalitions[:, r0:r1]
            index = ids[:, None, :].expand(batch, r1 - r0, -1)
            keep = torch.gather(part, 2, index)  # [B, r, n_features]
            rows = torch.where(keep, xf, bf).reshape((-1,) + feat)
            tr = None if target is None else target.repeat_interleave(r1 - r0)
            out[:, r0:r1] = select_output(model(rows), tr).view(batch, r1 - r0).to(x.dtype)
    return out


class SampledShapley(AttributionMethod):
    """The Shapley family's base: after each ``attribute`` call, :attr:`standard_error` holds
    the standard error of every sampled attribution (the attributions' structure), or None
    when nothing was sampled (exact enumeration, or ``sampler="captum"``)."""

    #: Standard errors of the last ``attribute`` call's attributions (None: not estimated).
    standard_error = None
    #: Coalition values are model calls on copies of the inputs with players replaced:
    #: integer/bool inputs and whole-batch outputs are taken (``AttributionMethod``).
    traits = replace(AttributionMethod.traits, perturbation=True)

    def _keep(self, explanation):
        """``attribute``'s result, keeping the call's standard errors as
        :attr:`standard_error` (also in :attr:`Explanation.standard_error`; with one object
        called from several threads, read them there: the attribute holds the last call's)."""
        self.standard_error = explanation.standard_error
        return explanation.result()


def _exact(model, x, base, t, ids, G, chunk, show_progress) -> tuple[torch.Tensor, torch.Tensor]:
    """``(phi, v(empty))``: the exact Shapley values of the ``G`` players ``[B, G]`` from
    the values of all ``2^G`` coalitions, and the empty coalition's value ``[B]``."""
    codes = torch.arange(2 ** G, device=x.device)
    bits = (codes[:, None] >> torch.arange(G, device=x.device)) & 1  # [2^G, G]
    v = coalition_values(model, x, base, t, ids, bits.bool(), chunk, show_progress, "shapley")
    size = bits.sum(1)
    fact = torch.tensor([math.factorial(k) for k in range(G + 1)], dtype=torch.float64,
                        device="cpu")
    # |S|! (G - |S| - 1)! / G! for coalitions S without the player (|S| <= G - 1)
    weight = (fact[size.cpu()] * fact[(G - size - 1).clamp(min=0).cpu()] / fact[G]).to(
        x.device, x.dtype)
    phi = torch.empty(x.shape[0], G, dtype=x.dtype, device=x.device)
    for i in range(G):
        without = codes[bits[:, i] == 0]
        phi[:, i] = ((v[:, without | (1 << i)] - v[:, without]) * weight[without]).sum(1)
    return phi, v[:, 0]


def draw_permutations(n_players: int, n_samples: int, seed: int) -> torch.Tensor:
    """``[n_samples, G]`` orders from ``torch.randperm`` on a CPU generator seeded with
    ``seed`` (the global generator after ``torch.manual_seed(seed)`` gives the same)."""
    gen = cpu_generator(check_seed(seed))
    return torch.stack([draw(torch.randperm, n_players, generator=gen, device="cpu")
                        for _ in range(n_samples)])


def _sampled(model, x, base, t, fx, ids, G, perms, chunk, show_progress, unit: int = 1):
    """Mean marginal contributions over the orders ``perms`` and their standard error, the
    orders taken in consecutive groups of ``unit`` (an order and its reverse: 2) as the
    independent draws."""
    n = perms.shape[0]
    perms = perms.to(x.device)
    rank = torch.empty_like(perms)
    rank.scatter_(1, perms, torch.arange(G, device=x.device).expand(n, G))
    # row (order p, step k) holds the first k + 1 players of order p
    steps = torch.arange(G, device=x.device)
    coal = (rank[:, None, :] <= steps[None, :, None]).reshape(n * G, G)
    v = coalition_values(model, x, base, t, ids, coal, chunk, show_progress, "shapley sampling")
    v = v.view(-1, n, G)
    with torch.no_grad():
        f_base = select_output(model(base), t).to(x.dtype)
    prev = torch.cat([f_base[:, None, None].expand(-1, n, 1), v[..., :-1]], dim=2)
    gains = v - prev  # [B, n, G]: gain of the player joining at step k
    # gains per (order, player): the marginal contribution of every player in every order
    per_order = torch.zeros_like(gains).scatter_(2, perms[None].expand_as(gains), gains)
    phi = per_order.mean(1)
    draws = per_order.view(x.shape[0], n // unit, unit, G).mean(2)
    se = draws.std(1) / math.sqrt(n // unit) if n // unit > 1 else None
    return phi, se, f_base


class ShapleyValues(SampledShapley):
    """Shapley values of the baseline-removal game, exact (``G <= 16``) or sampled.

    Equals an enumeration of all coalitions (``method="exact"``) and Captum's
    ``ShapleyValueSampling`` with the same orders (``method="sampling"``); see the module
    docstring for the definition and costs.
    """

    name = "shapley"
    #: every order's contributions sum to ``v(all) - v(none)``, so exact and sampled values
    #: alike are complete: checked on every call (``v(none) = f(x~)`` is a coalition row)
    traits = replace(SampledShapley.traits, complete=True, incomplete_cause=(
        "the model is not deterministic (its output for the same input "
        "differs between calls: dropout in training mode, or a batch-dependent "
        "layer)"))

    @overload
    def attribute(self, inputs: Inputs, baselines: Baselines = ..., target: Target = ..., *,
                  feature_mask: Any = ..., patch: Any = ..., method: str = ...,
                  n_samples: int = ..., seed: int = ..., permutations: Any = ...,
                  antithetic: bool = ..., perturbations_per_eval: int | None = ...,
                  return_convergence_delta: Literal[False] = ..., show_progress: bool = ...,
                  strict: bool = ..., additional_forward_args: Any = ..., layer: Any = ...,
                  attribute_to_layer_input: Any = ..., layer_baselines: Any = ...,
                  layer_delta: str = ...) -> Attributions: ...

    @overload
    def attribute(self, inputs: Inputs, baselines: Baselines = ..., target: Target = ..., *,
                  feature_mask: Any = ..., patch: Any = ..., method: str = ...,
                  n_samples: int = ..., seed: int = ..., permutations: Any = ...,
                  antithetic: bool = ..., perturbations_per_eval: int | None = ...,
                  return_convergence_delta: Literal[True], show_progress: bool = ...,
                  strict: bool = ..., additional_forward_args: Any = ..., layer: Any = ...,
                  attribute_to_layer_input: Any = ..., layer_baselines: Any = ...,
                  layer_delta: str = ...) -> tuple[Attributions, torch.Tensor]: ...

    def attribute(self, inputs: Inputs, baselines: Baselines = 0.0, target: Target = None, *,
                  feature_mask: Any = None, patch: Any = None, method: str = "auto",
                  n_samples: int = 25, seed: int = 0, permutations: Any = None,
                  antithetic: bool = False, perturbations_per_eval: int | None = None,
                  return_convergence_delta: bool = False, show_progress: bool = False,
                  strict: bool = False, additional_forward_args: Any = None,
                  layer: Any = CONSTRUCTED, attribute_to_layer_input: Any = CONSTRUCTED,
                  layer_baselines: Any = None,
                  layer_delta: str = "layer") -> Attributions | tuple[Attributions, torch.Tensor]:
        """ShapleyValues: attributions shaped like ``inputs`` (with
        ``return_convergence_delta=True`` and the delta ``[B]``); its options are
        ``_attribute``'s, the shared arguments :data:`~taylorattr.methods._call.SHARED_DOC`."""
        return self._keep(self.explain(**given(locals())))

    def _attribute(self, call, x, base, t, fx, *, feature_mask=None, patch=None, method: str = "auto",
                   n_samples: int = 25, seed: int = 0, permutations=None,
                   antithetic: bool = False, perturbations_per_eval: int | None = None,
                   show_progress: bool = False):
        """Options: ``feature_mask`` player ids (default: every feature a player), or
        ``patch``: square windows as players (Occlusion's layout);
        ``method`` ``"auto"`` | ``"exact"`` | ``"sampling"``; ``n_samples`` orders sampled
        (25, Captum's default); ``seed`` of the orders; ``permutations`` ``[n, G]`` orders to
        use instead of drawing them; ``antithetic`` each order followed by its reverse (2
        ``n_samples`` orders); ``perturbations_per_eval`` rows per model call."""
        chunk = check_optional_positive_int(perturbations_per_eval, "perturbations_per_eval")
        check_positive_int(n_samples, "n_samples")  # checked whichever method runs
        check_seed(seed)
        check_bool(antithetic, "antithetic")
        if method not in _METHODS:
            raise ValueError(f"method must be one of {list(_METHODS)}, got {method!r}")
        ids, G = player_ids(feature_mask, x, patch, call.layout)
        se = None
        exact = method == "exact" or (method == "auto" and G <= MAX_EXACT_PLAYERS
                                      and permutations is None)
        if exact:
            if G > MAX_EXACT_PLAYERS:
                raise ValueError(f"method='exact' enumerates 2^G coalitions and takes at most "
                                 f"{MAX_EXACT_PLAYERS} players, got G={G}; group features with "
                                 "feature_mask or use method='sampling'")
            if permutations is not None:
                raise ValueError("permutations are for method='sampling'; the exact method "
                                 "draws nothing")
            phi, f_base = _exact(call.model, x, base, t, ids, G, chunk, show_progress)
        else:
            if permutations is None:
                perms = draw_permutations(G, check_positive_int(n_samples, "n_samples"), seed)
            else:
                perms = _check_permutations(permutations, G)
            if antithetic:
                perms = torch.stack([perms, perms.flip(1)], 1).reshape(-1, G)
            phi, se, f_base = _sampled(call.model, x, base, t, fx, ids, G, perms, chunk,
                                       show_progress, 2 if antithetic else 1)
        index = ids.expand(x.shape[0], -1)
        # a group's value goes to each of its features: the players' values are complete
        return Attributed(phi.gather(1, index).view_as(x), base.unsqueeze(1), reference_outputs=f_base,
                          total=None if G == ids.shape[-1] and bool(
                              (ids == torch.arange(G, device=ids.device)).all()) else phi.sum(1),
                          standard_errors=None if se is None else se.gather(1, index).view_as(x))


    def _cost(self, x, options):
        """Exact: ``2^G`` coalitions per sample; sampling: ``G`` per order and sample, and
        one forward of the baselines. One reference."""

        _, G = player_ids(options.get("feature_mask"), x, options.get("patch"))
        method, perms = options.get("method", "auto"), options.get("permutations")
        if method not in _METHODS:
            raise ValueError(f"method must be one of {list(_METHODS)}, got {method!r}")
        batch = x.shape[0]
        if method == "exact" or (method == "auto" and G <= MAX_EXACT_PLAYERS and perms is None):
            return Cost(forward_rows=batch * 2 ** G), 1
        n = _check_permutations(perms, G).shape[0] if perms is not None else \
            check_positive_int(options.get("n_samples", 25), "n_samples")
        n *= 2 if options.get("antithetic", False) else 1
        return Cost(forward_rows=batch * n * G + batch), 1


def _check_permutations(perms, G: int) -> torch.Tensor:
    if not isinstance(perms, torch.Tensor) or perms.dtype.is_floating_point or perms.dim() != 2:
        raise TypeError("permutations must be an integer tensor [n_samples, G] of player orders")
    expected = torch.arange(G, device="cpu")
    if perms.shape[1] != G or perms.shape[0] == 0 or \
            not bool((perms.sort(1).values.cpu() == expected).all()):
        raise ValueError(f"permutations must hold, in each of its rows, every player id "
                         f"0..{G - 1} exactly once; got shape {tuple(perms.shape)}")
    return perms.to(torch.long)
