"""Numbered SQL files, one folder per backend (migrations/ for SQLite, migrations/postgres/ for PostgreSQL)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from memstream.errors import MigrationError

__all__ = ["Migration", "all_migrations", "migration_dir"]

_MIGRATION_NAME = re.compile(r"^(\d+)_(\w+)\.sql$")


@dataclass(frozen=True)
class Migration:
    """One numbered SQL file."""

    version: int
    name: str
    sql: str


def migration_dir(backend: str = "") -> Path:
    """The folder of a backend's migrations ("" for SQLite's, "postgres"), in the source tree or the wheel."""
    package = Path(__file__).resolve().parent.parent  # memstream/
    source_tree = package.parent / "migrations"
    base = source_tree if source_tree.is_dir() else package / "migrations"  # in the wheel
    return base / backend if backend else base


def all_migrations(directory: Path | None = None) -> list[Migration]:
    """The migrations in `directory` (SQLite's shipped ones by default), in order."""
    found = []
    for path in sorted((directory or migration_dir()).glob("*.sql")):
        match = _MIGRATION_NAME.match(path.name)
        if not match:
            raise MigrationError(f"migration file {path.name} is not named NNNN_name.sql")
        found.append(Migration(int(match.group(1)), match.group(2), path.read_text(encoding="utf-8")))
    versions = [m.version for m in found]
    if len(set(versions)) != len(versions):
        raise MigrationError(f"two migrations share a number: {versions}")
    return sorted(found, key=lambda m: m.version)

