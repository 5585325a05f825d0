"""Rows of any table in key order, and rows written as they are (same ids): what `memstream copy` needs."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from memstream.store.events import dropped_streams
from memstream.store.sqlite.rows import to_blob
from memstream.store.sqlite.scrub import Scrub
from memstream.store.tables import Table

__all__ = ["Transfer"]


class Transfer(Scrub):
    """Reading and writing whole rows of a table, for copying a persona between backends."""

    async def table_rows(self, table: Table, after: Sequence[Any] | None, limit: int) -> list[tuple[Any, ...]]:
        """Up to `limit` rows of `table` whose key is after `after` (all, if None), in key order (bytewise for
        text); embeddings as float32 arrays."""
        key = ", ".join(table.key)
        where, args = ("", []) if after is None else (f"WHERE ({key}) > ({', '.join('?' * len(after))})", list(after))
        async with self.conn.execute(f"SELECT {', '.join(table.columns)} FROM {table.name} {where} ORDER BY {key} "
                                     "LIMIT ?", [*args, limit]) as cur:
            rows = [tuple(row) for row in await cur.fetchall()]
        if "embedding" in table.columns:
            at = table.columns.index("embedding")
            rows = [(*r[:at], None if r[at] is None else np.frombuffer(r[at], "<f4").astype(np.float32), *r[at + 1:])
                    for r in rows]
        return rows

    async def put_rows(self, table: Table, rows: Sequence[Sequence[Any]]) -> None:
        """Write rows as they are, in one transaction; a row whose key is already there is left alone."""
        if "embedding" in table.columns:
            at = table.columns.index("embedding")
            rows = [(*r[:at], None if r[at] is None else to_blob(r[at]), *r[at + 1:]) for r in rows]
        async with self.transaction():
            await self.conn.executemany(f"INSERT OR IGNORE INTO {table.name} ({', '.join(table.columns)}) VALUES "
                                        f"({', '.join('?' * len(table.columns))})", [tuple(r) for r in rows])
            self._announce(*dropped_streams(table, rows))

    async def last_key(self, table: Table) -> tuple[Any, ...] | None:
        """The largest key in `table` (None if empty)."""
        order = ", ".join(f"{column} DESC" for column in table.key)
        async with self.conn.execute(f"SELECT {', '.join(table.key)} FROM {table.name} ORDER BY {order} "
                                     "LIMIT 1") as cur:
            row = await cur.fetchone()
        return None if row is None else tuple(row)

    async def count_rows(self, table: Table) -> int:
        """Rows in `table`."""
        async with self.conn.execute(f"SELECT COUNT(*) FROM {table.name}") as cur:
            row = await cur.fetchone()
        return int(row[0]) if row else 0

    async def id_floor(self, table: Table) -> int:
        """The largest id `table` ever gave (its sequence remembers ids since deleted)."""
        async with self.conn.execute("SELECT seq FROM sqlite_sequence WHERE name = ?", (table.name,)) as cur:
            row = await cur.fetchone()
        top = await self.last_key(table)
        return max(int(row[0]) if row else 0, int(top[0]) if top else 0)

    async def optimize(self) -> None:
        """After a bulk write: SQLite's own upkeep of its query planner's statistics."""
        async with self.conn.execute("PRAGMA optimize"):
            pass

    async def raise_id_floor(self, table: Table, floor: int) -> None:
        """New ids of `table` start above `floor` (never lowered)."""
        async with self.transaction():
            cursor = await self.conn.execute("UPDATE sqlite_sequence SET seq = max(seq, ?) WHERE name = ?",
                                             (floor, table.name))
            if cursor.rowcount == 0:
                await self.conn.execute("INSERT INTO sqlite_sequence (name, seq) VALUES (?, ?)", (table.name, floor))
