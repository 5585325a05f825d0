"""Exports: what a persona remembers from one person's messages, as one JSON document (a data-access
request), and a whole stream as the JSONL lines `memstream import` reads (moving or copying a stream)."""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, TextIO

from memstream.errors import ConfigError, StoreError
from memstream.records import Memory
from memstream.store import Store
from memstream.text import visible_json

__all__ = ["StreamExport", "author_document", "document_text", "import_line", "private_file", "write_stream"]

FORMAT = "memstream-author-export/1"


def _when(moment: datetime) -> str:
    return moment.isoformat().replace("+00:00", "Z")


def _dumps(data: Any, indent: int | None = None) -> str:
    """JSON that is the same to any reader and harmless on a terminal: control characters escaped (json does
    C0; DEL, C1 and bidi controls get \\u escapes too), other text kept readable."""
    return visible_json(json.dumps(data, indent=indent, ensure_ascii=False))


def _author_record(memory: Memory) -> dict[str, Any]:
    src = memory.source
    return {"id": memory.id, "stream": memory.stream, "kind": memory.kind, "text": memory.text,
            "created_at": _when(memory.created_at), "importance": memory.importance,
            "author": src.author, "message_id": src.message_id, "channel_id": src.channel_id,
            "channel": src.channel, "reply_to": src.reply_to}


def author_document(found: Sequence[Memory], *, persona: str, author_id: str, at: datetime,
                    stream: str | None = None) -> dict[str, Any]:
    """The document of a data-access request: `found`, every memory made from one author's messages (oldest
    first; MemoryStream.author_memories), in every stream or only in `stream`."""
    return {"format": FORMAT, "persona": persona, "author_id": author_id, "exported_at": _when(at),
            "stream": stream, "count": len(found), "memories": [_author_record(m) for m in found]}


def document_text(document: dict[str, Any]) -> str:
    """An author document as the text of a file."""
    return _dumps(document, indent=2) + "\n"


def import_line(memory: Memory) -> dict[str, Any]:
    """An observation as a line `memstream import` reads back into the same memory: text, time, stream, where
    it came from, and its importance unless that was a fallback (then the importing persona rates it)."""
    src = memory.source
    line: dict[str, Any] = {"text": memory.text, "at": _when(memory.created_at), "stream": memory.stream}
    if memory.importance is not None and memory.importance_source != "fallback":
        line["importance"] = memory.importance
    for key in ("author", "author_id", "channel", "channel_id", "message_id", "reply_to"):
        if getattr(src, key) is not None:
            line[key] = getattr(src, key)
    return line


@dataclass(frozen=True)
class StreamExport:
    """What a stream export wrote, and the insights it left out."""

    lines: int
    reflections: int


async def write_stream(store: Store, stream: str, out: TextIO) -> StreamExport:
    """Write a stream's observations as import lines, oldest first. Insights are not exported: they cite
    memories by id, and the importing persona draws its own (`memstream import --reflect`)."""
    lines = reflections = 0
    async for page in store.stream_pages(stream):
        for memory in page:
            if memory.kind != "observation":
                reflections += 1
                continue
            out.write(_dumps(import_line(memory)) + "\n")
            lines += 1
    if not lines and not reflections:
        raise ConfigError(f"stream {stream!r} has no memories to export (`memstream stats` lists the streams)")
    return StreamExport(lines, reflections)


@contextlib.contextmanager
def private_file(path: Path, *, force: bool = False) -> Iterator[TextIO]:
    """A new file at `path`, readable by its owner only, that appears only when the block ends without an
    error (written beside it, then renamed); an existing file is refused unless `force`."""
    if path.exists() and not force:
        raise ConfigError(f"{path} exists: choose another path, or --force to replace it")
    if path.is_dir():
        raise ConfigError(f"{path} is a folder: give a file name")
    partial = path.with_name(path.name + ".partial")
    try:
        partial.unlink(missing_ok=True)
        handle = os.fdopen(os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w", encoding="utf-8")
    except OSError as exc:
        raise StoreError(f"cannot write {path}: {exc.strerror or exc}") from exc
    try:
        with handle:
            yield handle
        os.replace(partial, path)
    except OSError as exc:
        partial.unlink(missing_ok=True)
        raise StoreError(f"cannot write {path}: {exc.strerror or exc}") from exc
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
