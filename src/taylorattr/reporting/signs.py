"""What a saliency map shows: signed values, the positive part, the negative part or
``|a|`` (:func:`taylorattr.reporting.plotting` draws them; the command line offers them
as ``--sign`` without importing torch or matplotlib)."""
from __future__ import annotations

__all__ = ["SIGNS"]

#: What a map shows: ``a``, ``max(a, 0)``, ``min(a, 0)`` or ``|a|``.
SIGNS = ("all", "positive", "negative", "abs")
