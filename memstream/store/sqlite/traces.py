"""Reply traces: what each reply was built from and which message it answered."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from memstream.clock import from_timestamp
from memstream.store.sqlite.evidence import Evidence

__all__ = ["Traces"]


class Traces(Evidence):
    """Saving, linking and reading reply traces."""

    async def save_trace(self, stream: str, at: float, query: str, items: list[dict[str, Any]],
                         reply_memory_id: int | None, *, query_memory_id: int | None = None,
                         query_message_id: str | None = None, query_author_id: str | None = None) -> int:
        """Record what a reply was built from, and which message (whose) it answered."""
        async with self.transaction():
            return await self._save_trace(stream, at, query, items, reply_memory_id, query_memory_id,
                                          query_message_id, query_author_id)

    async def _save_trace(self, stream: str, at: float, query: str, items: list[dict[str, Any]],
                          reply_memory_id: int | None, query_memory_id: int | None, query_message_id: str | None,
                          query_author_id: str | None) -> int:
        cursor = await self.conn.execute(
            "INSERT INTO reply_traces (stream, created_at, query, reply_memory_id, items, query_memory_id, "
            "query_message_id, query_author_id) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (stream, at, query, reply_memory_id, json.dumps(items), query_memory_id, query_message_id,
             query_author_id),
        )
        assert cursor.lastrowid is not None
        await self.conn.executemany("INSERT OR IGNORE INTO trace_items (memory_id, trace_id) VALUES (?, ?)",
                                    [(int(item["id"]), cursor.lastrowid) for item in items])
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

    async def trace(self, *, trace_id: int | None = None, message_id: str | None = None) -> dict[str, Any] | None:
        """A reply trace by its id or by the Discord message id of any part of the reply."""
        if trace_id is None and message_id is not None:
            async with self.conn.execute("SELECT trace_id FROM trace_messages WHERE message_id = ?",
                                         (message_id,)) as cur:
                row = await cur.fetchone()
            if row is None:
                return None
            trace_id = int(row[0])
        async with self.conn.execute(
            "SELECT id, stream, created_at, query, reply_memory_id, message_id, items FROM reply_traces "
            "WHERE id = ?", (trace_id,)
        ) as cur:
            found = await cur.fetchone()
        if found is None:
            return None
        return {"id": found[0], "stream": found[1], "created_at": from_timestamp(found[2]), "query": found[3],
                "reply_memory_id": found[4], "message_id": found[5], "items": json.loads(found[6])}

