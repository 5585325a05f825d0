"""Rules every backend follows alike: which pending observations come first (the oldest), when a failed one
is tried again (the one retry formula, and the SQL that follows it), and the last-access updates a reflection
collects to commit with its insights; and the bounds of a count (model usage) either backend stores, and the day
it counts in."""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterable, Iterator, Sequence
from contextvars import ContextVar
from datetime import datetime
from typing import Any, Literal

from memstream.clock import Clock, SystemClock
from memstream.errors import StoreError
from memstream.records import Memory

__all__ = [
    "COUNT_CEILING",
    "DAY_SECONDS",
    "REEMBED_PREFIX",
    "RETRY_BASE_SECONDS",
    "RETRY_CAP_SECONDS",
    "ModelRecord",
    "UsageDay",
    "bounded_count",
    "bounded_usage",
    "collected_touches",
    "deferred_touches",
    "model_mismatch",
    "oldest",
    "reembed_progress",
    "retry_delay",
    "retry_delay_sql",
    "saturating_add",
    "usage_day",
]

# A pending observation whose model calls failed waits RETRY_BASE * 2**(failures - 1) seconds, at most
# RETRY_CAP, before it is tried again (a restart tries every pending observation at once).
RETRY_BASE_SECONDS = 30.0
RETRY_CAP_SECONDS = 900.0
_DOUBLINGS = 30
# The largest usage count stored (calls, failures, tokens, retries, each per stream and role, and per day): well
# inside SQLite's INTEGER and PostgreSQL's bigint (both 64-bit signed), exact as a float and in JSON, and the
# sum of a thousand such rows still fits. A total that would pass it stays at it.
COUNT_CEILING = 2**53 - 1
DAY_SECONDS = 86400  # a usage row's day, and a budget's: a UTC day, from 00:00 UTC
_touches: ContextVar[dict[int, float] | None] = ContextVar("memstream_deferred_touches", default=None)


def oldest(memory: Memory) -> tuple[datetime, int]:
    """The order pending memories are taken in: by creation time, then id (ids follow time within a stream only,
    not across streams: memstream.store.idblocks); each backend's query says `ORDER BY created_at, id`."""
    return memory.created_at, memory.id


def collected_touches() -> dict[int, float] | None:
    """The last-access updates being collected by deferred_touches() in this task, or None (write them)."""
    return _touches.get()


def retry_delay(failures: int, *, base: float = RETRY_BASE_SECONDS, cap: float = RETRY_CAP_SECONDS) -> float:
    """Seconds before the next attempt at something that has failed `failures` times: `base` doubled each
    time, at most `cap` (by default a pending observation's model calls; the bot's store writes use it too)."""
    return min(cap, base * 2.0 ** min(max(failures - 1, 0), _DOUBLINGS))


def retry_delay_sql(dialect: Literal["sqlite", "postgres"]) -> str:
    """retry_delay(attempts + 1) as an SQL expression over the column `attempts` (the failures before this
    one), for the UPDATE that counts a failure: the formula above, written in each database's words."""
    if dialect == "sqlite":
        return f"min({RETRY_CAP_SECONDS!r}, {RETRY_BASE_SECONDS!r} * (1 << min(max(attempts, 0), {_DOUBLINGS})))"
    return (f"LEAST({RETRY_CAP_SECONDS!r}::float8, {RETRY_BASE_SECONDS!r}::float8 * "
            f"power(2, LEAST(GREATEST(attempts, 0), {_DOUBLINGS})))")


@contextlib.contextmanager
def deferred_touches() -> Iterator[dict[int, float]]:
    """Inside this block (in this task), Store.touch collects last-access updates instead of writing them.

    A reflection commits what its retrievals touched together with its insights (save_reflection), so a
    reflection that fails or is killed leaves every last-access time as it was.
    """
    outer = _touches.get()
    if outer is not None:  # nested: the outer block commits
        yield outer
        return
    collected: dict[int, float] = {}
    token = _touches.set(collected)
    try:
        yield collected
    finally:
        _touches.reset(token)




def bounded_count(value: object, ceiling: int = COUNT_CEILING) -> int:
    """A count that came from outside (a model server's usage, a header) as an int in [0, ceiling]: a number
    past the ceiling is the ceiling, a negative one or anything that is not a finite number (null, text, NaN)
    is 0. Bookkeeping never fails on it."""
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, int):
        number = value
    elif isinstance(value, float):
        if math.isnan(value):
            return 0
        number = ceiling if value > ceiling else int(value) if value > 0 else 0
    elif isinstance(value, str) and value.strip().isdigit():
        digits = value.strip()
        number = ceiling if len(digits) > len(str(ceiling)) else int(digits)
    else:
        return 0
    return min(max(number, 0), ceiling)


