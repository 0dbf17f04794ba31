"""The support table of the layer-wise engine, generated from :mod:`.rules`.

One row per kind of operation (:data:`~.rules.FAMILIES`, from :mod:`.ops`): its
operations in words and the label of the rule each rule set applies to it (``"-"`` where
a method refuses the kind). The error of an unsupported model quotes
:func:`support_summary` of the same objects.
"""
from __future__ import annotations

from typing import NamedTuple

from .rules import DEEPLIFT_RESCALE, FAMILIES, Family, RuleSet, epsilon_rule

__all__ = ["SupportRow", "operation_names", "support_summary", "supported_operations"]


def operation_names(family: Family) -> list[str]:
    """The operations of ``family`` as listed in the table."""
    return [op.strip() for op in family.operations.split(", ") if op.strip()]


class SupportRow(NamedTuple):
    """One kind of operation and the rule each method applies to it."""

    family: str
    operations: str
    deeplift: str
    epsilon_lrp: str
    note: str


def supported_operations() -> list[SupportRow]:
    """The support table of DeepLIFT and epsilon-LRP, generated from the rule sets.

    One row per kind; a method's column is ``"-"`` where it refuses the kind.
    """
    sets = (DEEPLIFT_RESCALE, epsilon_rule(1e-9))
    return [SupportRow(f.title, f.operations,
                       *(s.rules[f.key].label if f.key in s.rules else "-" for s in sets),
                       f.note) for f in FAMILIES]


def support_summary(rules: RuleSet) -> str:
    """One line per kind ``rules`` supports, for error messages."""
    return "\n".join(f"  {f.title}: {f.operations}" for f in rules.families)
