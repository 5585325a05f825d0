"""Run a persona on Discord: `memstream bot --persona personas/isabella.toml` (bot.plugin) or `python -m bot ...`.

One process per persona: each persona is its own Discord application (its own token, name and avatar)
and its own SQLite file, so a crash, a restart or a rate limit of one never touches another. A persona in
thousands of servers runs as several processes on one database, each with some of its shards
(`--shard-count 4 --shards 0-1`: bot.sharding).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import logging
import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path

import aiohttp
import discord

from bot.bot import NoVoiceNotices, OneLineReconnects, PersonaBot, make_bot
from bot.sharding import add_shard_arguments, parse_shards
from memstream import ConfigError, MemoryStream, load_persona
from memstream.config import is_database_url
from memstream.exits import run_to_exit

__all__ = ["configure_logging", "main", "run", "settle_memory"]

log = logging.getLogger("bot")
SETTLE_SECONDS = 30.0


async def settle_memory(bot: PersonaBot, delay: float = SETTLE_SECONDS) -> None:
    """Once the bot has been up a while, move what is alive then (modules, the SDK's types, caches) to the
    collector's permanent generation: full collections stop scanning it. Under load (bench/load.py) they had
    paused the event loop for 80-85 ms each; frozen, the loop's worst lag stays well under 100 ms."""
    await bot.wait_until_ready()
    await asyncio.sleep(delay)
    gc.collect()
    gc.freeze()


def configure_logging(*, verbose: bool) -> None:
    """The bot's one logging default, whether started as `memstream bot` or `python -m bot`: start-up facts,
    warnings (one line per fault: a rating fallback, a dropped insight, a pending retry) and errors at INFO;
    message text never (only -v, DEBUG, has discord.py log gateway payloads)."""
    level = logging.DEBUG if verbose else logging.INFO
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger().setLevel(level)  # also when the command line configured logging first
    # aiosqlite logs every statement with its values (message text) at DEBUG: never wanted in a log file.
    logging.getLogger("aiosqlite").setLevel(logging.INFO)
    client = logging.getLogger("discord.client")
    for kind in (OneLineReconnects, NoVoiceNotices):
        if not any(isinstance(f, kind) for f in client.filters):
            client.addFilter(kind())
    if not verbose:  # an INFO line per model request and per client retry: dozens a second under load
        for name in ("httpx", "httpx2", "openai"):  # (failures are logged once by memstream, counted in stats)
            logging.getLogger(name).setLevel(logging.WARNING)
        # APScheduler's INFO lines (a job added, executed, the scheduler started) say nothing the bot does not.
        logging.getLogger("apscheduler").setLevel(logging.WARNING)


# An unreachable Discord at start (DNS, connection refused) is tried again after LOGIN_RETRY seconds, doubling
# up to LOGIN_RETRY_CAP, with one line per attempt; once logged in, discord.py reconnects by itself.
LOGIN_RETRY, LOGIN_RETRY_CAP = 5.0, 300.0


async def login(bot: PersonaBot, token: str) -> None:
    """Log in, waiting out a Discord that cannot be reached (a rejected token is raised at once)."""
    delay = LOGIN_RETRY
    while True:
        try:
            await bot.login(token)
            return
        except (TimeoutError, OSError, aiohttp.ClientConnectionError) as exc:
            log.warning("Discord unreachable (%s: %s); trying again in %.0f s", type(exc).__name__, exc, delay)
            await asyncio.sleep(delay)
            delay = min(LOGIN_RETRY_CAP, delay * 2)


def stop_on_sigterm(bot: PersonaBot) -> None:
    """SIGTERM (docker stop, systemd) closes the bot cleanly: queued observations stored, then disconnect."""
    loop = asyncio.get_running_loop()
    with contextlib.suppress(NotImplementedError, RuntimeError):  # not on Windows, nor outside the main thread
        loop.add_signal_handler(signal.SIGTERM, lambda: asyncio.ensure_future(bot.close()))


async def run(args: argparse.Namespace) -> int:
    """Open the persona's memory, start the bot, and turn Discord's start-up errors into one line."""
    shards = parse_shards(getattr(args, "shard_count", None), getattr(args, "shards", None), os.environ)
    persona = load_persona(args.persona)
    if getattr(args, "db", None) is not None:
        persona = persona.with_database(args.db if is_database_url(args.db) else Path(args.db))
    token = os.environ.get(persona.discord.token_env, "").strip()
    if not token:
        raise ConfigError(f"{persona.discord.token_env} is not set: create a bot at "
                          "https://discord.com/developers/applications and export its token")
    async with await MemoryStream.open(persona) as memory:
        bot = make_bot(memory, persona, shards)
        settling = asyncio.create_task(settle_memory(bot))
        try:
            async with bot:
                stop_on_sigterm(bot)
                await login(bot, token)
                await bot.connect(reconnect=True)
        except discord.PrivilegedIntentsRequired as exc:
            raise ConfigError("Discord refused the MESSAGE CONTENT intent: enable it under Bot > Privileged "
                              "Gateway Intents in the Developer Portal") from exc
        except discord.LoginFailure as exc:
            raise ConfigError(f"Discord rejected the token in {persona.discord.token_env}") from exc
        finally:
            settling.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await settling
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """`python -m bot`."""
    parser = argparse.ArgumentParser(prog="python -m bot", description="Run a memstream persona on Discord.")
    parser.add_argument("--persona", default=os.environ.get("MEMSTREAM_PERSONA", "personas/isabella.toml"))
    parser.add_argument("--db", help="use this database (a file, or a postgresql:// URL) instead of the persona's")
    parser.add_argument("-v", "--verbose", action="store_true")
    add_shard_arguments(parser)
    args = parser.parse_args(argv)
    configure_logging(verbose=args.verbose)
    return run_to_exit(run(args))


if __name__ == "__main__":
    sys.exit(main())
