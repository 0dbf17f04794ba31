"""The support table of the layer-wise engine, generated from :mod:`.rules`.

One row per :class:`~.rules.Family`: its operations by name and the label of the rule
each rule set applies to it (``"-"`` where a method refuses the family). The error of an
unsupported model quotes :func:`support_summary` of the same objects.
"""
from __future__ import annotations

import operator
from typing import NamedTuple

import torch
import torch.nn.functional as F

from .rules import DEEPLIFT_RESCALE, FAMILIES, Family, RuleSet, epsilon_rule

__all__ = ["SupportRow", "operation_names", "support_summary", "supported_operations"]

_SYMBOLS = {operator.add: "a + b", operator.sub: "a - b", operator.neg: "-a",
            operator.pos: "+a", operator.getitem: "a[...]", operator.mul: "a * c",
            operator.truediv: "a / c"}


def _function_name(fn) -> str:
    if fn in _SYMBOLS:
        return _SYMBOLS[fn]
    name = getattr(fn, "__name__", repr(fn))
    for prefix, namespace in (("F.", F), ("torch.", torch)):
        if getattr(namespace, name, None) is fn:
            return prefix + name
    return name


def operation_names(family: Family) -> list[str]:
    """The module classes, functions and ``Tensor.`` methods of ``family``, by name."""
    return ([m.__name__ for m in family.modules] + [_function_name(f) for f in family.functions]
            + [f"Tensor.{m}" for m in family.methods])


class SupportRow(NamedTuple):
    """One family of operations and the rule each method applies to it."""

    family: str
    operations: str
    deeplift: str
    epsilon_lrp: str
    note: str


def supported_operations() -> list[SupportRow]:
    """The support table of DeepLIFT and epsilon-LRP, generated from the rule sets.

    One row per family; a method's column is ``"-"`` where it refuses the family.
    """
    sets = (DEEPLIFT_RESCALE, epsilon_rule(1e-9))
    return [SupportRow(f.title, ", ".join(operation_names(f)),
                       *(s.rules[f.key].label if f.key in s.rules else "-" for s in sets),
                       f.note) for f in FAMILIES]


def support_summary(rules: RuleSet) -> str:
    """One line per family ``rules`` supports, for error messages."""
    lines = []
    for f in rules.families:
        extra = f" ({f.note})" if f.note else ""
        lines.append(f"  {f.title}: {', '.join(operation_names(f))}{extra}")
    return "\n".join(lines)
