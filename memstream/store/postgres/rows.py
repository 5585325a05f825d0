"""Memory rows: inserting (pending or ready), completing a pending one, updating, and reading them back."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
from psycopg.errors import DeadlockDetected

from memstream.errors import MemoryNotFound, StoreError
from memstream.records import Memory, Source
from memstream.store.chunks import chunks
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
    collected_touches,
    oldest,
    reembed_progress,
    retry_delay_sql,
)
from memstream.store.postgres.counters import Counters
from memstream.store.postgres.presence import LIVE_OWNERS
from memstream.store.records import NewMemory, UsageRow
from memstream.store.rowmap import MEMORY_COLUMNS, memory_from_row

__all__ = ["CLAIM_SECONDS", "Rows"]

# A pending memory is the inserting (or claiming) process's while that process is there (presence.py), for this
# long at most (server clock): another process's retries leave it alone while the first completes it (or fails
# and lets it go: count_attempt).
CLAIM_SECONDS = 300.0
_DEADLOCK_TRIES = 5
_SOURCES = "SELECT id, author, author_id, channel, channel_id, message_id, reply_to FROM memories WHERE stream = "
_ARRAY = 5000  # ids a query passes as one array parameter (no limit of bound parameters to keep under)
_NOW = "extract(epoch FROM clock_timestamp())"
_INSERT = ("INSERT INTO memories (stream, kind, text, created_at, last_accessed_at, importance, importance_source, "
           "depth, author, author_id, channel, channel_id, message_id, status, embedding, claimed_until, claimed_by, "
           f"reply_to) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, "
           f"CASE WHEN %s THEN {_NOW} + {CLAIM_SECONDS} END, %s, %s) RETURNING id")
# Claimable: not claimed, its claim ran out, or its owner is gone.
_FREE = (f"(claimed_until IS NULL OR claimed_until <= {_NOW} OR (claimed_by IS NOT NULL AND claimed_by NOT IN "
         f"(SELECT owner FROM live)))")
_COMPLETE = ("UPDATE memories SET importance = %s, importance_source = %s, embedding = %s, status = 'ready', "
             "claimed_until = NULL WHERE id = %s AND status = 'pending' AND stream = %s "
             "AND (%s::text IS NULL OR text = %s) RETURNING id, importance, text, last_accessed_at, created_at")


def _ready(m: NewMemory) -> bool:
    return m.importance is not None and m.embedding is not None


def _insert_row(m: NewMemory, owner: int | None) -> tuple[Any, ...]:
    ready = _ready(m)
    return (m.stream, m.kind, m.text, m.created_at, m.created_at, m.importance, m.importance_source, m.depth,
            m.source.author, m.source.author_id, m.source.channel, m.source.channel_id, m.source.message_id,
            "ready" if ready else "pending", _vector(m.embedding), not ready, None if ready else owner,
            m.source.reply_to)


def _vector(embedding: npt.NDArray[np.float32] | None) -> npt.NDArray[np.float32] | None:
    return None if embedding is None else np.ascontiguousarray(embedding, dtype=np.float32)


class Rows(Counters):
    """Writing and reading memory rows."""

    async def insert(self, memories: Sequence[NewMemory]) -> list[int]:
        """Append memories (pending ones have no importance or embedding yet); one transaction."""
        if not memories:
            return []
        owner = await self._claimant(memories)
        async with self.transaction():
            await self._lock(m.stream for m in memories)
            await self._check_dimensions(m.embedding for m in memories)
            results = await self._many_returning(_INSERT, [_insert_row(m, owner) for m in memories])
            ids = [int(rows[0][0]) for rows in results]
            await self._bump(m.stream for m in memories if m.importance is not None and m.embedding is not None)
            self._announce(*ready_inserted(ids, memories))
        return ids

    async def insert_unique(self, memories: Sequence[NewMemory]) -> list[tuple[int, bool]]:
        """Append memories whose (stream, message id) is not stored yet; for each, its id and whether it is
        new. The unique index decides: processes importing the same messages at once store each once."""
        for attempt in range(_DEADLOCK_TRIES):
            try:
                return await self._insert_unique(memories)
            except StoreError as exc:  # two processes importing overlapping messages in other orders
                if not isinstance(exc.__cause__, DeadlockDetected) or self._joined() or attempt + 1 == _DEADLOCK_TRIES:
                    raise
        raise AssertionError("unreachable")

    async def _insert_unique(self, memories: Sequence[NewMemory]) -> list[tuple[int, bool]]:
        if not memories:
            return []
        out: list[tuple[int, bool] | None] = [None] * len(memories)
        owner = await self._claimant(memories)
        async with self.transaction():
            await self._lock(m.stream for m in memories)
            await self._check_dimensions(m.embedding for m in memories)
            seen: dict[tuple[str, str], int] = {}
            fresh: list[tuple[int, NewMemory]] = []
            for slot, m in enumerate(memories):
                key = (m.stream, m.source.message_id) if m.source.message_id else None
                if key is not None and key in seen:
                    continue  # the same message twice in one batch: stored once (resolved below)
                if key is not None:
                    seen[key] = slot
                fresh.append((slot, m))
            sql = _INSERT.replace(" RETURNING id", " ON CONFLICT (stream, message_id) WHERE message_id IS NOT NULL "
                                                   "DO NOTHING RETURNING id")
            results = await self._many_returning(sql, [_insert_row(m, owner) for _, m in fresh])
            for (slot, _), rows in zip(fresh, results, strict=True):
                if rows:  # new; else stored before (by us or another process)
                    out[slot] = (int(rows[0][0]), True)
            added = [m.stream for slot, m in fresh if out[slot] is not None
                     and m.importance is not None and m.embedding is not None]
            new = [(item[0], m) for slot, m in fresh if (item := out[slot]) is not None]
            self._announce(*ready_inserted([i for i, _ in new], [m for _, m in new]))
            missing = [(m.stream, m.source.message_id) for slot, m in enumerate(memories)
                       if out[slot] is None and m.source.message_id]
            known = await self.find_messages(missing)
            for slot, m in enumerate(memories):
                if out[slot] is None:
                    out[slot] = (known[(m.stream, str(m.source.message_id))], False)
            await self._bump(added)
        return [item for item in out if item is not None]

    async def _claimant(self, memories: Sequence[NewMemory]) -> int | None:
        """The owner key the pending ones among `memories` are claimed with (none: no claim to make)."""
        return await self.presence.owner() if not all(_ready(m) for m in memories) else None

    async def complete_many(self, stream: str, items: Sequence[tuple[int, int, str, npt.NDArray[np.float32]]],
                            usage: Sequence[UsageRow] = (), *, texts: Sequence[str] | None = None) -> list[int]:
        """Make pending memories of one stream ready, add their importance to the stream's total and record
        model usage, in one transaction; returns the ids completed here (a memory deleted meanwhile, or
        completed by another process first, is left out: the update waits for the other's row lock, then
        finds it ready)."""
        if not items:
            await self.record_usage_many(usage)
            return []
        async with self.transaction():
            await self._lock([stream])
            await self._check_dimensions(vector for *_, vector in items)
            # With texts, a memory edited meanwhile is left pending: its embedding is of the text before the edit.
            wanted = [None] * len(items) if texts is None else list(texts)
            results = await self._many_returning(_COMPLETE, [(importance, source, _vector(vector), memory_id, stream,
                                                              text, text)
                                                             for (memory_id, importance, source, vector), text
                                                             in zip(items, wanted, strict=True)])
            completed = {int(row[0]): row for rows in results for row in rows}
            if completed:
                await self.add_importance(stream, sum(int(row[1]) for row in completed.values()))
                await self._bump([stream])
            await self.record_usage_many(usage)
            done = [item for item in items if item[0] in completed]
            rows = [completed[memory_id] for memory_id, *_ in done]
            self._announce(ready_event(stream, [item[0] for item in done], [item[3] for item in done],
                                       [int(row[1]) for row in rows], [(row[3], row[4]) for row in rows],
                                       [row[2] for row in rows]))
        return [memory_id for memory_id, *_ in done]

    async def complete(self, memory_id: int, importance: int, source: str,
                       embedding: npt.NDArray[np.float32]) -> bool:
        """Make a pending memory ready; False if it was deleted (or completed elsewhere) meanwhile."""
        async with self.transaction():
            await self._lock(await self._streams_of([memory_id]))
            await self._check_dimensions([embedding])
            row = await self._row("UPDATE memories SET importance = %s, importance_source = %s, embedding = %s, "
                                  "status = 'ready', claimed_until = NULL WHERE id = %s AND status = 'pending' "
                                  "RETURNING stream, text, last_accessed_at, created_at",
                                  (importance, source, _vector(embedding), memory_id))
            if row is not None:
                await self._bump([row[0]])
                self._announce(ready_event(row[0], [memory_id], [embedding], [importance], [(row[2], row[3])],
                                           [row[1]]))
        return row is not None

    async def count_attempt(self, memory_id: int, *, at: float | None = None) -> None:
        """Record one more failed attempt to complete a pending memory (and let go of its claim); given the
        time of the failure, its next attempt waits retry_delay(failures) seconds."""
        if at is None:
            await self._execute("UPDATE memories SET attempts = attempts + 1, claimed_until = NULL WHERE id = %s",
                                (memory_id,))
            return
        await self._execute(
            "UPDATE memories SET attempts = attempts + 1, claimed_until = NULL, "
            f"next_attempt_at = %s + {retry_delay_sql('postgres')} WHERE id = %s", (at, memory_id))

    async def postpone(self, ids: Sequence[int], until: float) -> None:
        """Pending memories wait until `until` (a spent budget's renewal); no attempt counted, the claim let go."""
        if ids:
            await self._execute("UPDATE memories SET next_attempt_at = %s, claimed_until = NULL WHERE status = "
                                "'pending' AND id = ANY(%s)", (until, sorted({int(i) for i in ids})))

    async def update_text(self, memory_id: int, text: str, embedding: npt.NDArray[np.float32] | None = None) -> None:
        """Replace an observation's text (an edited message): with `embedding`, its embedding too; without,
        the memory goes back to pending, to be embedded again by the write path."""
        async with self.transaction():
            await self._lock(await self._streams_of([memory_id]))
            if embedding is None:
                rows = await self._rows(
                    "UPDATE memories AS m SET text = %s, embedding = NULL, status = 'pending', attempts = 0, "
                    "next_attempt_at = NULL, claimed_until = NULL FROM (SELECT id, status, importance FROM memories "
                    "WHERE id = %s) AS old WHERE m.id = old.id RETURNING m.stream, old.status, old.importance",
                    (text, memory_id))
                await self._bump(row[0] for row in rows)
                for stream, status, importance in rows:
                    if status == "ready":
                        await self._execute(
                            "UPDATE stream_state SET importance_since_reflection = "
                            "GREATEST(0, importance_since_reflection - %s) WHERE stream = %s",
                            (importance or 0, stream))
                        self._announce(MemoriesRemoved((memory_id,)))
            else:
                await self._check_dimensions([embedding])
                rows = await self._rows("UPDATE memories SET text = %s, embedding = %s WHERE id = %s "
                                        "RETURNING stream, status", (text, _vector(embedding), memory_id))
                await self._bump(row[0] for row in rows)
                vector = np.asarray(embedding, dtype=np.float32).reshape(-1)
                self._announce(*(MemoryUpdated(row[0], memory_id, vector, text) for row in rows if row[1] == "ready"))
            if rows:
                self._to_vacuum.add("memories")  # the text before the edit is a dead row until VACUUM

    # -- re-embedding a stream with another model (memstream reembed)

    async def reembed_todo(self, stream: str, model: str, limit: int) -> list[tuple[int, str]]:
        """(id, text) of the next `limit` embedded memories of `stream` not yet re-embedded with `model`."""
        if await self.get_meta("embedding_model") == model and await self.get_meta(REEMBED_TARGET) is None:
            return []
        after = reembed_progress(await self.get_meta(REEMBED_PREFIX + stream), model)
        rows = await self._rows("SELECT id, text FROM memories WHERE stream = %s AND embedding IS NOT NULL "
                                "AND id > %s ORDER BY id LIMIT %s", (stream, after, limit))
        return [(int(row[0]), str(row[1])) for row in rows]

    async def _embedded_after(self, stream: str, after: int) -> int:
        row = await self._row("SELECT COUNT(*) FROM memories WHERE stream = %s AND embedding IS NOT NULL "
                              "AND id > %s", (stream, after))
        return int(row[0]) if row else 0

    async def reembed(self, stream: str, model: str, items: Sequence[tuple[int, npt.NDArray[np.float32]]]) -> None:
        """Replace these memories' embeddings by `model`'s and record how far the stream is, in one transaction;
        the stream's in-memory copy is dropped (StreamDropped)."""
        if not items:
            return
        async with self.transaction():
            await self._lock([stream])
            await self._many("UPDATE memories SET embedding = %s WHERE id = %s AND stream = %s "
                             "AND embedding IS NOT NULL",
                             [(_vector(vector), memory_id, stream) for memory_id, vector in items])
            await self.set_meta(REEMBED_TARGET, model)  # no other write, no query until it is finished
            await self.set_meta(REEMBED_PREFIX + stream, f"{model}\t{max(i for i, _ in items)}")
            await self._bump([stream])
            self._announce(StreamDropped(stream))

    async def finish_reembed(self, model: str, dimensions: int | None) -> None:
        """Every stream re-embedded: `model` (and its dimension) becomes the store's, the progress is cleared."""
        async with self.transaction():
            await self.set_meta("embedding_model", model)
            await self._execute("DELETE FROM meta WHERE key = %s", (REEMBED_TARGET,))
            if dimensions is not None:
                await self.set_meta("embedding_dimensions", str(dimensions))
            await self._execute("DELETE FROM meta WHERE left(key, %s) = %s", (len(REEMBED_PREFIX), REEMBED_PREFIX))

    async def touch(self, ids: Sequence[int], at: float) -> None:
        """Set last access of these memories to `at` (collected instead inside `deferred_touches()`)."""
        collected = collected_touches()
        if collected is not None:
            for memory_id in ids:
                collected[memory_id] = max(at, collected.get(memory_id, at))
            return
        if ids:
            async with self.transaction():
                await self._lock(await self._streams_of(ids))
                # Never before the memory was made (a clock set back); what was written is announced, as written.
                rows = await self._rows("UPDATE memories SET last_accessed_at = GREATEST(%s, created_at) "
                                        "WHERE id = ANY(%s) RETURNING stream, id, last_accessed_at",
                                        (at, sorted(set(ids))))
                await self._bump(row[0] for row in rows)
                self._announce(*touched_rows(rows))

    async def retrieved(self, ids: Sequence[int], at: float, *, usage: Sequence[UsageRow] = ()) -> dict[int, Memory]:
        """The memories a retrieval returns, by id (missing ones left out, as read before the touch); their last
        access becomes `at` (collected inside `deferred_touches()`) and `usage` is added, in one transaction."""
        async with self.transaction():
            found = await self.get_many(ids)
            await self.touch(list(found), at)
            await self.record_usage_many(usage)
        return found

    async def _streams_of(self, ids: Iterable[int]) -> list[str]:
        """The streams of these memories (to lock them before writing to the memories)."""
        rows = await self._rows("SELECT DISTINCT stream FROM memories WHERE id = ANY(%s)", (sorted(set(ids)),))
        return [row[0] for row in rows]

    async def find_messages(self, keys: Sequence[tuple[str, str]]) -> dict[tuple[str, str], int]:
        """The memories made from these (stream, Discord message id) pairs, where stored."""
        by_stream: dict[str, list[str]] = {}
        for stream, message_id in keys:
            by_stream.setdefault(stream, []).append(message_id)
        found: dict[tuple[str, str], int] = {}
        for stream, message_ids in by_stream.items():
            for chunk in chunks(sorted(set(message_ids)), _ARRAY):
                rows = await self._rows("SELECT message_id, id FROM memories WHERE stream = %s AND "
                                        "message_id = ANY(%s)", (stream, chunk))
                found.update(((stream, row[0]), int(row[1])) for row in rows)
        return found

    async def find_pending(self, keys: Sequence[tuple[str, str]]) -> dict[tuple[str, str], int]:
        """The oldest pending observation of no Discord message for each (stream, text) pair, where stored."""
        found: dict[tuple[str, str], int] = {}
        for stream, text in sorted(set(keys)):
            row = await self._row(
                "SELECT MIN(id) FROM memories WHERE stream = %s AND status = 'pending' AND kind = 'observation' "
                "AND (message_id IS NULL OR message_id = '') AND text = %s", (stream, text))
            if row is not None and row[0] is not None:
                found[(stream, text)] = int(row[0])
        return found

    async def find_message(self, stream: str, message_id: str) -> int | None:
        """The memory made from a Discord message, if any."""
        row = await self._row("SELECT id FROM memories WHERE stream = %s AND message_id = %s", (stream, message_id))
        return None if row is None else int(row[0])

    async def get(self, memory_id: int, *, stream: str | None = None) -> Memory:
        """One memory by id (restricted to `stream` when given)."""
        row = await self._row(f"SELECT {MEMORY_COLUMNS} FROM memories WHERE id = %s", (memory_id,))
        if row is None or (stream is not None and row[1] != stream):
            where = f" in stream {stream!r}" if stream is not None else ""
            raise MemoryNotFound(f"no memory #{memory_id}{where}", memory_id=memory_id)
        return memory_from_row(row)

    async def get_many(self, ids: Sequence[int]) -> dict[int, Memory]:
        """Memories by id (missing ones are left out)."""
        found: dict[int, Memory] = {}
        for chunk in chunks((int(i) for i in ids), _ARRAY):
            for row in await self._rows(f"SELECT {MEMORY_COLUMNS} FROM memories WHERE id = ANY(%s)", (chunk,)):
                found[int(row[0])] = memory_from_row(row)
        return found

    async def by_number(self, stream: str, number: int) -> int:
        """The id of the memory a stream shows as #number (MemoryNotFound if there is none)."""
        row = await self._row("SELECT id FROM memories WHERE stream = %s AND number = %s", (stream, number))
        if row is None:
            raise MemoryNotFound(f"no memory #{number} in stream {stream!r}", memory_id=number)
        return int(row[0])

    async def recent(self, stream: str, limit: int, *, offset: int = 0, include_pending: bool = False,
                     kind: str | None = None) -> list[Memory]:
        """The most recent memories of a stream (of one kind, if given), newest first."""
        status = "" if include_pending else "AND status = 'ready'"
        rows = await self._rows(f"SELECT {MEMORY_COLUMNS} FROM memories WHERE stream = %(stream)s {status} AND "
                                "(%(kind)s::text IS NULL OR kind = %(kind)s::text) ORDER BY created_at DESC, id DESC "
                                "LIMIT %(limit)s OFFSET %(offset)s",
                                {"stream": stream, "kind": kind, "limit": limit, "offset": offset})
        return [memory_from_row(row) for row in rows]

    async def pending_memories(self, limit: int = 1000, *, due_at: float | None = None,
                               streams: Sequence[str] | None = None, claim: bool = False) -> list[Memory]:
        """Memories waiting for a rating or an embedding, oldest first (by creation time, then id); with
        `due_at`, only those whose next attempt is due by then; with `streams`, only those of these streams.
        With `claim`, only those no other process that is still there has claimed (presence.py), now claimed
        by this one (FOR UPDATE SKIP LOCKED: two processes never get the same memory)."""
        due = ("AND (%(due)s::float8 IS NULL OR next_attempt_at IS NULL OR next_attempt_at <= %(due)s::float8) "
               "AND (%(streams)s::text[] IS NULL OR stream = ANY(%(streams)s::text[]))")
        args = {"due": due_at, "limit": limit, "streams": None if streams is None else list(streams)}
        if not claim:
            rows = await self._rows(f"SELECT {MEMORY_COLUMNS} FROM memories WHERE status = 'pending' {due} "
                                    "ORDER BY created_at, id LIMIT %(limit)s", args)
            return [memory_from_row(row) for row in rows]
        args["owner"] = await self.presence.owner()
        rows = await self._rows(
            f"WITH live (owner) AS MATERIALIZED ({LIVE_OWNERS}) "
            f"UPDATE memories SET claimed_until = {_NOW} + {CLAIM_SECONDS}, claimed_by = %(owner)s WHERE id IN "
            f"(SELECT id FROM memories WHERE status = 'pending' {due} AND {_FREE} "
            f"ORDER BY created_at, id LIMIT %(limit)s FOR UPDATE OF memories SKIP LOCKED) RETURNING {MEMORY_COLUMNS}",
            args)
        return sorted((memory_from_row(row) for row in rows), key=oldest)

    async def by_author(self, stream: str, author_id: str) -> list[int]:
        """Ids of the observations made from one author's messages in a stream."""
        rows = await self._rows("SELECT id FROM memories WHERE stream = %s AND author_id = %s AND "
                                "kind = 'observation' ORDER BY id", (stream, author_id))
        return [int(row[0]) for row in rows]

    async def sources(self, stream: str, ids: Sequence[int] | None = None) -> dict[int, Source]:
        """Where these memories of `stream` came from, by id; without `ids`, every ready memory's."""
        if ids is None:
            rows = await self._rows(f"{_SOURCES}%s AND status = 'ready'", (stream,))
            return {int(row[0]): Source(*row[1:]) for row in rows}
        found: dict[int, Source] = {}
        for chunk in chunks((int(i) for i in ids), _ARRAY):
            rows = await self._rows(f"{_SOURCES}%s AND id = ANY(%s)", (stream, chunk))
            found.update((int(row[0]), Source(*row[1:])) for row in rows)
        return found

    async def author_memories(self, author_id: str, *, stream: str | None = None) -> list[Memory]:
        """The observations made from one author's messages, oldest first: in one stream, or in every one."""
        where, args = ("stream = %s AND ", [stream]) if stream is not None else ("", [])
        rows = await self._rows(f"SELECT {MEMORY_COLUMNS} FROM memories WHERE {where}author_id = %s AND "
                                "kind = 'observation' ORDER BY created_at, id", [*args, author_id])
        return [memory_from_row(row) for row in rows]

    async def stream_pages(self, stream: str, *, page: int = 1000) -> AsyncIterator[list[Memory]]:
        """Every memory of a stream, pending ones too, oldest first, a page at a time."""
        after: tuple[float, int] | None = None
        while True:
            where, args = ("", []) if after is None else (
                "AND (created_at, id) > (%s, %s)", [after[0], after[1]])
            rows = await self._rows(f"SELECT {MEMORY_COLUMNS} FROM memories WHERE stream = %s {where} "
                                    "ORDER BY created_at, id LIMIT %s", [stream, *args, page])
            if not rows:
                return
            yield [memory_from_row(row) for row in rows]
            after = (rows[-1][4], int(rows[-1][0]))

    async def by_message(self, message_ids: Sequence[str]) -> list[int]:
        """Ids of the memories made from these Discord messages, in any stream."""
        found: list[int] = []
        for chunk in chunks(message_ids, _ARRAY):
            rows = await self._rows("SELECT id FROM memories WHERE message_id = ANY(%s) ORDER BY id", (chunk,))
            found.extend(int(row[0]) for row in rows)
        return found

    async def streams(self) -> list[str]:
        """Every stream key in this database."""
        rows = await self._rows('SELECT stream FROM (SELECT DISTINCT stream FROM memories UNION SELECT stream FROM '
                                'stream_state) AS s ORDER BY stream COLLATE "C"')
        return [row[0] for row in rows]

    async def load_vector(self, memory_id: int) -> npt.NDArray[np.float32]:
        """One memory's embedding."""
        row = await self._row("SELECT embedding FROM memories WHERE id = %s", (memory_id,))
        if row is None or row[0] is None:
            raise MemoryNotFound(f"no embedding for memory #{memory_id}")
        vector: npt.NDArray[np.float32] = np.asarray(row[0].to_numpy(), dtype=np.float32)
        return vector
