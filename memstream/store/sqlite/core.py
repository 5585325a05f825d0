"""The SQLite store's connection, its write transactions, and the meta table (which every layer reads).

SQLiteStore is built in layers, one module per concept, each a class adding to the one below:
core -> migrate -> counters -> rows -> loading -> evidence -> traces -> deletion -> scrub -> transfer -> store.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterable
from typing import Any

import numpy as np
import numpy.typing as npt

from memstream.errors import StoreError
from memstream.store.events import Announcer, StoreEvent
from memstream.store.policy import REEMBED_TARGET, ModelRecord, UsageDay, model_mismatch, reembed_under_way
from memstream.store.readers import Readers
from memstream.store.sqlite.connection import Connection

__all__ = ["Core"]


class Core(Announcer, ModelRecord, UsageDay):
    """A connection to one persona's SQLite file, its transactions and its meta table."""

    def __init__(self, conn: Connection, path: str, *, load_processes: int | None = None) -> None:
        super().__init__()
        self.conn, self.path = conn, path
        # Processes that read a stream's rows at load: None picks (several for a large stream), 1 never.
        self.load_processes = load_processes
        self.readers: Readers | None = None  # the reader processes, once a load started them (readers.py)
        self._in_transaction = False
        self._owner: asyncio.Task[Any] | None = None
        self._lock = asyncio.Lock()
        self._closed = False
        # Texts deleted since the last scrub (looked for in the file by the scrub), or a whole stream.
        self._residue: list[str] = []
        self._vacuum_due = False
        self._data_version: int | None = None  # see changed_elsewhere
        # What the open transaction announces after its COMMIT (store/events.py); None when none is open.
        self._events: list[StoreEvent] | None = None

    @contextlib.asynccontextmanager
    async def transaction(self) -> AsyncIterator[None]:
        """BEGIN IMMEDIATE ... COMMIT, or ROLLBACK on any error; nested uses (same task) join the outer one.

        Tasks sharing this connection take turns: another task's transaction waits for ours to end,
        instead of beginning inside it (an error) or silently joining it. What the writes inside announce is
        delivered to the listeners after COMMIT, before the next transaction begins; nothing on ROLLBACK.
        """
        task = asyncio.current_task()
        if self._in_transaction and self._owner is task:
            yield
            return
        async with self._lock:
            self._owner = task
            events: list[StoreEvent] = []
            self._events = events
            try:
                await self.conn.execute("BEGIN IMMEDIATE")
                self._in_transaction = True
                try:
                    yield
                except BaseException:
                    self._in_transaction = False
                    if self.conn.in_transaction:  # SQLite rolls back by itself after some errors (a full disk)
                        with contextlib.suppress(StoreError):  # the first error is the one to report
                            await self.conn.execute("ROLLBACK")
                    raise
                self._in_transaction = False
                await self.conn.execute("COMMIT")
                self._events = None
                self._deliver(events)
            finally:
                self._in_transaction = False
                self._owner = None
                self._events = None

    def _open_events(self) -> list[StoreEvent] | None:
        # A write on this connection while a transaction is open joins it (whichever task opened it).
        return self._events

    async def _check_dimensions(self, vectors: Iterable[npt.NDArray[np.float32] | None]) -> None:
        dims = {v.shape[-1] for v in vectors if v is not None}
        if not dims:
            return
        known = await self.get_meta("embedding_dimensions")
        if len(dims) > 1 or (known is not None and int(known) not in dims):
            raise StoreError(
                f"{self.path}: embeddings of {sorted(dims)} dimensions do not match the store's {known}; "
                "use the embedding model this store was built with, or a new database file"
            )
        if known is None:
            await self.set_meta("embedding_dimensions", str(dims.pop()))
        await self._check_model(adopt=True)

    async def _check_model(self, *, adopt: bool) -> None:
        if self._embedding_model is None:
            return
        rows = await self.conn.execute_fetchall(  # one hop: this runs before every query
            "SELECT key, value FROM meta WHERE key IN ('embedding_model', ?)", (REEMBED_TARGET,))
        found: dict[str, str] = {str(row[0]): str(row[1]) for row in rows}
        recorded, target = found.get("embedding_model"), found.get(REEMBED_TARGET)
        if target is not None:
            raise reembed_under_way(self.path, str(target))
        if recorded is None:
            if adopt:  # the first embedding (or a store older than the record) adopts the model in use
                await self.set_meta("embedding_model", self._embedding_model)
            return
        if recorded != self._embedding_model:
            raise model_mismatch(self.path, str(recorded), self._embedding_model)

    async def get_meta(self, key: str) -> str | None:
        """A value of the meta table."""
        async with self.conn.execute("SELECT value FROM meta WHERE key = ?", (key,)) as cur:
            row = await cur.fetchone()
        return None if row is None else str(row[0])

    async def set_meta(self, key: str, value: str) -> None:
        """Set a value of the meta table."""
        await self.conn.execute("INSERT INTO meta (key, value) VALUES (?, ?) ON CONFLICT (key) DO UPDATE "
                                "SET value = excluded.value", (key, value))

