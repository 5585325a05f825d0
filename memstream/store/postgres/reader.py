"""Reading a stream's ready rows from PostgreSQL into arrays (memstream.store.postgres.grouped), in threads, each
on its own connection inside one exported snapshot (so that all of them read the same moment of the database),
or on the connection of the caller's transaction. psycopg waits for the server with the GIL released, and
numpy converts a group with it released too, so the readers and their server processes overlap.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import psycopg

from memstream.store import _load
from memstream.store.postgres.grouped import PLAN, Group, GroupReader, copy_sql

__all__ = ["plan", "read_here", "read_parts"]


async def plan(conn: Any, stream: str) -> list[Group]:
    """The stream's ready rows as groups (in id order), read on `conn` (inside the load's snapshot)."""
    cur = await conn.execute(PLAN, (stream,))
    return [(int(low), int(high), int(n)) for low, high, n in await cur.fetchall()]


def _arrays(groups: Sequence[Group]) -> tuple[list[int], list[int]]:
    return [g[0] for g in groups], [g[1] for g in groups]


def _read(url: str, snapshot: str, stream: str, groups: Sequence[Group], dim: int, texts: bool,
          sources: bool) -> _load.Part:
    reader = GroupReader(groups, dim, texts=texts, sources=sources)
    with psycopg.connect(url, client_encoding="UTF8") as conn:
        conn.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
        conn.read_only = True
        conn.execute(f"SET TRANSACTION SNAPSHOT '{snapshot}'")  # an id PostgreSQL made (hex digits and dashes)
        with conn.cursor() as cur, cur.copy(copy_sql(dim, texts=texts, sources=sources),
                                            (*_arrays(groups), stream)) as copy:
            for data in copy:
                reader.feed(data)
        conn.rollback()
    return reader.finish()


def read_parts(url: str, snapshot: str, stream: str, runs: Sequence[Sequence[Group]], dim: int, *,
               texts: bool = False, sources: bool = False) -> list[_load.Part]:
    """The ready rows of a stream in these runs of groups, one thread and connection each, all in the exported
    `snapshot`; with `texts`, their texts too, and with `sources` their sources."""
    if len(runs) == 1:
        return [_read(url, snapshot, stream, runs[0], dim, texts, sources)]
    with ThreadPoolExecutor(len(runs), thread_name_prefix="memstream-load") as pool:
        return list(pool.map(lambda run: _read(url, snapshot, stream, run, dim, texts, sources), runs))


async def read_here(conn: Any, stream: str, groups: Sequence[Group], dim: int, *, texts: bool = False,
                    sources: bool = False) -> _load.Part:
    """The ready rows of a stream in these groups, read on `conn` (the caller's transaction: what it sees, its
    own writes too)."""
    reader = GroupReader(groups, dim, texts=texts, sources=sources, encoding=conn.info.encoding)
    async with conn.cursor() as cur, cur.copy(copy_sql(dim, texts=texts, sources=sources),
                                              (*_arrays(groups), stream)) as copy:
        async for data in copy:
            reader.feed(data)
    return reader.finish()
