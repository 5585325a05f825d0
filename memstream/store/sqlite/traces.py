"""Reply traces: what each reply was built from and which message it answered."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from memstream.store.records import NewTrace
from memstream.store.rowmap import TRACE_COLUMNS, TRACE_FIELDS, trace_items_to_rows, trace_to_row
from memstream.store.sqlite.evidence import Evidence
from memstream.store.walks import TraceLookup

__all__ = ["Traces"]


class Traces(TraceLookup, Evidence):
    """Saving, linking and reading reply traces."""

    async def save_trace(self, trace: NewTrace) -> int:
        """Record what a reply was built from, and which message (whose) it answered."""
        async with self.transaction():
            cursor = await self.conn.execute(
                f"INSERT INTO reply_traces ({TRACE_FIELDS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?)", trace_to_row(trace))
            assert cursor.lastrowid is not None
            await self.conn.executemany("INSERT OR IGNORE INTO trace_items (memory_id, trace_id) VALUES (?, ?)",
                                        trace_items_to_rows(trace, cursor.lastrowid))
            return cursor.lastrowid

    async def delete_trace(self, trace_id: int) -> None:
        """Delete a reply's trace (a reply that was never delivered; its query is a message still remembered)."""
        await self.conn.execute("DELETE FROM reply_traces WHERE id = ?", (trace_id,))

    async def link_reply(self, trace_id: int, message_ids: Sequence[str], reply_memory_id: int | None) -> None:
        """Attach the Discord message ids of a sent reply to its trace (and the first to its memory); nothing if
        the trace was deleted meanwhile (a deletion took what the reply was built from)."""
        if not message_ids:
            return
        async with self.transaction():
            async with self.conn.execute("UPDATE reply_traces SET message_id = ? WHERE id = ?",
                                         (message_ids[0], trace_id)) as cursor:
                if cursor.rowcount == 0:
                    return
            await self.conn.executemany(
                "INSERT OR REPLACE INTO trace_messages (message_id, trace_id) VALUES (?, ?)",
                [(m, trace_id) for m in message_ids],
            )
            if reply_memory_id is not None:
                await self.conn.execute("UPDATE memories SET message_id = ? WHERE id = ? AND message_id IS NULL",
                                        (message_ids[0], reply_memory_id))

    async def _trace_of_message(self, message_id: str) -> int | None:
        async with self.conn.execute("SELECT trace_id FROM trace_messages WHERE message_id = ?", (message_id,)) as cur:
            row = await cur.fetchone()
        return None if row is None else int(row[0])

    async def _trace_row(self, trace_id: int) -> Sequence[Any] | None:
        async with self.conn.execute(f"SELECT {TRACE_COLUMNS} FROM reply_traces WHERE id = ?", (trace_id,)) as cur:
            row: Sequence[Any] | None = await cur.fetchone()
        return row
