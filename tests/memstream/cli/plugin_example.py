"""Plugins for tests/memstream/cli/test_plugins.py, named by the entry points the tests hand to `main`."""

from __future__ import annotations

import argparse

from memstream.cli.plugins import CommandLine
from memstream.errors import ConfigError


async def _hello(args: argparse.Namespace) -> int:
    if args.name == "nobody":
        raise ConfigError("nobody is not a name")
    print(f"hello {args.name} from {args.persona}{' (verbose)' if args.verbose else ''}")
    return 0


def register(commands: CommandLine) -> None:
    """`memstream hello --name NAME`."""
    commands.add("hello", _hello, help="say hello", description="Say hello.").add_argument("--name", default="you")


def register_chat(commands: CommandLine) -> None:
    """A plugin that takes a name memstream already has."""
    commands.add("chat", _hello, help="not memstream's chat", description="Not memstream's chat.")


def register_fails(commands: CommandLine) -> None:
    """A plugin whose registration raises."""
    raise RuntimeError("this plugin is broken")
