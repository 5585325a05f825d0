"""Commands from other packages. A package adds commands to `memstream` by naming a function in the entry
point group `memstream.commands` (as simonw/llm finds its plugins), the entry point's name being the command's:

    [project.entry-points."memstream.commands"]
    bot = "bot.plugin:register"

`register(commands: CommandLine) -> None` is called as the parser is built, for `--help` too: it adds its
commands with `commands.add(...)` and imports nothing heavy (what a command needs, its handler imports when it
runs). The core names no plugin. A plugin that fails to load leaves a stand-in command that says why.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Awaitable, Callable, Iterable
from importlib.metadata import EntryPoint, entry_points
from typing import TYPE_CHECKING

from memstream.cli.handlers import Plain
from memstream.errors import ConfigError
from memstream.text import visible

if TYPE_CHECKING:
    from memstream.cli.options import Subparsers

__all__ = ["GROUP", "CommandLine", "Register", "add_plugins", "installed"]

GROUP = "memstream.commands"


class CommandLine:
    """What a plugin's `register` is handed: the way to add a command to `memstream`."""

    def __init__(self, sub: Subparsers, common: argparse.ArgumentParser) -> None:
        self._sub = sub
        self._common = common

    def add(self, name: str, run: Callable[[argparse.Namespace], Awaitable[int]], *, help: str,
            description: str) -> argparse.ArgumentParser:
        """Add `memstream NAME` with the common options (--persona, --db, --json, -v); `run(args)` runs it and
        returns the exit status (a MemstreamError it raises is one line on stderr). --local is refused for it.
        The parser is returned for the command's own options."""
        parser = self._sub.add_parser(name, parents=[self._common], help=help, description=description)
        parser.set_defaults(handler=Plain(run, refuses_local=True))
        return parser


Register = Callable[[CommandLine], None]


def installed() -> list[EntryPoint]:
    """The plugins installed in this environment."""
    return list(entry_points(group=GROUP))


def add_plugins(sub: Subparsers, common: argparse.ArgumentParser, plugins: Iterable[EntryPoint]) -> None:
    """Let each plugin add its commands; one that fails leaves a stand-in command under its name."""
    for plugin in plugins:
        try:
            register: Register = plugin.load()
            register(CommandLine(sub, common))
        except Exception as exc:  # anything a foreign package raises as it loads: memstream's own commands go on
            _stand_in(sub, common, plugin, exc)


def _stand_in(sub: Subparsers, common: argparse.ArgumentParser, plugin: EntryPoint, exc: Exception) -> None:
    """`memstream NAME`, for a plugin that failed to load: whatever its arguments, it says what went wrong."""
    where = f" (from {plugin.dist.name})" if plugin.dist is not None else ""
    problem = (f"memstream {plugin.name} comes from the plugin {plugin.value}{where}, which failed to load: "
               f"{type(exc).__name__}: {exc}; reinstall the package that provides it (in a checkout: "
               "pip install -e .)")

    async def explain(args: argparse.Namespace) -> int:
        raise ConfigError(problem)

    if plugin.name in sub.choices:  # it clashed with a command of memstream's, or added part of itself: kept
        print(visible(f"memstream: warning: {problem}"), file=sys.stderr)
        return
    sub.add_parser(plugin.name, parents=[common], help="(the plugin that adds it failed to load: run it to see why)",
                   description=problem).set_defaults(handler=Plain(explain, takes_any=True))
