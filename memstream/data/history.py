"""Reading observations from files: our JSONL format and DiscordChatExporter's JSON exports.

Every reader validates the whole file before anything is stored, and gives each observation a stable
message id, so an interrupted import run again stores each line exactly once.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from memstream.clock import sane_time
from memstream.errors import ConfigError
from memstream.records import Observation, Source
from memstream.text import check_text, read_bounded

__all__ = ["IMPORT_MAX_BYTES", "IMPORT_MAX_LINE", "HistoryFile", "parse_time", "read_dce", "read_history",
           "read_jsonl"]

# A history file is refused past these (with one line saying so): a whole server's export fits, /dev/zero does not.
IMPORT_MAX_BYTES = 512 * 1024 * 1024
IMPORT_MAX_LINE = 1024 * 1024  # a JSONL line (one message; Discord's own limit is 4000 characters)

# DiscordChatExporter message types that are people talking (joins, pins, calls... are not).
_DCE_TALK = {"Default", "Reply", "ThreadStarterMessage"}
_DM_TYPES = {"DirectTextChat", "DirectGroupTextChat"}
# The keys of a JSONL line; the source keys are what `memstream export --stream` writes beside text and time.
_SOURCE_KEYS = ("author", "author_id", "channel", "channel_id", "message_id", "reply_to")
_JSONL_KEYS_SHOWN = ("text", "at", "stream", "importance", "id", *_SOURCE_KEYS)
_JSONL_KEYS = set(_JSONL_KEYS_SHOWN)


@dataclass(frozen=True)
class HistoryFile:
    """The observations of one file, in order, and what was skipped."""

    format: str
    observations: list[Observation]
    skipped: int = 0


def parse_time(text: str) -> datetime:
    """An ISO-8601 time; without an offset it is taken as UTC."""
    try:
        moment = datetime.fromisoformat(text.strip().replace("Z", "+00:00"))
    except (ValueError, AttributeError) as exc:
        raise ConfigError(f"not an ISO-8601 time: {text!r} (e.g. 2024-02-13T17:00:00Z)") from exc
    moment = moment if moment.tzinfo else moment.replace(tzinfo=UTC)
    try:
        return sane_time(moment)
    except ValueError as exc:
        raise ConfigError(str(exc)) from exc


def _fail(path: Path, errors: list[str]) -> ConfigError:
    if len(errors) == 1:
        return ConfigError(f"{path}: nothing was imported: {errors[0]}")
    more = f"\n… and {len(errors) - 10} more" if len(errors) > 10 else ""
    return ConfigError(f"{path}: nothing was imported:\n" + "\n".join(errors[:10]) + more)


def read_history(path: Path, *, stream: str | None = None, importance: int | None = None,
                 include_bots: bool = False) -> HistoryFile:
    """Read a JSONL file or a DiscordChatExporter JSON export (detected from the content)."""
    try:
        text = read_bounded(path, "a history file", max_bytes=IMPORT_MAX_BYTES, encoding="utf-8-sig")
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc}") from exc
    head = text.lstrip()[:1]
    if head == "{":
        try:
            data = json.loads(text)
        except json.JSONDecodeError:
            data = None  # JSONL whose first line is an object
        if isinstance(data, dict) and "messages" in data:
            return read_dce(path, data, stream=stream, importance=importance, include_bots=include_bots)
    return read_jsonl(path, text, stream=stream, importance=importance)


def read_jsonl(path: Path, text: str, *, stream: str | None = None, importance: int | None = None) -> HistoryFile:
    """Lines of {"text", "at", optional "stream", "importance", "author", "id"} (and, as `memstream export
    --stream` writes them, "author_id", "channel", "channel_id" and a verbatim "message_id")."""
    found, errors = [], []
    for number, raw in enumerate(text.splitlines(), 1):
        if len(raw) > IMPORT_MAX_LINE:
            raise ConfigError(f"{path}: nothing was imported: line {number} has {len(raw)} characters: a line "
                              f"of a history file may have at most {IMPORT_MAX_LINE}")
        if not raw.strip():
            continue
        try:
            found.append(_jsonl_line(raw, stream, importance))
        except json.JSONDecodeError as exc:
            errors.append(f"line {number}: not valid JSON ({exc.msg}, column {exc.colno})")
        except (ValueError, TypeError, ConfigError) as exc:
            errors.append(f"line {number}: {exc}")
    if errors:
        raise _fail(path, errors)
    return HistoryFile("jsonl", found)


def _check_importance(value: object) -> int | None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 10):
        raise ValueError(f'"importance" must be a whole number from 1 to 10, got {value!r}')
    return value


def _jsonl_line(raw: str, default_stream: str | None, default_importance: int | None) -> Observation:
    data = json.loads(raw)
    if not isinstance(data, dict):
        raise ValueError("each line must be a JSON object")
    unknown = set(data) - _JSONL_KEYS
    if unknown:
        raise ValueError(f"unknown key(s) {', '.join(sorted(unknown))}; allowed: {', '.join(_JSONL_KEYS_SHOWN)}")
    text, at = data.get("text"), data.get("at")
    if not isinstance(text, str) or not text.strip():
        raise ValueError('"text" must be a non-empty string')
    if not isinstance(at, str):
        raise ValueError('"at" must be an ISO-8601 time string')
    value = _check_importance(data.get("importance"))
    stream = data.get("stream", default_stream or "default")
    if not isinstance(stream, str) or not stream:
        raise ValueError('"stream" must be a non-empty string')
    for name in _SOURCE_KEYS:
        if data.get(name) is not None and not isinstance(data[name], str):
            raise ValueError(f'"{name}" must be a string')
    for name in ("text", "stream", "id", *_SOURCE_KEYS):
        if isinstance(data.get(name), str):
            check_text(data[name], f'"{name}"')
    if data.get("message_id") is not None and data.get("id") is not None:
        raise ValueError('give "id" (a key of your own) or "message_id" (kept as it is), not both')
    key = str(data.get("id") or hashlib.sha256(raw.strip().encode()).hexdigest()[:24])
    message_id = data.get("message_id") or f"import:{key}"
    return Observation(text, stream, parse_time(at), value if value is not None else default_importance,
                       Source(author=data.get("author"), author_id=data.get("author_id"), channel=data.get("channel"),
                              channel_id=data.get("channel_id"), message_id=message_id,
                              reply_to=data.get("reply_to")))


def read_dce(path: Path, data: dict[str, Any], *, stream: str | None = None, importance: int | None = None,
             include_bots: bool = False) -> HistoryFile:
    """A DiscordChatExporter JSON export: authors, times and Discord message ids are kept, so messages
    the bot later sees again are not stored twice."""
    guild, channel = data.get("guild") or {}, data.get("channel") or {}
    for key, value in (("guild", guild), ("channel", channel)):
        if not isinstance(value, dict):
            raise ConfigError(f'{path}: nothing was imported: "{key}" must be an object, got {type(value).__name__}')
    messages = data.get("messages")
    if not isinstance(messages, list):
        raise ConfigError(f"{path}: \"messages\" must be a list")
    if stream is None:
        if channel.get("type") in _DM_TYPES or not guild.get("id") or str(guild.get("id")) == "0":
            raise ConfigError(f"{path}: a direct-message export needs --stream dm:<user id>")
        stream = f"guild:{guild['id']}"
    name = str(channel.get("name") or "channel")
    found: list[Observation] = []
    errors: list[str] = []
    skipped = 0
    for index, message in enumerate(messages):
        try:
            observation = _dce_message(message, stream, name, str(channel.get("id") or ""), importance,
                                       include_bots)
        except (ValueError, TypeError, KeyError, AttributeError, ConfigError) as exc:
            errors.append(f"message {index} (id {message.get('id') if isinstance(message, dict) else '?'}): {exc}")
            continue
        if observation is None:
            skipped += 1
        else:
            found.append(observation)
    if errors:
        raise _fail(path, errors)
    return HistoryFile("discordchatexporter", found, skipped)


def _field(data: dict[str, Any], key: str, kind: type | tuple[type, ...], what: str, *,
           required: bool = True) -> Any:
    """data[key], checked: a ValueError naming the field if it is missing or of the wrong kind."""
    if key not in data or data[key] is None:
        if required:
            raise ValueError(f'"{key}" is missing')
        return None
    value = data[key]
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
        raise ValueError(f'"{key}" must be {what}, got {type(value).__name__} {str(value)[:40]!r}')
    if isinstance(value, str):
        check_text(value, f'"{key}"')
    return value


def _dce_message(message: object, stream: str, channel: str, channel_id: str, importance: int | None,
                 include_bots: bool) -> Observation | None:
    if not isinstance(message, dict):
        raise ValueError(f"must be an object, got {type(message).__name__}")
    kind = _field(message, "type", str, "a string", required=False) or "Default"
    if kind not in _DCE_TALK:
        return None
    author = _field(message, "author", dict, "an object")
    if _field(author, "isBot", bool, "true or false", required=False) and not include_bots:
        return None
    nickname = _field(author, "nickname", str, "a string", required=False)
    name = _field(author, "name", str, "a string", required=False)
    author_id = _field(author, "id", (str, int), "a string", required=False)
    who = str(nickname or name or "someone")
    body = " ".join(part for part in _dce_parts(message) if part).strip()
    if not body:
        return None
    message_id = str(_field(message, "id", (str, int), "a string"))
    timestamp = _field(message, "timestamp", str, "an ISO-8601 time string")
    reference = _field(message, "reference", dict, "an object", required=False) if kind == "Reply" else None
    parent = _field(reference, "messageId", (str, int), "a string", required=False) if reference else None
    return Observation(f"{who} in #{channel}: {body}", stream, parse_time(timestamp), importance,
                       Source(author=who, author_id=str(author_id or ""), channel=channel,
                              channel_id=channel_id, message_id=message_id, reply_to=str(parent) if parent else None))


def _dce_parts(message: dict[str, Any]) -> Iterator[str]:
    yield str(_field(message, "content", str, "a string", required=False) or "").strip()
    for key, label, names in (("attachments", "attachment", ("fileName", "url")),
                              ("stickers", "sticker", ("name",))):
        items = _field(message, key, list, "a list", required=False) or []
        for position, item in enumerate(items):
            if not isinstance(item, dict):
                raise ValueError(f'"{key}"[{position}] must be an object, got {type(item).__name__}')
            shown = next((str(item[n]) for n in names if isinstance(item.get(n), str) and item[n]), label)
            yield f"[{label}: {check_text(shown, f'{key}[{position}]')}]"
