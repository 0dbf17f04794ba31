"""The Taylor-mode rule tables: one entry per module type, function or tensor method.

Every entry knows its family (for the support table) and whether it treats every position
of the leading axes alike (``pointwise``: it may then run on a sequence-first tensor, see
:class:`~taylorattr.taylor.mode.jet.BatchSecond`; a callable ``(args, kwargs, ndim) -> bool``
decides per call). Errors, the docs table
(:func:`supported_ops_markdown`, written to ``docs/supported_ops.md``) and user rules
(:func:`register_taylor_rule`) all read these tables, so they cannot disagree.
"""
from __future__ import annotations

import operator
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["register_taylor_rule", "supported_ops", "supported_ops_markdown"]

FAMILIES = {
    "elementwise": "Elementwise nonlinearities (exact series recurrences)",
    "piecewise": "Piecewise-linear (exact inside a linear region; use `ta.smooth` for order >= 2)",
    "affine": "Affine layers and arithmetic",
    "shape": "Shape and indexing (linear, per sample)",
    "reduction": "Reductions and statistics over non-batch axes",
    "normalisation": "Normalisation",
    "attention": "Attention, softmax and multilinear products",
    "surrogates": "Smooth surrogates made by `ta.smooth`",
    "core": "Core ATen operations of a captured graph (the default route: `torch.export` "
            "lowers every model to these; `aten.<op>` covers all its overloads)",
    "user": "Registered by the user (`ta.register_taylor_rule`)",
}


@dataclass(frozen=True)
class Entry:
    rule: Callable
    family: str
    pointwise: bool | Callable = False

    def is_pointwise(self, args, kwargs, ndim: int) -> bool:
        return self.pointwise(args, kwargs, ndim) if callable(self.pointwise) else self.pointwise


MODULE_RULES: dict[type, Entry] = {}
#: Display names of the core ATen operations with a rule in :mod:`.core` (filled there).
CORE_NAMES: set[str] = set()
FUNCTION_RULES: dict[Callable, Entry] = {}
METHOD_RULES: dict[str, Entry] = {}


def _table(key):
    if isinstance(key, type):
        if not issubclass(key, nn.Module):
            raise TypeError(f"target must be an nn.Module subclass, a function or 'Tensor.<method>', "
                            f"got the class {key.__name__}")
        return MODULE_RULES, key
    if isinstance(key, str):
        if not key.startswith("Tensor.") or not key[7:].isidentifier():
            raise ValueError(f"target as a string must name a tensor method as 'Tensor.<method>', "
                             f"got {key!r}")
        return METHOD_RULES, key[7:]
    if callable(key):
        return FUNCTION_RULES, key
    raise TypeError(f"target must be an nn.Module subclass, a function or 'Tensor.<method>', "
                    f"got {type(key).__name__}")


def builtin(*keys, family: str, pointwise: bool | Callable = False):
    """Decorator: register ``rule`` for every key (module types, functions, 'Tensor.x')."""
    def deco(rule):
        for key in keys:
            table, k = _table(key)
            table[k] = Entry(rule, family, pointwise)
        return rule
    return deco


def register_taylor_rule(target, rule: Callable, *, pointwise: bool = False,
                         replace: bool = False) -> Callable[[], None]:
    """Give Taylor mode an exact rule for your own module type, function or tensor method.

    ``target``: an ``nn.Module`` subclass (the rule is called as ``rule(module, *args)``
    and the module is kept whole while tracing), a function called in ``forward``
    (``rule(*args)``; plain Python functions are kept whole while tracing, as if wrapped by
    ``torch.fx.wrap``) or ``"Tensor.<method>"`` (``rule(self, *args)``). Input-dependent
    arguments arrive as :class:`Jet` objects; the rule returns a Jet whose coefficients
    are exact, built from Jet arithmetic (``+ - * /``), ``jet.unary(series_fn)`` with the
    recurrences of :mod:`taylorattr.series`, and ``jet.linear(fn)`` for linear maps.
    ``pointwise=True`` declares that the op treats every position of the leading axes
    alike (it may then run on sequence-first tensors). Returns a function that removes
    the rule again. The example in :mod:`taylorattr.taylor.mode` (and in
    ``docs/supported_ops.md``) registers ``asinh``.
    """
    if not callable(rule):
        raise TypeError(f"rule must be callable, got {type(rule).__name__}")
    if not isinstance(pointwise, bool) or not isinstance(replace, bool):
        raise TypeError("pointwise and replace must be bools")
    table, key = _table(target)
    if key in table and not replace:
        raise ValueError(f"target {_display(target)} already has a Taylor-mode rule; pass "
                         "replace=True to override it")
    previous = table.get(key)
    table[key] = Entry(rule, "user", pointwise)

    def remove() -> None:
        if previous is None:
            table.pop(key, None)
        else:
            table[key] = previous
    return remove


def module_entry(m: nn.Module) -> Entry | None:
    for cls in type(m).__mro__:
        if cls in MODULE_RULES:
            return MODULE_RULES[cls]
    return None


def leaf_modules() -> tuple[type, ...]:
    """Module types with a rule defined outside torch.nn (kept whole while tracing; torch.nn's
    own modules are leaves anyway)."""
    return tuple(k for k in MODULE_RULES if not k.__module__.startswith("torch.nn"))


def user_functions() -> tuple[Callable, ...]:
    return tuple(k for k, e in FUNCTION_RULES.items()
                 if e.family == "user" and hasattr(k, "__code__"))


def _display(key) -> str:
    if isinstance(key, str):
        return key if key.startswith("Tensor.") else f"Tensor.{key}"
    if isinstance(key, type):
        return f"nn.{key.__name__}" if getattr(nn, key.__name__, None) is key else key.__qualname__
    name = getattr(key, "__name__", repr(key))
    if name.startswith("special_") and getattr(torch.special, name[8:], None) is key:
        return f"torch.special.{name[8:]}"
    for prefix, namespace in (("F", F), ("torch", torch), ("torch.special", torch.special),
                              ("operator", operator)):
        if getattr(namespace, name, None) is key:
            return f"{prefix}.{name}"
    return f"{getattr(key, '__module__', '')}.{name}".lstrip(".")


def supported_ops() -> dict[str, list[str]]:
    """Family -> sorted display names of every module, function and tensor method with a rule."""
    out: dict[str, set[str]] = {f: set() for f in FAMILIES}
    for key, entry in MODULE_RULES.items():
        if key.__name__.startswith("_"):  # a private base class: list its public subclasses
            out[entry.family].update(_display(c) for c in vars(nn).values()
                                     if isinstance(c, type) and issubclass(c, key))
        else:
            out[entry.family].add(_display(key))
    for key, entry in FUNCTION_RULES.items():
        out[entry.family].add(_display(key))
    for key, entry in METHOD_RULES.items():
        out[entry.family].add(_display(key))
    out["core"].update(CORE_NAMES)
    return {f: sorted(names) for f, names in out.items() if names}


def supported_ops_markdown() -> str:
    """The support table of ``docs/supported_ops.md``, generated from the rule tables."""
    from . import __doc__ as package_doc  # the overview and the registration example

    lines = ["# Operations supported by Taylor mode", "",
             "Generated by `taylorattr.taylor.mode.supported_ops_markdown()`; do not edit by hand.",
             "", "```text", package_doc.strip(), "```", ""]
    for family, names in supported_ops().items():
        if family == "user":
            continue
        lines += [f"## {FAMILIES[family]}", "", ", ".join(f"`{n}`" for n in names), ""]
    return "\n".join(lines)
