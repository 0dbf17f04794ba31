"""DeepLiftShap (Lundberg & Lee 2017): DeepLIFT (Rescale) averaged over references.

    a_i = 1/N sum_k DeepLIFT_i(x, x~_k)
        = 1/N sum_k (x_i - x~_ik) * m_i(x, x~_k)      (m: the Rescale multipliers)

Each term is complete towards its reference, so ``sum_i a_i = f(x) - 1/N sum_k f(x~_k)``.
References: a reference set (a :class:`~taylorattr.baselines.ReferenceSet` or a tensor
``[N, ...]``), of which **every** row is used, as Captum's ``DeepLiftShap`` does (nothing
is drawn); or :class:`~taylorattr.baselines.Noise` (``noise_std = s``: ``N(x, s^2)``),
of which ``n_samples`` references per sample are drawn exactly as Expected Gradients
draws its baselines with the same ``seed``
(:func:`taylorattr.methods.expected_gradients.draw`).

Supported models: those of :class:`~taylorattr.methods.DeepLift` (its
:class:`~taylorattr.methods.layerwise.UnsupportedModelError` otherwise).

Taylor view: layer-wise, as DeepLIFT (Thm 4) for each reference; no reformulation is
registered for the average (none derived and tested here).

Precision: as DeepLIFT's (:mod:`taylorattr.methods.deeplift`): for float16/bfloat16
models each pass runs in float32, the average is accumulated in float32, checked at the
passes' float32 values (``f32(x)`` averaged over the sample's rows, ``mean_k f32(x~_k)``)
with float32's tolerance, and rounded once to the input dtype.

Cost: ``B * N`` DeepLIFT rows (one reference forward, one forward and one backward
each), in chunks of ``internal_batch_size`` rows.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Any, Literal, overload

import torch

from .._validation import accumulation_dtype, check_positive_int
from ..baselines import ReferenceSet
from ._base import Attributed
from ._call import CONSTRUCTED, Attributions, Baselines, Inputs, Target, given
from ._passes import check_optional_positive_int, default_chunk_rows, grid_blocks
from .deeplift import DeepLift
from .expected_gradients import _distribution, _reference_rows, draw

__all__ = ["DeepLiftShap"]


class DeepLiftShap(DeepLift):
    """DeepLIFT averaged over a reference set (all rows) or over references drawn from a
    :class:`~taylorattr.baselines.Noise`. Equals Captum's ``DeepLiftShap`` given the same
    reference tensor. It is DeepLIFT (the same plan, checked when it is built) run on the
    (sample, reference) rows, so layer and tuple inputs reach it as they reach DeepLIFT."""

    name = "deeplift_shap"

    traits = replace(DeepLift.traits, baseline_kind="distribution")

    @overload
    def attribute(self, inputs: Inputs, baselines: Baselines = ..., target: Target = ..., *,
                  n_samples: int = ..., noise_std: Any = ..., seed: int = ...,
                  internal_batch_size: int | None = ..., multiply_by_inputs: bool = ...,
                  return_convergence_delta: Literal[False] = ..., show_progress: bool = ...,
                  strict: bool = ..., additional_forward_args: Any = ..., layer: Any = ...,
                  attribute_to_layer_input: Any = ..., layer_baselines: Any = ...,
                  layer_delta: str = ...) -> Attributions: ...

    @overload
    def attribute(self, inputs: Inputs, baselines: Baselines = ..., target: Target = ..., *,
                  n_samples: int = ..., noise_std: Any = ..., seed: int = ...,
                  internal_batch_size: int | None = ..., multiply_by_inputs: bool = ...,
                  return_convergence_delta: Literal[True], show_progress: bool = ...,
                  strict: bool = ..., additional_forward_args: Any = ..., layer: Any = ...,
                  attribute_to_layer_input: Any = ..., layer_baselines: Any = ...,
                  layer_delta: str = ...) -> tuple[Attributions, torch.Tensor]: ...

    def attribute(self, inputs: Inputs, baselines: Baselines = None, target: Target = None, *,
                  n_samples: int = 50, noise_std: Any = None, seed: int = 0,
                  internal_batch_size: int | None = None, multiply_by_inputs: bool = True,
                  return_convergence_delta: bool = False, show_progress: bool = False,
                  strict: bool = False, additional_forward_args: Any = None,
                  layer: Any = CONSTRUCTED, attribute_to_layer_input: Any = CONSTRUCTED,
                  layer_baselines: Any = None,
                  layer_delta: str = "layer") -> Attributions | tuple[Attributions, torch.Tensor]:
        """DeepLiftShap: attributions shaped like ``inputs`` (with
        ``return_convergence_delta=True`` and the delta ``[B]``); its options are
        ``_attribute``'s, the shared arguments :data:`~taylorattr.methods._call.SHARED_DOC`."""
        return self.explain(**given(locals())).result()

    def _attribute(self, call, x, baselines, t, fx, *, n_samples: int = 50, noise_std=None,
                   seed: int = 0, internal_batch_size: int | None = None,
                   multiply_by_inputs: bool = True, show_progress: bool = False):
        """Options: ``n_samples`` (references drawn per sample from a Noise, 50),
        ``noise_std`` (shorthand for ``Noise(noise_std)`` around the input), ``seed``
        (of the draws, 0), ``internal_batch_size`` (rows per call). ``baselines``: the
        references: a tensor ``[N, ...]`` or a
        :class:`~taylorattr.baselines.ReferenceSet` (every row used), or a
        :class:`~taylorattr.baselines.Noise` (``n_samples`` drawn), or None with
        ``noise_std``.

        ``multiply_by_inputs=False``: the multipliers averaged over the references."""
        chunk = check_optional_positive_int(internal_batch_size, "internal_batch_size")
        check_positive_int(n_samples, "n_samples")
        dist = _distribution(baselines, noise_std)
        feat = tuple(x.shape[1:])
        if isinstance(dist, ReferenceSet):  # every row, shared by the samples: [1, N, ...]
            refs = _reference_rows(dist.samples, x).to(x.device).unsqueeze(0)
        else:
            refs = draw(x, dist, n_samples, None, seed).baselines  # [B, n, ...]
        batch, n = x.shape[0], refs.shape[1]
        chunk = chunk or default_chunk_rows(x, backward=True)
        acc = accumulation_dtype(x.dtype)  # float32 for half x: DeepLIFT's pass dtype
        total = torch.zeros(x.shape, dtype=acc, device=x.device)
        f_ref = torch.zeros(batch, dtype=acc, device=x.device)
        f_x = torch.zeros(batch, dtype=acc, device=x.device)  # the passes' f32(x), half x
        casts = ()
        for s0, s1, k0, k1 in grid_blocks(batch, n, chunk, show_progress, "deeplift shap"):
            # rows (sample s, reference k), sample-major as in Captum
            ref = refs[s0:s1] if refs.shape[0] > 1 else refs
            ref = ref[:, k0:k1].expand((s1 - s0, k1 - k0) + feat)
            rows = x[s0:s1, None].expand_as(ref).reshape((-1,) + feat)
            tr = None if t is None else t[s0:s1].repeat_interleave(k1 - k0)
            one = DeepLift._attribute(self, call, rows, ref.reshape((-1,) + feat), tr, None,
                                      multiply_by_inputs=multiply_by_inputs)
            total[s0:s1] += one.attributions.to(acc).view(ref.shape).sum(1)
            if one.reference_outputs is not None:  # DeepLIFT's f(x~) of these rows
                f_ref[s0:s1] += one.reference_outputs.detach().to(acc).view(
                    s1 - s0, k1 - k0).sum(1)
            if one.pass_output is not None:
                f_x[s0:s1] += one.pass_output.view(s1 - s0, k1 - k0).sum(1)
            casts = one.casts or casts  # of DeepLIFT's plan: the check names them
        if not multiply_by_inputs:
            return Attributed((total / n).to(x.dtype), refs.expand((batch, n) + feat))
        # complete towards the mean of the references: checked by the pipeline (for half x
        # at the passes' float32 values, then rounded)
        return Attributed(total / n, refs.expand((batch, n) + feat), reference_outputs=f_ref / n,
                          casts=casts, pass_output=f_x / n if acc != x.dtype else None)

    def _cost(self, x, options):
        """DeepLIFT's pass (:meth:`DeepLift._cost`) on the ``B * N`` (sample, reference)
        rows: ``N`` the reference set's rows, or ``n_samples`` drawn from a Noise; the
        ``N`` references per sample are the delta's, read from that pass (no extra forward)
        except with ``multiply_by_inputs=False``."""
        dist = _distribution(options.get("baselines"), options.get("noise_std"))
        n = dist.samples.shape[0] if isinstance(dist, ReferenceSet) else \
            check_positive_int(options.get("n_samples", 50), "n_samples")
        return self._propagate_cost(x.shape[0] * n), \
            n * int(not options.get("multiply_by_inputs", True))
