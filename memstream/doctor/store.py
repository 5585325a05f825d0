"""The doctor's checks of storage: SQLite extension loading (sqlite-vec) and the persona's database file.

Read-only: the database is opened with `mode=ro`, never created or migrated here.
"""

from __future__ import annotations

import contextlib
import os
import types
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import sqlite_vec

from memstream.config import url_problem
from memstream.doctor.checks import Check
from memstream.errors import StoreError
from memstream.store import all_migrations, redact, sqlite_module
from memstream.store.migrations import migration_dir

__all__ = ["DatabaseState", "check_database", "check_database_url", "check_dimensions", "check_model", "check_sqlite"]

_RESTORE = "restore a backup (memstream backup makes one), or copy out what can be read: memstream salvage SRC DEST"
_INSTALL = ("pip install pysqlite3 (Linux: a SQLite that can load extensions), or use a Python whose sqlite3 "
            "can load extensions (python.org and Homebrew builds can; many pyenv builds cannot)")


@dataclass(frozen=True)
class DatabaseState:
    """What the database check found: the embedding dimension it stores (None: new, or no vectors yet)."""

    exists: bool
    dimensions: int | None = None
    model: str | None = None  # the embedding model recorded as the maker of its vectors
    reembedding: str | None = None  # the model a re-embedding under way (or stopped) moves it to
    current: bool = False  # its schema is this memstream's: opening it through the store migrates nothing


def check_sqlite(binding: Callable[[], types.ModuleType] = sqlite_module,
                 extension: Callable[[], str] = sqlite_vec.loadable_path) -> Check:
    """A SQLite binding that can load extensions, and sqlite-vec loaded into it."""
    try:
        module = binding()
    except StoreError as exc:
        return Check.fail("sqlite", str(exc).split(": pip install")[0], _INSTALL)
    name = f"{module.__name__.split('.')[0]} (SQLite {getattr(module, 'sqlite_version', '?')})"
    if not hasattr(module.Connection, "enable_load_extension"):
        return Check.fail("sqlite", f"{name} cannot load extensions (needed for sqlite-vec)", _INSTALL)
    try:
        conn = module.connect(":memory:")
        try:
            conn.enable_load_extension(True)
            conn.load_extension(extension())
            version = conn.execute("SELECT vec_version()").fetchone()[0]
        finally:
            conn.close()
    except Exception as exc:  # the binding's own error classes, or a missing file
        return Check.fail("sqlite", f"{name} cannot load sqlite-vec ({exc})",
                          "pip install --force-reinstall sqlite-vec (a wheel for this platform)")
    return Check.ok("sqlite", f"{name}, sqlite-vec {version}")


def check_database(path: Path, binding: Callable[[], types.ModuleType] = sqlite_module
                   ) -> tuple[list[Check], DatabaseState]:
    """The database file: where it is or will be, its schema version, `PRAGMA quick_check`."""
    if str(path) == ":memory:":
        return [Check.ok("database", "in memory (nothing kept)")], DatabaseState(exists=False)
    if not path.exists():
        return [_will_be_created(path)], DatabaseState(exists=False)
    try:
        module = binding()
    except StoreError as exc:
        return [Check.fail("database", f"{path}: not checked: {exc}", _INSTALL)], DatabaseState(exists=True)
    try:
        with _read_only(module, path) as conn:
            return _inspect(conn, path)
    except Exception as exc:  # the binding's error classes: not a database, unreadable, locked
        text = str(exc)
        if "not a database" in text or "malformed" in text or "file is encrypted" in text:
            return [Check.fail("database", f"{path} is damaged or not a database ({text})", _RESTORE)], \
                DatabaseState(exists=True)
        return [Check.fail("database", f"{path} cannot be read ({text})",
                           "check the file's owner and permissions, and that no other program holds it")], \
            DatabaseState(exists=True)


@contextlib.contextmanager
def _read_only(module: types.ModuleType, path: Path) -> Iterator[Any]:
    conn = module.connect(f"file:{quote(str(path.absolute()))}?mode=ro", uri=True)
    try:
        yield conn
    finally:
        conn.close()


def _will_be_created(path: Path) -> Check:
    folder = path.absolute().parent
    existing = folder
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if existing.is_dir() and os.access(existing, os.W_OK | os.X_OK):
        return Check.ok("database", f"{path} does not exist yet: it is created at the first run")
    return Check.fail("database", f"{path} does not exist and cannot be created ({existing} is not writable)",
                      "set [persona] database to a writable place, or $MEMSTREAM_DATA_DIR")


