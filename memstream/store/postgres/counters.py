"""Per-stream state (the importance total towards a reflection), model usage, fault counts, summaries."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from memstream.clock import from_timestamp
from memstream.records import Counts, PendingState, RoleUsage, StreamState
from memstream.store.policy import bounded_usage, saturating_add, usage_day
from memstream.store.postgres.core import Core
from memstream.store.records import UsageRow
from memstream.store.rowmap import STATE_COLUMNS, counts_from_rows, pending_from_row, state_from_row, usage_from_row

__all__ = ["Counters"]

# Each total stays at COUNT_CEILING rather than overflowing (the rows are bounded first: policy.bounded_usage).
_COUNTS = ("calls", "failures", "prompt_tokens", "completion_tokens", "retries")
_USAGE = ("INSERT INTO model_usage (stream, role, calls, failures, prompt_tokens, completion_tokens, retries) "
          "VALUES (%s, %s, %s, %s, %s, %s, %s) ON CONFLICT (stream, role) DO UPDATE SET "
          + ", ".join(saturating_add("model_usage", column) for column in _COUNTS))
# A model call also counts in its UTC day's row (the store's usage clock, the wall clock: when the call was made,
# even in a replay), given third (policy.usage_day).
_DAILY_USAGE = ("INSERT INTO model_usage_daily AS d (stream, role, day, calls, failures, prompt_tokens, "
                "completion_tokens, retries) VALUES (%s, %s, %s, "
                "%s, %s, %s, %s, %s) ON CONFLICT (stream, role, day) DO UPDATE SET "
                + ", ".join(saturating_add("d", column) for column in _COUNTS))


def _dated(row: Sequence[Any], day: int) -> tuple[Any, ...]:
    """A usage row with its day, in _DAILY_USAGE's order."""
    return (row[0], row[1], day, *row[2:])


def _where(stream: str | None, prefix: str = "WHERE") -> tuple[str, tuple[Any, ...]]:
    return (f"{prefix} stream = %s", (stream,)) if stream is not None else ("", ())


