"""--shard-count and --shards (and their variables): which shards a process runs, which streams it serves,
and one-line errors for anything else."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bot.__main__ import run
from bot.bot import PersonaBot, ShardedPersonaBot, make_bot
from bot.sharding import Shards, parse_shards, shard_of
from memstream import ConfigError, MemoryStream, PersonaConfig
from memstream.exits import EXIT_BAD_INPUT
from memstream.testing import FakeEmbedder, ScriptedChat

ROOT = Path(__file__).resolve().parents[2]


def test_ranges_lists_and_the_whole_bot() -> None:
    assert parse_shards("4", "0-3") == Shards(4, (0, 1, 2, 3))
    assert parse_shards("4", "2,0") == Shards(4, (0, 2))
    assert parse_shards(16, " 0-1, 8 ,10-11") == Shards(16, (0, 1, 8, 10, 11))
    assert parse_shards("3", None) == Shards(3, (0, 1, 2))  # the count alone: every shard in this process
    assert parse_shards(None, None) is None  # no flags: one unsharded connection, as before


def test_the_variables_stand_in_for_the_flags_and_the_flags_win() -> None:
    env = {"MEMSTREAM_SHARD_COUNT": "4", "MEMSTREAM_SHARDS": "2-3"}
    assert parse_shards(None, None, env) == Shards(4, (2, 3))
    assert parse_shards("8", "0", env) == Shards(8, (0,))
    assert parse_shards(None, None, {"MEMSTREAM_SHARD_COUNT": "", "MEMSTREAM_SHARDS": ""}) is None


@pytest.mark.parametrize(("count", "shards", "env", "error"), [
    ("4", "4", {}, "--shards: shard 4 does not exist: with a shard count of 4 the ids are 0-3"),
    ("4", "2-9", {}, "shard 9 does not exist"),
    ("1", "1", {}, "with a shard count of 1 the only id is 0"),
    ("4", "3-1", {}, "the range 3-1 is backwards"),
    ("4", "0-1,1", {}, "shard 1 is listed twice"),
    ("4", "one", {}, "--shards 'one' is not a list of shard ids such as 0-3 or 0,2"),
    ("4", "", {}, "is not a list of shard ids"),
    ("4", "-1", {}, "is not a list of shard ids"),
    ("0", None, {}, "--shard-count must be a whole number of at least 1, not '0'"),
    ("four", None, {}, "not 'four'"),
    (None, "0-1", {}, "--shards needs --shard-count (or MEMSTREAM_SHARD_COUNT)"),
    (None, None, {"MEMSTREAM_SHARDS": "0"}, "MEMSTREAM_SHARDS needs --shard-count"),
    (None, None, {"MEMSTREAM_SHARD_COUNT": "2", "MEMSTREAM_SHARDS": "5"}, "MEMSTREAM_SHARDS: shard 5 does not"),
    (None, None, {"MEMSTREAM_SHARD_COUNT": "-2"}, "MEMSTREAM_SHARD_COUNT must be a whole number"),
])
def test_bad_shards_are_one_line_errors(count: str | None, shards: str | None, env: dict[str, str],
                                        error: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_shards(count, shards, env)
    assert error in str(caught.value) and "\n" not in str(caught.value)


def test_a_process_owns_its_servers_streams_and_shard_0_the_rest() -> None:
    guilds = [(n << 22) | 12345 for n in range(100, 108)]  # 8 servers, two on each of 4 shards
    low, high = Shards(4, (0, 1)), Shards(4, (2, 3))
    for guild in guilds:
        stream = f"guild:{guild}"
        assert low.owns(stream) == (shard_of(guild, 4) in (0, 1))
        assert low.owns(stream) != high.owns(stream)
    for other in ("dm:42", "default", "notes"):
        assert low.owns(other) and not high.owns(other)
    assert Shards(4, (0, 1)).describe() == "shard(s) 0-1 of 4" and Shards(8, (0, 2, 3)).describe() == \
        "shard(s) 0,2-3 of 8"


async def test_without_the_flags_the_bot_is_one_unsharded_connection(tmp_path: Path) -> None:
    persona = PersonaConfig(name="I", summary="s", database=tmp_path / "i.db")
    async with await MemoryStream.open(persona, chat=ScriptedChat(), embedder=FakeEmbedder(), environ={}) as memory:
        plain = make_bot(memory, persona)
        assert type(plain) is PersonaBot and plain.shard_count is None and plain.sharding is None
        assert plain.reflections.owns is None
        sharded = make_bot(memory, persona, Shards(4, (2, 3)))
        assert isinstance(sharded, ShardedPersonaBot)
        assert (sharded.shard_count, sharded.shard_ids) == (4, [2, 3])
        assert sharded.reflections.owns is not None and not sharded.reflections.owns("dm:1")


async def test_bad_shards_are_reported_before_anything_is_opened(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DISCORD_TOKEN", raising=False)
    args = argparse.Namespace(persona=str(tmp_path / "missing.toml"), db=None, shard_count="4", shards="0-4")
    with pytest.raises(ConfigError, match="shard 4 does not exist"):
        await run(args)


@pytest.mark.parametrize(("argv", "env", "error"), [
    (["--shard-count", "4", "--shards", "7"], {},
     "--shards: shard 7 does not exist: with a shard count of 4 the ids are 0-3"),
    ([], {"MEMSTREAM_SHARD_COUNT": "2", "MEMSTREAM_SHARDS": "0-2"},  # the container's way: `memstream bot`
     "MEMSTREAM_SHARDS: shard 2 does not exist: with a shard count of 2 the ids are 0-1"),
])
def test_memstream_bot_rejects_bad_shards_in_one_line(argv: list[str], env: dict[str, str], error: str) -> None:
    done = subprocess.run([sys.executable, "-m", "memstream", "bot", *argv], cwd=ROOT, capture_output=True,
                          text=True, timeout=60, env={**os.environ, **env})
    assert done.returncode == EXIT_BAD_INPUT
    assert done.stderr == f"memstream: error: {error}\n"
