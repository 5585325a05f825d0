"""Applying SQLite's numbered migrations, each in one transaction with its record row."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime

from memstream.errors import MigrationError, SchemaTooNew, StoreError
from memstream.store.migrations import Migration, all_migrations
from memstream.store.sqlite.binding import sqlite_module
from memstream.store.sqlite.core import Core

__all__ = ["Migrations", "split_statements"]


def split_statements(sql: str) -> list[str]:
    """Split a script into complete statements (executescript would commit on its own)."""
    complete = sqlite_module().complete_statement
    statements, buffer = [], ""
    for line in sql.splitlines(keepends=True):
        buffer += line
        if complete(buffer):
            if buffer.strip():
                statements.append(buffer.strip())
            buffer = ""
    if buffer.strip() and not all(part.strip().startswith("--") for part in buffer.strip().splitlines()):
        raise MigrationError(f"incomplete SQL statement at the end of a migration: {buffer.strip()[:60]!r}")
    return statements


class Migrations(Core):
    """Which migrations a file has, and applying the others."""

    async def applied(self) -> list[int]:
        """Versions already applied to this file."""
        await self.conn.execute(
            "CREATE TABLE IF NOT EXISTS schema_migrations (version INTEGER PRIMARY KEY, name TEXT NOT NULL, "
            "applied_at TEXT NOT NULL)"
        )
        async with self.conn.execute("SELECT version FROM schema_migrations ORDER BY version") as cur:
            return [row[0] for row in await cur.fetchall()]

    async def pending(self, migrations: Iterable[Migration] | None = None) -> list[Migration]:
        """Migrations not yet applied."""
        done = set(await self.applied())
        return [m for m in (migrations or all_migrations()) if m.version not in done]

    async def migrate(self, migrations: Iterable[Migration] | None = None) -> list[int]:
        """Apply pending migrations in order, each in one transaction with its record row."""
        applied: list[int] = []
        known = list(migrations or all_migrations())
        newer = sorted(set(await self.applied()) - {m.version for m in known})
        if newer and newer[-1] > max((m.version for m in known), default=0):
            raise SchemaTooNew(f"{self.path} was made by a newer memstream (schema {newer[-1]:04d}; this version "
                               f"knows up to {max(m.version for m in known):04d}): upgrade memstream to use it; "
                               "nothing was changed")
        todo = await self.pending(known)
        if not todo:
            return applied
        # A migration may rebuild a table (the only way SQLite changes a column's definition): with foreign
        # keys on, dropping the old table would cascade into every table that points at it. So they are off
        # while migrations run (the pragma cannot change inside a transaction) and checked before going on.
        await self.conn.execute("PRAGMA foreign_keys=OFF")
        try:
            for migration in todo:
                try:
                    async with self.transaction():
                        async with self.conn.execute("SELECT 1 FROM schema_migrations WHERE version = ?",
                                                     (migration.version,)) as cur:
                            if await cur.fetchone() is not None:  # another process applied it meanwhile
                                continue
                        for statement in split_statements(migration.sql):
                            await self.conn.execute(statement)
                        async with self.conn.execute("PRAGMA foreign_key_check") as cur:
                            broken = list(await cur.fetchall())
                        if broken:
                            raise MigrationError(f"{self.path}: migration {migration.version:04d}_{migration.name} "
                                                 f"left {len(broken)} broken reference(s), e.g. {tuple(broken[0])}")
                        await self.conn.execute(
                            "INSERT INTO schema_migrations (version, name, applied_at) VALUES (?, ?, ?)",
                            (migration.version, migration.name, datetime.now(UTC).isoformat()),
                        )
                except MigrationError:
                    raise
                except (StoreError, sqlite_module().Error) as exc:
                    raise MigrationError(
                        f"{self.path}: migration {migration.version:04d}_{migration.name} failed: {exc}"
                    ) from exc
                applied.append(migration.version)
        finally:
            await self.conn.execute("PRAGMA foreign_keys=ON")
        return applied

