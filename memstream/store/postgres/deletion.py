"""Deletion cascades (a memory takes with it every reflection citing it and every reply built on it), and the
scrub after them: VACUUM of the tables the deletion touched, so that the deleted rows are no longer in the
table files either (PostgreSQL keeps a deleted row, a dead tuple, until VACUUM removes it)."""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from typing import Any

import psycopg

from memstream.store.events import MemoriesRemoved, StreamDropped
from memstream.store.postgres.connection import connect, mapped_errors
from memstream.store.postgres.traces import Traces
from memstream.store.walks import CascadeWalk

__all__ = ["Deletion"]

log = logging.getLogger(__name__)
_CUTOFF = re.compile(r"removable cutoff: (\d+)")
# In the meta table while a scrub could not remove the deleted rows (an older snapshot still saw them).
_SCRUB_MARK = "scrub_pending_since"
_TRACE_TABLES = ("reply_traces", "trace_items", "trace_messages")
_STREAM_TABLES = ("stream_state", "model_usage", "model_usage_daily", "faults", "stream_numbers")


def _removed(cutoff: int, xid: int) -> bool:
    """Whether rows deleted by transaction `xid` (64-bit) are older than VACUUM's removable cutoff (32-bit)."""
    return 0 < (cutoff - xid) % 2**32 < 2**31


class Deletion(CascadeWalk, Traces):
    """Deleting memories, what depends on them, and whole streams; scrubbing the tables after."""

    async def delete(self, ids: Iterable[int], *, messages: Sequence[str] = (),
                     author: tuple[str, str] | None = None, keep: Iterable[int] = ()) -> list[int]:
        """Delete memories and, transitively, every reflection that cites one of them and every reply built
        to answer one (with its trace, whose query is the message's text). Traces answering the Discord
        `messages`, or anything the (stream, author id) `author` said, go too, stored as memories or not.
        Memories in `keep` stay (an edited message: only what was drawn from its old text goes)."""
        async with self.transaction():
            ordered = await self._doomed(ids, messages, author, keep)
            await self._lock(await self._streams_of(ordered))
            rows = await self._rows("DELETE FROM memories WHERE id = ANY(%s) RETURNING stream", (ordered,))
            await self._bump(row[0] for row in rows)
            if rows:
                self._to_vacuum.update(("memories", "evidence", *_TRACE_TABLES))
                self._announce(MemoriesRemoved(tuple(ordered)))
            await self._note_deletion()
        return ordered

    async def _note_deletion(self) -> None:
        row = await self._row("SELECT pg_current_xact_id()::text::bigint")
        assert row is not None
        self._deleted_by = max(self._deleted_by, int(row[0]))

    async def _citing(self, ids: set[int]) -> set[int]:
        rows = await self._rows("SELECT DISTINCT reflection_id FROM evidence WHERE memory_id = ANY(%s)", (sorted(ids),))
        return {int(row[0]) for row in rows}

    async def _drop(self, where: str, args: Sequence[Any]) -> set[int]:
        """Delete the traces matching `where`; the ids of their replies."""
        rows = await self._rows(f"DELETE FROM reply_traces WHERE {where} RETURNING reply_memory_id", args)
        if rows:
            self._to_vacuum.update(_TRACE_TABLES)
        return {int(row[0]) for row in rows if row[0] is not None}

    async def _replies_to(self, ids: set[int]) -> set[int]:
        """The replies (memories) built to answer these memories' messages; their traces are deleted."""
        chunk = sorted(ids)
        return await self._drop("query_memory_id = ANY(%s) OR query_message_id IN (SELECT message_id FROM memories "
                                "WHERE id = ANY(%s) AND message_id IS NOT NULL AND stream = reply_traces.stream)",
                                (chunk, chunk))

    async def _replies_using(self, ids: set[int]) -> set[int]:
        """The replies (memories) whose prompts held one of these memories; their traces are deleted."""
        return await self._drop("id IN (SELECT trace_id FROM trace_items WHERE memory_id = ANY(%s))", (sorted(ids),))

    async def _drop_traces(self, messages: Sequence[str], author: tuple[str, str] | None) -> set[int]:
        """Delete the traces answering these messages or this (stream, author); their replies' ids."""
        replies: set[int] = set()
        if messages:
            replies |= await self._drop("query_message_id = ANY(%s)", (list(messages),))
        if author is not None:
            replies |= await self._drop("stream = %s AND query_author_id = %s", author)
        return replies

    async def purge_stream(self, stream: str) -> int:
        """Delete a whole stream: memories, traces, state, usage and fault counts."""
        async with self.transaction():
            await self._lock([stream])
            removed = await self._execute("DELETE FROM memories WHERE stream = %s", (stream,))
            for table in ("reply_traces", *_STREAM_TABLES):
                await self._execute(f"DELETE FROM {table} WHERE stream = %s", (stream,))
            await self._bump([stream])
            self._to_vacuum.update(("memories", "evidence", *_TRACE_TABLES, *_STREAM_TABLES))
            self._announce(StreamDropped(stream))
            await self._note_deletion()
        return removed

    async def scrub(self, *, wait: float = 2.0) -> bool:
        """After a deletion: VACUUM the tables it touched (outside any transaction), which removes the deleted
        rows from the table files. True when done; False when a transaction older than the deletion still
        saw them (VACUUM must leave them): a mark stays, and the scrub is finished the next time this
        database is opened or closed by memstream (finish_scrub). What VACUUM cannot reach: README,
        Privacy (write-ahead log, backups, free space of a page)."""
        tables, deleted_by = sorted(self._to_vacuum), self._deleted_by
        if not tables:
            return True
        cutoffs = await self._vacuum(tables, wait)
        done = bool(cutoffs) and all(_removed(cutoff, deleted_by) for cutoff in cutoffs)
        if done:
            self._to_vacuum -= set(tables)
            if await self.get_meta(_SCRUB_MARK) is not None:
                await self._execute("DELETE FROM meta WHERE key = %s", (_SCRUB_MARK,))
            return True
        await self.set_meta(_SCRUB_MARK, datetime.now(UTC).isoformat())
        log.warning("%s: an older transaction still sees the deleted rows; they stay in the table files until it "
                    "ends (memstream vacuums again the next time it opens or closes this database)", self.path)
        return False

    async def _vacuum(self, tables: Sequence[str], wait: float) -> list[int]:
        """VACUUM (VERBOSE) these tables; the removable cutoff it reported for each (and its TOAST table)."""
        notices: list[str] = []
        async with connect(self.url) as conn:
            conn.add_notice_handler(lambda diag: notices.append(diag.message_primary or ""))
            with mapped_errors(self.path):
                await conn.execute(f"SET lock_timeout = {max(int(wait * 1000), 1)}")
                try:
                    await conn.execute(f"VACUUM (VERBOSE) {', '.join(tables)}")
                except psycopg.errors.LockNotAvailable:  # another VACUUM (or a schema change) holds a table
                    return []
        return [int(m.group(1)) for note in notices for m in [_CUTOFF.search(note)] if m]

    async def finish_scrub(self) -> bool:
        """Finish a scrub that an older transaction held up (see scrub); True if none is left to do."""
        if await self.get_meta(_SCRUB_MARK) is None:
            return True
        self._to_vacuum.update(("memories", "evidence", *_TRACE_TABLES, *_STREAM_TABLES))
        self._deleted_by = max(self._deleted_by, await self._current_xid())
        return await self.scrub(wait=0.0)

    async def _current_xid(self) -> int:
        row = await self._row("SELECT pg_current_xact_id()::text::bigint")
        assert row is not None
        return int(row[0])
