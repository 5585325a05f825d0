"""Reflections on a schedule: APScheduler 3.11 jobs tied to the bot's lifecycle.

Nothing lives only in the job store: whether a stream is due is read from the database, so a restart
loses no due reflection (the periodic check, which also runs at start, finds it again).
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime

from apscheduler.schedulers.asyncio import AsyncIOScheduler

from memstream import MemoryStream, MemstreamError

__all__ = ["ReflectionScheduler"]

log = logging.getLogger("bot.scheduler")


class ReflectionScheduler:
    """One reflection job per due stream (coalesced, one at a time), plus a periodic catch-up."""

    def __init__(self, memory: MemoryStream, *, check_minutes: float = 10.0) -> None:
        self.memory = memory
        self.check_minutes = check_minutes
        self.scheduler = AsyncIOScheduler(timezone=UTC)
        self.runs: list[str] = []

    def start(self) -> None:
        """Start the scheduler (inside the running event loop)."""
        self.scheduler.add_job(self.check, "interval", minutes=self.check_minutes, id="check-due",
                               next_run_time=datetime.now(UTC), coalesce=True, max_instances=1,
                               replace_existing=True)
        self.scheduler.start()

    def shutdown(self) -> None:
        """Stop the scheduler; running jobs are not waited for (their work is transactional)."""
        if self.scheduler.running:
            self.scheduler.shutdown(wait=False)

    async def request(self, stream: str) -> None:
        """Schedule one reflection for a stream now; a request while one is queued merges with it."""
        if not self.scheduler.running:
            return
        self.scheduler.add_job(self.reflect, args=[stream], id=f"reflect:{stream}", replace_existing=True,
                               next_run_time=datetime.now(UTC), coalesce=True, max_instances=1,
                               misfire_grace_time=None)

    async def reflect(self, stream: str) -> None:
        """The job: one call into the core, which checks again that the stream is due."""
        try:
            result = await self.memory.reflect(stream, only_if_due=True)
        except MemstreamError as exc:
            log.warning("scheduled reflection on %s failed, will retry at the next check: %s", stream, exc)
            return
        if result is not None:
            self.runs.append(stream)

    async def check(self) -> None:
        """The periodic job: finish pending observations, then reflect on every stream that is due."""
        try:
            await self.memory.complete_pending()
            for stream in await self.memory.due_streams():
                await self.request(stream)
        except MemstreamError as exc:
            log.warning("periodic check failed: %s", exc)
