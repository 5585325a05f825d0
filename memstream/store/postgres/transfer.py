"""Rows of any table in key order, and rows written as they are (same ids): what `memstream copy` needs."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from memstream.store.events import dropped_streams
from memstream.store.postgres.claims import Claims
from memstream.store.postgres.connection import connect, mapped_errors
from memstream.store.tables import Table

__all__ = ["Transfer"]


def _key(table: Table) -> str:
    """The key columns, text compared bytewise (as SQLite does), so both backends agree on the order."""
    text = {"stream", "kind", "role", "key", "message_id"}
    return ", ".join(f'{c} COLLATE "C"' if c in text else c for c in table.key)


class Transfer(Claims):
    """Reading and writing whole rows of a table, for copying a persona between backends."""

    async def table_rows(self, table: Table, after: Sequence[Any] | None, limit: int) -> list[tuple[Any, ...]]:
        """Up to `limit` rows of `table` whose key is after `after` (all, if None), in key order (bytewise for
        text); embeddings as float32 arrays."""
        key = _key(table)
        where, args = ("", []) if after is None else (
            f"WHERE ({key}) > ({', '.join(['%s'] * len(after))})", list(after))
        rows = await self._rows(f"SELECT {', '.join(table.columns)} FROM {table.name} {where} ORDER BY {key} "
                                "LIMIT %s", [*args, limit])
        if "embedding" in table.columns:
            at = table.columns.index("embedding")
            rows = [(*r[:at], None if r[at] is None else np.asarray(r[at].to_numpy(), np.float32), *r[at + 1:])
                    for r in rows]
        return rows

    async def put_rows(self, table: Table, rows: Sequence[Sequence[Any]]) -> None:
        """Write rows as they are, in one transaction; a row whose key is already there is left alone."""
        streams = {r[table.columns.index("stream")] for r in rows} if table.name == "memories" else set()
        async with self.transaction():
            await self._lock(streams)
            await self._many(f"INSERT INTO {table.name} ({', '.join(table.columns)}) VALUES "
                             f"({', '.join(['%s'] * len(table.columns))}) ON CONFLICT DO NOTHING", rows)
            await self._bump(streams)
            self._announce(*dropped_streams(table, rows))

    async def last_key(self, table: Table) -> tuple[Any, ...] | None:
        """The largest key in `table` (None if empty)."""
        key = _key(table)
        order = ", ".join(f"{part} DESC" for part in key.split(", "))
        row = await self._row(f"SELECT {', '.join(table.key)} FROM {table.name} ORDER BY {order} LIMIT 1")
        return None if row is None else tuple(row)

    async def count_rows(self, table: Table) -> int:
        """Rows in `table`."""
        row = await self._row(f"SELECT COUNT(*) FROM {table.name}")
        return int(row[0]) if row else 0

    async def id_floor(self, table: Table) -> int:
        """The largest id `table` ever gave (its sequence remembers ids since deleted)."""
        row = await self._row(f"SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM "
                              f"{table.name}_id_seq")
        top = await self.last_key(table)
        return max(int(row[0]) if row else 0, int(top[0]) if top else 0)

    async def optimize(self) -> None:
        """After a bulk write: VACUUM ANALYZE (outside a transaction), so that the planner reads a stream's id
        ranges by index and index-only scans see the visibility map, as autovacuum would set them later."""
        async with connect(self.url) as conn:
            with mapped_errors(self.path):
                await conn.execute("VACUUM (ANALYZE)")

    async def raise_id_floor(self, table: Table, floor: int) -> None:
        """New ids of `table` start above `floor` (never lowered)."""
        if floor > 0:
            await self._execute(f"SELECT setval(pg_get_serial_sequence('{table.name}', 'id'), GREATEST(%s, "
                                f"(SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM {table.name}_id_seq)))",
                                (floor,))
