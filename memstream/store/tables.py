"""The tables of a persona's memory as `memstream copy` moves them between backends: the same names and columns
in every backend, copied in this order (parents first), a batch at a time in key order."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["TABLES", "Table"]


@dataclass(frozen=True)
class Table:
    """A table: its columns as copied, the columns of its key (the copy's order), and its id sequence."""

    name: str
    columns: tuple[str, ...]
    key: tuple[str, ...]
    sequence: bool = False  # ids from a sequence that never goes back (the copy carries its position over)


TABLES = (
    Table("memories", ("id", "stream", "kind", "text", "created_at", "last_accessed_at", "importance",
                       "importance_source", "depth", "author", "author_id", "channel", "channel_id", "message_id",
                       "status", "attempts", "embedding", "next_attempt_at", "number", "reply_to"), ("id",),
          sequence=True),
    Table("evidence", ("reflection_id", "memory_id", "position"), ("reflection_id", "memory_id")),
    Table("reply_traces", ("id", "stream", "created_at", "query", "reply_memory_id", "message_id", "items",
                           "query_message_id", "query_author_id", "query_memory_id"), ("id",), sequence=True),
    Table("trace_messages", ("message_id", "trace_id"), ("message_id",)),
    Table("trace_items", ("memory_id", "trace_id"), ("memory_id", "trace_id")),
    Table("stream_state", ("stream", "importance_since_reflection", "last_reflection_at", "reflections",
                           "skipped_reflections"), ("stream",)),
    Table("model_usage", ("stream", "role", "calls", "failures", "prompt_tokens", "completion_tokens", "retries"),
          ("stream", "role")),
    Table("model_usage_daily", ("stream", "role", "day", "calls", "failures", "prompt_tokens", "completion_tokens",
                                "retries"), ("stream", "role", "day")),
    Table("faults", ("stream", "kind", "count"), ("stream", "kind")),
    Table("stream_numbers", ("stream", "last"), ("stream",)),
    Table("meta", ("key", "value"), ("key",)),
)
