"""Deletion cascades: a memory takes with it every reflection citing it and every reply built on it."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from memstream.store.chunks import chunks
from memstream.store.events import MemoriesRemoved, StreamDropped
from memstream.store.sqlite.traces import Traces
from memstream.store.walks import CascadeWalk

__all__ = ["Deletion"]


class Deletion(CascadeWalk, Traces):
    """Deleting memories, what depends on them, and whole streams."""

    async def delete(self, ids: Iterable[int], *, messages: Sequence[str] = (),
                     author: tuple[str, str] | None = None, keep: Iterable[int] = ()) -> list[int]:
        """Delete memories and, transitively, every reflection that cites one of them and every reply built
        to answer one (with its trace, whose query is the message's text). Traces answering the Discord
        `messages`, or anything the (stream, author id) `author` said, go too, stored as memories or not.
        Memories in `keep` stay (an edited message: only what was drawn from its old text goes)."""
        async with self.transaction():
            ordered = await self._doomed(ids, messages, author, keep)
            for chunk in chunks(ordered):
                marks = ",".join("?" * len(chunk))
                async with self.conn.execute(f"SELECT text FROM memories WHERE id IN ({marks})", chunk) as cur:
                    self._residue += [row[0] for row in await cur.fetchall()]
                await self.conn.execute(f"DELETE FROM memories WHERE id IN ({marks})", tuple(chunk))
            if ordered:
                self._announce(MemoriesRemoved(tuple(ordered)))
        return ordered

    async def _citing(self, ids: set[int]) -> set[int]:
        found: set[int] = set()
        for chunk in chunks(sorted(ids)):
            marks = ",".join("?" * len(chunk))
            async with self.conn.execute(
                f"SELECT DISTINCT reflection_id FROM evidence WHERE memory_id IN ({marks})", chunk
            ) as cur:
                found |= {row[0] for row in await cur.fetchall()}
        return found

    async def _replies_to(self, ids: set[int]) -> set[int]:
        """The replies (memories) built to answer these memories' messages; their traces are deleted."""
        replies: set[int] = set()
        for chunk in chunks(sorted(ids)):
            marks = ",".join("?" * len(chunk))
            where = (f"query_memory_id IN ({marks}) OR query_message_id IN (SELECT message_id FROM memories "
                     f"WHERE id IN ({marks}) AND message_id IS NOT NULL AND stream = reply_traces.stream)")
            async with self.conn.execute(f"SELECT reply_memory_id, query FROM reply_traces WHERE {where}",
                                         chunk + chunk) as cur:
                rows = list(await cur.fetchall())
            replies |= {row[0] for row in rows if row[0] is not None}
            self._residue += [row[1] for row in rows]
            await self.conn.execute(f"DELETE FROM reply_traces WHERE {where}", chunk + chunk)
        return replies

    async def _replies_using(self, ids: set[int]) -> set[int]:
        """The replies (memories) whose prompts held one of these memories; their traces are deleted."""
        replies: set[int] = set()
        for chunk in chunks(sorted(ids)):
            where = f"id IN (SELECT trace_id FROM trace_items WHERE memory_id IN ({','.join('?' * len(chunk))}))"
            async with self.conn.execute(f"SELECT reply_memory_id, query FROM reply_traces WHERE {where}",
                                         chunk) as cur:
                rows = list(await cur.fetchall())
            replies |= {row[0] for row in rows if row[0] is not None}
            self._residue += [row[1] for row in rows]
            await self.conn.execute(f"DELETE FROM reply_traces WHERE {where}", chunk)
        return replies

    async def _drop_traces(self, messages: Sequence[str], author: tuple[str, str] | None) -> set[int]:
        """Delete the traces answering these messages or this (stream, author); their replies' ids."""
        wheres: list[tuple[str, list[Any]]] = [(f"query_message_id IN ({','.join('?' * len(chunk))})", chunk)
                                               for chunk in chunks(messages)]
        if author is not None:
            wheres.append(("stream = ? AND query_author_id = ?", list(author)))
        replies: set[int] = set()
        for where, args in wheres:
            async with self.conn.execute(f"SELECT reply_memory_id, query FROM reply_traces WHERE {where}",
                                         args) as cur:
                rows = list(await cur.fetchall())
            replies |= {row[0] for row in rows if row[0] is not None}
            self._residue += [row[1] for row in rows]
            await self.conn.execute(f"DELETE FROM reply_traces WHERE {where}", args)
        return replies

    async def purge_stream(self, stream: str) -> int:
        """Delete a whole stream: memories, traces, state, usage and fault counts."""
        self._vacuum_due = True  # a whole stream: rewriting the file is cheaper than looking for its texts
        async with self.transaction():
            cursor = await self.conn.execute("DELETE FROM memories WHERE stream = ?", (stream,))
            for table in ("reply_traces", "stream_state", "model_usage", "model_usage_daily", "faults",
                          "stream_numbers", "id_blocks"):
                await self.conn.execute(f"DELETE FROM {table} WHERE stream = ?", (stream,))
            self._announce(StreamDropped(stream))
        return cursor.rowcount

