"""What processes sharing one database claim before they work: a stream's reflection (a session advisory lock on
a connection of its own, released by PostgreSQL itself if the process dies). Pending memories are claimed in
pending_memories (and at insert), for as long as the claiming process is there (presence.py)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

from memstream.store.postgres.connection import connect, mapped_errors
from memstream.store.postgres.deletion import Deletion

__all__ = ["Claims"]

_REFLECT_KEY = "SELECT hashtextextended('memstream reflect ' || %s, 0)"


class Claims(Deletion):
    """Claims on work that one process at a time must do."""

    @contextlib.asynccontextmanager
    async def reflection_claim(self, stream: str) -> AsyncIterator[bool]:
        """Whether this process holds the reflection of `stream` for the block: no other process reflects on
        it until the block ends (yields False, at once, while another one does)."""
        # A connection of its own, not the pool's: a reflection's writes take pool connections while the
        # claim is held, and many streams reflecting at once must not wait for each other's claims.
        async with connect(self.url) as conn:
            with mapped_errors(self.path):
                cur = await conn.execute(f"SELECT pg_try_advisory_lock(({_REFLECT_KEY}))", (stream,))
                row = await cur.fetchone()
            held = bool(row and row[0])
            try:
                yield held
            finally:
                if held:
                    with mapped_errors(self.path):
                        await conn.execute(f"SELECT pg_advisory_unlock(({_REFLECT_KEY}))", (stream,))
