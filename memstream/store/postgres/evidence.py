"""Reflections (saved in one transaction with their evidence) and the evidence they cite."""

from __future__ import annotations

from collections.abc import Sequence

from memstream.store.events import evidence_saved, touched_at
from memstream.store.postgres.loading import Loading
from memstream.store.records import NewMemory
from memstream.store.walks import EvidenceWalk, links

__all__ = ["Evidence"]


class Evidence(EvidenceWalk, Loading):
    """Saving reflections and reading their evidence."""

    async def save_reflection(self, stream: str, insights: Sequence[tuple[NewMemory, Sequence[int]]],
                              at: float, touches: dict[int, float] | None = None) -> list[int]:
        """Insights, their evidence pointers, the importance reset and the last-access updates of the
        reflection's retrievals (`touches`, id: time), in one transaction."""
        async with self.transaction():
            await self._lock([stream, *(await self._streams_of(touches or ()))])
            if touches:
                rows = await self._many_returning(
                    "UPDATE memories SET last_accessed_at = GREATEST(last_accessed_at, %s, created_at) WHERE id = %s "
                    "RETURNING stream, id, last_accessed_at", [(t, i) for i, t in sorted(touches.items())])
                await self._bump(row[0] for found in rows for row in found)
                self._announce(*touched_at(stream, {int(row[1]): float(row[2]) for found in rows for row in found}))
            ids = await self.insert([insight for insight, _ in insights])
            await self._many("INSERT INTO evidence (reflection_id, memory_id, position) VALUES (%s, %s, %s)",
                             [(reflection_id, memory_id, pos)
                              for reflection_id, (_, cited) in zip(ids, insights, strict=True)
                              for pos, memory_id in enumerate(cited)])
            self._announce(evidence_saved(stream, ids, [cited for _, cited in insights]))
            await self._execute(
                "INSERT INTO stream_state (stream, importance_since_reflection, last_reflection_at, reflections) "
                "VALUES (%s, 0, %s, 1) ON CONFLICT (stream) DO UPDATE SET importance_since_reflection = 0, "
                "last_reflection_at = excluded.last_reflection_at, reflections = stream_state.reflections + 1",
                (stream, at))
        return ids

    async def evidence(self, reflection_id: int) -> list[int]:
        """The memories a reflection cites, in citation order."""
        rows = await self._rows("SELECT memory_id FROM evidence WHERE reflection_id = %s ORDER BY position",
                                (reflection_id,))
        return [int(row[0]) for row in rows]

    async def evidence_links(self, stream: str) -> dict[int, list[int]]:
        """Every reflection of a stream (ready or not) and the memories it cites, in citation order. Read from
        the evidence pointers (a reflection cites one memory at least: min_citations), never a scan of the
        stream's memories."""
        rows = await self._rows(
            "SELECT e.reflection_id, e.memory_id FROM evidence e JOIN memories m ON m.id = e.reflection_id "
            "WHERE m.stream = %s AND m.kind = 'reflection' ORDER BY e.reflection_id, e.position", (stream,))
        return links(rows)

