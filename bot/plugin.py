"""`memstream bot`: the bot's command on memstream's command line, added as a plugin (the entry point group
`memstream.commands` in pyproject.toml), so that the core never names the bot. Light at import: discord.py is
loaded when the command runs, not when `memstream --help` lists it."""

from __future__ import annotations

import argparse

from bot.sharding import add_shard_arguments
from memstream.cli.plugins import CommandLine

__all__ = ["register", "run"]


def register(commands: CommandLine) -> None:
    """Add `memstream bot` and its options."""
    parser = commands.add("bot", run, help="run the persona on Discord (needs DISCORD_TOKEN)",
                          description="Run the persona as a Discord bot: one process, or with --shard-count and "
                                      "--shards some shards of a bot run as several processes on one database.")
    add_shard_arguments(parser)


async def run(args: argparse.Namespace) -> int:
    """Run the bot, with the same logging default as `python -m bot`."""
    from bot import __main__ as runner  # discord.py and aiohttp: only once the bot runs

    runner.configure_logging(verbose=args.verbose)
    return await runner.run(args)
