"""Applying PostgreSQL's numbered migrations (migrations/postgres/), each in one transaction with its record
row, under an advisory lock: processes starting at once apply each migration once."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime
from pathlib import Path

import psycopg

from memstream.config import redact
from memstream.errors import MigrationError, SchemaTooNew
from memstream.store.migrations import Migration, all_migrations, migration_dir
from memstream.store.postgres.connection import Conn, connect, mapped_errors

__all__ = ["applied", "migrate", "postgres_migrations"]

_LOCK = 0x6D656D7374726D  # the advisory lock key of migrations ("memstrm")


def postgres_migrations(directory: Path | None = None) -> list[Migration]:
    """PostgreSQL's migrations (or those in `directory`), in order."""
    return all_migrations(directory or migration_dir("postgres"))


async def applied(conn: Conn) -> list[int]:
    """Versions already applied to this database."""
    await conn.execute("CREATE TABLE IF NOT EXISTS schema_migrations (version integer PRIMARY KEY, "
                       "name text NOT NULL, applied_at text NOT NULL)")
    cur = await conn.execute("SELECT version FROM schema_migrations ORDER BY version")
    return [int(row[0]) for row in await cur.fetchall()]


async def migrate(url: str, migrations: Iterable[Migration] | None = None) -> list[int]:
    """Apply pending migrations in order; the versions applied here."""
    where = redact(url)
    known = list(migrations if migrations is not None else postgres_migrations())
    done: list[int] = []
    async with connect(url) as conn:
        with mapped_errors(where):
            await conn.execute("SELECT pg_advisory_lock(%s)", (_LOCK,))
            try:
                present = set(await applied(conn))
                newest = max((m.version for m in known), default=0)
                if present and max(present) > newest:
                    raise SchemaTooNew(f"{where} was made by a newer memstream (schema {max(present):04d}; this "
                                       f"version knows up to {newest:04d}): upgrade memstream to use it; nothing "
                                       "was changed")
                for migration in known:
                    if migration.version in present:
                        continue
                    try:
                        async with conn.transaction():
                            await conn.execute(migration.sql.encode("utf-8"))
                            await conn.execute(
                                "INSERT INTO schema_migrations (version, name, applied_at) VALUES (%s, %s, %s)",
                                (migration.version, migration.name, datetime.now(UTC).isoformat()))
                    except psycopg.Error as exc:
                        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
                        raise MigrationError(f"{where}: migration {migration.version:04d}_{migration.name} "
                                             f"failed: {first}") from exc
                    done.append(migration.version)
            finally:
                await conn.execute("SELECT pg_advisory_unlock(%s)", (_LOCK,))
    return done
