"""Reflections on a schedule: APScheduler 3.11 jobs tied to the bot's lifecycle.

Nothing lives only in the job store: whether a stream is due, and which observations are still pending,
is read from the database, so a restart loses nothing (the periodic check, which also runs at start,
finds it again). Pending observations are retried every PENDING_SECONDS once their backoff has passed
(memstream.store.retry_delay); at start, all of them at once.

A process running some shards of a sharded bot (`owns`) touches only its own streams: several processes
share the database, and each stream is reflected on and retried by exactly one of them.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from datetime import UTC, datetime

from apscheduler.schedulers.asyncio import AsyncIOScheduler

from memstream import MemoryStream, MemstreamError, ProviderError

__all__ = ["PENDING_SECONDS", "ReflectionScheduler"]

log = logging.getLogger("bot.scheduler")
PENDING_SECONDS = 60.0


class ReflectionScheduler:
    """One reflection job per due stream (coalesced, one at a time), plus a periodic catch-up."""

    def __init__(self, memory: MemoryStream, *, check_minutes: float = 10.0,
                 owns: Callable[[str], bool] | None = None) -> None:
        self.memory = memory
        self.owns = owns  # which streams this process serves (None: all of them)
        self.check_minutes = check_minutes
        self.scheduler = AsyncIOScheduler(timezone=UTC)
        self.runs: list[str] = []
        self._started = False
        self._running: set[str] = set()
        self._rater_flat = False  # the flat-rater alarm is in the log already

    def start(self) -> None:
        """Start the scheduler (inside the running event loop)."""
        self.scheduler.add_job(self.check, "interval", minutes=self.check_minutes, id="check-due",
                               next_run_time=datetime.now(UTC), coalesce=True, max_instances=1,
                               replace_existing=True)
        self.scheduler.add_job(self.check_pending, "interval", seconds=PENDING_SECONDS, id="retry-pending",
                               coalesce=True, max_instances=1, replace_existing=True)
        self.scheduler.start()

    def shutdown(self) -> None:
        """Stop the scheduler; running jobs are not waited for (their work is transactional)."""
        if self.scheduler.running:
            self.scheduler.shutdown(wait=False)

    async def request(self, stream: str) -> None:
        """Schedule one reflection for a stream now; a request while one is queued merges with it."""
        if not self.scheduler.running or stream in self._running or (self.owns is not None and not self.owns(stream)):
            return  # a reflection running now resets the total; the periodic check catches anything after
        self.scheduler.add_job(self.reflect, args=[stream], id=f"reflect:{stream}", replace_existing=True,
                               next_run_time=datetime.now(UTC), coalesce=True, max_instances=1,
                               misfire_grace_time=None)

    async def reflect(self, stream: str) -> None:
        """The job: one call into the core, which checks again that the stream is due."""
        self._running.add(stream)
        try:
            result = await self.memory.reflect(stream, only_if_due=True)
        except ProviderError:
            return  # the core has logged it and counted a skipped reflection; the next check retries
        except asyncio.CancelledError:  # shutting down: a reflection is one transaction, nothing was saved
            log.info("reflection on %s stopped by the shutdown; the next start tries again", stream)
            return
        except MemstreamError as exc:
            log.warning("scheduled reflection on %s failed, will retry at the next check: %s", stream, exc)
            return
        finally:
            self._running.discard(stream)
        if result is not None:
            self.runs.append(stream)

    async def retry_pending(self) -> int:
        """Complete the pending observations whose retry is due (all of them on the first run after a
        start); returns how many became ready."""
        first, self._started = not self._started, True
        streams = None
        if self.owns is not None:
            streams = [s for s in await self.memory.streams() if self.owns(s)]
            if not streams:
                return 0
        done = 0
        while True:  # in chunks, until none is due: each one either completes or waits for its next retry
            finished = await self.memory.complete_pending(500, due_only=not first, streams=streams)
            done += finished
            if finished == 0:
                return done

    async def check_pending(self) -> None:
        """The every-minute job: retry the pending observations that are due."""
        try:
            await self.retry_pending()
        except MemstreamError as exc:
            log.warning("retrying pending observations failed: %s", exc)
        except asyncio.CancelledError:
            log.info("retrying pending observations stopped by the shutdown")

    async def check_rater(self) -> None:
        """Say in the log, once, that the rater's latest ratings are flat (memstream.calibration); once more only
        if they vary again and then go flat again."""
        check = await self.memory.rater_check()
        flat = check is not None and check.flat
        if check is not None and flat and not self._rater_flat:
            log.warning("importance ratings: %s (see memstream doctor; README: Importance ratings)", check.text())
        self._rater_flat = flat

    async def check(self) -> None:
        """The periodic job: finish pending observations, reflect on every stream that is due, and look at the
        rater's latest ratings."""
        try:
            await self.retry_pending()
            for stream in await self.memory.due_streams():
                await self.request(stream)  # (only this process's streams)
            await self.check_rater()
        except MemstreamError as exc:
            log.warning("periodic check failed: %s", exc)
        except asyncio.CancelledError:
            log.info("periodic check stopped by the shutdown")
