"""Memory rows: inserting (pending or ready), completing a pending one, updating, and reading them back."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from memstream.errors import MemoryNotFound
from memstream.records import Memory, Source
from memstream.store.chunks import CHUNK, chunks
from memstream.store.events import (
    MemoriesRemoved,
    MemoryUpdated,
    StreamDropped,
    ready_event,
    ready_inserted,
    touched_rows,
)
from memstream.store.policy import (
    REEMBED_PREFIX,
    REEMBED_TARGET,
    bounded_usage,
    collected_touches,
    oldest,
    reembed_progress,
    retry_delay_sql,
)
from memstream.store.records import NewMemory, UsageRow
from memstream.store.rowmap import MEMORY_COLUMNS, memory_from_row
from memstream.store.sqlite.binding import sqlite_module
from memstream.store.sqlite.counters import DAILY_USAGE, USAGE
from memstream.store.sqlite.ids import Ids

__all__ = ["Rows", "to_blob"]

_INSERT = ("INSERT INTO memories (stream, kind, text, created_at, last_accessed_at, importance, importance_source, "
           "depth, author, author_id, channel, channel_id, message_id, status, embedding, reply_to) "
           "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)")
_INSERT_ID = _INSERT.replace("(stream, ", "(id, stream, ", 1).replace("VALUES (", "VALUES (?, ", 1)

_SOURCES = "SELECT id, author, author_id, channel, channel_id, message_id, reply_to FROM memories WHERE stream = "

# A touch: last access becomes the retrieval's time, never before the memory was made (a clock set back, as by
# `--at` under the spec profile, must not put it there); what was written is announced, as written.
_TOUCH = "UPDATE memories SET last_accessed_at = max(?, created_at) WHERE id IN"
_TOUCHED = "RETURNING stream, id, last_accessed_at"


def _insert_row(m: NewMemory) -> tuple[Any, ...]:
    ready = m.importance is not None and m.embedding is not None
    return (m.stream, m.kind, m.text, m.created_at, m.created_at, m.importance, m.importance_source, m.depth,
            m.source.author, m.source.author_id, m.source.channel, m.source.channel_id, m.source.message_id,
            "ready" if ready else "pending", None if m.embedding is None else to_blob(m.embedding), m.source.reply_to)


def to_blob(vector: npt.NDArray[np.float32]) -> bytes:
    """A vector in sqlite-vec's float32 format."""
    return np.ascontiguousarray(vector, dtype="<f4").tobytes()


