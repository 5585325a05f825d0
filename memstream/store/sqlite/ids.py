"""Which ids new memory rows take: the next of their stream's block (memstream.store.idblocks), reserved in
AUTOINCREMENT's sequence so that no id is ever given twice, even to a memory since deleted."""

from __future__ import annotations

from collections.abc import Sequence

from memstream.store.chunks import chunks
from memstream.store.idblocks import BLOCK, Block, allocate
from memstream.store.sqlite.counters import Counters

__all__ = ["Ids"]

# A stream's open block, unless some of its ids were taken meanwhile by rows written with their ids (a copy, a
# salvage): the stream then opens a new block.
_HELD = ("SELECT stream, next, stop FROM id_blocks AS b WHERE stream IN ({}) AND NOT EXISTS "
         "(SELECT 1 FROM memories WHERE id >= b.next AND id < b.stop)")
_KEEP = ("INSERT INTO id_blocks (stream, next, stop) VALUES (?, ?, ?) "
         "ON CONFLICT (stream) DO UPDATE SET next = excluded.next, stop = excluded.stop")


class Ids(Counters):
    """Ids for new memories."""

    async def _new_ids(self, streams: Sequence[str]) -> list[int] | None:
        """Ids for new rows of these streams (one per row, in order), their blocks stored and reserved; inside
        the insert's transaction. None when the id space is nearly spent (the insert lets SQLite choose)."""
        top = await self._top_id()
        if top + BLOCK * len(streams) >= 2**63 - 1:
            return None
        held: dict[str, Block] = {}
        for part in chunks(sorted(set(streams))):
            async with self.conn.execute(_HELD.format(", ".join("?" * len(part))), part) as cur:
                held.update({row[0]: (int(row[1]), int(row[2])) for row in await cur.fetchall()})
        made = allocate(streams, held, top)
        await self.conn.executemany(_KEEP, [(stream, *block) for stream, block in made.blocks.items()])
        if made.top > top:
            await self._reserve(made.top)
        return made.ids

    async def _reserve(self, top: int) -> None:
        """No id up to `top` is given again (AUTOINCREMENT's sequence: ids written without one start above it)."""
        cursor = await self.conn.execute("UPDATE sqlite_sequence SET seq = max(seq, ?) WHERE name = 'memories'",
                                         (top,))
        if cursor.rowcount == 0:
            await self.conn.execute("INSERT INTO sqlite_sequence (name, seq) VALUES ('memories', ?)", (top,))

    async def _top_id(self) -> int:
        """The largest memory id ever given or reserved (ids are never reused: AUTOINCREMENT's sequence
        remembers ids of memories since deleted, and the blocks opened)."""
        async with self.conn.execute("SELECT COALESCE(MAX(id), 0) FROM memories") as cur:
            row = await cur.fetchone()
        top = int(row[0]) if row else 0
        async with self.conn.execute("SELECT 1 FROM sqlite_master WHERE name = 'sqlite_sequence'") as cur:
            if await cur.fetchone() is None:  # a file migrated only part of the way (tests)
                return top
        async with self.conn.execute("SELECT seq FROM sqlite_sequence WHERE name = 'memories'") as cur:
            row = await cur.fetchone()
        return max(top, int(row[0]) if row else 0)
