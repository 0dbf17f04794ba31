"""Captum names taylorattr does not offer: each class refuses at construction with
``NotImplementedError``, the reason and the nearest taylorattr alternative (docs/captum.md,
"Coming from Captum")."""
from __future__ import annotations

from .._mapping import not_offered

__all__ = ["ImageMaskInput"]


class _Refused:
    """A Captum class that is not offered: constructing it raises."""

    _why = ""
    _instead = ""

    def __init__(self, *args, **kwargs) -> None:
        raise not_offered(type(self).__name__, f"{self._why}; instead: {self._instead}")


class ImageMaskInput(_Refused):
    _why = "multimodal (image-mask) inputs of LLMAttribution are not offered"
    _instead = ("taylorattr.captum.attr.FeatureAblation/ShapleyValueSampling on the image with "
                "feature_mask=<the segment mask>")
