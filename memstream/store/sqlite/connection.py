"""The one place SQLite errors become ours: every statement, fetch and commit of the store's connection
passes through `Connection._execute` (aiosqlite's single hop to its worker thread), which maps a SQLite
error to the StoreError that says what happened in one line, and waits out a locked database.

A batch write's cursor is closed in the worker thread before it is handed back: a cursor that still held its
statement would reset it when dropped, in whichever thread drops it last, possibly the event loop's while the
worker runs that same statement for another write (pysqlite3 shares one prepared statement per SQL text);
that write's statement was then left half-run, and the next batch write of that SQL failed ("Error binding
parameter 0").

A locked database: SQLite's busy timeout waits BUSY_TIMEOUT_MS inside each attempt; a statement outside a
transaction (or the BEGIN IMMEDIATE that starts one) is tried again until LOCK_WAIT_SECONDS have passed in
all, then StoreLocked says that nothing was written. Inside a transaction nothing is retried (the
transaction is rolled back as a whole by its caller).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

import aiosqlite
from aiosqlite.context import contextmanager

from memstream.errors import StoreDamaged, StoreError, StoreFull, StoreLocked, StoreReadOnly

__all__ = ["BUSY_TIMEOUT_MS", "LOCK_WAIT_SECONDS", "Connection", "store_error"]

T = TypeVar("T")

# How long one statement waits inside SQLite for another connection's lock.
BUSY_TIMEOUT_MS = 5000
# How long a statement is tried again, in all, while another process holds the database.
LOCK_WAIT_SECONDS = 30.0
_RETRYABLE = {"execute", "executemany", "_execute_fetchall", "hop"}


def _kind(exc: BaseException) -> str:
    text = str(exc).lower()
    name = str(getattr(exc, "sqlite_errorname", "") or "")
    if "is locked" in text or name.startswith(("SQLITE_BUSY", "SQLITE_LOCKED")):
        return "locked"
    if "database or disk is full" in text or name.startswith("SQLITE_FULL"):
        return "full"
    if "readonly database" in text or name.startswith("SQLITE_READONLY"):
        return "readonly"
    if ("malformed" in text or "not a database" in text or "unsupported file format" in text
            or name.startswith(("SQLITE_CORRUPT", "SQLITE_NOTADB"))):
        return "damaged"
    if "disk i/o error" in text or name.startswith("SQLITE_IOERR"):
        return "io"
    if "unable to open database file" in text or name.startswith("SQLITE_CANTOPEN"):
        return "cantopen"
    return "other"


def store_error(exc: BaseException, path: str, *, waited: float = 0.0) -> StoreError:
    """The StoreError for a SQLite error on the database at `path` (one line, saying what to do)."""
    kind = _kind(exc)
    if kind == "locked":
        return StoreLocked(f"{path}: another process kept the database locked for {waited:.0f} s; nothing was "
                           "written: try again when it is done (or stop it)")
    if kind == "full":
        return StoreFull(f"{path}: the disk is full; nothing was written (what was stored before is intact): "
                         "free some space and try again")
    if kind == "readonly":
        return StoreReadOnly(f"{path}: the database cannot be written (read-only file, folder or file system); "
                             "nothing was written")
    if kind == "damaged":
        return StoreDamaged(f"{path}: the database file is damaged or not a database ({exc}); restore a backup, "
                            "or copy out what can be read with: memstream salvage SRC DEST")
    if kind == "cantopen" and path != ":memory:" and not os.access(os.path.dirname(os.path.abspath(path)), os.W_OK):
        return StoreReadOnly(f"{path}: its folder cannot be written (a read-only file system, or permissions), "
                             "and SQLite needs it for the write-ahead log; nothing was written")
    if kind == "cantopen":
        return StoreError(f"{path}: cannot open the database (a missing or unreadable file, or a folder where its "
                          "write-ahead log cannot be created)")
    if kind == "io":
        return StoreError(f"{path}: the disk failed to read or write ({exc}); nothing was written")
    return StoreError(f"{path}: {exc}")


class Connection(aiosqlite.Connection):
    """aiosqlite's connection, whose every call maps SQLite errors to ours (see the module)."""

    def __init__(self, connector: Any, iter_chunk_size: int, *, path: str,
                 errors: tuple[type[BaseException], ...]) -> None:
        super().__init__(connector, iter_chunk_size)
        self.path, self.errors = path, errors  # the database's path for messages; the binding's error classes

    @property
    def _conn(self) -> Any:
        """SQLite's connection; once closed, a StoreError (aiosqlite's is a ValueError), which callers handle as
        they do every store failure: a task still at work as its owner closes the store (a bot stopping)."""
        if self._connection is None:
            raise StoreError(f"{self.path}: the store is closed")
        return self._connection

    async def _execute(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        loop = asyncio.get_running_loop()
        started = loop.time()
        guarded = self._rolled_back_on_damage(fn)
        while True:
            try:
                return await super()._execute(guarded, *args, **kwargs)  # type: ignore[no-untyped-call]
            except self.errors as exc:
                waited = loop.time() - started
                if (_kind(exc) == "locked" and self._may_retry(fn, args) and waited < LOCK_WAIT_SECONDS):
                    await asyncio.sleep(0.1)
                    continue
                raise store_error(exc, self.path, waited=max(waited, BUSY_TIMEOUT_MS / 1000)) from exc

    def _rolled_back_on_damage(self, fn: Any) -> Any:
        """`fn`, ending on SQLite's thread, in the same hop, the transaction in which it met a damaged page or a
        failing disk: SQLite fails every later statement of such a transaction, and the tasks sharing this
        connection (another stream's reads and touches) must not run theirs inside it before its owner rolls it
        back (the owner's ROLLBACK is skipped then: nothing is left open)."""
        conn, errors = self._conn, self.errors

        def guarded(*args: Any, **kwargs: Any) -> Any:
            try:
                return fn(*args, **kwargs)
            except errors as exc:
                if _kind(exc) in ("damaged", "io") and conn is not None and conn.in_transaction:
                    with contextlib.suppress(Exception):
                        conn.execute("ROLLBACK")
                raise

        guarded.__name__ = getattr(fn, "__name__", "guarded")  # (_may_retry reads it)
        return guarded

    async def run(self, fn: Callable[[Any], T]) -> T:
        """`fn(the SQLite connection)` on SQLite's thread: several statements for one hop there instead of one
        each. A locked database is waited out as for one statement (when fn leaves no transaction open: one it
        began, it must roll back on an error)."""
        def hop(conn: Any) -> T:
            return fn(conn)

        result: T = await self._execute(hop, self._conn)
        return result

    @contextmanager
    async def executemany(self, sql: str, parameters: Iterable[Iterable[Any]]) -> aiosqlite.Cursor:
        """aiosqlite's executemany, its cursor closed in the worker thread (see the module)."""
        conn: Any = self._conn  # (pysqlite3 or sqlite3)

        def executemany(sql: str, parameters: Iterable[Iterable[Any]]) -> Any:  # (the name: _may_retry)
            cursor = conn.executemany(sql, parameters)
            cursor.close()
            return cursor

        return aiosqlite.Cursor(self, await self._execute(executemany, sql, parameters))

    def _may_retry(self, fn: Any, args: tuple[Any, ...]) -> bool:
        if getattr(fn, "__name__", "") not in _RETRYABLE:
            return False
        sql = str(args[0]).lstrip().upper() if args else ""
        if sql.startswith("BEGIN"):
            return True
        try:
            return not self._conn.in_transaction
        except StoreError:  # closed
            return False