def _inspect(conn: Any, path: Path) -> tuple[list[Check], DatabaseState]:
    tables = {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    known = max((m.version for m in all_migrations()), default=0)
    applied = ([row[0] for row in conn.execute("SELECT version FROM schema_migrations")]
               if "schema_migrations" in tables else [])
    version = max(applied, default=0)
    if version > known:
        schema = Check.fail("schema", f"{path} was made by a newer memstream (schema {version:04d}; this version "
                                      f"knows up to {known:04d})", "upgrade memstream (pip install -U memstream)")
    elif version < known:
        schema = Check.ok("schema", f"{path}: schema {version:04d}; {known - version} migration(s) to "
                                    f"{known:04d} are applied at the next start")
    else:
        schema = Check.ok("schema", f"{path}: schema {version:04d}, current")
    problems = [row[0] for row in conn.execute("PRAGMA quick_check(5)")]
    if problems == ["ok"]:
        integrity = Check.ok("integrity", "quick_check: ok")
    else:
        found = " ".join(" ".join(map(str, problems)).split())
        integrity = Check.fail("integrity", f"quick_check: {found[:300]}", _RESTORE)
    dimensions = model = reembedding = None
    if "meta" in tables:
        row = conn.execute("SELECT value FROM meta WHERE key = 'embedding_dimensions'").fetchone()
        dimensions = int(row[0]) if row and str(row[0]).isdigit() else None
        row = conn.execute("SELECT value FROM meta WHERE key = 'embedding_model'").fetchone()
        model = None if row is None else str(row[0])
        row = conn.execute("SELECT value FROM meta WHERE key = 'reembed_to'").fetchone()
        reembedding = None if row is None else str(row[0])
    return [schema, integrity], DatabaseState(exists=True, dimensions=dimensions, model=model,
                                              reembedding=reembedding, current=version == known)


def check_database_url(url: str) -> tuple[list[Check], DatabaseState]:
    """A PostgreSQL database (read only): reachable, its schema version, the embedding dimension it stores."""
    where = redact(url)
    problem = url_problem(url)
    if problem:
        return [Check.fail("database", problem, "correct the URL ($MEMSTREAM_DATABASE_URL or [persona] database)")], \
            DatabaseState(exists=False)
    try:
        import psycopg
    except ImportError:
        return [Check.fail("database", f"{where}: PostgreSQL needs the postgres extra",
                           "pip install 'memstream[postgres]'")], DatabaseState(exists=False)
    known = max((m.version for m in all_migrations(migration_dir("postgres"))), default=0)
    try:
        with psycopg.connect(url, connect_timeout=10, autocommit=True) as conn:
            tables = {row[0] for row in conn.execute("SELECT tablename FROM pg_tables WHERE schemaname = "
                                                     "current_schema()")}
            if "schema_migrations" not in tables:
                return [Check.ok("database", f"{where}: reachable, empty: memstream's schema is created at the "
                                             "first run")], DatabaseState(exists=False)
            version = max((row[0] for row in conn.execute("SELECT version FROM schema_migrations")), default=0)
            row = conn.execute("SELECT value FROM meta WHERE key = 'embedding_dimensions'").fetchone()
            made = conn.execute("SELECT value FROM meta WHERE key = 'embedding_model'").fetchone()
            moving = conn.execute("SELECT value FROM meta WHERE key = 'reembed_to'").fetchone()
    except psycopg.Error as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        return [Check.fail("database", f"{where} cannot be reached ({first})",
                           "start the server, or correct the URL ($MEMSTREAM_DATABASE_URL or [persona] "
                           "database)")], DatabaseState(exists=False)
    if version > known:
        schema = Check.fail("schema", f"{where} was made by a newer memstream (schema {version:04d}; this version "
                                      f"knows up to {known:04d})", "upgrade memstream (pip install -U memstream)")
    else:
        left = f"; {known - version} migration(s) are applied at the next start" if version < known else ", current"
        schema = Check.ok("schema", f"{where}: PostgreSQL schema {version:04d}{left}")
    dimensions = int(row[0]) if row and str(row[0]).isdigit() else None
    return [schema], DatabaseState(exists=True, dimensions=dimensions, model=None if made is None else str(made[0]),
                                   reembedding=None if moving is None else str(moving[0]), current=version == known)


def check_dimensions(state: DatabaseState, returned: int | None, configured: int | None, model: str) -> Check:
    """The database's embedding dimension against what the embedding model returns now."""
    if state.dimensions is None:
        return Check.ok("dimensions", "no embeddings stored yet: the first one sets the dimension")
    if returned is None:
        return Check.warn("dimensions", f"the database holds {state.dimensions}-dimension embeddings; not "
                                        "compared, the embedding model did not answer")
    if returned != state.dimensions:
        setting = "" if configured is None else f" (embedding_dimensions = {configured})"
        return Check.fail("dimensions", f"the database holds {state.dimensions}-dimension embeddings, but {model}"
                                        f"{setting} returns {returned}: memories cannot be stored or compared",
                          "set [models] embedding back to the model that made them, or start a new database "
                          "(--db FILE, or export and import the streams into one)")
    return Check.ok("dimensions", f"{returned} dimensions, as stored in the database")


def check_model(state: DatabaseState, configured: str) -> Check:
    """The model recorded as the maker of the database's embeddings against the persona's embedding model."""
    if state.reembedding is not None:
        return Check.fail("embedded by", f"a re-embedding with {state.reembedding} is under way or stopped half way: "
                                         "nothing is stored or recalled until it is finished",
                          f"memstream reembed --stream all (with [models] embedding = {state.reembedding})")
    if state.model is None:
        if state.dimensions is None:
            return Check.ok("embedded by", f"no embeddings stored yet: the first records {configured}")
        return Check.warn("embedded by", "the database does not record which model made its embeddings (an "
                                             f"older memstream): {configured} is recorded at the next write",
                          "if another model made them: memstream reembed --stream all")
    if state.model != configured:
        return Check.fail("embedded by", f"the database's embeddings were made by {state.model}, but the "
                                             f"persona's embedding model is {configured}: memories cannot be "
                                             "stored or recalled (two models' vectors do not mix)",
                          f"memstream reembed --stream all (re-embeds every memory with {configured}), or set "
                          f"[models] embedding back to {state.model}")
    return Check.ok("embedded by", f"{configured}, as recorded in the database")
