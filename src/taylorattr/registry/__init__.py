"""The method registry: one row per method, filled by the catalog.

:mod:`.specs` defines the rows (:class:`MethodSpec`, its variants, :meth:`MethodSpec.bind`,
:func:`reformulate`); :mod:`.catalog` registers the library's own methods. Methods never
import the registry: it knows them, not the other way round. Names and labels are
resolved here (:func:`resolve`) and nowhere else.
"""
from __future__ import annotations

from . import catalog as _catalog  # noqa: F401  (fills METHODS: one row per method)
from .specs import *
from .specs import __all__  # noqa: F401
