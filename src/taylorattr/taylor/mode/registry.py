"""The Taylor-mode rule table: one entry per core ATen operation (or ``torch.library``
custom op, or surrogate module type of :mod:`taylorattr.taylor.smoothing`).

Every entry knows its family (for the support table). The rule families in
:mod:`taylorattr.taylor.mode.rules` register their entries where they are defined
(:func:`rule`); users add theirs with :func:`register_taylor_rule`, which come first. The
interpreter (:mod:`.core`), its refusals, the piecewise-linear warning and the docs table
(:func:`supported_ops_markdown`, written to ``docs/supported_ops.md``) all read this one
table, so they cannot disagree.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

__all__ = ["FAMILIES", "lookup", "register_taylor_rule", "rule", "supported_ops",
           "supported_ops_markdown"]

FAMILIES = {
    "pointwise": "Elementwise nonlinearities (exact series recurrences)",
    "piecewise": "Piecewise-linear (exact inside a linear region; use `ta.smooth` for order >= 2)",
    "affine": "Affine maps and linear algebra (convolutions, products, pooling, arithmetic)",
    "shape": "Shape, indexing and copies (linear, act on every coefficient)",
    "normalisation": "Normalisation and statistics",
    "attention": "Softmax and log-softmax (attention decomposes into these and products)",
    "surrogates": "Smooth surrogates put in by `ta.smooth`",
    "user": "Registered by the user (`ta.register_taylor_rule`)",
}

_OPS = (torch._ops.OpOverload, torch._ops.OpOverloadPacket)


@dataclass(frozen=True)
class Entry:
    rule: Callable
    family: str


#: Key (an ATen ``OpOverload`` or ``OpOverloadPacket``, a custom op's overload, or a
#: surrogate module type) -> its entry. User entries shadow built-in ones (``_USER``).
_BUILTIN: dict = {}
_USER: dict = {}
_CHANGES = [0]  # registrations and removals so far (the generated passes bind rules)


def version() -> int:
    """Changes whenever a rule is registered or removed."""
    return _CHANGES[0]


def rule(*keys, family: str):
    """Decorator: register ``fn`` as the built-in rule of every key (an overload packet
    covers all its overloads)."""
    if family not in FAMILIES or family == "user":
        raise ValueError(f"unknown rule family {family!r}")

    def deco(fn):
        for key in keys:
            _BUILTIN[key] = Entry(fn, family)
        _CHANGES[0] += 1
        return fn
    return deco


def _key(target):
    """The table key of a user target: an op overload or packet (a ``torch.library``
    custom op gives its overload)."""
    overload = getattr(target, "_opoverload", None)  # torch.library.custom_op's CustomOpDef
    if isinstance(overload, torch._ops.OpOverload):
        return overload
    if isinstance(target, _OPS):
        return target
    raise TypeError(
        f"target must be an ATen operation (torch.ops.aten.<op> or torch.ops.aten.<op>.<overload>) "
        f"or a torch.library custom op, got {type(target).__name__} {target!r}. To give a module "
        "or function of your own a rule, wrap it in torch.library.custom_op (torch.export then "
        "keeps it whole) and register the rule on that op (docs/supported_ops.md shows how).")


def register_taylor_rule(target, rule: Callable, *, replace: bool = False) -> Callable[[], None]:
    """Give Taylor mode an exact rule for an ATen operation or a ``torch.library`` custom op.

    ``target``: ``torch.ops.aten.<op>.<overload>`` (or the packet ``torch.ops.aten.<op>``,
    every overload), or an op made by ``torch.library.custom_op`` (or its
    ``torch.ops.<ns>.<name>.default``); a custom op is how a module or function is kept
    whole: ``torch.export`` leaves it as one node. The rule is called with the node's
    arguments, input-dependent ones as :class:`~taylorattr.taylor.mode.core.CoreJet` (value
    ``x_0`` and coefficients ``x_1..x_K`` of ``x(t) = sum_k x_k t^k`` along
    ``f(x + t v)``), and returns a CoreJet (or a tuple, as the op does) whose coefficients
    are exact, built from CoreJet arithmetic (``+ - * /``), ``jet.unary(series_fn)`` with
    the recurrences of :mod:`taylorattr.series` and ``jet.linear(fn)`` for linear maps.
    ``replace=True`` overrides a rule registered before. Returns a function that removes
    the rule again. The example in :mod:`taylorattr.taylor.mode` (and in
    ``docs/supported_ops.md``) registers one for a custom op.
    """
    if not callable(rule):
        raise TypeError(f"rule must be callable, got {type(rule).__name__}")
    if not isinstance(replace, bool):
        raise TypeError(f"replace must be a bool, got {type(replace).__name__}")
    key = _key(target)
    if key in _USER and not replace:
        raise ValueError(f"target {_display(key)} already has a user rule; pass replace=True "
                         "to override it")
    previous = _USER.get(key)
    _USER[key] = Entry(rule, "user")
    _CHANGES[0] += 1

    def remove() -> None:
        if previous is None:
            _USER.pop(key, None)
        else:
            _USER[key] = previous
        _CHANGES[0] += 1
    return remove


def lookup(target) -> Entry | None:
    """The entry for a graph node's target: a user rule for the overload or its packet
    first, then the built-in one; a surrogate module by its type."""
    if isinstance(target, torch.nn.Module):
        return next((_BUILTIN[c] for c in type(target).__mro__ if c in _BUILTIN), None)
    packet = target.overloadpacket if isinstance(target, torch._ops.OpOverload) else None
    for table in (_USER, _BUILTIN):
        for key in (target, packet):
            if key is not None and key in table:
                return table[key]
    return None


def _display(key) -> str:
    if isinstance(key, type):
        return key.__name__
    if isinstance(key, torch._ops.OpOverloadPacket):
        return str(key).replace("::", ".")
    return str(key)


def supported_ops() -> dict[str, list[str]]:
    """Family -> sorted names of every operation with a rule (``aten.<op>`` covers all its
    overloads)."""
    out: dict[str, set[str]] = {f: set() for f in FAMILIES}
    for table in (_BUILTIN, _USER):
        for key, entry in table.items():
            out[entry.family].add(_display(key))
    return {f: sorted(names) for f, names in out.items() if names}


def supported_ops_markdown() -> str:
    """The support table of ``docs/supported_ops.md``, generated from the rule table."""
    from . import __doc__ as package_doc  # the overview and the registration example

    lines = ["# Operations supported by Taylor mode", "",
             "Generated by `taylorattr.taylor.mode.supported_ops_markdown()`; do not edit by hand.",
             "", "```text", package_doc.strip(), "```", ""]
    for family, names in supported_ops().items():
        if family == "user":
            continue
        lines += [f"## {FAMILIES[family]}", "", ", ".join(f"`{n}`" for n in names), ""]
    return "\n".join(lines)
