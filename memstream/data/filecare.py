"""Looking after a persona's database file: a consistent backup while the persona runs, and salvage of what
can still be read from a damaged file into a new one."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from memstream.errors import ConfigError, StoreError
from memstream.store.sqlite import SQLiteStore, sqlite_module

__all__ = ["SalvageReport", "backup", "salvage"]

Progress = Callable[[int, int], None]
# Tables copied by salvage, parents first, and the column that orders and ranges their rows.
_TABLES = (("memories", "id"), ("evidence", "rowid"), ("reply_traces", "id"), ("trace_messages", "rowid"),
           ("stream_state", "rowid"), ("model_usage", "rowid"), ("model_usage_daily", "rowid"),
           ("faults", "rowid"))
_META_KEEP = ("embedding_dimensions", "embedding_model")
_RANGE = 256


def backup(source: Path, dest: Path, *, force: bool = False, progress: Progress | None = None) -> int:
    """A consistent copy of `source` at `dest` (SQLite's online backup: safe while the persona runs); pages
    copied. The copy is written beside `dest` and renamed into place, readable by its owner only; an existing
    `dest` is refused unless `force`."""
    if not source.exists():
        raise ConfigError(f"{source}: no such database file")
    if dest.exists() and not force:
        raise ConfigError(f"{dest} exists: choose another path, or --force to replace it")
    if dest.resolve() == source.resolve():
        raise ConfigError(f"{dest} is the database itself: choose another path")
    module = sqlite_module()
    partial = dest.with_name(dest.name + ".partial")
    partial.unlink(missing_ok=True)
    try:
        os.close(os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    except OSError as exc:
        raise StoreError(f"cannot write {dest}: {exc}") from exc
    try:
        src = module.connect(f"file:{source}?mode=ro", uri=True)
        dst = module.connect(str(partial))
        try:
            total = int(src.execute("PRAGMA page_count").fetchone()[0])
            src.backup(dst, pages=1024, progress=None if progress is None else
                       (lambda status, remaining, pages: progress(pages - remaining, pages)))
            dst.execute("PRAGMA journal_mode=WAL").fetchone()
        finally:
            dst.close()
            src.close()
        os.replace(partial, dest)
    except module.Error as exc:
        partial.unlink(missing_ok=True)
        raise StoreError(f"backup of {source} failed: {exc}; nothing was written to {dest}") from exc
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
    return total


@dataclass
class SalvageReport:
    """What salvage copied, per table, and what it could not read."""

    copied: dict[str, int] = field(default_factory=dict)
    unreadable: dict[str, list[str]] = field(default_factory=dict)  # table: ids that could not be read
    dropped: dict[str, int] = field(default_factory=dict)  # table: rows left out (they cite unreadable rows)

    @property
    def complete(self) -> bool:
        """Everything was read."""
        return not any(self.unreadable.values())


async def salvage(source: Path, dest: Path, *, progress: Progress | None = None) -> SalvageReport:
    """Copy every row of `source` that can still be read into a new database at `dest` (same ids), and report
    the id ranges that could not be read. `dest` must not exist."""
    _check_salvage_paths(source, dest)
    module = sqlite_module()
    try:
        src = module.connect(f"file:{source}?mode=ro", uri=True)
        tables = {row[0] for row in src.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    except module.Error as exc:
        raise StoreError(f"{source}: nothing can be read (its schema is damaged too: {exc}); restore a "
                         "backup") from exc
    report = SalvageReport()
    store = await SQLiteStore.open(dest)
    try:
        for table, key in _TABLES:
            if table in tables:
                await _copy_table(src, store, table, key, report, module, progress)
        with contextlib.suppress(module.Error):
            for meta_key, value in src.execute("SELECT key, value FROM meta"):
                if meta_key in _META_KEEP:
                    await store.set_meta(meta_key, value)
    finally:
        src.close()
        await store.close()
    return report


def _check_salvage_paths(source: Path, dest: Path) -> None:
    if not source.exists():
        raise ConfigError(f"{source}: no such file")
    if dest.exists():
        raise ConfigError(f"{dest} exists: salvage writes a new file; choose another path")


async def _copy_table(src: Any, store: SQLiteStore, table: str, key: str, report: SalvageReport, module: Any,
                      progress: Progress | None) -> None:
    columns = [row[1] for row in src.execute(f"PRAGMA table_info({table})")]
    async with store.conn.execute(f"PRAGMA table_info({table})") as cur:
        wanted = [row[1] for row in await cur.fetchall() if row[1] in columns]
    select = ", ".join(wanted)
    try:
        top = int(src.execute(f"SELECT MAX({key}) FROM {table}").fetchone()[0] or 0)
    except module.Error:
        top = int(src.execute("SELECT seq FROM sqlite_sequence WHERE name = ?", (table,)).fetchone()[0]) \
            if table == "memories" else 0
    report.copied[table], report.unreadable[table] = 0, []
    insert = f"INSERT OR IGNORE INTO {table} ({select}) VALUES ({', '.join('?' * len(wanted))})"
    rows: list[tuple[Any, ...]] = []
    for low in range(1, top + 1, _RANGE):
        rows += _read(src, table, key, select, low, min(low + _RANGE, top + 1), report, module)
        if progress is not None:
            progress(min(low + _RANGE - 1, top), top)
    kept = 0
    async with store.transaction():
        if table == "memories":  # no references to check: one statement for the lot
            await store.conn.executemany(insert, rows)
            kept = len(rows)
        else:  # a row citing an unreadable memory (or trace) is left out, never pointed elsewhere
            for row in rows:
                try:
                    await store.conn.execute(insert, row)
                    kept += 1
                except StoreError:
                    report.dropped[table] = report.dropped.get(table, 0) + 1
    report.copied[table] = kept


def _read(src: Any, table: str, key: str, select: str, low: int, high: int, report: SalvageReport,
          module: Any) -> list[tuple[Any, ...]]:
    """Rows with low <= key < high; a range that fails is halved until the bad rows are found."""
    try:
        return list(src.execute(f"SELECT {select} FROM {table} WHERE {key} >= ? AND {key} < ?", (low, high)))
    except module.Error:
        if high - low <= 1:
            report.unreadable[table].append(str(low))
            return []
        middle = (low + high) // 2
        return (_read(src, table, key, select, low, middle, report, module)
                + _read(src, table, key, select, middle, high, report, module))
