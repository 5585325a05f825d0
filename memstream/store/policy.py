"""Rules every backend follows alike: when a failed pending observation is tried again (the one retry
formula, and the SQL that follows it), and the last-access updates a reflection collects to commit with its
insights."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar
from typing import Literal

__all__ = ["RETRY_BASE_SECONDS", "RETRY_CAP_SECONDS", "collected_touches", "deferred_touches", "retry_delay",
           "retry_delay_sql"]

# A pending observation whose model calls failed waits RETRY_BASE * 2**(failures - 1) seconds, at most
# RETRY_CAP, before it is tried again (a restart tries every pending observation at once).
RETRY_BASE_SECONDS = 30.0
RETRY_CAP_SECONDS = 900.0
_DOUBLINGS = 30
_touches: ContextVar[dict[int, float] | None] = ContextVar("memstream_deferred_touches", default=None)


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


