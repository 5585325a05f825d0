"""The store of record: the storage interface (base.py), its backends (sqlite/, postgres/), the events they
deliver after each COMMIT (events.py), and the factory that picks a backend (`Store.open`, here).

`await Store.open(location)` opens a SQLite file (a path) or a PostgreSQL database (a `postgresql://` URL).
Nothing above this package knows which one it runs on.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

from memstream.clock import Clock
from memstream.config import is_database_url, redact
from memstream.errors import StoreError
from memstream.store.base import StoreInterface
from memstream.store.events import StoreEvent, StoreListener
from memstream.store.migrations import Migration, all_migrations
from memstream.store.policy import RETRY_BASE_SECONDS, RETRY_CAP_SECONDS, deferred_touches, retry_delay
from memstream.store.records import NewMemory, NewTrace, StreamArrays, UsageRow
from memstream.store.sqlite import SQLiteStore, sqlite_module
from memstream.store.sqlite.rows import to_blob
from memstream.store.sqlite.scrub import residue_needles

__all__ = ["RETRY_BASE_SECONDS", "RETRY_CAP_SECONDS", "Migration", "NewMemory", "NewTrace", "SQLiteStore",
           "Store", "StoreEvent", "StoreListener", "StreamArrays", "UsageRow", "all_migrations", "deferred_touches",
           "is_database_url", "redact", "residue_needles", "retry_delay", "sqlite_module", "to_blob"]


class Store(StoreInterface, Protocol):
    """One persona's memory (the interface: base.StoreInterface), and the factory that opens one."""

    @classmethod
    async def open(cls, location: str | Path, *, migrations: Path | None = None,
                   load_processes: int | None = None, clock: Clock | None = None) -> Store:
        """Open (creating if needed) the store at `location` and apply its pending migrations.

        A `postgresql://` URL opens PostgreSQL (memstream[postgres]); anything else is a SQLite file.
        `migrations`: another folder of migrations (tests); `load_processes`: see SQLiteStore.open; `clock`:
        the wall clock that dates model usage (the day a daily budget counts; tests move it).
        """
        if is_database_url(location):
            try:
                from memstream.store.postgres import PostgresStore  # optional: memstream[postgres]
            except ImportError as exc:
                raise StoreError(f"a PostgreSQL database needs memstream's postgres extra: pip install "
                                 f"'memstream[postgres]' ({exc})") from exc
            return await PostgresStore.open(location, migrations=migrations, load_processes=load_processes,
                                            clock=clock)
        return await SQLiteStore.open(location, migrations=migrations, load_processes=load_processes, clock=clock)

