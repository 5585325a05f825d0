"""Records to and from the rows both backends' queries give, written once: a memory, a reply's trace (its items'
JSON lives only here), a stream's state, counts of memories, pending memories and model usage."""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Any

from memstream.clock import from_timestamp
from memstream.records import Counts, Memory, PendingState, ReplyTrace, RoleUsage, Source, StreamState, TraceItem
from memstream.store.records import NewTrace

__all__ = ["MEMORY_COLUMNS", "STATE_COLUMNS", "TRACE_COLUMNS", "TRACE_FIELDS", "counts_from_rows", "memory_from_row",
           "pending_from_row", "state_from_row", "trace_from_row", "trace_items_to_rows", "trace_to_row",
           "usage_from_row"]

# The columns of memories that memory_from_row reads, in its order.
MEMORY_COLUMNS = ("id, stream, kind, text, created_at, last_accessed_at, importance, importance_source, depth, "
                  "author, author_id, channel, channel_id, message_id, status, number, reply_to")

# The columns of reply_traces that trace_to_row gives values for, in its order.
TRACE_FIELDS = ("stream, created_at, query, reply_memory_id, items, query_memory_id, query_message_id, "
                "query_author_id")
# The columns trace_from_row reads, in its order.
TRACE_COLUMNS = f"id, message_id, {TRACE_FIELDS}"
# The columns of stream_state that state_from_row reads, in its order.
STATE_COLUMNS = "importance_since_reflection, last_reflection_at, reflections, skipped_reflections"
_ITEM_KEYS = ("id", "score", "recency", "importance", "relevance", "cosine")  # a trace item in its JSON


def memory_from_row(row: Sequence[Any]) -> Memory:
    """A Memory from a row of MEMORY_COLUMNS."""
    return Memory(
        id=int(row[0]), stream=row[1], kind=row[2], text=row[3],
        created_at=from_timestamp(row[4]), last_accessed_at=from_timestamp(row[5]),
        importance=row[6], importance_source=row[7], depth=row[8],
        source=Source(author=row[9], author_id=row[10], channel=row[11], channel_id=row[12],
                      message_id=row[13], reply_to=row[16]),
        status=row[14], number=row[15],
    )


def trace_to_row(trace: NewTrace) -> tuple[Any, ...]:
    """The values of TRACE_FIELDS for a trace (its items as one JSON list)."""
    items = [dict(zip(_ITEM_KEYS, (i.memory_id, i.score, i.recency, i.importance, i.relevance, i.cosine),
                      strict=True)) for i in trace.items]
    return (trace.stream, trace.at, trace.query, trace.reply_memory_id, json.dumps(items), trace.query_memory_id,
            trace.query_message_id, trace.query_author_id)


def trace_items_to_rows(trace: NewTrace, trace_id: int) -> list[tuple[int, int]]:
    """The (memory id, trace id) rows of trace_items: which traces a deleted memory takes with it."""
    return [(item.memory_id, trace_id) for item in trace.items]


def trace_from_row(row: Sequence[Any]) -> ReplyTrace:
    """A ReplyTrace from a row of TRACE_COLUMNS."""
    items = tuple(TraceItem(int(item["id"]), float(item["score"]), float(item["recency"]), float(item["importance"]),
                            float(item["relevance"]), float(item["cosine"])) for item in json.loads(row[6]))
    return ReplyTrace(id=int(row[0]), stream=row[2], at=from_timestamp(row[3]), query=row[4], items=items,
                      reply_memory_id=_int(row[5]), message_id=row[1], query_memory_id=_int(row[7]),
                      query_message_id=row[8], query_author_id=row[9])


def state_from_row(row: Sequence[Any] | None) -> StreamState:
    """A StreamState from a row of STATE_COLUMNS (None: a stream with no state yet)."""
    if row is None:
        return StreamState()
    return StreamState(int(row[0]), None if row[1] is None else from_timestamp(row[1]), int(row[2]), int(row[3]))


def pending_from_row(row: Sequence[Any]) -> PendingState:
    """A PendingState from (count, attempts, earliest next attempt) of the pending memories."""
    return PendingState(int(row[0]), int(row[1]), None if row[2] is None else from_timestamp(row[2]))


def usage_from_row(row: Sequence[Any]) -> RoleUsage:
    """A RoleUsage from (calls, failures, prompt tokens, completion tokens)."""
    return RoleUsage(int(row[0]), int(row[1]), int(row[2]), int(row[3]))


def counts_from_rows(rows: Iterable[Sequence[Any]]) -> Counts:
    """Counts from (kind, status, importance, importance source, count) groups of memories."""
    kinds = {"observation": 0, "reflection": 0}
    pending = fallback = 0
    histogram = dict.fromkeys(range(1, 11), 0)
    for kind, status, importance, source, n in rows:
        kinds["observation" if kind == "observation" else "reflection"] += int(n)
        pending += int(n) if status == "pending" else 0
        fallback += int(n) if source == "fallback" else 0
        if importance is not None:
            histogram[int(importance)] += int(n)
    return Counts(kinds["observation"], kinds["reflection"], pending, fallback, histogram)


def _int(value: Any) -> int | None:
    return None if value is None else int(value)
