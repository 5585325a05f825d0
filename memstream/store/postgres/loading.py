"""Loading a stream's ready rows into arrays for retrieval (and their texts, for the lexical index), and noticing
other processes' writes (per-stream change versions, read in the load's snapshot and checked before each
query)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from typing import Any

import psycopg

from memstream.errors import StoreError
from memstream.store import _load
from memstream.store.events import ChangedElsewhere
from memstream.store.postgres.connection import mapped_errors, pooled
from memstream.store.postgres.grouped import split
from memstream.store.postgres.reader import plan, read_here, read_parts
from memstream.store.postgres.rows import Rows
from memstream.store.records import StreamArrays, part_arrays

__all__ = ["MAX_READERS", "PARALLEL_LOAD_ROWS", "Loading"]

# A stream this large is read by several connections at once: one more than this machine's cores (a reader's
# thread and its server process wait for each other in turn, so a spare one keeps the cores busy: 1M memories
# on 2 cores were ready in 3.7 s with 3 readers, 4.1 s with 2), at most MAX_READERS.
PARALLEL_LOAD_ROWS = 100_000
MAX_READERS = 4


class Loading(Rows):
    """A stream's rows as arrays (and texts), and other processes' writes."""

    def _readers(self, count: int) -> int:
        if self.readers is not None:
            return self.readers
        if count < PARALLEL_LOAD_ROWS:
            return 1
        cores = _load.cores()
        return max(2, min(cores + 1, MAX_READERS))

    async def load_stream(self, stream: str, *, texts: bool = False, sources: bool = False,
                          each: Callable[[list[str]], None] | None = None) -> StreamArrays:
        """The ready memories of a stream, as arrays for retrieval (rows in id order); with `texts`, their texts,
        and with `sources` their sources, in the same pass.

        One REPEATABLE READ snapshot, exported to the readers: the stream's change version is read in it, so
        that any write after it shows at the next check (changed_elsewhere). A large stream is read by
        several connections at once, each a run of id ranges, straight into preallocated arrays.
        """
        dims = await self.get_meta("embedding_dimensions")
        dim = int(dims) if dims else 0
        joined = self._joined()
        try:
            if joined is not None:  # inside a transaction: read what it sees, its own writes included
                with mapped_errors(self.path):
                    groups = await plan(joined.conn, stream)
                    parts = ([await read_here(joined.conn, stream, groups, dim, texts=texts, sources=sources)]
                             if groups else [])
                return part_arrays(parts, dim, texts=texts)
            async with pooled(self.pool, self.path) as conn:
                await conn.set_autocommit(False)
                try:
                    await conn.set_isolation_level(psycopg.IsolationLevel.REPEATABLE_READ)
                    async with conn.transaction():
                        return await self._load_snapshot(conn, stream, dim, texts, sources)
                finally:
                    await conn.set_isolation_level(None)
                    await conn.set_autocommit(True)
        except _load.LoadError as exc:
            raise StoreError(f"{self.path}: cannot load stream {stream!r}: {exc}") from exc

    async def _load_snapshot(self, conn: Any, stream: str, dim: int, texts: bool, sources: bool) -> StreamArrays:
        snapshot = (await (await conn.execute("SELECT pg_export_snapshot()")).fetchone())[0]
        version = await (await conn.execute("SELECT version FROM stream_changes WHERE stream = %s",
                                            (stream,))).fetchone()
        self._known[stream] = int(version[0]) if version else 0
        self._stale.discard(stream)
        groups = await plan(conn, stream)
        if not groups:
            return part_arrays([], dim, texts=texts)
        runs = split(groups, self._readers(sum(g[2] for g in groups)))
        try:
            parts = await asyncio.to_thread(read_parts, self.url, snapshot, stream, runs, dim, texts=texts,
                                            sources=sources)
        except psycopg.Error as exc:
            raise StoreError(f"{self.path}: cannot read stream {stream!r}: {exc}") from exc
        return part_arrays(parts, dim, texts=texts)

    async def changed_elsewhere(self, streams: Iterable[str] = ()) -> set[str]:
        """Of these streams (whose matrices the caller holds), those another process has written to since
        they were loaded: their change version is not the one this process knows (one indexed query). The
        listeners hear it too (ChangedElsewhere)."""
        changed = await self._changed_elsewhere(streams)
        if changed:
            self._deliver([ChangedElsewhere(frozenset(changed))])
        return changed

    async def _changed_elsewhere(self, streams: Iterable[str]) -> set[str]:
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