class Counters(Core):
    """Stream state, usage and fault counters, and counts of memories."""

    async def add_importance(self, stream: str, amount: int) -> int:
        """Add to the importance total since the last reflection; return the new total (one statement: two
        processes adding at once both count)."""
        row = await self._row(
            "INSERT INTO stream_state (stream, importance_since_reflection) VALUES (%s, %s) "
            "ON CONFLICT (stream) DO UPDATE SET importance_since_reflection = "
            "stream_state.importance_since_reflection + excluded.importance_since_reflection "
            "RETURNING importance_since_reflection", (stream, amount))
        assert row is not None
        return int(row[0])

    async def state(self, stream: str) -> StreamState:
        """The importance total, last reflection time and counters of a stream."""
        return state_from_row(await self._row(f"SELECT {STATE_COLUMNS} FROM stream_state WHERE stream = %s", (stream,)))

    async def count_skipped_reflection(self, stream: str) -> None:
        """A reflection that could not run (it will be tried again)."""
        await self._execute("INSERT INTO stream_state (stream, skipped_reflections) VALUES (%s, 1) "
                            "ON CONFLICT (stream) DO UPDATE SET skipped_reflections = "
                            "stream_state.skipped_reflections + 1", (stream,))

    async def due_streams(self, threshold: int) -> list[str]:
        """Streams whose importance total has reached the threshold."""
        rows = await self._rows("SELECT stream FROM stream_state WHERE importance_since_reflection >= %s "
                                "ORDER BY stream COLLATE \"C\"", (threshold,))
        return [row[0] for row in rows]

    async def record_usage(self, stream: str, role: str, *, calls: int = 1, failures: int = 0,
                           prompt_tokens: int = 0, completion_tokens: int = 0, retries: int = 0) -> None:
        """Count model calls (failed ones, and retries the client made) and tokens per stream and role."""
        [row] = bounded_usage([(stream, role, calls, failures, prompt_tokens, completion_tokens, retries)])
        async with self.transaction():
            await self._execute(_USAGE, row)
            await self._execute(_DAILY_USAGE, _dated(row, self.usage_day()))

    async def record_usage_many(self, rows: Sequence[UsageRow]) -> None:
        """Add many (stream, role, calls, failures, prompt tokens, completion tokens, retries) rows at once.
        Their rows are locked in one order (stream, then role) whatever the order given: two writers listing
        the same counters in opposite orders (a burst's batches of two streams) would otherwise deadlock."""
        if rows:
            ordered = sorted(bounded_usage(rows), key=lambda row: (row[0], row[1]))
            async with self.transaction():
                day = self.usage_day()
                await self._many(_USAGE, ordered)
                await self._many(_DAILY_USAGE, [_dated(row, day) for row in ordered])

    async def count_fault(self, stream: str, kind: str, count: int = 1) -> None:
        """Count a degraded outcome (rating_fallback, insight_dropped, questions_trimmed, ...)."""
        await self._execute("INSERT INTO faults (stream, kind, count) VALUES (%s, %s, %s) ON CONFLICT (stream, kind) "
                            "DO UPDATE SET count = faults.count + excluded.count", (stream, kind, count))

    async def faults(self, stream: str | None = None) -> dict[str, int]:
        """Fault counts by kind (one stream, or all)."""
        where, args = _where(stream)
        rows = await self._rows(f"SELECT kind, SUM(count) FROM faults {where} GROUP BY kind ORDER BY kind COLLATE "
                                '"C"', args)
        return {row[0]: int(row[1]) for row in rows}

    async def pending_state(self, stream: str | None = None) -> PendingState:
        """Pending observations: how many, their failed attempts, and when the next retry is due."""
        where, args = _where(stream, "AND")
        row = await self._row(f"SELECT COUNT(*), COALESCE(SUM(attempts), 0), MIN(next_attempt_at) FROM memories "
                              f"WHERE status = 'pending' {where}", args)
        assert row is not None
        return pending_from_row(row)

    async def usage(self, stream: str | None = None) -> dict[str, RoleUsage]:
        """Model calls and tokens per role (one stream, or all)."""
        where, args = _where(stream)
        rows = await self._rows(f"SELECT role, SUM(calls), SUM(failures), SUM(prompt_tokens), SUM(completion_tokens) "
                                f'FROM model_usage {where} GROUP BY role ORDER BY role COLLATE "C"', args)
        return {row[0]: usage_from_row(row[1:]) for row in rows}

    async def usage_by_day(self, stream: str | None = None) -> list[tuple[datetime, str, RoleUsage]]:
        """Model calls and tokens per UTC day and role (one stream, or all), oldest day first."""
        where, args = _where(stream)
        rows = await self._rows(f"SELECT day, role, SUM(calls), SUM(failures), SUM(prompt_tokens), "
                                f"SUM(completion_tokens) FROM model_usage_daily {where} GROUP BY day, role "
                                'ORDER BY day, role COLLATE "C"', args)
        return [(from_timestamp(row[0]), row[1], usage_from_row(row[2:])) for row in rows]

    async def usage_of_day(self, day: datetime) -> dict[str, RoleUsage]:
        """Model calls and tokens per role in the UTC day that holds `day`, every stream's."""
        rows = await self._rows("SELECT role, SUM(calls), SUM(failures), SUM(prompt_tokens), SUM(completion_tokens) "
                                'FROM model_usage_daily WHERE day = %s GROUP BY role ORDER BY role COLLATE "C"',
                                (usage_day(day),))
        return {row[0]: usage_from_row(row[1:]) for row in rows}

    async def retries(self, stream: str | None = None) -> dict[str, int]:
        """Failed requests the model client retried, per role (one stream, or all)."""
        where, args = _where(stream)
        rows = await self._rows(f'SELECT role, SUM(retries) FROM model_usage {where} GROUP BY role ORDER BY role '
                                'COLLATE "C"', args)
        return {row[0]: int(row[1]) for row in rows}

    async def recent_ratings(self, stream: str | None, limit: int) -> list[int]:
        """The importance the rater gave the latest `limit` observations it rated, newest first (of a stream, by
        time; of every stream, by insertion)."""
        order = "created_at DESC, id DESC" if stream is not None else "id DESC"
        where, args = _where(stream, "AND")
        rows = await self._rows(
            f"SELECT importance FROM memories WHERE kind = 'observation' AND importance_source = 'rater' {where} "
            f"ORDER BY {order} LIMIT %s", (*args, limit))
        return [int(row[0]) for row in rows]

    async def counts(self, stream: str | None = None) -> Counts:
        """Counts by kind and status, the importance histogram and fallback ratings."""
        where, args = _where(stream)
        rows = await self._rows(f"SELECT kind, status, importance, importance_source, COUNT(*) FROM memories {where} "
                                "GROUP BY kind, status, importance, importance_source", args)
        return counts_from_rows(rows)
