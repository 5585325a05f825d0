"""Loading a stream's ready rows into arrays for retrieval, its texts for the lexical index, and noticing other
processes' writes (per-stream change versions, read in the load's snapshot and checked before each query)."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterable
from typing import Any

import psycopg

from memstream import _load
from memstream.errors import StoreError
from memstream.store.postgres.connection import mapped_errors
from memstream.store.postgres.reader import CHUNK, SELECT_READY, put_rows, read_parts
from memstream.store.postgres.rows import Rows
from memstream.store.records import StreamArrays, part_arrays, sink_arrays

__all__ = ["MAX_READERS", "PARALLEL_LOAD_ROWS", "Loading"]

# A stream this large is read by several connections at once (one per core, at most MAX_READERS).
PARALLEL_LOAD_ROWS = 100_000
MAX_READERS = 4


def _split(counts: list[tuple[int, int]], parts: int) -> list[tuple[int, int, int]]:
    """(low, high, rows) ranges of about equal rows from (id bucket start, rows) counts, in id order."""
    total = sum(n for _, n in counts)
    out: list[tuple[int, int, int]] = []
    low, rows, seen = None, 0, 0
    for i, (start, n) in enumerate(counts):
        low = start if low is None else low
        rows, seen = rows + n, seen + n
        last = i + 1 == len(counts)
        if last or (seen >= total * (len(out) + 1) / parts and len(out) + 1 < parts):
            high = (counts[i + 1][0] - 1) if not last else 2**63 - 1
            out.append((low, high, rows))
            low, rows = None, 0
    return [r for r in out if r[2] > 0]


class Loading(Rows):
    """A stream's rows as arrays, its texts, and other processes' writes."""

    def _readers(self, count: int) -> int:
        if self.readers is not None:
            return self.readers
        if count < PARALLEL_LOAD_ROWS:
            return 1
        try:
            cores = len(os.sched_getaffinity(0))
        except AttributeError:  # not Linux
            cores = os.cpu_count() or 1
        return max(2, min(cores, MAX_READERS))

    async def load_stream(self, stream: str) -> StreamArrays:
        """The ready memories of a stream, as arrays for retrieval (rows in id order).

        One REPEATABLE READ snapshot, exported to the readers: the stream's change version is read in it, so
        that any write after it shows at the next check (changed_elsewhere). A large stream is read by
        several connections at once, each a range of ids, straight into preallocated arrays.
        """
        dims = await self.get_meta("embedding_dimensions")
        dim = int(dims) if dims else 0
        joined = self._joined()
        if joined is not None:  # inside a transaction: read what it sees, its own writes included
            return await self._load_here(joined.conn, stream, dim)
        with mapped_errors(self.path):
            async with self.pool.connection() as conn:
                await conn.set_autocommit(False)
                try:
                    await conn.set_isolation_level(psycopg.IsolationLevel.REPEATABLE_READ)
                    async with conn.transaction():
                        return await self._load_snapshot(conn, stream, dim)
                finally:
                    await conn.set_isolation_level(None)
                    await conn.set_autocommit(True)

    async def _load_snapshot(self, conn: Any, stream: str, dim: int) -> StreamArrays:
        snapshot = (await (await conn.execute("SELECT pg_export_snapshot()")).fetchone())[0]
        version = await (await conn.execute("SELECT version FROM stream_changes WHERE stream = %s",
                                            (stream,))).fetchone()
        self._known[stream] = int(version[0]) if version else 0
        self._stale.discard(stream)
        cur = await conn.execute(
            "SELECT min(id), count(*) FROM memories WHERE stream = %s AND status = 'ready' GROUP BY id / 4096 "
            "ORDER BY 1", (stream,))
        counts = [(int(low), int(n)) for low, n in await cur.fetchall()]
        total = sum(n for _, n in counts)
        if total == 0:
            return sink_arrays(_load.Sink(0, dim))
        ranges = _split(counts, self._readers(total))
        try:
            parts = await asyncio.to_thread(read_parts, self.url, snapshot, stream, ranges, dim)
        except _load.LoadError as exc:
            raise StoreError(f"{self.path}: {exc}") from exc
        except psycopg.Error as exc:
            raise StoreError(f"{self.path}: cannot read stream {stream!r}: {exc}") from exc
        return part_arrays(parts, dim)

    async def _load_here(self, conn: Any, stream: str, dim: int) -> StreamArrays:
        row = await (await conn.execute("SELECT count(*) FROM memories WHERE stream = %s AND status = 'ready'",
                                        (stream,))).fetchone()
        sink = _load.Sink(int(row[0]), dim)
        async with conn.cursor(binary=True) as cur:
            await cur.execute(SELECT_READY, (stream, 0, 2**63 - 1))
            while rows := await cur.fetchmany(CHUNK):
                try:
                    put_rows(sink, rows, dim)
                except _load.LoadError as exc:
                    raise StoreError(f"{self.path}: {exc}") from exc
        return sink_arrays(sink)

    async def stream_texts(self, stream: str) -> tuple[list[int], list[str]]:
        """(ids, texts) of the ready memories of a stream, for its lexical index."""
        rows = await self._rows("SELECT id, text FROM memories WHERE stream = %s AND status = 'ready' ORDER BY id",
                                (stream,))
        return [int(r[0]) for r in rows], [str(r[1]) for r in rows]

    async def changed_elsewhere(self, streams: Iterable[str] = ()) -> set[str]:
        """Of these streams (whose matrices the caller holds), those another process has written to since
        they were loaded: their change version is not the one this process knows (one indexed query)."""
        wanted = sorted(set(streams) & set(self._known))
        changed = self._stale & set(wanted)
        self._stale -= changed
        if not wanted:
            return changed
        rows = await self._rows("SELECT stream, version FROM stream_changes WHERE stream = ANY(%s)", (wanted,))
        current = {row[0]: int(row[1]) for row in rows}
        for stream in wanted:
            now = current.get(stream, 0)
            if now != self._known[stream]:
                changed.add(stream)
                self._known[stream] = now
        return changed
