"""The PostgreSQL store's connections, its write transactions, its meta table and per-stream change versions.

PostgresStore is built in layers like SQLiteStore, one module per concept, each a class adding to the one
below: core -> counters -> rows -> loading -> evidence -> traces -> deletion -> claims -> transfer -> store.

Every statement runs on a pooled autocommit connection, or on the connection of the transaction the calling
task is inside (`transaction()`), so nested calls join it, and other tasks run beside it on their own
connections (PostgreSQL's locks order them).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterable, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt
from psycopg_pool import AsyncConnectionPool

from memstream.errors import StoreError
from memstream.store.events import Announcer, StoreEvent
from memstream.store.policy import REEMBED_TARGET, ModelRecord, UsageDay, model_mismatch, reembed_under_way
from memstream.store.postgres.connection import Conn, pooled
from memstream.store.postgres.presence import Presence

__all__ = ["Conn", "Core"]



@dataclass
class _Transaction:
    store: object
    conn: Conn
    task: asyncio.Task[Any] | None
    bumps: list[tuple[str, int, int]] = field(default_factory=list)  # (stream, old, new), applied on commit
    locked: dict[str, int] = field(default_factory=dict)  # streams locked, with their version now
    events: list[StoreEvent] = field(default_factory=list)  # announced after COMMIT (store/events.py)


_active: ContextVar[_Transaction | None] = ContextVar("memstream_postgres_transaction", default=None)


class Core(Announcer, ModelRecord, UsageDay):
    """A pool of connections to one persona's database, its transactions and its meta table."""

    def __init__(self, pool: AsyncConnectionPool[Conn], url: str, path: str, *, readers: int | None = None) -> None:
        super().__init__()
        self.pool, self.url, self.path = pool, url, path
        self.readers = readers  # connections that read a large stream at load (None: memstream's choice)
        self._closed = False
        self.presence = Presence(url, path)  # what this process's claims on pending work hang on
        self._known: dict[str, int] = {}  # stream -> the change version this process's matrix reflects
        self._stale: set[str] = set()  # streams another process wrote to, seen in our own writes
        self._to_vacuum: set[str] = set()  # tables holding deleted text in dead rows, until scrub
        self._deleted_by = 0  # the newest transaction (64-bit id) that deleted rows, for scrub

    def _joined(self) -> _Transaction | None:
        active = _active.get()
        if active is not None and active.store is self and active.task is asyncio.current_task():
            return active
        return None

    def _open_events(self) -> list[StoreEvent] | None:
        joined = self._joined()
        return None if joined is None else joined.events

    @contextlib.asynccontextmanager
    async def _conn(self) -> AsyncIterator[Conn]:
        """The connection of this task's transaction, or one from the pool (autocommit) for the block."""
        joined = self._joined()
        if joined is not None:
            yield joined.conn
            return
        async with pooled(self.pool, self.path) as conn:
            yield conn

    @contextlib.asynccontextmanager
    async def transaction(self) -> AsyncIterator[None]:
        """BEGIN ... COMMIT on one connection, or ROLLBACK on any error; nested uses (same task) join it. What
        the writes inside announce is delivered to the listeners after COMMIT; nothing on ROLLBACK."""
        if self._joined() is not None:
            yield
            return
        async with pooled(self.pool, self.path) as conn:
            state = _Transaction(self, conn, asyncio.current_task())
            async with conn.transaction():
                token = _active.set(state)
                try:
                    yield
                finally:
                    _active.reset(token)
        self._committed(state.bumps)
        self._deliver(state.events)

    async def _rows(self, sql: str, args: Sequence[Any] | dict[str, Any] = ()) -> list[tuple[Any, ...]]:
        async with self._conn() as conn:
            cur = await conn.execute(sql, args)
            return await cur.fetchall() if cur.description is not None else []

    async def _row(self, sql: str, args: Sequence[Any] | dict[str, Any] = ()) -> tuple[Any, ...] | None:
        rows = await self._rows(sql, args)
        return rows[0] if rows else None

    async def _execute(self, sql: str, args: Sequence[Any] | dict[str, Any] = ()) -> int:
        """Run one statement; the rows it changed."""
        async with self._conn() as conn:
            cur = await conn.execute(sql, args)
            return cur.rowcount

    async def _many(self, sql: str, rows: Iterable[Sequence[Any]]) -> None:
        """One statement for many argument rows (pipelined: no round trip waited for per row)."""
        batch = list(rows)
        if batch:
            async with self._conn() as conn, conn.cursor() as cur:
                await cur.executemany(sql, batch)

    async def _many_returning(self, sql: str, rows: Iterable[Sequence[Any]]) -> list[list[tuple[Any, ...]]]:
        """One statement for many argument rows (pipelined); the rows each execution returned, in order."""
        batch = list(rows)
        if not batch:
            return []
        out: list[list[tuple[Any, ...]]] = []
        async with self._conn() as conn, conn.cursor() as cur:
            await cur.executemany(sql, batch, returning=True)
            while True:
                out.append(await cur.fetchall())
                if not cur.nextset():
                    break
        if len(out) != len(batch):
            raise StoreError(f"{self.path}: {len(batch)} statements gave {len(out)} results")
        return out

    # -- stream locks and change versions (see migrations/postgres/0001_initial.sql)

    async def _lock(self, streams: Iterable[str]) -> None:
        """Lock these streams' change rows for the current transaction, in one order (bytewise), before it
        takes any other lock of theirs: every writer of a stream takes this lock first, so writers of one
        stream queue instead of locking each other's rows in opposite orders (a deadlock)."""
        state = self._joined()
        if state is None:
            raise RuntimeError("streams are locked inside the writing transaction")
        wanted = sorted(set(streams) - set(state.locked))
        if not wanted:
            return
        rows = await self._rows(
            "INSERT INTO stream_changes (stream, version) SELECT s, 0 FROM unnest(%s::text[]) AS s "
            'ORDER BY s COLLATE "C" ON CONFLICT (stream) DO UPDATE SET version = stream_changes.version '
            "RETURNING stream, version", (wanted,))
        state.locked.update({row[0]: int(row[1]) for row in rows})

    async def _bump(self, streams: Iterable[str]) -> None:
        """Give these streams a new change version in the current transaction (their memories changed)."""
        wanted = sorted(set(streams))
        if not wanted:
            return
        await self._lock(wanted)
        state = self._joined()
        assert state is not None
        rows = await self._rows("UPDATE stream_changes SET version = nextval('stream_change_versions') "
                                "WHERE stream = ANY(%s) RETURNING stream, version", (wanted,))
        for stream, new in rows:
            state.bumps.append((stream, state.locked[stream], int(new)))
            state.locked[stream] = int(new)

    def _committed(self, bumps: Sequence[tuple[str, int, int]]) -> None:
        """Our writes are in: a stream whose version before our write is not the one we knew was written by
        another process in between (its matrix must be reloaded)."""
        for stream, old, new in bumps:
            known = self._known.get(stream)
            if known is None:
                continue
            if known != old:
                self._stale.add(stream)
            self._known[stream] = new

    # -- meta

    async def get_meta(self, key: str) -> str | None:
        """A value of the meta table."""
        row = await self._row("SELECT value FROM meta WHERE key = %s", (key,))
        return None if row is None else str(row[0])

    async def set_meta(self, key: str, value: str) -> None:
        """Set a value of the meta table."""
        await self._execute("INSERT INTO meta (key, value) VALUES (%s, %s) ON CONFLICT (key) DO UPDATE "
                            "SET value = excluded.value", (key, value))

    async def _check_dimensions(self, vectors: Iterable[npt.NDArray[np.float32] | None]) -> None:
        dims = {v.shape[-1] for v in vectors if v is not None}
        if not dims:
            return
        if len(dims) == 1:  # the first embedding ever sets it (once, whichever process is first)
            await self._execute("INSERT INTO meta (key, value) VALUES ('embedding_dimensions', %s) "
                                "ON CONFLICT (key) DO NOTHING", (str(next(iter(dims))),))
        known = await self.get_meta("embedding_dimensions")
        if len(dims) > 1 or (known is not None and int(known) not in dims):
            raise StoreError(
                f"{self.path}: embeddings of {sorted(dims)} dimensions do not match the store's {known}; "
                "use the embedding model this store was built with, or a new database"
            )
        await self._check_model(adopt=True)

    async def _check_model(self, *, adopt: bool) -> None:
        if self._embedding_model is None:
            return
        found = dict(await self._rows("SELECT key, value FROM meta WHERE key IN ('embedding_model', %s)",
                                      (REEMBED_TARGET,)))
        if found.get(REEMBED_TARGET) is not None:
            raise reembed_under_way(self.path, str(found[REEMBED_TARGET]))
        recorded = found.get("embedding_model")
        if recorded is None and adopt:  # the first embedding (or a store older than the record) adopts the model
            await self._execute("INSERT INTO meta (key, value) VALUES ('embedding_model', %s) "  # in use, once
                                "ON CONFLICT (key) DO NOTHING", (self._embedding_model,))
            recorded = await self.get_meta("embedding_model")
        if recorded is not None and recorded != self._embedding_model:
            raise model_mismatch(self.path, recorded, self._embedding_model)
