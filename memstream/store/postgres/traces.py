"""Reply traces: what each reply was built from and which message it answered."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from memstream.store.postgres.evidence import Evidence
from memstream.store.records import NewTrace
from memstream.store.rowmap import TRACE_COLUMNS, TRACE_FIELDS, trace_items_to_rows, trace_to_row
from memstream.store.walks import TraceLookup

__all__ = ["Traces"]


class Traces(TraceLookup, Evidence):
    """Saving, linking and reading reply traces."""

    async def save_trace(self, trace: NewTrace) -> int:
        """Record what a reply was built from, and which message (whose) it answered."""
        async with self.transaction():
            row = await self._row(f"INSERT INTO reply_traces ({TRACE_FIELDS}) VALUES (%s, %s, %s, %s, %s, %s, %s, %s) "
                                  "RETURNING id", trace_to_row(trace))
            assert row is not None
            trace_id = int(row[0])
            await self._many("INSERT INTO trace_items (memory_id, trace_id) VALUES (%s, %s) ON CONFLICT DO NOTHING",
                             trace_items_to_rows(trace, trace_id))
        return trace_id

    async def delete_trace(self, trace_id: int) -> None:
        """Delete a reply's trace (a reply that was never delivered; its query is a message still remembered)."""
        await self._execute("DELETE FROM reply_traces WHERE id = %s", (trace_id,))

    async def link_reply(self, trace_id: int, message_ids: Sequence[str], reply_memory_id: int | None) -> None:
        """Attach the Discord message ids of a sent reply to its trace (and the first to its memory); nothing if
        the trace was deleted meanwhile (a deletion took what the reply was built from). The trace's row is
        updated first: that locks it, so a deletion by another process either came first (and nothing is
        linked) or waits for this transaction (and takes its links with the trace)."""
        if not message_ids:
            return
        async with self.transaction():
            if not await self._execute("UPDATE reply_traces SET message_id = %s WHERE id = %s",
                                       (message_ids[0], trace_id)):
                return
            await self._many("INSERT INTO trace_messages (message_id, trace_id) VALUES (%s, %s) ON CONFLICT "
                             "(message_id) DO UPDATE SET trace_id = excluded.trace_id",
                             [(m, trace_id) for m in message_ids])
            if reply_memory_id is not None:
                await self._execute("UPDATE memories SET message_id = %s WHERE id = %s AND message_id IS NULL",
                                    (message_ids[0], reply_memory_id))

    async def _trace_of_message(self, message_id: str) -> int | None:
        row = await self._row("SELECT trace_id FROM trace_messages WHERE message_id = %s", (message_id,))
        return None if row is None else int(row[0])

    async def _trace_row(self, trace_id: int) -> Sequence[Any] | None:
        return await self._row(f"SELECT {TRACE_COLUMNS} FROM reply_traces WHERE id = %s", (trace_id,))
