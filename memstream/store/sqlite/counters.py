"""Per-stream state (the importance total towards a reflection), model usage, fault counts, summaries."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from memstream.clock import from_timestamp
from memstream.records import Counts, PendingState, RoleUsage, StreamState
from memstream.store.policy import bounded_usage, saturating_add, usage_day
from memstream.store.records import UsageRow
from memstream.store.rowmap import STATE_COLUMNS, counts_from_rows, pending_from_row, state_from_row, usage_from_row
from memstream.store.sqlite.migrate import Migrations

__all__ = ["DAILY_USAGE", "USAGE", "Counters"]

# Usage rows (stream, role, calls, failures, prompt tokens, completion tokens, retries) added to the totals, each
# total staying at COUNT_CEILING rather than overflowing (the rows are bounded first: policy.bounded_usage).
_COUNTS = ("calls", "failures", "prompt_tokens", "completion_tokens", "retries")


def _sums(table: str) -> str:
    return ", ".join(saturating_add(table, column) for column in _COUNTS)


USAGE = ("INSERT INTO model_usage (stream, role, calls, failures, prompt_tokens, completion_tokens, retries) "
         f"VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (stream, role) DO UPDATE SET {_sums('model_usage')}")
# A model call also counts in its UTC day's row (the store's usage clock, the wall clock: when the call was made,
# even in a replay), given last (?8: policy.usage_day).
DAILY_USAGE = ("INSERT INTO model_usage_daily (stream, role, day, calls, failures, prompt_tokens, completion_tokens, "
                "retries) VALUES (?1, ?2, ?8, ?3, ?4, ?5, ?6, ?7) "
                f"ON CONFLICT (stream, role, day) DO UPDATE SET {_sums('model_usage_daily')}")


def _where(stream: str | None, prefix: str = "WHERE") -> tuple[str, tuple[Any, ...]]:
    return (f"{prefix} stream = ?", (stream,)) if stream is not None else ("", ())


class Counters(Migrations):
    """Stream state, usage and fault counters, and counts of memories."""

    async def add_importance(self, stream: str, amount: int) -> int:
        """Add to the importance total since the last reflection; return the new total."""
        async with self.conn.execute(
            "INSERT INTO stream_state (stream, importance_since_reflection) VALUES (?, ?) "
            "ON CONFLICT (stream) DO UPDATE SET importance_since_reflection = importance_since_reflection + ? "
            "RETURNING importance_since_reflection", (stream, amount, amount)
        ) as cur:
            row = await cur.fetchone()
        assert row is not None
        return int(row[0])

    async def state(self, stream: str) -> StreamState:
        """The importance total, last reflection time and counters of a stream."""
        async with self.conn.execute(f"SELECT {STATE_COLUMNS} FROM stream_state WHERE stream = ?", (stream,)) as cur:
            return state_from_row(await cur.fetchone())

    async def count_skipped_reflection(self, stream: str) -> None:
        """A reflection that could not run (it will be tried again)."""
        await self.conn.execute(
            "INSERT INTO stream_state (stream, skipped_reflections) VALUES (?, 1) "
            "ON CONFLICT (stream) DO UPDATE SET skipped_reflections = skipped_reflections + 1", (stream,)
        )

    async def due_streams(self, threshold: int) -> list[str]:
        """Streams whose importance total has reached the threshold."""
        async with self.conn.execute(
            "SELECT stream FROM stream_state WHERE importance_since_reflection >= ? ORDER BY stream",
            (threshold,),
        ) as cur:
            return [row[0] for row in await cur.fetchall()]

    async def record_usage(self, stream: str, role: str, *, calls: int = 1, failures: int = 0,
                           prompt_tokens: int = 0, completion_tokens: int = 0, retries: int = 0) -> None:
        """Count model calls (failed ones, and retries the client made) and tokens per stream and role."""
        [row] = bounded_usage([(stream, role, calls, failures, prompt_tokens, completion_tokens, retries)])
        await self.conn.execute(USAGE, row)
        await self.conn.execute(DAILY_USAGE, (*row, self.usage_day()))

    async def count_fault(self, stream: str, kind: str, count: int = 1) -> None:
        """Count a degraded outcome (rating_fallback, insight_dropped, questions_trimmed, ...)."""
        await self.conn.execute(
            "INSERT INTO faults (stream, kind, count) VALUES (?, ?, ?) "
            "ON CONFLICT (stream, kind) DO UPDATE SET count = count + excluded.count", (stream, kind, count),
        )

    async def faults(self, stream: str | None = None) -> dict[str, int]:
        """Fault counts by kind (one stream, or all)."""
        where, args = _where(stream)
        async with self.conn.execute(
            f"SELECT kind, SUM(count) FROM faults {where} GROUP BY kind ORDER BY kind", args
        ) as cur:
            return {row[0]: int(row[1]) for row in await cur.fetchall()}

    async def pending_state(self, stream: str | None = None) -> PendingState:
        """Pending observations: how many, their failed attempts, and when the next retry is due."""
        where, args = _where(stream, "AND")
        async with self.conn.execute(
            f"SELECT COUNT(*), COALESCE(SUM(attempts), 0), MIN(next_attempt_at) FROM memories "
            f"WHERE status = 'pending' {where}", args
        ) as cur:
            row = await cur.fetchone()
        assert row is not None
        return pending_from_row(row)

    async def record_usage_many(self, rows: Sequence[UsageRow]) -> None:
        """Add many (stream, role, calls, failures, prompt tokens, completion tokens, retries) rows at once."""
        if rows:
            bounded = bounded_usage(rows)
            day = self.usage_day()
            await self.conn.executemany(USAGE, bounded)
            await self.conn.executemany(DAILY_USAGE, [(*row, day) for row in bounded])

    async def usage(self, stream: str | None = None) -> dict[str, RoleUsage]:
        """Model calls and tokens per role (one stream, or all)."""
        where, args = _where(stream)
        async with self.conn.execute(
            f"SELECT role, SUM(calls), SUM(failures), SUM(prompt_tokens), SUM(completion_tokens) "
            f"FROM model_usage {where} GROUP BY role ORDER BY role", args
        ) as cur:
            return {row[0]: usage_from_row(row[1:]) for row in await cur.fetchall()}

    async def usage_by_day(self, stream: str | None = None) -> list[tuple[datetime, str, RoleUsage]]:
        """Model calls and tokens per UTC day and role (one stream, or all), oldest day first."""
        where, args = _where(stream)
        async with self.conn.execute(
            f"SELECT day, role, SUM(calls), SUM(failures), SUM(prompt_tokens), SUM(completion_tokens) "
            f"FROM model_usage_daily {where} GROUP BY day, role ORDER BY day, role", args
        ) as cur:
            return [(from_timestamp(row[0]), row[1], usage_from_row(row[2:])) for row in await cur.fetchall()]

    async def usage_of_day(self, day: datetime) -> dict[str, RoleUsage]:
        """Model calls and tokens per role in the UTC day that holds `day`, every stream's."""
        async with self.conn.execute(
            "SELECT role, SUM(calls), SUM(failures), SUM(prompt_tokens), SUM(completion_tokens) "
            "FROM model_usage_daily WHERE day = ? GROUP BY role ORDER BY role", (usage_day(day),)
        ) as cur:
            return {row[0]: usage_from_row(row[1:]) for row in await cur.fetchall()}

    async def retries(self, stream: str | None = None) -> dict[str, int]:
        """Failed requests the model client retried, per role (one stream, or all)."""
        where, args = _where(stream)
        async with self.conn.execute(
            f"SELECT role, SUM(retries) FROM model_usage {where} GROUP BY role ORDER BY role", args
        ) as cur:
            return {row[0]: int(row[1]) for row in await cur.fetchall()}

    async def recent_ratings(self, stream: str | None, limit: int) -> list[int]:
        """The importance the rater gave the latest `limit` observations it rated, newest first (of a stream, by
        time; of every stream, by insertion)."""
        order = "created_at DESC, id DESC" if stream is not None else "id DESC"
        where, args = _where(stream, "AND")
        rows = await self.conn.execute_fetchall(
            f"SELECT importance FROM memories WHERE kind = 'observation' AND importance_source = 'rater' {where} "
            f"ORDER BY {order} LIMIT ?", (*args, limit))
        return [int(row[0]) for row in rows]

    async def counts(self, stream: str | None = None) -> Counts:
        """Counts by kind and status, the importance histogram and fallback ratings."""
        where, args = _where(stream)
        async with self.conn.execute(
            f"SELECT kind, status, importance, importance_source, COUNT(*) FROM memories {where} "
            "GROUP BY kind, status, importance, importance_source", args
        ) as cur:
            return counts_from_rows(await cur.fetchall())
