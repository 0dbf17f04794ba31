"""The seven attribution methods of the paper, one call contract (DESIGN.md section 5).

    from taylorattr.methods import DeepLift
    attr = DeepLift(model).attribute(inputs, baselines=0.0, target=None)

``METHODS`` maps the registry names to :class:`MethodSpec` entries::

    spec = METHODS["occlusion_patch"]
    attr = spec(model, inputs, patch=(4, 4))          # build + attribute in one call
    method = spec.build(model)                          # the Occlusion object
    attr = method.attribute(inputs, **spec.fixed)       # the same, by hand

DeepLIFT and epsilon-LRP also give their per-layer terms (paper Thm 4 and supplement)::

    records = DeepLift(model).layer_records(inputs, baselines, target)  # one per Linear/Conv
    a = local_relevance(records[0])    # [B, out, in] (conv: [B, C_out, L, K]) local a_ij^(l)

See :mod:`taylorattr.methods.layerwise` for what the layer-wise rules support.
"""
from __future__ import annotations

import inspect
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from ._base import AttributionMethod
from .deeplift import DeepLift
from .expected_gradients import EGDraws, ExpectedGradients
from .gradient_input import GradientInput
from .integrated_gradients import IntegratedGradients
from .layerwise import LayerRecord, UnsupportedModelError, global_relevance, local_relevance
from .lrp import EpsilonLRP
from .occlusion import Occlusion

__all__ = [
    "METHODS",
    "AttributionMethod",
    "DeepLift",
    "EGDraws",
    "EpsilonLRP",
    "ExpectedGradients",
    "GradientInput",
    "IntegratedGradients",
    "LayerRecord",
    "MethodSpec",
    "Occlusion",
    "UnsupportedModelError",
    "global_relevance",
    "local_relevance",
]


@dataclass(frozen=True)
class MethodSpec:
    """A registry entry: which class, and which ``attribute`` arguments it fixes.

    Attributes:
        name: the registry name.
        cls: the method class.
        fixed: ``attribute`` arguments this entry pins (``occlusion_1``: ``patch=1``);
            passing a different value raises ValueError.
        defaults: ``attribute`` arguments this entry defaults but lets callers override
            (``occlusion_patch``: ``patch=2``, the paper's 2x2).
        init_args: argument names routed to the constructor (``epsilon`` for LRP).
        uses_baselines: whether ``attribute`` takes ``baselines``.
    """

    name: str
    cls: type
    fixed: Mapping[str, Any] = field(default_factory=dict)
    defaults: Mapping[str, Any] = field(default_factory=dict)
    init_args: tuple[str, ...] = ()
    uses_baselines: bool = True

    def build(self, model, **init_kwargs) -> AttributionMethod:
        """The method object for ``model`` (constructor arguments: ``init_args``)."""
        unknown = set(init_kwargs) - set(self.init_args)
        if unknown:
            raise TypeError(f"{self.name}: unexpected constructor argument(s) {sorted(unknown)}")
        return self.cls(model, **init_kwargs)

    def attribute_kwargs(self, **kwargs) -> dict:
        """``kwargs`` with this entry's defaults and pinned arguments applied."""
        for k, v in self.fixed.items():
            if k in kwargs and kwargs[k] != v:
                raise ValueError(f"{self.name} fixes {k}={v!r}, got {k}={kwargs[k]!r}")
        return {**self.defaults, **kwargs, **self.fixed}

    def __call__(self, model, inputs, **kwargs):
        """Build the method and attribute ``inputs``; keyword arguments are routed to
        the constructor (``init_args``) or to ``attribute``."""
        init = {k: kwargs.pop(k) for k in self.init_args if k in kwargs}
        return self.build(model, **init).attribute(inputs, **self.attribute_kwargs(**kwargs))

    def signature(self) -> inspect.Signature:
        """The signature of the class's ``attribute`` method."""
        return inspect.signature(self.cls.attribute)


METHODS: Mapping[str, MethodSpec] = MappingProxyType({
    "gradient_input": MethodSpec("gradient_input", GradientInput, uses_baselines=False),
    "occlusion_1": MethodSpec("occlusion_1", Occlusion, fixed=MappingProxyType({"patch": 1})),
    "occlusion_patch": MethodSpec("occlusion_patch", Occlusion,
                                  defaults=MappingProxyType({"patch": 2})),
    "deeplift": MethodSpec("deeplift", DeepLift),
    "epsilon_lrp": MethodSpec("epsilon_lrp", EpsilonLRP, init_args=("epsilon",),
                              uses_baselines=False),
    "integrated_gradients": MethodSpec("integrated_gradients", IntegratedGradients),
    "expected_gradients": MethodSpec("expected_gradients", ExpectedGradients),
})
