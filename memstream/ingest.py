"""The write path, in one place for the bot, the command line and imports: an observation is validated,
persisted pending (so nothing is lost to a model outage), then rated and embedded in batches and made ready
in one transaction per batch. A memory whose model calls failed stays pending and is tried again after
`retry_delay` (the one retry policy: store/policy.py holds the formula and the SQL that follows it). A memory
whose rater or embedding budget is spent (the persona's [budget]) stays pending, no call made, until the budget
renews (`Store.postpone`: no failure counted).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

import numpy as np
import numpy.typing as npt

from memstream.clock import Clock, sane_time, to_timestamp
from memstream.config import StreamConfig
from memstream.errors import BudgetSpent, ConfigError, ProviderError
from memstream.models.roles import Models
from memstream.rate import Rater, Rating
from memstream.records import Memory, Observation
from memstream.store import NewMemory, Store
from memstream.store.policy import RETRY_BASE_SECONDS, RETRY_CAP_SECONDS, retry_delay
from memstream.text import check_text

__all__ = ["RETRY_BASE_SECONDS", "RETRY_CAP_SECONDS", "Added", "Ingest", "check_importance", "retry_delay"]

log = logging.getLogger("memstream")


def check_importance(value: int | None) -> None:
    """A given importance is a whole number from 1 to 10 (ConfigError if not)."""
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 10):
        raise ConfigError(f"importance must be a whole number from 1 to 10, got {value!r}")


@dataclass(frozen=True)
class Added:
    """What `Ingest.add` did: every memory in the order given (a message already stored comes back as it
    is), the ones it stored, and the model failures that left some pending."""

    memories: list[Memory]
    fresh: list[Memory]
    errors: list[ProviderError]


class Ingest:
    """Observations into one persona's store: validated, persisted, rated, embedded, made ready."""

    def __init__(self, store: Store, models: Models, rater: Rater, config: StreamConfig, clock: Clock) -> None:
        self.store, self.models, self.rater, self.config, self.clock = store, models, rater, config, clock
        self.persisting = asyncio.Lock()  # a lookup of known message ids and the insert of the rest: one step
        # The last model failure that left a memory pending (why something is pending, for the operator).
        self.last_model_error: ProviderError | None = None
        self._limit = asyncio.Semaphore(config.max_concurrency)
        self._inflight: set[int] = set()  # pending memories being completed right now (never twice at once)
        self._failures: set[int] = set()
        self._waiting: dict[int, BudgetSpent] = {}  # memories a spent budget held back in this call
        self._told: set[tuple[str, datetime | None]] = set()  # the spent budgets already logged as a warning

    async def pending(self, limit: int, *, due_only: bool, streams: Sequence[str] | None) -> list[Memory]:
        """Pending memories this process may complete now (claimed: none another process is completing);
        with `due_only`, those whose retry is due."""
        due = to_timestamp(self.clock.now()) if due_only else None
        return await self.store.pending_memories(limit, due_at=due, streams=streams, claim=True)

    async def add(self, items: Sequence[Observation], *, defer: bool = False) -> Added:
        """Validate a burst (all or nothing: ConfigError), persist it pending, then, unless `defer`, rate and
        embed what is new."""
        for item in items:
            check_importance(item.importance)
            if not isinstance(item.text, str):
                raise ConfigError(f"observation text must be a string, got {type(item.text).__name__}")
            if not item.text.strip():
                raise ConfigError("an observation needs some text: it is empty or only white space")
            try:
                check_text(item.text, "observation text")
                if item.at is not None:
                    sane_time(item.at)
            except ValueError as exc:
                raise ConfigError(str(exc)) from exc
        async with self.persisting:  # looking up known message ids and inserting the rest is one step
            ids = await self.persist(items)
        fresh = sorted({i for i, new in ids if new})
        errors = [] if defer else await self.complete(fresh)
        found = await self.store.get_many([i for i, _ in ids])
        return Added([found[i] for i, _ in ids], [found[i] for i in fresh if i in found], errors)

    async def persist(self, items: Sequence[Observation]) -> list[tuple[int, bool]]:
        """Store these (validated) observations pending, each message once: (id, whether new) for each.
        Hold `persisting` around it when a caller writes more in the same step."""
        out: list[tuple[int, bool]] = []
        new: list[NewMemory] = []
        slots: list[int] = []
        first: dict[tuple[str, str], int] = {}  # a message repeated within this batch is stored once
        twins: list[tuple[int, int]] = []
        # Without a message id, an observation whose stream and text a pending one has (a run whose models
        # failed, retried) is that memory: completed, not stored twice. Once ready, the same text is a new one.
        retried = await self.store.find_pending([(o.stream, o.text) for o in items if not o.source.message_id])
        for item in items:
            again = None if item.source.message_id else retried.pop((item.stream, item.text), None)
            if again is not None:
                out.append((again, True))
                continue
            if item.source.message_id:
                key = (item.stream, item.source.message_id)
                if key in first:
                    twins.append((len(out), first[key]))
                    out.append((-1, False))
                    continue
                first[key] = len(out)
            at = to_timestamp(item.at or self.clock.now())
            new.append(NewMemory(stream=item.stream, kind="observation", text=item.text, created_at=at,
                                 importance=item.importance,
                                 importance_source=None if item.importance is None else "given",
                                 source=item.source))
            slots.append(len(out))
            out.append((-1, True))
        # Messages already stored (by this process or another) are looked up in the insert's transaction.
        for slot, found in zip(slots, await self.store.insert_unique(new), strict=True):
            out[slot] = found
        for slot, earlier in twins:
            out[slot] = (out[earlier][0], False)
        return out

    async def complete(self, ids: Sequence[int]) -> list[ProviderError]:
        """Rate and embed these pending memories (others are skipped, and any another task is completing);
        the model failures that left some pending (each failure counted as one attempt, retried later)."""
        memories = [m for m in (await self.store.get_many([i for i in ids if i not in self._inflight])).values()
                    if m.status == "pending"]
        if memories:  # vectors of another model than the store's would be refused: no model call made for them
            await self.store.check_embedding_model()
            try:  # a spent budget: no call at all, every memory waits for the renewal
                await self.models.check_budget("embedding", *(("rater",) if any(m.importance is None
                                                                                for m in memories) else ()))
            except BudgetSpent as exc:
                self._waiting.update((m.id, exc) for m in memories)
                await self._postpone()
                return [exc]
        errors: list[ProviderError] = []
        self._inflight.update(m.id for m in memories)
        try:
            with self.models.deferred_usage():
                outcomes = await asyncio.gather(*(self._complete_batch(batch, errors)
                                                  for batch in self._batches(memories)), return_exceptions=True)
            await self.models.flush_usage()
        finally:
            self._inflight.difference_update(m.id for m in memories)
        for outcome in outcomes:
            if isinstance(outcome, BaseException):
                raise outcome
        await self._postpone()
        if errors:
            self.last_model_error = errors[0]
        errors_left = [e for e in errors if not isinstance(e, BudgetSpent)]
        if errors_left:  # one line per burst, however many of its calls failed
            left = sorted(m.id for m in memories if m.id in self._failures)
            self._failures.difference_update(left)
            shown = ", ".join(f"#{i}" for i in left[:5]) + (", ..." if len(left) > 5 else "")
            log.warning("memory %s kept as pending (%d failed model call(s)), retried with backoff: %s", shown,
                        len(errors_left), errors_left[0])
        return errors

    async def _postpone(self) -> None:
        """The memories a spent budget held back wait pending until it renews (logged once per budget day)."""
        waiting, self._waiting = self._waiting, {}
        for spent in {id(e): e for e in waiting.values()}.values():
            ids = sorted(i for i, e in waiting.items() if e is spent)
            until = spent.until or self.clock.now()
            await self.store.postpone(ids, to_timestamp(until))
            self.last_model_error = spent
            told = (spent.role, spent.until) in self._told
            self._told.add((spent.role, spent.until))
            log.log(logging.INFO if told else logging.WARNING, "%d memor%s kept pending, no model call made: %s",
                    len(ids), "y" if len(ids) == 1 else "ies", spent)

    def _batches(self, memories: Sequence[Memory]) -> list[list[Memory]]:
        """Per stream, in id order, `embed_batch_size` at a time."""
        by_stream: dict[str, list[Memory]] = {}
        for memory in sorted(memories, key=lambda m: m.id):
            by_stream.setdefault(memory.stream, []).append(memory)
        size = self.config.embed_batch_size
        return [group[i:i + size] for group in by_stream.values() for i in range(0, len(group), size)]

    async def _complete_batch(self, batch: list[Memory], errors: list[ProviderError]) -> None:
        """Embed a batch while its memories are rated (every model call bounded by max_concurrency), then
        store it, its importance and the usage counted so far in one transaction."""
        embedding = asyncio.ensure_future(self._embed(batch, errors))
        try:
            ratings = await asyncio.gather(*(self._rate(m, errors) for m in batch))
        except BaseException:  # cancelled (Ctrl-C) or failed: the embedding call must not outlive the batch
            embedding.cancel()
            raise
        embedded = await embedding
        if embedded is None:
            return
        ready = [(m, r, v) for m, r, v in zip(batch, ratings, embedded, strict=True) if r is not None]
        if ready:
            await self._store_batch(batch[0].stream, ready)

    async def _embed(self, batch: list[Memory], errors: list[ProviderError]) -> npt.NDArray[np.float32] | None:
        async with self._limit:
            try:
                return await self.models.embed([m.text for m in batch], stream=batch[0].stream)
            except ProviderError as exc:
                for memory in batch:
                    await self._failed(memory, exc, errors)
                return None

    async def _store_batch(self, stream: str, ready: list[tuple[Memory, Rating, npt.NDArray[np.float32]]]) -> None:
        with self.models.usage_to_write() as usage:  # the index hears of them from the store (MemoriesReady)
            await self.store.complete_many(stream, [(m.id, r.importance, r.source, v) for m, r, v in ready], usage,
                                           texts=[m.text for m, _, _ in ready])  # an edit meanwhile: left pending

    async def _rate(self, memory: Memory, errors: list[ProviderError]) -> Rating | None:
        if memory.importance is not None:
            return Rating(memory.importance, memory.importance_source or "given")
        async with self._limit:
            try:
                return await self.rater.rate(memory.text, stream=memory.stream)
            except ProviderError as exc:
                await self._failed(memory, exc, errors)
                return None

    async def _failed(self, memory: Memory, exc: ProviderError, errors: list[ProviderError]) -> None:
        if not any(e is exc for e in errors):
            errors.append(exc)
        if isinstance(exc, BudgetSpent):  # not a failure: it waits for the renewal (_postpone)
            self._waiting.setdefault(memory.id, exc)
            return
        if memory.id not in self._failures:  # one failed attempt, however many of its calls failed
            self._failures.add(memory.id)
            await self.store.count_attempt(memory.id, at=to_timestamp(self.clock.now()))

