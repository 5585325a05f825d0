"""Whether a process that claimed pending work is still there: from its first claim until it closes its store, a
process holds a session advisory lock on a random key of its own, on a connection of its own. Its claims carry
that key (`memories.claimed_by`); a claim whose owner holds no such lock is free at once, so the process that
starts after a crash, a kill or a shutdown retries what the last one left without waiting for the claims to run
out (PostgreSQL drops a session's locks with the session; CLAIM_SECONDS still ends a claim whose owner's
connection the server has not seen close, e.g. a machine that vanished)."""

from __future__ import annotations

import asyncio
import secrets

from memstream.store.postgres.connection import Conn, mapped_errors, open_connection

__all__ = ["LIVE_OWNERS", "Presence"]

# The owners whose presence lock is held now (advisory locks taken with one bigint key, in this database).
LIVE_OWNERS = ("SELECT (classid::int8 << 32) | objid::int8 FROM pg_locks WHERE locktype = 'advisory' AND granted "
               "AND objsubid = 1 AND database = (SELECT oid FROM pg_database WHERE datname = current_database())")


class Presence:
    """This process's presence lock on one database, taken at the first `owner()` call."""

    def __init__(self, url: str, path: str) -> None:
        self.url, self.path = url, path
        self.key = secrets.randbits(62) + 1  # positive: (classid << 32) | objid gives it back
        self._conn: Conn | None = None
        self._taking = asyncio.Lock()

    async def owner(self) -> int:
        """The key a claim of this process carries, once its lock is held (taken again if the connection
        holding it broke)."""
        async with self._taking:
            if self._conn is None or self._conn.closed:
                conn = await open_connection(self.url)
                try:
                    with mapped_errors(self.path):
                        await conn.execute("SELECT pg_advisory_lock(%s)", (self.key,))
                except BaseException:
                    await conn.close()
                    raise
                self._conn = conn
        return self.key

    async def close(self) -> None:
        """Let go of the lock (and with it every claim of this process still open)."""
        conn, self._conn = self._conn, None
        if conn is not None:
            await conn.close()
