"""Captum's ``NoiseTunnel`` over :class:`taylorattr.methods.NoiseTunnel`.

The wrapped Captum-compatible method's ``attribute`` arguments are mapped to its native
call; the noise is drawn as Captum draws it (:func:`~taylorattr.captum._mapping.captum_noise`,
one draw per input for every block of ``nt_samples_batch_size`` copies) and handed to the
native tunnel (``noise=``), whose per-copy deltas (``copy_deltas=True``) come back in
Captum's order (block by block, sample-major) as ``[B * nt_samples]``.
"""
from __future__ import annotations

import torch

from ... import methods as native
from ...inputs import as_tuple
from .._mapping import Attribution, captum_noise, native_call, not_offered

__all__ = ["NoiseTunnel"]


class NoiseTunnel(Attribution):
    """Captum's ``NoiseTunnel(attribution_method)``."""

    def __init__(self, attribution_method) -> None:
        if not hasattr(attribution_method, "_call"):
            raise TypeError("attribution_method must be a taylorattr.captum.attr method, got "
                            f"{type(attribution_method).__name__}")
        super().__init__(attribution_method.forward_func)
        self.attribution_method = attribution_method
        self.is_delta_supported = attribution_method.has_convergence_delta()

    @property
    def multiplies_by_inputs(self) -> bool:
        return self.attribution_method.multiplies_by_inputs

    def has_convergence_delta(self) -> bool:
        return self.is_delta_supported

    def attribute(self, inputs, nt_type: str = "smoothgrad", nt_samples: int = 5,
                  nt_samples_batch_size=None, stdevs=1.0,
                  draw_baseline_from_distrib: bool = False, **kwargs):
        if draw_baseline_from_distrib:
            raise not_offered("NoiseTunnel(draw_baseline_from_distrib=True)",
                              "the tunnel takes the inner method's baselines as they are")
        call = self.attribution_method._call(inputs, **kwargs)
        if not hasattr(call, "method"):
            raise not_offered(f"NoiseTunnel around {type(self.attribution_method).__name__} "
                              "with these options", "its call is not one native call")
        parts, _ = as_tuple(inputs)
        per = nt_samples if nt_samples_batch_size is None else \
            min(nt_samples, nt_samples_batch_size)
        blocks = [per] * (nt_samples // per) + ([nt_samples % per] if nt_samples % per else [])
        drawn = [captum_noise(parts, stdevs, k) for k in blocks]
        noise = tuple(torch.cat([d[i] for d in drawn], 1) for i in range(len(parts)))
        want_delta = bool(call.delta) and self.is_delta_supported
        tunnel = native.NoiseTunnel(self.forward_func, inner=call.method)
        out = native_call(tunnel, call.inputs, call.baselines, call.target,
                          call.additional_forward_args, want_delta, **call.options,
                          nt_type=nt_type, nt_samples=nt_samples, noise=noise,
                          copy_deltas=want_delta)
        if not want_delta:
            return out
        attributions, delta = out
        if call.finish is not None:
            delta = call.finish(delta)
        starts = [sum(blocks[:j]) for j in range(len(blocks))]
        delta = torch.cat([delta[:, s:s + k].reshape(-1) for s, k in zip(starts, blocks)])
        return attributions, delta
