"""`memstream copy SRC DST`: a persona's memory moved between backends (SQLite <-> PostgreSQL), same ids.

Every table is copied in key order, a batch at a time, each batch one transaction on DST that skips rows
already there: a copy that stops (killed, a lost connection) is resumed by running it again, from the
largest key DST holds, and no row is ever written twice. The id sequences are carried over (ids of
memories deleted in SRC are not given again in DST). At the end the copy is checked: row counts of every
table, the counts of every stream, and the same top k for sample queries in the largest streams.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from memstream.config import StreamConfig, show_database
from memstream.errors import ConfigError, StoreError
from memstream.index.ranking import rank
from memstream.index.vectors import StreamVectors
from memstream.store import Store, is_database_url
from memstream.store.tables import TABLES, Table

__all__ = ["BATCH_ROWS", "CopyReport", "copy_store", "describe"]

BATCH_ROWS = 2000
# Meta keys that describe one database, not the persona: never copied.
_LOCAL_META = {"scrub_pending_since", "copied_from"}
_SAMPLE_STREAMS = 3
_SAMPLE_QUERIES = 3
Progress = Callable[[str, int, int], None]


@dataclass
class CopyReport:
    """What a copy did: rows copied now and present in all, per table; and what the check compared."""

    copied: dict[str, int] = field(default_factory=dict)
    total: dict[str, int] = field(default_factory=dict)
    streams: int = 0
    queries: int = 0


async def copy_store(src: Store, dst: Store, *, source: str, batch: int = BATCH_ROWS,
                     progress: Progress | None = None, k: int = 10) -> CopyReport:
    """Copy everything of `src` into `dst` (empty, or holding an earlier, stopped copy of the same source:
    `source` names it), then check it. Raises StoreError when DST holds anything else, or the check fails."""
    marked = await dst.get_meta("copied_from")
    if marked is None and any([await dst.count_rows(t) for t in TABLES if t.name != "meta"]):
        raise ConfigError(f"{dst.path} already holds a persona's memory: copy into a new, empty database")
    if marked is not None and marked != source:
        raise ConfigError(f"{dst.path} holds a copy of {marked}, not of {source}: copy into a new, empty database")
    await dst.set_meta("copied_from", source)
    report = CopyReport()
    for table in TABLES:
        report.copied[table.name] = await _copy_table(src, dst, table, batch, progress)
        if table.sequence:
            await dst.raise_id_floor(table, await src.id_floor(table))
    await dst.optimize()
    await _check(src, dst, report, k)
    return report


async def _copy_table(src: Store, dst: Store, table: Table, batch: int, progress: Progress | None) -> int:
    total = await src.count_rows(table)
    after = await dst.last_key(table)
    done = 0 if after is None else await dst.count_rows(table)
    copied = 0
    if progress is not None:
        progress(table.name, done, total)
    while rows := await src.table_rows(table, after, batch):
        after = rows[-1][: len(table.key)] if table.key == table.columns[: len(table.key)] else _key(table, rows[-1])
        if table.name == "meta":
            rows = [row for row in rows if row[0] not in _LOCAL_META]
        await dst.put_rows(table, rows)
        copied += len(rows)
        done += len(rows)
        if progress is not None:
            progress(table.name, min(done, total), total)
    return copied


def _key(table: Table, row: tuple[Any, ...]) -> tuple[Any, ...]:
    return tuple(row[table.columns.index(column)] for column in table.key)


async def _check(src: Store, dst: Store, report: CopyReport, k: int) -> None:
    """Row counts of every table, counts of every stream, and the same top k for sample queries."""
    for table in TABLES:
        have, want = await dst.count_rows(table), await src.count_rows(table)
        if table.name == "meta":
            have -= 1  # copied_from
            want -= int(await src.get_meta("scrub_pending_since") is not None) + int(
                await src.get_meta("copied_from") is not None)
        report.total[table.name] = have
        if have != want:
            raise StoreError(f"the copy is incomplete: {table.name} has {have} rows in {dst.path}, {want} in "
                             f"{src.path}; run the copy again to finish it")
    streams = await src.streams()
    if streams != await dst.streams():
        raise StoreError(f"the copy's streams differ from {src.path}'s")
    sizes = []
    for stream in streams:
        counts = await src.counts(stream)
        if counts != await dst.counts(stream):
            raise StoreError(f"stream {stream!r} differs between {src.path} and {dst.path}")
        sizes.append((counts.observations + counts.reflections, stream))
    report.streams = len(streams)
    config = StreamConfig()
    for _, stream in sorted(sizes, reverse=True)[:_SAMPLE_STREAMS]:
        here, there = StreamVectors(await src.load_stream(stream)), StreamVectors(await dst.load_stream(stream))
        if here.n == 0:
            continue
        rng = np.random.default_rng(len(stream))
        now = float(max(here.last_accessed.max(), here.created.max()))
        for row in rng.choice(here.n, size=min(_SAMPLE_QUERIES, here.n), replace=False).tolist():
            query = here.gather([row])[0]
            mine = here.ids[rank(here, query, now, config, k).rows].tolist()
            theirs = there.ids[rank(there, query, now, config, k).rows].tolist()
            if mine != theirs:
                raise StoreError(f"retrieval differs between {src.path} and {dst.path} in stream {stream!r}: "
                                 f"{mine} against {theirs}")
            report.queries += 1


def describe(location: str | Path) -> str:
    """A location as the copy names its source (a URL without its password, or a file's absolute path)."""
    return show_database(location) if is_database_url(location) else str(
        Path(location).resolve())
