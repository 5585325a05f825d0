"""Reflections (saved in one transaction with their evidence) and the evidence they cite."""

from __future__ import annotations

from collections.abc import Sequence

from memstream.store.events import evidence_saved, touched_at
from memstream.store.records import NewMemory
from memstream.store.sqlite.loading import Loading
from memstream.store.walks import EvidenceWalk, links

__all__ = ["Evidence"]

# A stream's evidence pointers. CROSS JOIN: the stream's reflections first (their own index, migration 0009: never
# a look at its observations), then each one's pointers by key; not every stream's evidence.
STREAM_EVIDENCE = ("SELECT e.reflection_id, e.memory_id FROM memories m INDEXED BY memories_reflections "
                   "CROSS JOIN evidence e ON e.reflection_id = m.id "
                   "WHERE m.stream = ? AND m.kind = 'reflection' ORDER BY e.reflection_id, e.position")


class Evidence(EvidenceWalk, Loading):
    """Saving reflections and reading their evidence."""

    async def save_reflection(self, stream: str, insights: Sequence[tuple[NewMemory, Sequence[int]]],
                              at: float, touches: dict[int, float] | None = None) -> list[int]:
        """Insights, their evidence pointers, the importance reset and the last-access updates of the
        reflection's retrievals (`touches`, id: time), in one transaction."""
        async with self.transaction():
            if touches:
                await self.conn.executemany("UPDATE memories SET last_accessed_at = "
                                            "max(last_accessed_at, ?, created_at) WHERE id = ?",
                                            [(t, i) for i, t in touches.items()])
                ids = sorted(touches)  # what each last access is now (a later one than the touch stays)
                rows = await self.conn.execute_fetchall(
                    f"SELECT id, last_accessed_at FROM memories WHERE id IN ({','.join('?' * len(ids))})", ids)
                self._announce(*touched_at(stream, {int(i): float(at) for i, at in rows}))
            ids = await self.insert([insight for insight, _ in insights])
            for reflection_id, (_, cited) in zip(ids, insights, strict=True):
                await self.conn.executemany(
                    "INSERT INTO evidence (reflection_id, memory_id, position) VALUES (?, ?, ?)",
                    [(reflection_id, memory_id, pos) for pos, memory_id in enumerate(cited)],
                )
            self._announce(evidence_saved(stream, ids, [cited for _, cited in insights]))
            await self.conn.execute(
                "INSERT INTO stream_state (stream, importance_since_reflection, last_reflection_at, reflections) "
                "VALUES (?, 0, ?, 1) ON CONFLICT (stream) DO UPDATE SET importance_since_reflection = 0, "
                "last_reflection_at = excluded.last_reflection_at, reflections = reflections + 1",
                (stream, at),
            )
        return ids

    async def evidence(self, reflection_id: int) -> list[int]:
        """The memories a reflection cites, in citation order."""
        async with self.conn.execute(
            "SELECT memory_id FROM evidence WHERE reflection_id = ? ORDER BY position", (reflection_id,)
        ) as cur:
            return [row[0] for row in await cur.fetchall()]

    async def evidence_links(self, stream: str) -> dict[int, list[int]]:
        """Every reflection of a stream (ready or not) and the memories it cites, in citation order. Only this
        stream's rows are read (its reflections through their index, then each one's pointers by key): never
        another stream's pages, so a page damaged in one stream cannot stop another from loading."""
        rows = await self.conn.execute_fetchall(STREAM_EVIDENCE, (stream,))
        return links(rows)