def bounded_usage(rows: Iterable[Sequence[Any]]) -> list[tuple[Any, ...]]:
    """Usage rows (stream, role, then counts) with every count in [0, COUNT_CEILING]: what a backend writes."""
    return [(row[0], row[1], *(bounded_count(value) for value in row[2:])) for row in rows]


def usage_day(moment: datetime) -> int:
    """The UTC day a model call made at `moment` counts in (its 00:00 UTC, in seconds since the epoch): the day of a
    usage row, and of a daily budget."""
    return int(moment.timestamp()) // DAY_SECONDS * DAY_SECONDS


def saturating_add(table: str, column: str) -> str:
    """`column = table.column + excluded.column` for an upsert, staying at COUNT_CEILING instead of overflowing
    (the same words in SQLite and PostgreSQL; `excluded` is bounded by bounded_usage)."""
    return (f"{column} = CASE WHEN {table}.{column} > {COUNT_CEILING} - excluded.{column} THEN {COUNT_CEILING} "
            f"ELSE {table}.{column} + excluded.{column} END")


# The meta key of a stream's re-embedding in progress: "<model>\t<last id re-embedded>".
REEMBED_PREFIX = "reembed:"
# The meta key of the model a re-embedding under way moves the store to: while it is set, no embedding is
# written but the re-embedding's own, and no query is ranked (a stream may hold both models' vectors).
REEMBED_TARGET = "reembed_to"


def reembed_progress(value: str | None, model: str) -> int:
    """The last memory id of a stream re-embedded with `model` (0: none, or another model's run)."""
    if not value:
        return 0
    name, _, last = value.rpartition("\t")
    return int(last) if name == model and last.isdigit() else 0


def model_mismatch(path: str, recorded: str, configured: str) -> StoreError:
    """The error of a write or a query whose embedding model is not the one that made the store's vectors."""
    return StoreError(
        f"{path}: its embeddings were made by {recorded!r}, but the persona's embedding model is {configured!r}; "
        "the two cannot be mixed in one stream. Re-embed every memory with the new model: memstream reembed "
        f"--stream all (or set [models] embedding back to {recorded!r})")


def reembed_under_way(path: str, target: str) -> StoreError:
    """The error of a write or a query while a re-embedding (to `target`) is under way or stopped half way."""
    return StoreError(
        f"{path}: its embeddings are being re-embedded with {target!r} (or a re-embedding stopped half way); "
        f"nothing is stored or recalled until it is finished: memstream reembed --stream all, with {target!r} "
        "as the persona's embedding model")


class UsageDay:
    """The clock that dates model usage (its UTC day: the day a daily budget counts), the wall clock unless a
    store is opened with another (tests). Both backends date every usage row by it, in Python."""

    usage_clock: Clock = SystemClock()

    def usage_day(self) -> int:
        """Today's 00:00 UTC by the usage clock, in seconds since the epoch."""
        return usage_day(self.usage_clock.now())


class ModelRecord:
    """The embedding model a store's vectors are made by: told once (use_embedding_model), checked before every
    query and every embedding written. A backend supplies `_check_model` (one read of its meta table)."""

    _embedding_model: str | None = None

    def use_embedding_model(self, model: str | None) -> None:
        """The model that makes every embedding written from now on (None: not checked)."""
        self._embedding_model = model

    async def check_embedding_model(self) -> None:
        """Refuse (StoreError) when the store's vectors were made by another model than the one in use."""
        await self._check_model(adopt=False)

    async def _check_model(self, *, adopt: bool) -> None:
        raise NotImplementedError

    async def get_meta(self, key: str) -> str | None:
        raise NotImplementedError

    async def reembed_left(self, stream: str, model: str) -> int:
        """How many embedded memories of `stream` are not yet re-embedded with `model`."""
        if await self.get_meta("embedding_model") == model and await self.get_meta(REEMBED_TARGET) is None:
            return 0
        return await self._embedded_after(stream, reembed_progress(await self.get_meta(REEMBED_PREFIX + stream), model))

    async def _embedded_after(self, stream: str, after: int) -> int:
        """How many memories of `stream` above id `after` hold an embedding."""
        raise NotImplementedError
