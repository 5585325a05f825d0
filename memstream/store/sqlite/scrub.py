"""After a deletion, the deleted texts out of the file: the WAL truncated, and the file rewritten when a copy
of a deleted text is still found in it.

Both run on a short-lived connection of their own, never on the store's: the store's connection is shared by
the process's tasks, and one of them may be inside a write transaction or in the middle of a read when a
deletion comes (SQLite refuses a checkpoint or a VACUUM there, and a busy timeout changed for the scrub would
change theirs). To the scrub's connection they are just another connection: it waits for them."""

from __future__ import annotations

import asyncio
import logging
import mmap
import os
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from typing import Any

from memstream.store.sqlite import connection
from memstream.store.sqlite.binding import sqlite_module
from memstream.store.sqlite.deletion import Deletion

__all__ = ["SEARCH_BUDGET_BYTES", "Scrub", "residue_needles"]

log = logging.getLogger(__name__)
# A deletion whose texts would take longer to search the file for than this many bytes (needles x file size)
# rewrites the file without searching.
SEARCH_BUDGET_BYTES = 4 * 2**30
# In the meta table while a scrub after a deletion could not truncate the WAL (a reader held it).
_SCRUB_MARK = "scrub_pending_since"


def residue_needles(texts: Iterable[str]) -> list[bytes]:
    """What to look for in the file to find a copy (or a piece of one, on an overflow page) of deleted texts:
    each text's UTF-8 bytes in 24-byte windows every 256 bytes; texts under 8 bytes are not searched for
    (they match everywhere, and say nothing)."""
    needles: set[bytes] = set()
    for text in texts:
        data = text.encode("utf-8", "surrogatepass")
        if len(data) < 8:
            continue
        if len(data) <= 24:
            needles.add(data)
            continue
        needles.update(data[i:i + 24] for i in range(0, len(data) - 23, 256))
    return sorted(needles)


def _size(path: str) -> int:
    return os.path.getsize(path) if os.path.exists(path) else 0


def _on_own_connection(path: str, wait: float, *statements: str) -> Any:
    """Run statements on a connection of their own (waiting up to `wait` seconds for another connection's lock);
    the last one's first row. Blocking: run in a thread."""
    module = sqlite_module()
    try:
        conn = module.connect(path, isolation_level=None, timeout=wait, check_same_thread=False)
        try:
            row = None
            for statement in statements:
                row = conn.execute(statement).fetchone()
            return row
        finally:
            conn.close()
    except module.Error as exc:
        raise connection.store_error(exc, path, waited=wait) from exc


def _file_holds_any(path: str, needles: Sequence[bytes]) -> bool:
    if not needles or not os.path.exists(path) or os.path.getsize(path) == 0:
        return False
    with open(path, "rb") as file, mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as data:
        return any(data.find(needle) >= 0 for needle in needles)


class Scrub(Deletion):
    """Scrubbing the file after a deletion."""

    async def scrub(self, *, wait: float = 2.0) -> bool:
        """After a deletion for privacy: copy the WAL into the file and truncate it, so that the deleted
        text (zeroed in the file by secure_delete) survives in no old WAL frame either. True when done.

        Another connection in the middle of a read keeps the WAL from being truncated: this tries again for
        up to `wait` seconds, then returns False and leaves a mark, and the scrub is finished the next time
        this file is opened or closed by memstream (finish_scrub)."""
        if self.path == ":memory:":
            return True
        if await self._checkpoint(wait) and await self._rewrite_residue(wait):
            if await self.get_meta(_SCRUB_MARK) is not None:
                await self.conn.execute("DELETE FROM meta WHERE key = ?", (_SCRUB_MARK,))
                await self._checkpoint(wait)
            return True
        await self.set_meta(_SCRUB_MARK, datetime.now(UTC).isoformat())
        log.warning("%s: another connection is reading; deleted text stays in the write-ahead log until it "
                    "lets go (memstream finishes the scrub the next time it opens or closes this file)", self.path)
        return False

    async def _rewrite_residue(self, wait: float) -> bool:
        """secure_delete zeroes a deleted row, but a copy an earlier page split left in a page that still
        holds live rows stays. So the file is searched for the deleted texts (one pass per needle, ~2 GB/s;
        a deletion too large to search cheaply skips the search) and rewritten (VACUUM: time and space of
        one copy of the file) when a copy is found. Most deletions cost the search only. False when the
        rewritten pages could not be copied into the file within `wait` seconds (a reader held them up: the
        old pages stay in the file until a later checkpoint, which the scrub's mark asks for)."""
        texts, self._residue = self._residue, []
        vacuum, self._vacuum_due = self._vacuum_due, False
        if not texts and not vacuum:
            return True
        if not vacuum:
            needles = residue_needles(texts)
            size = await asyncio.to_thread(_size, self.path)
            vacuum = len(needles) * size > SEARCH_BUDGET_BYTES or await asyncio.to_thread(
                _file_holds_any, self.path, needles)
        if vacuum:  # waits for another connection's write as long as any statement of the store does
            await asyncio.to_thread(_on_own_connection, self.path, connection.LOCK_WAIT_SECONDS,
                                    "PRAGMA secure_delete=ON", "VACUUM")
            return await self._checkpoint(wait)
        return True

    async def _checkpoint(self, wait: float) -> bool:
        """Copy the WAL into the file and truncate it, waiting up to `wait` seconds for writers and readers
        (the store's own connection too); True if done."""
        row = await asyncio.to_thread(_on_own_connection, self.path, wait, "PRAGMA wal_checkpoint(TRUNCATE)")
        return row is None or not row[0]

    async def finish_scrub(self) -> bool:
        """Finish a scrub that a reader held up (see scrub); True if none is left to do."""
        if self.path == ":memory:" or await self.get_meta(_SCRUB_MARK) is None:
            return True
        return await self.scrub(wait=0.0)

