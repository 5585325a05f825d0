"""The `memstream` argument parser: the top-level options, every command family's commands (each family module
adds its own with `add_parsers`), then the commands of the installed plugins."""

from __future__ import annotations

import argparse
from collections.abc import Iterable
from importlib.metadata import EntryPoint
from typing import NoReturn

from memstream.cli import chat, doctor, evaluate, files, init, memories, reembed, web
from memstream.cli.options import database, parents
from memstream.cli.plugins import GROUP, add_plugins, installed

__all__ = ["DESCRIPTION", "build_parser"]

DESCRIPTION = "`memstream`: talk to a persona, feed its memory, and look inside it from the terminal."
FAMILIES = (chat, memories, reembed, files, evaluate, web, doctor, init)  # in the order --help lists their commands


class _Parser(argparse.ArgumentParser):
    """An unknown command, when no plugin is installed, says where plugins' commands come from."""

    no_plugins = False

    def error(self, message: str) -> NoReturn:
        if self.no_plugins and message.startswith("argument COMMAND: invalid choice"):
            message += (f"; no plugin is installed (the entry point group {GROUP}), and commands such as the "
                        "Discord bot's come from one: install memstream with pip (in a checkout: pip install -e .)")
        super().error(message)


def _version() -> str:
    from memstream import __version__

    return __version__


def build_parser(plugins: Iterable[EntryPoint] | None = None) -> argparse.ArgumentParser:
    """The argument parser of every command: memstream's own and those of `plugins` (default: the installed)."""
    parser = _Parser(prog="memstream", description=DESCRIPTION)
    parser.add_argument("--version", action="version", version=f"memstream {_version()}")
    # The common options are accepted before the command too (memstream --persona FILE stats).
    parser.add_argument("--persona", dest="top_persona", help=argparse.SUPPRESS)
    parser.add_argument("--db", dest="top_db", type=database, help=argparse.SUPPRESS)
    parser.add_argument("--json", dest="top_json", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("-v", "--verbose", dest="top_verbose", action="store_true", help=argparse.SUPPRESS)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=argparse.ArgumentParser)
    shared = parents()
    for family in FAMILIES:
        family.add_parsers(sub, shared)
    found = installed() if plugins is None else list(plugins)
    add_plugins(sub, shared.common, found)
    parser.no_plugins = not found
    return parser
