"""SQLiteStore: the store of record in one SQLite file per persona, sqlite-vec loaded, schema from migrations/."""

from __future__ import annotations

import asyncio
import contextlib
import os
from pathlib import Path
from typing import Any, Self

import sqlite_vec

from memstream.clock import Clock
from memstream.errors import StoreError
from memstream.store.migrations import all_migrations
from memstream.store.sqlite import connection
from memstream.store.sqlite.binding import sqlite_module
from memstream.store.sqlite.connection import BUSY_TIMEOUT_MS
from memstream.store.sqlite.transfer import Transfer

__all__ = ["SQLiteStore"]


def _create_private(path: Path) -> None:
    """A new database file is readable by its owner only (0600; SQLite gives its -wal and -shm the same
    mode), in folders made 0700. Existing files and folders keep the mode the operator gave them."""
    missing = []
    folder = path.parent
    while not folder.exists():
        missing.append(folder)
        folder = folder.parent
    for made in reversed(missing):
        with contextlib.suppress(FileExistsError):
            made.mkdir(mode=0o700)
    if not path.exists():
        with contextlib.suppress(FileExistsError):
            os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))


class SQLiteStore(Transfer):
    """Async access to one persona's SQLite file. Open with `await SQLiteStore.open(path)`."""

    @classmethod
    async def open(cls, path: str | Path, *, migrations: Path | None = None,
                   load_processes: int | None = None, clock: Clock | None = None) -> Self:
        """Open (creating if needed) the file, load sqlite-vec, apply pending migrations.

        `load_processes`: how many processes read a stream's rows when it is loaded; None (the default) reads a
        stream of PROCESS_ROWS memories or more in reader processes (one per PROCESS_ROWS / 2, at most one per
        core), kept for the next loads until the store is closed; 1 never starts one.
        """
        if load_processes is not None and (isinstance(load_processes, bool) or not isinstance(load_processes, int)
                                           or load_processes < 1):
            raise ValueError(f"load_processes must be a whole number of 1 or more, or None; got {load_processes!r}")
        module = sqlite_module()
        location = str(path)
        if location != ":memory:":
            try:
                _create_private(Path(location))
            except OSError as exc:
                raise StoreError(f"cannot create {location}: {exc}") from exc

        def connector() -> Any:
            conn = module.connect(location, isolation_level=None, check_same_thread=False)
            conn.enable_load_extension(True)
            conn.load_extension(sqlite_vec.loadable_path())
            conn.enable_load_extension(False)
            return conn

        # SQLite errors become ours in the connection (memstream.store.sqlite.connection).
        conn = connection.Connection(connector, 64, path=location, errors=(module.Error,))
        try:
            await conn
        except (module.Error, StoreError) as exc:
            raise StoreError(f"cannot open {location}: {exc}") from exc
        store = cls(conn, location, load_processes=load_processes)
        if clock is not None:
            store.usage_clock = clock  # what dates model usage (policy.UsageDay)
        try:
            # The busy timeout first: switching a new file to WAL waits for another process doing the same
            # (SQLite refuses at once there; the connection tries again within its lock wait).
            for pragma in (f"busy_timeout={BUSY_TIMEOUT_MS}", "journal_mode=WAL", "synchronous=NORMAL",
                           "foreign_keys=ON", "secure_delete=ON"):
                async with conn.execute(f"PRAGMA {pragma}"):
                    pass
        except StoreError:
            await conn.close()
            raise
        try:
            await store.migrate(all_migrations(migrations))
            await store.finish_scrub()
        except BaseException:
            await conn.close()
            raise
        return store

    async def close(self) -> None:
        """Close the connection (finishing a scrub a reader held up, if it can now)."""
        if self._closed:
            return
        self._closed = True
        try:
            with contextlib.suppress(StoreError):
                await self.finish_scrub()
        finally:
            if self.readers is not None:
                await asyncio.to_thread(self.readers.close)
            await self.conn.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

