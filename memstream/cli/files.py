"""Memories in and out of files: import, export, backup, salvage and copy (the work itself is in memstream.data;
these commands check their arguments, show progress and report)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from memstream.cli.handlers import OnMemory, OnPersona, Plain
from memstream.cli.options import Parents, importance, positive, stream_key, user_id
from memstream.cli.output import emit, progress
from memstream.config import PersonaConfig, is_database_url, load_persona
from memstream.data.history import read_history
from memstream.errors import ConfigError, MemstreamError, ProviderError, StoreError
from memstream.exits import EXIT_PENDING, Interrupted
from memstream.records import Observation
from memstream.render import compact_ranges
from memstream.text import visible

if TYPE_CHECKING:
    from memstream.cli.options import Subparsers
    from memstream.stream import MemoryStream

__all__ = ["add_parsers", "cmd_backup", "cmd_copy", "cmd_export", "cmd_import", "cmd_salvage"]

CHUNK = 256  # observations stored per batch by import


@dataclass
class _Imported:
    """What an import stored, as it goes."""

    ready: int = 0
    already: int = 0
    read: int = 0  # lines of the file handled (stored, or already there)
    stored: int = 0  # lines in the database (committed), whether ready yet or not
    waiting: list[int] = field(default_factory=list)


async def cmd_import(memory: MemoryStream, args: argparse.Namespace) -> int:
    """Import a JSONL file or a DiscordChatExporter export; already imported messages are skipped."""
    history = read_history(Path(args.file), stream=args.stream if args.stream_given else None,
                           importance=args.importance, include_bots=args.include_bots)
    lines = history.observations
    # Reflections run only when asked (--reflect), at the imported messages' time, never behind the user's back.
    memory.auto_reflect = False
    done = _Imported()
    try:
        # A run interrupted (or cut off by a model outage) left lines pending: finish all of them first.
        await _finish_pending(memory)
        for start in range(0, len(lines), CHUNK):
            await _import_chunk(memory, lines[start:start + CHUNK], done, reflect=args.reflect)
            done.read = min(start + CHUNK, len(lines))
            progress(done.read, len(lines), CHUNK)
    except asyncio.CancelledError:  # Ctrl-C: what is stored stays; say so, and what is left
        raise Interrupted(await _interrupted_line(memory, done, len(lines))) from None
    except StoreError as exc:  # the database went away (or refused a write): what is kept, what is not
        raise StoreError(f"{exc}; {_stopped_line(done, len(lines))}") from exc
    if done.waiting:  # lines another import stored and is still completing, or whose model calls failed: try once more
        await memory.complete(sorted(set(done.waiting)))
        now = await memory.store.get_many(sorted(set(done.waiting)))
        done.ready += sum(1 for i in done.waiting if i in now and now[i].status == "ready")
    left = (await memory.store.pending_state()).count  # of this file and of earlier runs
    streams = dict(Counter(o.stream for o in lines))
    await _import_report(memory, args, ImportSummary(history.format, len(lines), history.skipped, streams), done, left)
    return 0 if left == 0 else 3


async def _import_chunk(memory: MemoryStream, part: Sequence[Observation], done: _Imported, *, reflect: bool) -> None:
    """Store a chunk of observations (a message already imported is not stored again), then reflect if asked."""
    known = await memory.store.find_messages([(o.stream, o.source.message_id) for o in part if o.source.message_id])
    done.already += sum(1 for o in part if o.source.message_id and (o.stream, o.source.message_id) in known)
    stored = await memory.observe_many(part, defer=True)  # committed: kept whatever happens next
    done.stored += len(part)
    await memory.complete([m.id for m in stored if m.status == "pending"])
    memories = list((await memory.store.get_many([m.id for m in stored])).values())
    done.ready += sum(1 for m in memories if m.status == "ready")
    done.waiting += [m.id for m in memories if m.status == "pending"]
    if reflect:
        await _reflect_due(memory, at=max(o.at for o in part if o.at) if any(o.at for o in part) else None)


async def _interrupted_line(memory: MemoryStream, done: _Imported, count: int) -> str:
    """What an interrupted import leaves: the lines it got through, and the memories left pending."""
    if sys.stderr.isatty() and done.read:
        print(file=sys.stderr)  # off the progress bar's line
    try:
        left: int | None = (await asyncio.wait_for(memory.store.pending_state(), 5)).count
    except (TimeoutError, MemstreamError):
        left = None
    pending = "" if left is None else (f"; {left} stored memory(ies) pending (not yet rated and embedded)"
                                       if left else "; nothing is pending")
    return (f"{done.read} of {count} line(s) imported ({done.ready} ready){pending}: the same import run again "
            "skips what is stored and completes what is pending")


def _stopped_line(done: _Imported, count: int) -> str:
    """What an import the database stopped leaves: what is kept (ready or pending), what was not stored."""
    return (f"the import stopped: {done.stored} of {count} line(s) are stored (those not yet rated and embedded "
            f"are pending), {count - done.stored} were not stored; run the same import again once the database is "
            "back: it skips what is stored and completes what is pending")


@dataclass(frozen=True)
class ImportSummary:
    """What a file held: its format, its messages, those skipped, and how many went to each stream."""

    form: str
    count: int
    skipped: int
    streams: dict[str, int]


def where_lines(streams: dict[str, int]) -> list[str]:
    """Where an import's messages went, and how to look there (a stream other than the default one is easy
    to miss: recall and chat read `default` unless told)."""
    if not streams:
        return []
    shown = ", ".join(f"{key} ({n})" for key, n in sorted(streams.items())[:5])
    more = f" and {len(streams) - 5} more" if len(streams) > 5 else ""
    first = min(streams)
    return [f"stored in stream(s): {shown}{more}; look there with --stream, e.g. memstream recall \"...\" "
            f"--stream {first}"]


async def _import_report(memory: MemoryStream, args: argparse.Namespace, summary_of: ImportSummary,
                         done: _Imported, left: int) -> None:
    form, count, skipped = summary_of.form, summary_of.count, summary_of.skipped
    pending = count - done.ready
    due = await memory.due_streams()
    new = count - done.already
    summary = [f"read {count} {form} message(s): {new} new, {done.already} already imported; "
               f"{done.ready} ready, {pending} pending"
               + (f", {skipped} skipped (bots, joins, pins, empty)" if skipped else "")]
    summary += where_lines(summary_of.streams)
    if due:
        summary.append(f"due for reflection: {', '.join(due)} (run: memstream reflect --stream KEY, or import "
                       "with --reflect)")
    if left:
        why = f" ({memory.last_model_error})" if memory.last_model_error is not None else ""
        summary.append(f"{left} memory(ies) pending: the model server failed{why}; they are kept, and the same "
                       "import run again (or the bot) completes them once the server is back")
    emit(args, {"format": form, "observations": count, "new": new, "already_imported": done.already,
                "skipped": skipped, "ready": done.ready, "pending": pending, "pending_total": left,
                "due_for_reflection": due, "streams": summary_of.streams,
                "error": None if memory.last_model_error is None or not left else str(memory.last_model_error)},
         summary)


async def _finish_pending(memory: MemoryStream, chunk: int = 1000) -> None:
    """Complete every pending memory (not only the first thousand), a chunk at a time, each tried once."""
    ids = [m.id for m in await memory.store.pending_memories(limit=2**62, claim=True)]
    for start in range(0, len(ids), chunk):
        await memory.complete(ids[start:start + chunk])


async def _reflect_due(memory: MemoryStream, *, at: datetime | None) -> None:
    """Reflect on every stream that is due; a reflection the model server fails is skipped (it is counted,
    and runs again at the next import with --reflect, `memstream reflect`, or the bot), never the import."""
    for stream in await memory.due_streams():
        try:
            await memory.reflect(stream, at=at, only_if_due=True)
        except ProviderError as exc:
            print(visible(f"memstream: reflection on {stream} skipped, it is tried again later: {exc}"),
                  file=sys.stderr)


async def cmd_export(memory: MemoryStream, args: argparse.Namespace) -> int:
    """A data-access request (--author: one JSON document), or a stream as import lines (--stream)."""
    from memstream.data.export import private_file

    out = args.output
    with contextlib.ExitStack() as stack:
        handle = sys.stdout if out is None else stack.enter_context(private_file(out, force=args.force))
        count, what, data = await (_export_author(memory, args, handle) if args.author is not None
                                   else _export_stream(memory, args, handle))
        handle.flush()
    if out is not None:  # stdout is free for a summary
        lines = [f"exported {count} memory(ies) of {what} to {out}"
                 + (f" from {len(data['streams'])} stream(s)" if "streams" in data else "")]
        if data.get("reflections_left_out"):
            lines.append(f"{data['reflections_left_out']} insight(s) left out: they are drawn again after an "
                         "import (memstream import --reflect)")
        emit(args, {**data, "file": str(out)}, lines)
    return 0


async def _export_author(memory: MemoryStream, args: argparse.Namespace,
                         handle: Any) -> tuple[int, str, dict[str, Any]]:
    """Everything remembered from one author's messages, as one JSON document."""
    from memstream.data.export import author_document, document_text

    document = author_document(await memory.author_memories(args.author), persona=memory.name,
                               author_id=args.author, at=memory.now())
    handle.write(document_text(document))
    streams = sorted({m["stream"] for m in document["memories"]})
    count: int = document["count"]
    return count, f"author {args.author}", {"author_id": args.author, "memories": count, "streams": streams}


