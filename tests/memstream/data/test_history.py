"""History import: JSONL and DiscordChatExporter exports, validated whole, idempotent by message id."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from memstream import ConfigError, MemoryStream
from memstream.data.history import read_history


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


def test_a_reply_keeps_the_message_it_answers(tmp_path: Path) -> None:
    path = tmp_path / "general.json"
    path.write_text(json.dumps(_export([
        _message(0, "who brings the cake?"),
        _message(1, "I do", author="Maria", kind="Reply", reference={"messageId": "1000", "channelId": "222"}),
        _message(2, "and I the tea", author="Sam", reference={"messageId": "1000"}),  # not a reply: a forward
    ])))
    parents = [o.source.reply_to for o in read_history(path).observations]
    assert parents == [None, "1000", None]
    line = tmp_path / "lines.jsonl"
    line.write_text(json.dumps({"text": "yes", "at": "2023-01-01T00:00:00Z", "message_id": "2", "reply_to": "1"}))
    assert read_history(line).observations[0].source.reply_to == "1"


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


@pytest.mark.parametrize(("field", "value", "expected"), [
    ("author", "klaus", r'message 1 \(id 1001\): "author" must be an object, got str'),
    ("content", 42, r'message 1 \(id 1001\): "content" must be a string, got int'),
    ("attachments", "a.png", r'message 1 \(id 1001\): "attachments" must be a list, got str'),
    ("attachments", ["a.png"], r'message 1 \(id 1001\): "attachments"\[0\] must be an object, got str'),
    ("timestamp", None, r'message 1 \(id 1001\): "timestamp" is missing'),
])
def test_a_malformed_export_is_one_line_naming_the_message_and_field(tmp_path: Path, field: str, value: object,
                                                                      expected: str) -> None:
    path = tmp_path / "malformed.json"
    broken = _message(1, "hello")
    broken[field] = value
    path.write_text(json.dumps(_export([_message(0, "fine"), broken])))
    with pytest.raises(ConfigError, match=expected) as info:
        read_history(path)
    assert "\n" not in str(info.value)


def test_a_malformed_export_header_is_one_line(tmp_path: Path) -> None:
    path = tmp_path / "malformed.json"
    data = _export([_message(0, "fine")])
    data["channel"] = "general"
    path.write_text(json.dumps(data))
    with pytest.raises(ConfigError, match='"channel" must be an object') as info:
        read_history(path)
    assert "\n" not in str(info.value)


async def test_a_lone_surrogate_is_a_line_error_and_nothing_is_stored(tmp_path: Path, memory: MemoryStream) -> None:
    path = tmp_path / "history.jsonl"
    good = [json.dumps({"text": f"line {i}", "at": "2024-01-01T10:00:00Z"}) for i in range(300)]
    good[259] = '{"text": "bad \\ud800 text", "at": "2024-01-01T10:00:00Z"}'  # legal JSON, not storable text
    path.write_text("\n".join(good) + "\n", encoding="utf-8")
    with pytest.raises(ConfigError, match=r"line 260: \"text\" holds a character that is not valid text") as info:
        read_history(path)
    assert "Traceback" not in str(info.value)
    assert await memory.recent("default", 10) == []


async def test_text_that_cannot_be_stored_is_refused_before_anything_is_written(memory: MemoryStream) -> None:
    with pytest.raises(ConfigError, match="not valid text"):
        await memory.observe("half a pair \udc80 of surrogates")
    assert await memory.store.recent("default", 10, include_pending=True) == []


@pytest.mark.parametrize("at", ["0001-01-01T00:00:00Z", "1969-12-31T23:59:59Z", "2200-01-01T00:00:00Z",
                                "9999-12-31T23:59:59-05:00"])
def test_times_outside_a_sane_window_are_refused_at_the_door(tmp_path: Path, at: str) -> None:
    path = tmp_path / "history.jsonl"
    path.write_text(json.dumps({"text": "hello", "at": at}) + "\n", encoding="utf-8")
    with pytest.raises(ConfigError, match="outside the times memstream accepts"):
        read_history(path)


async def test_observe_refuses_a_time_outside_the_window(memory: MemoryStream) -> None:
    from datetime import UTC, datetime

    with pytest.raises(ConfigError, match="outside the times memstream accepts"):
        await memory.observe("long ago", at=datetime(1, 1, 1, tzinfo=UTC))
    assert await memory.store.recent("default", 10, include_pending=True) == []
    memory_ok = await memory.observe("in range", at=datetime(2024, 5, 1, tzinfo=UTC))
    assert memory_ok.id > 0


def test_jsonl_lines_keep_where_they_came_from_and_refuse_bad_source_keys(tmp_path: Path) -> None:
    path = tmp_path / "lines.jsonl"
    line = {"text": "Klaus in #general: hi", "at": "2024-03-01T10:00:00Z", "stream": "guild:1", "author": "Klaus",
            "author_id": "500", "channel": "general", "channel_id": "222", "message_id": "1000"}
    path.write_text(json.dumps(line) + "\n" + json.dumps({"text": "x", "at": "2024-03-01T10:00:00Z", "id": "k"}))
    first, second = read_history(path).observations
    assert (first.source.author, first.source.author_id, first.source.channel, first.source.channel_id,
            first.source.message_id) == ("Klaus", "500", "general", "222", "1000")  # a Discord id stays as it is
    assert second.source.message_id == "import:k" and second.source.author_id is None
    path.write_text(json.dumps({**line, "author_id": 500}) + "\n" + json.dumps({**line, "id": "k"}) + "\n"
                    + json.dumps({**line, "reactions": 3}))
    with pytest.raises(ConfigError) as failed:
        read_history(path)
    message = str(failed.value)
    assert 'line 1: "author_id" must be a string' in message
    assert 'line 2: give "id" (a key of your own) or "message_id"' in message
    assert "line 3: unknown key(s) reactions; allowed: text, at, stream, importance, id, author, author_id" in message
