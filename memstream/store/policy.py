"""Rules every backend follows alike: when a failed pending observation is tried again, and the last-access
updates a reflection collects to commit with its insights."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar

__all__ = ["RETRY_BASE_SECONDS", "RETRY_CAP_SECONDS", "collected_touches", "deferred_touches", "retry_delay"]

# A pending observation whose model calls failed waits RETRY_BASE * 2**(failures - 1) seconds, at most
# RETRY_CAP, before it is tried again (a restart tries every pending observation at once).
RETRY_BASE_SECONDS = 30.0
RETRY_CAP_SECONDS = 900.0
_touches: ContextVar[dict[int, float] | None] = ContextVar("memstream_deferred_touches", default=None)


def collected_touches() -> dict[int, float] | None:
    """The last-access updates being collected by deferred_touches() in this task, or None (write them)."""
    return _touches.get()


def retry_delay(failures: int) -> float:
    """Seconds before the next attempt at a pending observation that has failed `failures` times."""
    return min(RETRY_CAP_SECONDS, RETRY_BASE_SECONDS * 2.0 ** min(max(failures - 1, 0), 30))


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