class Rows(Ids):
    """Writing and reading memory rows."""

    async def insert(self, memories: Sequence[NewMemory]) -> list[int]:
        """Append memories (pending ones have no importance or embedding yet); one transaction.

        One executemany for the lot, each row with its id: the next of its stream's block (sqlite/ids.py), so
        that a stream's rows sit together in the file.
        """
        if not memories:
            return []
        rows = [_insert_row(m) for m in memories]
        async with self.transaction():
            await self._check_dimensions(m.embedding for m in memories)
            ids = await self._new_ids([m.stream for m in memories])
            if ids is not None:
                await self.conn.executemany(_INSERT_ID, [(i, *row) for i, row in zip(ids, rows, strict=True)])
            else:
                ids = []
                for values in rows:
                    cursor = await self.conn.execute(_INSERT, values)
                    assert cursor.lastrowid is not None
                    ids.append(cursor.lastrowid)
            self._announce(*ready_inserted(ids, memories))
            return ids

    async def insert_unique(self, memories: Sequence[NewMemory]) -> list[tuple[int, bool]]:
        """Append memories whose (stream, message id) is not stored yet; for each, its id and whether it is
        new. The lookup and the insert are one write transaction, so processes importing the same messages
        at once each finish cleanly, every message stored once."""
        if not memories:
            return []
        async with self.transaction():
            known = await self.find_messages([(m.stream, m.source.message_id) for m in memories
                                              if m.source.message_id])
            fresh = [m for m in memories if not m.source.message_id or (m.stream, m.source.message_id) not in known]
            ids = iter(await self.insert(fresh))
            return [(known[(m.stream, m.source.message_id)], False)
                    if m.source.message_id and (m.stream, m.source.message_id) in known else (next(ids), True)
                    for m in memories]

    async def complete_many(self, stream: str, items: Sequence[tuple[int, int, str, npt.NDArray[np.float32]]],
                            usage: Sequence[UsageRow] = (), *, texts: Sequence[str] | None = None) -> list[int]:
        """Make pending memories of one stream ready, add their importance to the stream's total and record
        model usage, in one transaction; returns the ids completed (not those deleted meanwhile).

        `items` are (id, importance, importance source, embedding); `usage` rows as in record_usage_many.
        """
        ids = [item[0] for item in items]
        if not ids:
            await self.record_usage_many(usage)
            return []
        async with self.transaction():
            await self._check_dimensions(vector for *_, vector in items)
            async with self.conn.execute(
                f"SELECT id, text, last_accessed_at, created_at FROM memories WHERE status = 'pending' AND stream = ? "
                f"AND id IN ({','.join('?' * len(ids))})", (stream, *ids)
            ) as cur:
                rows = {int(row[0]): (row[1], (row[2], row[3])) for row in await cur.fetchall()}
            completed = set(rows)  # not deleted meanwhile
            if texts is not None:  # nor edited meanwhile: its embedding is of the text before the edit
                completed &= {item[0] for item, text in zip(items, texts, strict=True)
                              if item[0] in rows and rows[item[0]][0] == text}
            await self.conn.executemany(
                "UPDATE memories SET importance = ?, importance_source = ?, embedding = ?, status = 'ready' "
                "WHERE id = ? AND status = 'pending'",
                [(importance, source, to_blob(vector), memory_id) for memory_id, importance, source, vector in items
                 if memory_id in completed],
            )
            done = [memory_id for memory_id in ids if memory_id in completed]
            total = sum(importance for memory_id, importance, *_ in items if memory_id in completed)
            if done:
                await self.add_importance(stream, total)
            await self.record_usage_many(usage)
            kept = [item for item in items if item[0] in completed]
            self._announce(ready_event(stream, done, [vector for *_, vector in kept], [item[1] for item in kept],
                                       [rows[i][1] for i in done], [rows[i][0] for i in done]))
        return done

    async def find_messages(self, keys: Sequence[tuple[str, str]]) -> dict[tuple[str, str], int]:
        """The memories made from these (stream, Discord message id) pairs, where stored: one query per
        stream and 500 ids, not one per message."""
        by_stream: dict[str, list[str]] = {}
        for stream, message_id in keys:
            by_stream.setdefault(stream, []).append(message_id)
        found: dict[tuple[str, str], int] = {}
        for stream, message_ids in by_stream.items():
            for chunk in chunks(sorted(set(message_ids))):
                async with self.conn.execute(
                    f"SELECT message_id, id FROM memories WHERE stream = ? AND message_id IN "
                    f"({','.join('?' * len(chunk))})", (stream, *chunk)
                ) as cur:
                    found.update(((stream, row[0]), int(row[1])) for row in await cur.fetchall())
        return found

    async def find_pending(self, keys: Sequence[tuple[str, str]]) -> dict[tuple[str, str], int]:
        """The oldest pending observation of no Discord message for each (stream, text) pair, where stored."""
        found: dict[tuple[str, str], int] = {}
        for stream, text in sorted(set(keys)):
            async with self.conn.execute(
                "SELECT MIN(id) FROM memories WHERE stream = ? AND status = 'pending' AND kind = 'observation' "
                "AND (message_id IS NULL OR message_id = '') AND text = ?", (stream, text)
            ) as cur:
                row = await cur.fetchone()
            if row is not None and row[0] is not None:
                found[(stream, text)] = int(row[0])
        return found

    async def find_message(self, stream: str, message_id: str) -> int | None:
        """The memory made from a Discord message, if any."""
        async with self.conn.execute(
            "SELECT id FROM memories WHERE stream = ? AND message_id = ?", (stream, message_id)
        ) as cur:
            row = await cur.fetchone()
        return None if row is None else int(row[0])

    async def complete(self, memory_id: int, importance: int, source: str,
                       embedding: npt.NDArray[np.float32]) -> bool:
        """Make a pending memory ready; False if it was deleted meanwhile."""
        async with self.transaction():
            await self._check_dimensions([embedding])
            rows = list(await self.conn.execute_fetchall(
                "UPDATE memories SET importance = ?, importance_source = ?, embedding = ?, status = 'ready' "
                "WHERE id = ? AND status = 'pending' RETURNING stream, text, last_accessed_at, created_at",
                (importance, source, to_blob(embedding), memory_id),
            ))
            for stream, text, last, created in rows:
                self._announce(ready_event(stream, [memory_id], [embedding], [importance], [(last, created)], [text]))
        return len(rows) == 1

    async def count_attempt(self, memory_id: int, *, at: float | None = None) -> None:
        """Record one more failed attempt to complete a pending memory; given the time of the failure, its
        next attempt waits retry_delay(failures) seconds."""
        if at is None:
            await self.conn.execute("UPDATE memories SET attempts = attempts + 1 WHERE id = ?", (memory_id,))
            return
        await self.conn.execute(
            f"UPDATE memories SET attempts = attempts + 1, next_attempt_at = ? + {retry_delay_sql('sqlite')} "
            "WHERE id = ?", (at, memory_id),
        )

    async def postpone(self, ids: Sequence[int], until: float) -> None:
        """Pending memories wait until `until` (a spent budget's renewal); no attempt counted."""
        async with self.transaction():
            for chunk in chunks(sorted({int(i) for i in ids}), CHUNK):
                await self.conn.execute(f"UPDATE memories SET next_attempt_at = ? WHERE status = 'pending' AND id IN "
                                        f"({','.join('?' * len(chunk))})", [until, *chunk])

    async def update_text(self, memory_id: int, text: str, embedding: npt.NDArray[np.float32] | None = None) -> None:
        """Replace an observation's text (an edited message): with `embedding`, its embedding too; without,
        the memory goes back to pending, to be embedded again by the write path."""
        async with self.transaction():
            if embedding is not None:
                await self._check_dimensions([embedding])
            async with self.conn.execute("SELECT text, stream, status, importance FROM memories WHERE id = ?",
                                         (memory_id,)) as cur:
                found = list(await cur.fetchall())
            self._residue += [row[0] for row in found]
            if embedding is None:
                await self.conn.execute("UPDATE memories SET text = ?, embedding = NULL, status = 'pending', "
                                        "attempts = 0, next_attempt_at = NULL WHERE id = ?", (text, memory_id))
                for _, stream, status, importance in found:
                    if status == "ready":
                        await self.conn.execute(
                            "UPDATE stream_state SET importance_since_reflection = "
                            "MAX(0, importance_since_reflection - ?) WHERE stream = ?", (importance or 0, stream))
                        self._announce(MemoriesRemoved((memory_id,)))
                return
            await self.conn.execute("UPDATE memories SET text = ?, embedding = ? WHERE id = ?",
                                    (text, to_blob(embedding), memory_id))
            for _, stream, status, _ in found:
                if status == "ready":
                    vector = np.asarray(embedding, dtype=np.float32).reshape(-1)
                    self._announce(MemoryUpdated(stream, memory_id, vector, text))

    # -- re-embedding a stream with another model (memstream reembed)

    async def reembed_todo(self, stream: str, model: str, limit: int) -> list[tuple[int, str]]:
        """(id, text) of the next `limit` embedded memories of `stream` not yet re-embedded with `model`."""
        if await self.get_meta("embedding_model") == model and await self.get_meta(REEMBED_TARGET) is None:
            return []
        after = reembed_progress(await self.get_meta(REEMBED_PREFIX + stream), model)
        async with self.conn.execute(
            "SELECT id, text FROM memories WHERE stream = ? AND embedding IS NOT NULL AND id > ? ORDER BY id LIMIT ?",
            (stream, after, limit)) as cur:
            return [(int(row[0]), str(row[1])) for row in await cur.fetchall()]

    async def _embedded_after(self, stream: str, after: int) -> int:
        async with self.conn.execute("SELECT COUNT(*) FROM memories WHERE stream = ? AND embedding IS NOT NULL "
                                     "AND id > ?", (stream, after)) as cur:
            row = await cur.fetchone()
        return int(row[0]) if row else 0

    async def reembed(self, stream: str, model: str, items: Sequence[tuple[int, npt.NDArray[np.float32]]]) -> None:
        """Replace these memories' embeddings by `model`'s and record how far the stream is, in one transaction;
        the stream's in-memory copy is dropped (StreamDropped)."""
        if not items:
            return
        async with self.transaction():
            await self.conn.executemany("UPDATE memories SET embedding = ? WHERE id = ? AND stream = ? "
                                        "AND embedding IS NOT NULL",
                                        [(to_blob(vector), memory_id, stream) for memory_id, vector in items])
            await self.set_meta(REEMBED_TARGET, model)  # no other write, no query until it is finished
            await self.set_meta(REEMBED_PREFIX + stream, f"{model}\t{max(i for i, _ in items)}")
            self._announce(StreamDropped(stream))

    async def finish_reembed(self, model: str, dimensions: int | None) -> None:
        """Every stream re-embedded: `model` (and its dimension) becomes the store's, the progress is cleared."""
        async with self.transaction():
            await self.set_meta("embedding_model", model)
            await self.conn.execute("DELETE FROM meta WHERE key = ?", (REEMBED_TARGET,))
            if dimensions is not None:
                await self.set_meta("embedding_dimensions", str(dimensions))
            await self.conn.execute("DELETE FROM meta WHERE substr(key, 1, ?) = ?",
                                    (len(REEMBED_PREFIX), REEMBED_PREFIX))

    async def touch(self, ids: Sequence[int], at: float) -> None:
        """Set last access of these memories to `at` (collected instead inside `deferred_touches()`)."""
        collected = collected_touches()
        if collected is not None:
            for memory_id in ids:
                collected[memory_id] = max(at, collected.get(memory_id, at))
        elif ids:
            written: list[Any] = []
            for chunk in chunks(sorted({int(i) for i in ids}), CHUNK):
                written += await self.conn.execute_fetchall(f"{_TOUCH} ({','.join('?' * len(chunk))}) {_TOUCHED}",
                                                            [at, *chunk])
            self._announce(*touched_rows(written))

    async def retrieved(self, ids: Sequence[int], at: float, *, usage: Sequence[UsageRow] = ()) -> dict[int, Memory]:
        """The memories a retrieval returns, by id (missing ones left out, the rest as they were read, before
        the touch); their last access becomes `at` (collected inside `deferred_touches()`, as `touch`) and
        `usage` is added, in one write: all of it one hop to SQLite's thread."""
        ids = [int(i) for i in ids]
        if len(ids) > CHUNK:  # more than one statement's worth of ids: the plain calls, one write
            async with self.transaction():
                found = await self.get_many(ids)
                await self.touch(ids, at)
                await self.record_usage_many(usage)
            return found
        collected = collected_touches()
        if collected is not None:
            for memory_id in ids:
                collected[memory_id] = max(at, collected.get(memory_id, at))
        touching = ids if collected is None else []
        marks = ",".join("?" * len(ids))
        usage = bounded_usage(usage)
        day = self.usage_day()

        def read_and_write(conn: Any) -> tuple[list[Any], list[Any], bool]:
            """The rows, the touches written, and whether the write joined a transaction another task holds."""
            rows = conn.execute(f"SELECT {MEMORY_COLUMNS} FROM memories WHERE id IN ({marks})", ids).fetchall()
            written: list[Any] = []
            if not (touching and rows) and not usage:
                return list(rows), written, False
            began = not conn.in_transaction  # else another task's open transaction: joined, as by `touch`
            if began:
                conn.execute("BEGIN IMMEDIATE")
            try:
                if touching and rows:
                    written = conn.execute(f"{_TOUCH} ({marks}) {_TOUCHED}", [at, *touching]).fetchall()
                if usage:
                    conn.executemany(USAGE, usage)
                    conn.executemany(DAILY_USAGE, [(*row, day) for row in usage])
                if began:
                    conn.execute("COMMIT")
            except sqlite_module().Error:
                if began:
                    if conn.in_transaction:
                        conn.execute("ROLLBACK")
                    raise
                # Joined another task's transaction, which failed before us (SQLite keeps failing every statement
                # of a transaction that met a damaged page until it is rolled back): the touch and the usage go
                # with that transaction, as they would at its rollback; the rows were read, and are answered.
                return list(rows), [], True
            except BaseException:
                if began and conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise
            return list(rows), written, not began

        if not ids and not usage:
            return {}
        rows, written, joined = await self.conn.run(read_and_write)
        found = {int(row[0]): memory_from_row(row) for row in rows}
        if written:
            touched = touched_rows(written)
            held = self._open_events() if joined else None
            if held is not None:
                held.extend(touched)
            else:
                self._deliver(touched)
        return found

    async def get(self, memory_id: int, *, stream: str | None = None) -> Memory:
        """One memory by id (restricted to `stream` when given)."""
        async with self.conn.execute(f"SELECT {MEMORY_COLUMNS} FROM memories WHERE id = ?", (memory_id,)) as cur:
            row = await cur.fetchone()
        if row is None or (stream is not None and row[1] != stream):
            where = f" in stream {stream!r}" if stream is not None else ""
            raise MemoryNotFound(f"no memory #{memory_id}{where}", memory_id=memory_id)
        return memory_from_row(row)

    async def by_number(self, stream: str, number: int) -> int:
        """The id of the memory a stream shows as #number (MemoryNotFound if there is none)."""
        async with self.conn.execute("SELECT id FROM memories WHERE stream = ? AND number = ?",
                                     (stream, number)) as cur:
            row = await cur.fetchone()
        if row is None:
            raise MemoryNotFound(f"no memory #{number} in stream {stream!r}", memory_id=number)
        return int(row[0])

    async def get_many(self, ids: Sequence[int]) -> dict[int, Memory]:
        """Memories by id (missing ones are left out)."""
        found: dict[int, Memory] = {}
        for chunk in chunks(ids):
            marks = ",".join("?" * len(chunk))
            for row in await self.conn.execute_fetchall(f"SELECT {MEMORY_COLUMNS} FROM memories WHERE id IN ({marks})",
                                                        chunk):  # one round trip to SQLite's thread
                found[row[0]] = memory_from_row(row)
        return found

    async def recent(self, stream: str, limit: int, *, offset: int = 0, include_pending: bool = False,
                     kind: str | None = None) -> list[Memory]:
        """The most recent memories of a stream (of one kind, if given), newest first."""
        status = "" if include_pending else "AND status = 'ready'"
        async with self.conn.execute(
            f"SELECT {MEMORY_COLUMNS} FROM memories WHERE stream = ?1 {status} AND (?2 IS NULL OR kind = ?2) "
            "ORDER BY created_at DESC, id DESC LIMIT ?3 OFFSET ?4", (stream, kind, limit, offset)
        ) as cur:
            return [memory_from_row(row) for row in await cur.fetchall()]

    async def pending_memories(self, limit: int = 1000, *, due_at: float | None = None,
                               streams: Sequence[str] | None = None, claim: bool = False) -> list[Memory]:
        """Memories waiting for a rating or an embedding, oldest first (by creation time, then id: ids follow
        time within a stream only); with `due_at`, only those whose next attempt is due by then; with
        `streams`, only those of these streams (500 keys a query). `claim` changes nothing here (see
        Store.pending_memories)."""
        sql = (f"SELECT {MEMORY_COLUMNS} FROM memories WHERE status = 'pending' AND (? IS NULL OR "
               "next_attempt_at IS NULL OR next_attempt_at <= ?)")
        found: list[Memory] = []
        groups: list[list[str] | None] = [None] if streams is None else list(chunks(streams))
        for chunk in groups:
            where = "" if chunk is None else f" AND stream IN ({','.join('?' * len(chunk))})"
            async with self.conn.execute(f"{sql}{where} ORDER BY created_at, id LIMIT ?",
                                         (due_at, due_at, *(chunk or ()), limit)) as cur:
                found += [memory_from_row(row) for row in await cur.fetchall()]
        return sorted(found, key=oldest)[:limit]

    async def by_author(self, stream: str, author_id: str) -> list[int]:
        """Ids of the observations made from one author's messages in a stream."""
        async with self.conn.execute(
            "SELECT id FROM memories WHERE stream = ? AND author_id = ? AND kind = 'observation'",
            (stream, author_id),
        ) as cur:
            return [row[0] for row in await cur.fetchall()]

    async def sources(self, stream: str, ids: Sequence[int] | None = None) -> dict[int, Source]:
        """Where these memories of `stream` came from, by id; without `ids`, every ready memory's."""
        if ids is None:
            rows = await self.conn.execute_fetchall(f"{_SOURCES}? AND status = 'ready'", (stream,))
            return {int(row[0]): Source(*row[1:]) for row in rows}
        found: dict[int, Source] = {}
        for chunk in chunks(ids):
            rows = await self.conn.execute_fetchall(f"{_SOURCES}? AND id IN ({','.join('?' * len(chunk))})",
                                                    (stream, *chunk))
            found.update((int(row[0]), Source(*row[1:])) for row in rows)
        return found

    async def author_memories(self, author_id: str, *, stream: str | None = None) -> list[Memory]:
        """The observations made from one author's messages, oldest first: in one stream, or in every one."""
        where, args = ("stream = ? AND ", [stream]) if stream is not None else ("", [])
        async with self.conn.execute(
            f"SELECT {MEMORY_COLUMNS} FROM memories WHERE {where}author_id = ? AND kind = 'observation' "
            "ORDER BY created_at, id", [*args, author_id],
        ) as cur:
            return [memory_from_row(row) for row in await cur.fetchall()]

    async def stream_pages(self, stream: str, *, page: int = 1000) -> AsyncIterator[list[Memory]]:
        """Every memory of a stream, pending ones too, oldest first, a page at a time (a long stream is never
        held whole)."""
        after: tuple[float, int] | None = None
        while True:
            where, args = ("", []) if after is None else (
                "AND (created_at > ? OR (created_at = ? AND id > ?))", [after[0], after[0], after[1]])
            async with self.conn.execute(
                f"SELECT {MEMORY_COLUMNS} FROM memories WHERE stream = ? {where} ORDER BY created_at, id LIMIT ?",
                [stream, *args, page],
            ) as cur:
                rows = list(await cur.fetchall())
            if not rows:
                return
            yield [memory_from_row(row) for row in rows]
            after = (rows[-1][4], rows[-1][0])

    async def by_message(self, message_ids: Sequence[str]) -> list[int]:
        """Ids of the memories made from these Discord messages, in any stream."""
        found: list[int] = []
        for chunk in chunks(message_ids):
            marks = ",".join("?" * len(chunk))
            async with self.conn.execute(f"SELECT id FROM memories WHERE message_id IN ({marks})", chunk) as cur:
                found.extend(row[0] for row in await cur.fetchall())
        return found

    async def streams(self) -> list[str]:
        """Every stream key in this file."""
        async with self.conn.execute("SELECT DISTINCT stream FROM memories ORDER BY stream") as cur:
            keys = {row[0] for row in await cur.fetchall()}
        async with self.conn.execute("SELECT stream FROM stream_state") as cur:
            keys |= {row[0] for row in await cur.fetchall()}
        return sorted(keys)

    async def load_vector(self, memory_id: int) -> npt.NDArray[np.float32]:
        """One memory's embedding."""
        async with self.conn.execute("SELECT embedding FROM memories WHERE id = ?", (memory_id,)) as cur:
            row = await cur.fetchone()
        if row is None or row[0] is None:
            raise MemoryNotFound(f"no embedding for memory #{memory_id}")
        return np.frombuffer(row[0], dtype="<f4").astype(np.float32)

