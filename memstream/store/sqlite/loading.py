"""Loading a stream's ready rows into arrays for retrieval, and their texts for the lexical index, in one read
(a stream of thousands in reader processes: memstream.store.readers), and noticing other connections' writes."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable, Iterable

from memstream.errors import StoreError
from memstream.store import _load
from memstream.store.events import ChangedElsewhere
from memstream.store.readers import Readers, processes_available
from memstream.store.records import StreamArrays, part_arrays, sink_arrays
from memstream.store.sqlite import connection
from memstream.store.sqlite.binding import sqlite_module
from memstream.store.sqlite.rows import Rows

__all__ = ["MAX_LOAD_PROCESSES", "PROCESS_ROWS", "Loading"]

log = logging.getLogger(__name__)
# A stream of this many rows or more is read by reader processes when it is loaded: one per PROCESS_ROWS / 2 rows,
# at most one per core and the maximum. Below it, the round trip costs more than a second core saves.
PROCESS_ROWS = 4_000
MAX_LOAD_PROCESSES = 8


class Loading(Rows):
    """A stream's rows as arrays (and texts), and other connections' writes."""

    async def load_stream(self, stream: str, *, texts: bool = False, sources: bool = False,
                          each: Callable[[list[str]], None] | None = None) -> StreamArrays:
        """The ready memories of a stream, as arrays for retrieval (rows in no particular order); with `texts`,
        their texts too (and `each`: Store.load_stream).

        A file is read by read-only connections off the event loop (they do not hold up this
        connection's writes), straight into preallocated arrays: one copy of the embeddings in memory,
        never two. A stream of PROCESS_ROWS or more is read by reader processes (memstream.store.readers).
        """
        dims = await self.get_meta("embedding_dimensions")
        dim = int(dims) if dims else 0
        async with self.conn.execute(
            "SELECT COUNT(*), MIN(id), MAX(id) FROM memories WHERE stream = ?", (stream,)
        ) as cur:
            row = await cur.fetchone()
        count, low, high = (int(row[0]), row[1], row[2]) if row else (0, None, None)
        if count == 0 or low is None or high is None:
            return sink_arrays(_load.Sink(0, dim, texts=texts, sources=sources))
        if self.path == ":memory:" or self._in_transaction:
            sink = _load.Sink(count, dim, texts=texts, sources=sources)
            query = _load.select_ready(texts=texts, sources=sources, seek=_load.seeks(count, int(low), int(high)))
            async with self.conn.execute(query, (stream, low, high)) as cur:
                while rows := list(await cur.fetchmany(_load.CHUNK)):
                    try:
                        sink.put(rows)
                    except _load.LoadError as exc:
                        raise StoreError(str(exc)) from exc
            return sink_arrays(sink)
        seek = _load.seeks(count, int(low), int(high))  # its rows are interleaved with other streams'
        workers = self._load_workers(count)
        if workers > 0:
            try:
                parts = await asyncio.to_thread(self._readers().read, stream, int(low), int(high), count, dim,
                                                workers, texts=texts, sources=sources, seek=seek,
                                                each=each if texts else None)
                return part_arrays(parts, dim, texts=texts)
            except _load.LoadError as exc:
                raise StoreError(str(exc)) from exc
            except _load.WorkerFailed as exc:
                log.warning("loading stream %r in %d processes failed (%s); loading it here", stream, workers, exc)
        return await asyncio.to_thread(self._read_range, stream, int(low), int(high), count, dim, texts, sources,
                                       seek)

    def _load_workers(self, count: int) -> int:
        """How many reader processes read a stream of `count` rows (0: this process does)."""
        if not processes_available() or self.load_processes == 1:
            return 0
        if self.load_processes is not None:
            return self.load_processes
        if count < PROCESS_ROWS:
            return 0
        return max(1, min(_load.cores(), MAX_LOAD_PROCESSES, count // (PROCESS_ROWS // 2)))

    def _readers(self) -> Readers:
        """This file's reader processes (started as loads need them, ended by close)."""
        if self.readers is None:
            keep = self.load_processes or min(_load.cores(), MAX_LOAD_PROCESSES)
            self.readers = Readers(sqlite_module().__name__, self.path, keep)
        return self.readers

    def _read_range(self, stream: str, low: int, high: int, count: int, dim: int, texts: bool,
                    sources: bool, seek: bool) -> StreamArrays:
        sink = _load.Sink(count, dim, texts=texts, sources=sources)
        try:
            _load.read_range(_load.read_only(sqlite_module(), self.path), stream, low, high, sink, seek=seek)
        except _load.LoadError as exc:
            raise StoreError(str(exc)) from exc
        except sqlite_module().Error as exc:
            raise connection.store_error(exc, self.path) from exc
        return sink_arrays(sink)

    async def changed_elsewhere(self, streams: Iterable[str] = ()) -> set[str]:
        """Of these streams, those another connection (another process, or another Store on this file) may
        have written to since the last call: all of them when SQLite's data_version moved (one cheap pragma,
        one round trip: asked per query; SQLite cannot tell streams apart), else none. The first call only
        sets the mark. The listeners hear it too (ChangedElsewhere)."""
        rows = list(await self.conn.execute_fetchall("PRAGMA data_version"))
        version = int(rows[0][0]) if rows else 0
        changed = self._data_version is not None and version != self._data_version
        self._data_version = version
        found = set(streams) if changed else set()
        if found:
            self._deliver([ChangedElsewhere(frozenset(found))])
        return found

    @contextlib.asynccontextmanager
    async def reflection_claim(self, stream: str) -> AsyncIterator[bool]:
        """Always granted: one persona process writes a SQLite file (MemoryStream orders its own tasks)."""
        yield True