async def _export_stream(memory: MemoryStream, args: argparse.Namespace,
                         handle: Any) -> tuple[int, str, dict[str, Any]]:
    """A stream's observations as the lines `memstream import` reads."""
    from memstream.data.export import write_stream

    done = await write_stream(memory.store, args.stream, handle)
    return done.lines, f"stream {args.stream}", {"stream": args.stream, "memories": done.lines,
                                                 "reflections_left_out": done.reflections}


async def cmd_backup(args: argparse.Namespace, persona: PersonaConfig) -> int:
    """A consistent copy of the persona's database, safe while the bot runs."""
    if isinstance(persona.database, str):
        raise ConfigError("backup copies a SQLite file; back up a PostgreSQL database with pg_dump, or copy it to a "
                          "file with: memstream copy")
    from memstream.data.filecare import backup

    source = Path(persona.database)
    pages = await asyncio.to_thread(backup, source, args.dest, force=args.force,
                                    progress=lambda done, total: progress(done, total, max(1, total // 10), "copied"))
    emit(args, {"source": str(source), "backup": str(args.dest), "pages": pages},
         [f"backed up {source} to {args.dest} ({pages} pages)"])
    return 0


async def cmd_salvage(args: argparse.Namespace) -> int:
    """Copy what can be read from a damaged database into a new one."""
    from memstream.data.filecare import salvage

    report = await salvage(args.src, args.dest)
    lines = [f"salvaged into {args.dest}: " + ", ".join(f"{n} {table}" for table, n in report.copied.items())]
    for table, ids in report.unreadable.items():
        if ids:
            lines.append(f"could not read {len(ids)} row(s) of {table}: {_ranges(ids)}")
    for table, n in report.dropped.items():
        lines.append(f"left out {n} row(s) of {table} that cite rows that could not be read")
    if report.complete:
        lines.append("every row could be read")
    emit(args, {"copied": report.copied, "unreadable": report.unreadable, "dropped": report.dropped}, lines)
    return 0 if report.complete else EXIT_PENDING


def _ranges(ids: Sequence[str]) -> str:
    """Ids as compact ranges: 3-7, 9."""
    parts = compact_ranges(int(i) for i in ids)
    return ", ".join(parts[:20]) + (", ..." if len(parts) > 20 else "")


def _location(value: str) -> Path | str:
    """A copy's SRC or DST: a persona file's database, a postgresql:// URL, or a SQLite file."""
    if is_database_url(value):
        return value
    if value.endswith(".toml"):
        return load_persona(value).database
    return Path(value)


async def cmd_copy(args: argparse.Namespace) -> int:
    """Copy a persona's memory between databases (SQLite <-> PostgreSQL), resumable, checked at the end."""
    from memstream.data.transfer import copy_store, describe
    from memstream.store import Store

    src, dst = _location(args.src), _location(args.dest)
    if isinstance(src, Path) and not src.exists():
        raise ConfigError(f"{src}: no such database file")
    if describe(src) == describe(dst):
        raise ConfigError("SRC and DST are the same database")
    shown: dict[str, int] = {}

    def show(table: str, done: int, total: int) -> None:
        if table not in shown and sys.stderr.isatty():
            print(f"{table}:", file=sys.stderr)
        progress(done, total, done - shown.get(table, 0), "copied")
        shown[table] = done

    async with await Store.open(src) as source, await Store.open(dst) as dest:
        report = await copy_store(source, dest, source=describe(src), batch=args.batch, progress=show)
    lines = [f"copied {describe(src)} to {describe(dst)}: " + ", ".join(f"{n} {table}" for table, n
                                                                       in report.total.items() if n),
             f"checked: row counts, {report.streams} stream(s), the same top 10 for {report.queries} sample "
             "queries"]
    emit(args, {"source": describe(src), "dest": describe(dst), "copied_now": report.copied, "rows": report.total,
                "streams": report.streams, "queries_compared": report.queries}, lines)
    return 0


def add_parsers(sub: Subparsers, shared: Parents) -> None:
    """import, export, backup, salvage and copy."""
    common = shared.common
    p = sub.add_parser("import", parents=[common, shared.scoped, shared.timed],
                       help="import a JSONL file or a DiscordChatExporter JSON export",
                       description='Import lines of {"text", "at", optional "stream", "importance"}, or a '
                                   "DiscordChatExporter JSON export of a channel (authors, times and message ids "
                                   "kept). Everything is validated before anything is stored; messages already "
                                   "imported are skipped, so an interrupted import can be re-run.")
    p.add_argument("file")
    p.add_argument("--importance", type=importance, help="importance for messages that have none (skips the rater)")
    p.add_argument("--include-bots", action="store_true", help="also import bots' messages (exports)")
    p.add_argument("--reflect", action="store_true", help="reflect whenever a stream crosses the threshold")
    p.set_defaults(handler=OnMemory(cmd_import, models=True))
    _add_export(sub, shared)
    p = sub.add_parser("backup", parents=[common], help="a consistent copy of the database (safe while running)",
                       description="Copy the persona's database to DEST with SQLite's online backup: consistent "
                                   "even while the bot writes. Forgotten text is not in the copy, but a backup made "
                                   "before a deletion request still holds it (see the README's Privacy section).")
    p.add_argument("dest", type=Path)
    p.add_argument("--force", action="store_true", help="replace DEST if it exists")
    p.set_defaults(handler=OnPersona(cmd_backup))
    p = sub.add_parser("salvage", parents=[common], help="copy what can be read from a damaged database",
                       description="Copy every memory, evidence pointer and reply trace that can still be read "
                                   "from the damaged database SRC into a new database DEST (same ids), and report "
                                   "what could not be read.")
    p.add_argument("src", type=Path)
    p.add_argument("dest", type=Path)
    p.set_defaults(handler=Plain(cmd_salvage, refuses_local=True))
    _add_copy(sub, shared)


def _add_export(sub: Subparsers, shared: Parents) -> None:
    p = sub.add_parser("export", parents=[shared.common],
                       help="export a user's memories (access requests) or a stream",
                       description="--author USER_ID: everything the persona remembers from that Discord user's "
                                   "messages, in every stream, as one JSON document (for a data-access request). "
                                   "--stream KEY: a whole stream's observations as the JSONL lines `memstream "
                                   "import` reads (texts, times, authors, message ids, importance), oldest first; "
                                   "insights are left out. Written to standard output, or to a new file with -o.")
    chosen = p.add_mutually_exclusive_group(required=True)
    chosen.add_argument("--author", type=user_id, metavar="USER_ID", help="a Discord user id")
    chosen.add_argument("--stream", type=stream_key, metavar="KEY", help="a stream key, e.g. guild:123 or dm:456")
    p.add_argument("-o", "--output", type=Path, metavar="FILE", help="write to this new file (readable by you only)")
    p.add_argument("--force", action="store_true", help="replace FILE if it exists")
    p.set_defaults(handler=OnMemory(cmd_export, models=False))


def _add_copy(sub: Subparsers, shared: Parents) -> None:
    p = sub.add_parser("copy", parents=[shared.common],
                       help="copy a persona's memory to another database (SQLite <-> PostgreSQL)",
                       description="Copy every memory, evidence pointer, reply trace, counter and meta value from SRC "
                                   "to DST, same ids, a batch at a time (each batch one transaction): run it again "
                                   "to resume a copy that stopped. SRC and DST are each a persona file (its "
                                   "database), a SQLite file or a postgresql:// URL; DST must be new or empty. Stop "
                                   "the bot first. The copy is checked at the end: row counts, per-stream counts, "
                                   "and the same top k for sample queries.")
    p.add_argument("src", metavar="SRC")
    p.add_argument("dest", metavar="DST")
    p.add_argument("--batch", type=positive, default=2000, help="rows per transaction (default: %(default)s)")
    p.set_defaults(handler=Plain(cmd_copy))
