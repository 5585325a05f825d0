"""Where "now" comes from: the system clock in production, a FakeClock (memstream.testing) in tests."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Protocol

__all__ = ["EARLIEST", "LATEST", "Clock", "FixedClock", "SystemClock", "from_timestamp", "sane_time", "to_timestamp"]

# The times a memory may carry: anything outside is a typo or an attack (year 1 overflowed every later
# retrieval), refused where it comes in.
EARLIEST = datetime(1970, 1, 1, tzinfo=UTC)
LATEST = datetime(2200, 1, 1, tzinfo=UTC)


class Clock(Protocol):
    """Anything that tells the current time as an aware UTC datetime."""

    def now(self) -> datetime: ...


class SystemClock:
    """The real clock."""

    def now(self) -> datetime:
        """The current time in UTC."""
        return datetime.now(UTC)


class FixedClock:
    """A clock that stands still at a moment until moved (`--at` replays, eval)."""

    def __init__(self, moment: datetime) -> None:
        self.moment = moment

    def now(self) -> datetime:
        """The set moment."""
        return self.moment


def sane_time(moment: datetime) -> datetime:
    """`moment` (naive taken as UTC) if it lies from 1970 to 2200; ValueError naming the window if not."""
    aware = moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)
    try:
        inside = EARLIEST <= aware < LATEST
    except OverflowError:  # an offset pushing it past year 1 or 9999
        inside = False
    if not inside:
        raise ValueError(f"{moment.isoformat()} is outside the times memstream accepts "
                         f"({EARLIEST.year}-01-01 to {LATEST.year - 1}-12-31)")
    return aware


def to_timestamp(moment: datetime) -> float:
    """Seconds since the epoch; naive datetimes are taken as UTC."""
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.timestamp()


def from_timestamp(seconds: float) -> datetime:
    """An aware UTC datetime from seconds since the epoch."""
    return datetime.fromtimestamp(seconds, UTC)
