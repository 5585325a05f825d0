"""PostgresStore: one persona's memory in a PostgreSQL database with pgvector, shared by several processes."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Self

from memstream.clock import Clock
from memstream.config import redact
from memstream.errors import StoreError
from memstream.store.postgres.connection import make_pool
from memstream.store.postgres.migrate import migrate, postgres_migrations
from memstream.store.postgres.transfer import Transfer

__all__ = ["PostgresStore"]


class PostgresStore(Transfer):
    """Async access to one persona's PostgreSQL database. Open with `await PostgresStore.open(url)`."""

    @classmethod
    async def open(cls, location: str | Path, *, migrations: Path | None = None,
                   load_processes: int | None = None, clock: Clock | None = None) -> Self:
        """Connect (a pool of connections), apply pending migrations (migrations/postgres/ or `migrations`).

        `load_processes`: how many connections read a large stream at load; None (the default) uses
        several for a stream of PARALLEL_LOAD_ROWS memories or more.
        """
        if load_processes is not None and (isinstance(load_processes, bool) or not isinstance(load_processes, int)
                                           or load_processes < 1):
            raise ValueError(f"load_processes must be a whole number of 1 or more, or None; got {load_processes!r}")
        url = str(location)
        await migrate(url, postgres_migrations(migrations))
        pool = await make_pool(url)
        store = cls(pool, url, redact(url), readers=load_processes)
        if clock is not None:
            store.usage_clock = clock  # what dates model usage (policy.UsageDay)
        try:
            await store.finish_scrub()
        except BaseException:
            await pool.close()
            raise
        return store

    async def close(self) -> None:
        """Close the pool (finishing a scrub an older transaction held up, if it can now) and let go of the
        pending memories this process claimed."""
        if self._closed:
            return
        self._closed = True
        try:
            if self._to_vacuum or self._deleted_by:
                with contextlib.suppress(StoreError):
                    await self.finish_scrub()
        finally:
            try:
                await self.pool.close()
            finally:
                await self.presence.close()  # this process's claims on pending work end with it

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
