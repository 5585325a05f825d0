"""Which Discord shards a bot process runs, and so which memory streams it serves.

Discord sends a server's events on shard `(guild_id >> 22) % shard_count` and direct messages on shard 0
only. Each process of a sharded persona runs some of the shards (`--shard-count 4 --shards 0-1`), so each
`guild:<id>` stream has exactly one process that observes, answers and reflects on it, and the `dm:<user>`
streams (and any other, such as ones filled by `memstream import`) belong to the process holding shard 0.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Mapping
from dataclasses import dataclass

from memstream import ConfigError
from memstream.render import compact_ranges

__all__ = ["COUNT_ENV", "SHARDS_ENV", "Shards", "add_shard_arguments", "parse_shards", "shard_of"]

COUNT_ENV = "MEMSTREAM_SHARD_COUNT"
SHARDS_ENV = "MEMSTREAM_SHARDS"
_GUILD = re.compile(r"guild:(\d+)")
_PART = re.compile(r"(\d+)(?:-(\d+))?")


def shard_of(guild_id: int, count: int) -> int:
    """The shard that receives a server's events (Discord's formula)."""
    return (guild_id >> 22) % count


@dataclass(frozen=True)
class Shards:
    """The shards one process runs, out of `count`."""

    count: int
    ids: tuple[int, ...]

    @property
    def dms(self) -> bool:
        """Whether this process receives direct messages (they come on shard 0 only)."""
        return 0 in self.ids

    def owns(self, stream: str) -> bool:
        """Whether this process serves a stream: a server's on its shard, every other (DMs) on shard 0."""
        match = _GUILD.fullmatch(stream)
        if match is None:
            return self.dms
        return shard_of(int(match.group(1)), self.count) in self.ids

    def describe(self) -> str:
        """`shards 0-1 of 4`, for the start-up line."""
        return f"shard(s) {_ranges(self.ids)} of {self.count}"


def _ranges(ids: tuple[int, ...]) -> str:
    return ",".join(compact_ranges(ids))


def parse_shards(count: str | int | None, shards: str | None, environ: Mapping[str, str] | None = None,
                 ) -> Shards | None:
    """The shards from `--shard-count N --shards 0-3` (or MEMSTREAM_SHARD_COUNT and MEMSTREAM_SHARDS; a flag
    wins over its variable); None when neither is given: one unsharded connection. `--shards` takes ids and
    ranges (`0-3`, `0,2`, `0-1,4`); without it the process runs every shard. Errors are one line."""
    env = {} if environ is None else environ
    count_from, shards_from = "--shard-count", "--shards"
    if count is None and env.get(COUNT_ENV, "").strip():
        count, count_from = env[COUNT_ENV], COUNT_ENV
    if shards is None and env.get(SHARDS_ENV, "").strip():
        shards, shards_from = env[SHARDS_ENV], SHARDS_ENV
    if count is None:
        if shards is not None:
            raise ConfigError(f"{shards_from} needs --shard-count (or {COUNT_ENV}): the total number of shards "
                              "of the bot, across all its processes")
        return None
    text = str(count).strip()
    if not text.isdigit() or int(text) < 1:
        raise ConfigError(f"{count_from} must be a whole number of at least 1, not {str(count)!r}")
    total = int(text)
    if shards is None:
        return Shards(total, tuple(range(total)))
    ids: set[int] = set()
    for part in (p.strip() for p in shards.split(",")):
        match = _PART.fullmatch(part)
        if match is None:
            raise ConfigError(f"{shards_from} {shards!r} is not a list of shard ids such as 0-3 or 0,2")
        low = int(match.group(1))
        high = int(match.group(2)) if match.group(2) is not None else low
        if high < low:
            raise ConfigError(f"{shards_from}: the range {part} is backwards (write {high}-{low})")
        if high >= total:
            valid = f"the ids are 0-{total - 1}" if total > 1 else "the only id is 0"
            raise ConfigError(f"{shards_from}: shard {high} does not exist: with a shard count of {total} {valid}")
        for shard in range(low, high + 1):
            if shard in ids:
                raise ConfigError(f"{shards_from}: shard {shard} is listed twice")
            ids.add(shard)
    return Shards(total, tuple(sorted(ids)))


def add_shard_arguments(parser: argparse.ArgumentParser) -> None:
    """--shard-count and --shards (checked by parse_shards, with their variables)."""
    parser.add_argument("--shard-count", metavar="N", help=f"the bot's total number of shards, across all its "
                                                           f"processes (or ${COUNT_ENV}); without it, no sharding")
    parser.add_argument("--shards", metavar="IDS", help=f"the shards this process runs: 0-3, 0,2 (or ${SHARDS_ENV}; "
                                                        "default: all of them); the one with shard 0 serves DMs")
