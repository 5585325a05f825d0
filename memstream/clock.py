"""Where "now" comes from: the system clock in production, a FakeClock (memstream.testing) in tests."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Protocol

__all__ = ["Clock", "FixedClock", "SystemClock", "from_timestamp", "to_timestamp"]


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


def to_timestamp(moment: datetime) -> float:
    """Seconds since the epoch; naive datetimes are taken as UTC."""
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.timestamp()


def from_timestamp(seconds: float) -> datetime:
    """An aware UTC datetime from seconds since the epoch."""
    return datetime.fromtimestamp(seconds, UTC)
