"""The argument parser: one subparser per registered command, choices and defaults in --help.

``build_parser(command)`` fills in only that command's options, from its module (the others
are listed with their one-line help from :mod:`.commands`, their modules not imported), so
that ``taylorattr --help`` and argument errors need no torch import.
"""
from __future__ import annotations

import argparse

from . import commands
from .arguments import _Parser

__all__ = ["build_parser"]


def build_parser(command: str | None = None, method_help: bool = True
                 ) -> argparse.ArgumentParser:
    """The parser; with ``command``, only that command's options are added (the others
    stay bare, which is all ``taylorattr --help`` shows); with None, every command's.
    ``method_help``: the command may list what its help needs the registry for (explain's
    methods: a torch import)."""
    parser = _Parser(
        prog="taylorattr",
        description="Exact Taylor attributions and the experiments of Deng et al. (AAAI 2021).")
    sub = parser.add_subparsers(dest="command", required=True)
    for name, registered in commands.REGISTERED.items():
        p = sub.add_parser(name, help=registered.help)
        if command is None or command == name:
            commands.load(name).arguments(p, method_help)
    return parser
