"""History import: JSONL and DiscordChatExporter exports, validated whole, idempotent by message id."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from memstream import ConfigError, MemoryStream
from memstream.history import read_history


def _export(messages: list[dict[str, object]], *, guild: str = "111", channel_type: str = "GuildTextChat"
            ) -> dict[str, object]:
    return {"guild": {"id": guild, "name": "Smallville"},
            "channel": {"id": "222", "type": channel_type, "name": "general", "category": "Text"},
            "dateRange": {"after": None, "before": None}, "exportedAt": "2023-03-01T00:00:00+00:00",
            "messages": messages, "messageCount": len(messages)}


def _message(n: int, content: str, *, author: str = "Klaus", bot: bool = False, kind: str = "Default",
             **extra: object) -> dict[str, object]:
    return {"id": str(1000 + n), "type": kind, "timestamp": f"2023-02-{n + 1:02d}T10:00:00.123+01:00",
            "timestampEdited": None, "isPinned": False, "content": content,
            "author": {"id": str(500 + len(author)), "name": author.lower(), "discriminator": "0000",
                       "nickname": author, "isBot": bot},
            "attachments": [], "embeds": [], "stickers": [], "reactions": [], "mentions": [], **extra}


def test_a_discordchatexporter_export_keeps_authors_times_and_ids(tmp_path: Path) -> None:
    path = tmp_path / "general.json"
    path.write_text(json.dumps(_export([
        _message(0, "the party is on Friday"),
        _message(1, "", author="Maria", attachments=[{"id": "9", "fileName": "cake.png", "url": "x"}]),
        _message(2, "beep", author="Robot", bot=True),
        _message(3, "", author="Maria", kind="GuildMemberJoin"),
        _message(4, "", author="Sam", stickers=[{"id": "1", "name": "wave"}]),
    ])))
    history = read_history(path)
    assert history.format == "discordchatexporter" and history.skipped == 2
    texts = [o.text for o in history.observations]
    assert texts == ["Klaus in #general: the party is on Friday", "Maria in #general: [attachment: cake.png]",
                     "Sam in #general: [sticker: wave]"]
    first = history.observations[0]
    assert first.stream == "guild:111" and first.source.message_id == "1000" and first.source.author == "Klaus"
    assert first.at is not None and first.at.isoformat() == "2023-02-01T10:00:00.123000+01:00"
    assert len(read_history(path, include_bots=True).observations) == 4


def test_a_dm_export_needs_a_stream(tmp_path: Path) -> None:
    path = tmp_path / "dm.json"
    path.write_text(json.dumps(_export([_message(0, "hi")], guild="0", channel_type="DirectTextChat")))
    with pytest.raises(ConfigError, match="--stream dm:"):
        read_history(path)
    assert read_history(path, stream="dm:42").observations[0].stream == "dm:42"


def test_a_broken_export_names_the_message_and_stores_nothing(tmp_path: Path) -> None:
    path = tmp_path / "broken.json"
    broken = _message(1, "no time")
    broken["timestamp"] = "not a time"
    path.write_text(json.dumps(_export([_message(0, "fine"), broken])))
    with pytest.raises(ConfigError, match=r"message 1 \(id 1001\)"):
        read_history(path)


async def test_importing_twice_stores_each_message_once(tmp_path: Path, memory: MemoryStream) -> None:
    path = tmp_path / "general.json"
    path.write_text(json.dumps(_export([_message(n, f"message {n}") for n in range(20)])))
    history = read_history(path, importance=3)
    await memory.observe_many(history.observations[:12])  # interrupted
    await memory.observe_many(history.observations)
    stored = await memory.recent("guild:111", 100)
    assert sorted(m.text for m in stored) == sorted(o.text for o in history.observations)
    assert {m.importance_source for m in stored} == {"given"}
