"""Connections to a persona's PostgreSQL database: the pool, the one place psycopg errors become ours, and the
URL as shown in messages (without its password)."""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import psycopg
from pgvector.psycopg import register_vector_async
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from memstream.config import redact, url_problem
from memstream.errors import ConfigError, StoreError, StoreFull, StoreReadOnly

__all__ = ["POOL_SIZE", "Conn", "checked", "connect", "make_pool", "mapped_errors", "open_connection", "pooled",
           "store_error"]

Conn = psycopg.AsyncConnection[tuple[Any, ...]]
# Connections one process keeps open to the database (a reflection holds one for its claim).
POOL_SIZE = 8
CONNECT_TIMEOUT_SECONDS = 10
# How long a task waits for a pooled connection while the pool is busy (every connection in use)...
BUSY_WAIT_SECONDS = 60.0
# ...and how often meanwhile it checks that the server can be reached at all: a server that is down (the pool
# cannot replace the connections it lost) fails the task in seconds, not after BUSY_WAIT_SECONDS.
PROBE_EVERY_SECONDS = 1.0


def store_error(exc: BaseException, where: str) -> StoreError:
    """The StoreError for a psycopg error on the database at `where` (one line, saying what to do)."""
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    if isinstance(exc, psycopg.errors.DiskFull):
        return StoreFull(f"{where}: the database server's disk is full; nothing was written")
    if isinstance(exc, psycopg.errors.ReadOnlySqlTransaction):
        return StoreReadOnly(f"{where}: the database is read-only (a standby?); nothing was written")
    state = getattr(exc, "sqlstate", None)
    if isinstance(exc, psycopg.OperationalError) and (state is None or state.startswith(("08", "57P"))):
        return StoreError(f"{where}: cannot reach the database server ({first}); is it running, and is the URL "
                          "right?")
    return StoreError(f"{where}: {first}")


@contextlib.contextmanager
def mapped_errors(where: str) -> Iterator[None]:
    """psycopg's errors (and the pool's timeout) inside the block become StoreError."""
    try:
        yield
    except psycopg.Error as exc:
        raise store_error(exc, where) from exc


def checked(url: str) -> str:
    """The URL, unless libpq would read it otherwise than it is shown (its messages would then quote pieces of
    the password): ConfigError, without the password."""
    problem = url_problem(url)
    if problem:
        raise ConfigError(problem)
    return url


async def open_connection(url: str) -> Conn:
    """One autocommit connection outside the pool, open until the caller closes it."""
    with mapped_errors(redact(checked(url))):
        return await psycopg.AsyncConnection.connect(url, autocommit=True, connect_timeout=CONNECT_TIMEOUT_SECONDS)


@contextlib.asynccontextmanager
async def connect(url: str) -> AsyncIterator[Conn]:
    """One autocommit connection outside the pool for the block (migrations, VACUUM)."""
    conn = await open_connection(url)
    try:
        yield conn
    finally:
        await conn.close()


async def _configure(conn: Conn) -> None:
    await register_vector_async(conn)


@contextlib.asynccontextmanager
async def pooled(pool: AsyncConnectionPool[Conn], where: str) -> AsyncIterator[Conn]:
    """A connection of the pool for the block (as `pool.connection()`), but a server that cannot be reached is
    one StoreError within seconds (the probe's own reason), while a busy pool is waited for."""
    with mapped_errors(where):
        conn = await _acquire(pool)
        try:
            async with conn:  # the pool's connections are not closed by this; it ends a transaction left open
                yield conn
        finally:
            await pool.putconn(conn)


async def _acquire(pool: AsyncConnectionPool[Conn]) -> Conn:
    deadline = time.monotonic() + BUSY_WAIT_SECONDS
    while True:
        try:
            return await pool.getconn(timeout=min(PROBE_EVERY_SECONDS, max(deadline - time.monotonic(), 0.1)))
        except PoolTimeout:
            if time.monotonic() >= deadline:
                raise
            await _probe(pool)  # raises psycopg.OperationalError when the server is down


async def _probe(pool: AsyncConnectionPool[Conn]) -> None:
    """Connect once outside the pool: libpq's reason when the server cannot be reached."""
    conninfo = pool.conninfo if isinstance(pool.conninfo, str) else ""
    conn = await psycopg.AsyncConnection.connect(conninfo, autocommit=True, connect_timeout=CONNECT_TIMEOUT_SECONDS)
    await conn.close()


class _CleanupWarningsAsDebug(logging.Filter):
    """While the server is down, psycopg's pool warns of each failed reconnection (every few seconds) and each
    connection it discards, and psycopg of each error it ignored while giving up a broken connection (a rollback, a
    pipeline): none is the user's business, as the task that needed the database fails with one StoreError saying
    why. They are logged at DEBUG. Of psycopg's own warnings only those "error ignored ..." are."""

    def __init__(self, prefix: str = "") -> None:
        super().__init__()
        self.prefix = prefix

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno == logging.WARNING and str(record.msg).startswith(self.prefix):
            record.levelno, record.levelname = logging.DEBUG, "DEBUG"
            return logging.getLogger(record.name).isEnabledFor(logging.DEBUG)
        return True


def _quiet_cleanup_warnings() -> None:
    for name, prefix in (("psycopg.pool", ""), ("psycopg", "error ignored"), ("psycopg.transaction", "error ignored")):
        logger = logging.getLogger(name)  # a logger's filters see its own records only, not its children's
        if not any(isinstance(f, _CleanupWarningsAsDebug) for f in logger.filters):
            logger.addFilter(_CleanupWarningsAsDebug(prefix))


async def make_pool(url: str, *, size: int = POOL_SIZE) -> AsyncConnectionPool[Conn]:
    """An open pool of autocommit connections with pgvector's adapter registered (the schema must exist)."""
    _quiet_cleanup_warnings()
    pool: AsyncConnectionPool[Conn] = AsyncConnectionPool(
        checked(url), min_size=1, max_size=size, open=False, configure=_configure, timeout=BUSY_WAIT_SECONDS,
        kwargs={"autocommit": True, "connect_timeout": CONNECT_TIMEOUT_SECONDS})
    try:
        with mapped_errors(redact(url)):
            await pool.open(wait=True, timeout=CONNECT_TIMEOUT_SECONDS)
    except BaseException:
        await pool.close()
        raise
    return pool
