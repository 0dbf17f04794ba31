"""The commands of the command line: the one place a command is registered.

Each command is one module holding everything about it::

    def arguments(parser, method_help: bool) -> None  # its flags (light: --help imports no torch)
    def argument_errors(args) -> str | None            # optional: combinations argparse cannot check
    def check(args) -> None                            # optional: what can fail before the work
    def stages(args) -> list                           # optional: its StageCosts, for the estimate
    CHEAPER = "..."                                    # with stages: what makes a run cheaper
    def run(args) -> str                               # the work; returns the text to print

and one :func:`register` line below (name, module, one-line help, in ``--help`` order). A
command module is imported only when its command is chosen (:func:`load`), so the modules
it runs are imported after the arguments are parsed, never for ``taylorattr --help``.
Adding a command is its module and one ``register`` line (``tests/test_cli.py`` adds a
toy command that way).
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from types import ModuleType

__all__ = ["COMMANDS", "REGISTERED", "Command", "load", "register"]


@dataclass(frozen=True)
class Command:
    """A registered command: the module that holds it and its one-line help."""

    module: str
    help: str


#: Command name -> :class:`Command`, in ``--help`` order.
REGISTERED: dict[str, Command] = {}


def register(name: str, module: str, help: str) -> None:
    """Register the command ``name`` held by ``module`` (a dotted module path)."""
    if not (isinstance(name, str) and name and not name.startswith("-")):
        raise ValueError(f"name must be a command word, got {name!r}")
    REGISTERED[name] = Command(module, help)


def load(name: str) -> ModuleType:
    """The module of the registered command ``name``: the command line's one lazy import."""
    return importlib.import_module(REGISTERED[name].module)


class _Runs(dict):
    """``COMMANDS[name]``: the registered command's ``run`` (its module imported on first
    use); an entry set here (a test's stand-in) is used instead."""

    def __missing__(self, name):
        if name not in REGISTERED:
            raise KeyError(name)
        return load(name).run

    def __contains__(self, name):
        return name in REGISTERED or dict.__contains__(self, name)

    def __iter__(self):  # every registered command, loaded or not (and a test's stand-ins)
        return iter(dict.fromkeys([*REGISTERED, *dict.keys(self)]))

    def __len__(self):
        return sum(1 for _ in self)


#: Command name -> ``run(args) -> str`` of its module.
COMMANDS = _Runs()

register("validate", f"{__name__}.validate", "paper Table 3: methods vs their Taylor reformulations")
register("principles", f"{__name__}.principles", "paper Table 2, measured")
register("assess", f"{__name__}.assess", "paper Figures 3 and 4: infidelity and localisation")
register("reproduce", f"{__name__}.reproduce",
         "every table and figure, with report.md and report.html")
register("explain", f"{__name__}.explain",
         "saliency maps and top-5 classes of one image, on any model")
register("evaluate", f"{__name__}.evaluate", "attribute and score a whole dataset (torchrun-ready)")
register("attribute", f"{__name__}.attribute", "attributions of a whole dataset, one map per input")
register("cache", f"{__name__}.cache", "the captures kept on disk: info (folder, entries, size) or clear")
