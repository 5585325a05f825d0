"""A bot process for the sharding tests: `python -m tests.bot.shard_worker bot --persona P --shard-count 4
--shards 0-1` runs `memstream` with those arguments, against the fake Discord of the test process at
$FAKE_DISCORD_URL (discord.py has no setting for another host: the same two class attributes the in-process
tests set), with the identify pacing between a process's shards cut from 5 s to 0.05 s."""

from __future__ import annotations

import os
import sys

import bot.bot
from memstream import cli
from tests.fakes.discord_server import use_fake_discord

URL_ENV = "FAKE_DISCORD_URL"


def main() -> int:
    use_fake_discord(os.environ[URL_ENV])
    bot.bot.IDENTIFY_SECONDS = 0.05
    return cli.main(sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())
