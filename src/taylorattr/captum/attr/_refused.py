"""Captum names taylorattr does not offer: each class refuses at construction with
``NotImplementedError``, the reason and the nearest taylorattr alternative (README,
"Coming from Captum")."""
from __future__ import annotations

from .._mapping import Attribution, not_offered

__all__ = ["DataLoaderAttribution", "ImageMaskInput"]


class _Refused:
    """A Captum class that is not offered: constructing it raises."""

    _why = ""
    _instead = ""

    def __init__(self, *args, **kwargs) -> None:
        raise not_offered(type(self).__name__, f"{self._why}; instead: {self._instead}")


class DataLoaderAttribution(_Refused, Attribution):
    _why = ("attributing a whole data loader's aggregated output is not mapped onto the "
            "native methods")
    _instead = ("taylorattr.captum.attr.FeatureAblation on each batch (a forward_func "
                "returning one value for the batch is read as Captum's aggregate mode), or the "
                "`taylorattr` CLI / taylorattr.runtime jobs for datasets")


class ImageMaskInput(_Refused):
    _why = "multimodal (image-mask) inputs of LLMAttribution are not offered"
    _instead = ("taylorattr.captum.attr.FeatureAblation/ShapleyValueSampling on the image with "
                "feature_mask=<the segment mask>")
