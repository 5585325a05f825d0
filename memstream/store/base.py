"""The storage interface: what every part of memstream above the store may ask of one, whatever the backend.

A backend is one folder (memstream/store/sqlite/, memstream/store/postgres/) with a class that has every
method of `Store`, each keeping the guarantee its docstring states, and that announces what it commits
(events.py). The factory that picks a backend is `memstream.store.Store.open` (store/__init__.py).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from datetime import datetime
from typing import Any, Protocol, Self

import numpy as np
import numpy.typing as npt

from memstream.clock import Clock
from memstream.records import Counts, EvidenceNode, Memory, PendingState, ReplyTrace, RoleUsage, Source, StreamState
from memstream.store.events import StoreListener
from memstream.store.records import NewMemory, NewTrace, StreamArrays, UsageRow
from memstream.store.tables import Table

__all__ = ["StoreInterface"]

class StoreInterface(Protocol):
    """One persona's memory: every stream's memories, evidence, traces, counters and meta.

    Guarantees common to every method: a stream's memories are never returned for another stream unless
    the caller asks by id; ids (of memories and of traces) are never reused, even after a deletion; every
    method that writes more than one row does so in one transaction (all or nothing).
    """

    path: str  # where the store is, for messages (a file's path, or a URL without its password)
    usage_clock: Clock  # the wall clock that dates model usage (policy.UsageDay): the day a daily budget counts

    async def close(self) -> None:
        """Release the connection(s); a second call does nothing."""
        ...

    def listen(self, listener: StoreListener) -> Callable[[], None]:
        """Deliver what this store commits to `listener` (events.py): after each COMMIT, in commit order;
        nothing for a transaction rolled back. Returns what stops the deliveries."""
        ...

    async def __aenter__(self) -> Self: ...

    async def __aexit__(self, *exc: object) -> None: ...

    def transaction(self) -> contextlib.AbstractAsyncContextManager[None]:
        """One write transaction: everything the calling task writes inside it is committed together or not
        at all. Nested uses in the same task join the outer one; other tasks' writes wait for it to end."""
        ...

    # -- writing memories

    async def insert(self, memories: Sequence[NewMemory]) -> list[int]:
        """Append memories in one transaction; their new ids, in order. A memory without importance or
        embedding is stored pending. Refuses an embedding whose dimensions differ from the store's."""
        ...

    async def insert_unique(self, memories: Sequence[NewMemory]) -> list[tuple[int, bool]]:
        """Append the memories whose (stream, message id) is not stored yet; for each, its id and whether it
        is new. Idempotent across processes: a message is stored once however many insert it at once."""
        ...

    async def complete(self, memory_id: int, importance: int, source: str,
                       embedding: npt.NDArray[np.float32]) -> bool:
        """Make a pending memory ready; False if it is not pending (deleted, or completed elsewhere)."""
        ...

    async def complete_many(self, stream: str, items: Sequence[tuple[int, int, str, npt.NDArray[np.float32]]],
                            usage: Sequence[UsageRow] = (), *, texts: Sequence[str] | None = None) -> list[int]:
        """Make pending memories of one stream ready, add their importance to the stream's total and record
        `usage`, in one transaction. Returns the ids completed here: a memory deleted meanwhile, or completed
        by another process, is left out (its importance is never counted twice). With `texts` (the text each
        item's embedding was made from), a memory whose text changed meanwhile (an edited message) is left
        out too: it stays pending, to be embedded again from its new text."""
        ...

    async def count_attempt(self, memory_id: int, *, at: float | None = None) -> None:
        """One more failed attempt at a pending memory; with `at`, its next attempt waits retry_delay."""
        ...

    async def postpone(self, ids: Sequence[int], until: float) -> None:
        """Pending memories that wait, not for a failure but for `until` (a spent budget's renewal): their next
        attempt is then, no attempt is counted, and a claim on them is let go."""
        ...

    async def update_text(self, memory_id: int, text: str, embedding: npt.NDArray[np.float32] | None = None) -> None:
        """Replace a memory's text (an edited message); the old text is scrubbed later. With `embedding`, the
        memory keeps its status and takes that embedding; without, it goes back to pending at once (its
        embedding of the old text dropped, its attempts reset, leaving the index: MemoriesRemoved) for the
        write path to embed the new text (MemoriesReady when completed again; a ready memory's importance is
        taken from the stream's total, not to be counted twice when it is completed again)."""
        ...

    async def touch(self, ids: Sequence[int], at: float) -> None:
        """Set these memories' last access to `at`; inside deferred_touches() only collect it."""
        ...

    async def retrieved(self, ids: Sequence[int], at: float, *, usage: Sequence[UsageRow] = ()) -> dict[int, Memory]:
        """What a retrieval returns, at the cost of one write: the memories by id (missing ones left out, each as
        read before this call), their last access set to `at` as by `touch`, and `usage` added as by
        `record_usage_many`, all in one transaction."""
        ...

    # -- reading memories

    async def get(self, memory_id: int, *, stream: str | None = None) -> Memory:
        """One memory by id (in `stream` when given); MemoryNotFound otherwise."""
        ...

    async def get_many(self, ids: Sequence[int]) -> dict[int, Memory]:
        """Memories by id; missing ones are left out."""
        ...

    async def by_number(self, stream: str, number: int) -> int:
        """The id of the memory that `stream` shows as #number: each stream numbers its own memories from 1,
        in insertion order, never reusing a number (a purged stream starts again); MemoryNotFound otherwise."""
        ...

    async def recent(self, stream: str, limit: int, *, offset: int = 0, include_pending: bool = False,
                     kind: str | None = None) -> list[Memory]:
        """A stream's most recent memories (only `kind`'s, if given), newest first (ties: the larger id
        first)."""
        ...

    async def pending_memories(self, limit: int = 1000, *, due_at: float | None = None,
                               streams: Sequence[str] | None = None, claim: bool = False) -> list[Memory]:
        """Pending memories, oldest (smallest id) first; with `due_at`, only those whose retry is due; with
        `streams`, only those of these streams (any number of them). With `claim`, the memories returned
        are this process's to complete while it is there (a while at most): another process's call (with
        `claim`) skips them, so two processes never work on one pending memory, and a process started after
        this one ended gets them at once (SQLite: one process writes a file at a time, and completing twice
        is refused anyway; claim changes nothing there)."""
        ...

    async def find_message(self, stream: str, message_id: str) -> int | None:
        """The memory made from a Discord message in a stream, if any."""
        ...

    async def find_messages(self, keys: Sequence[tuple[str, str]]) -> dict[tuple[str, str], int]:
        """The memories made from these (stream, message id) pairs, where stored."""
        ...

    async def find_pending(self, keys: Sequence[tuple[str, str]]) -> dict[tuple[str, str], int]:
        """The pending observations made from no Discord message with these (stream, text) pairs (the oldest
        of each pair): an observation retried after its models failed is that memory, not a second one."""
        ...

    async def by_message(self, message_ids: Sequence[str]) -> list[int]:
        """Ids of the memories made from these Discord messages, in any stream."""
        ...

    async def by_author(self, stream: str, author_id: str) -> list[int]:
        """Ids of the observations made from one author's messages in a stream."""
        ...

    async def sources(self, stream: str, ids: Sequence[int] | None = None) -> dict[int, Source]:
        """Where these memories of `stream` came from (author, channel, message), by id (missing ones are left
        out); without `ids`, every ready memory's. What retrieval knows of who wrote what, and where."""
        ...

    async def author_memories(self, author_id: str, *, stream: str | None = None) -> list[Memory]:
        """One author's observations, oldest first: in one stream, or in every one."""
        ...

    def stream_pages(self, stream: str, *, page: int = 1000) -> AsyncIterator[list[Memory]]:
        """Every memory of a stream, pending ones too, oldest first, `page` at a time."""
        ...

    async def streams(self) -> list[str]:
        """Every stream key in the store (with memories or state)."""
        ...

    async def load_stream(self, stream: str, *, texts: bool = False, sources: bool = False,
                          each: Callable[[list[str]], None] | None = None) -> StreamArrays:
        """The ready memories of a stream as arrays for exact retrieval in process (rows in any order); with
        `texts`, each row's text too (for its in-memory lexical index), read in the same pass; with `sources`,
        each row's source where the same pass can read it (StreamArrays.sources; else None: see sources()).
        `each`: with `texts`, called with the texts of consecutive rows from row 0 on, in row order, as a backend
        that reads in parts gets them (in the thread that reads, while it reads on: the caller indexes them
        meanwhile), for the rows it reads so (possibly none); the rest are the caller's to read from `texts`."""
        ...

    async def load_vector(self, memory_id: int) -> npt.NDArray[np.float32]:
        """One memory's embedding; MemoryNotFound if it has none."""
        ...

    async def changed_elsewhere(self, streams: Iterable[str] = ()) -> set[str]:
        """Of these streams (whose matrices the caller holds), those another connection (another process)
        may have written to since the last call or their load, also delivered to the listeners as one
        ChangedElsewhere: they reload them. SQLite cannot tell
        streams apart (every stream, after any other connection's commit); the first call only sets the
        mark. PostgreSQL compares per-stream change versions."""
        ...

    def reflection_claim(self, stream: str) -> contextlib.AbstractAsyncContextManager[bool]:
        """Whether this process may reflect on `stream` now: while the block runs, no other process sharing
        the store does (yields False at once while another one holds it). SQLite: always True (a file has
        one persona process)."""
        ...

    # -- reflections and evidence

    async def save_reflection(self, stream: str, insights: Sequence[tuple[NewMemory, Sequence[int]]],
                              at: float, touches: dict[int, float] | None = None) -> list[int]:
        """Insights, their evidence pointers, the importance reset and the last-access updates of the
        reflection's retrievals, in one transaction; the insights' ids."""
        ...

    async def evidence(self, reflection_id: int) -> list[int]:
        """The memories a reflection cites, in citation order."""
        ...

    async def evidence_tree(self, memory_id: int, *, stream: str | None = None) -> EvidenceNode:
        """A memory with its evidence, down to observations (forgotten ones left out)."""
        ...

    async def evidence_links(self, stream: str) -> dict[int, list[int]]:
        """Every reflection of a stream and the memories it cites, in citation order (the index's grounding)."""
        ...

    # -- deleting

    async def delete(self, ids: Iterable[int], *, messages: Sequence[str] = (),
                     author: tuple[str, str] | None = None, keep: Iterable[int] = ()) -> list[int]:
        """Delete memories and, transitively, every reflection citing one and every reply (with its trace)
        answering one or built from one; traces answering `messages` or anything `author` (stream, author
        id) said go too. Memories in `keep` stay. One transaction; the ids deleted, sorted."""
        ...

    async def purge_stream(self, stream: str) -> int:
        """Delete a whole stream: memories, traces, state, usage and faults; the memories deleted."""
        ...

    async def scrub(self, *, wait: float = 2.0) -> bool:
        """After a deletion: make the deleted texts unreadable from the database's files (as far as the
        backend can); False if another reader held it up (finished later), True when done."""
        ...

    # -- stream state, counters and usage

    async def add_importance(self, stream: str, amount: int) -> int:
        """Add to the importance total since the last reflection (atomically); the new total."""
        ...

    async def state(self, stream: str) -> StreamState:
        """The importance total, last reflection time and reflection counters of a stream."""
        ...

    async def count_skipped_reflection(self, stream: str) -> None:
        """A reflection that could not run (it will be tried again)."""
        ...

    async def due_streams(self, threshold: int) -> list[str]:
        """Streams whose importance total has reached `threshold`, sorted."""
        ...

    async def record_usage(self, stream: str, role: str, *, calls: int = 1, failures: int = 0,
                           prompt_tokens: int = 0, completion_tokens: int = 0, retries: int = 0) -> None:
        """Count model calls and tokens per stream and role."""
        ...

    async def record_usage_many(self, rows: Sequence[UsageRow]) -> None:
        """Add many usage rows at once."""
        ...

    async def count_fault(self, stream: str, kind: str, count: int = 1) -> None:
        """Count a degraded outcome (rating_fallback, insight_dropped, ...)."""
        ...

    async def faults(self, stream: str | None = None) -> dict[str, int]:
        """Fault counts by kind (one stream, or all)."""
        ...

    async def usage(self, stream: str | None = None) -> dict[str, RoleUsage]:
        """Model calls and tokens per role (one stream, or all)."""
        ...

    async def usage_by_day(self, stream: str | None = None) -> list[tuple[datetime, str, RoleUsage]]:
        """Model calls and tokens per UTC day (of the wall clock, when the call was made) and role (one stream,
        or all), oldest first: (day at 00:00 UTC, role, its usage that day)."""
        ...

    async def usage_of_day(self, day: datetime) -> dict[str, RoleUsage]:
        """Model calls and tokens per role in the UTC day that holds `day` (by `usage_clock`), every stream's:
        what a daily budget has spent, as every process sharing the store has written it."""
        ...

    async def retries(self, stream: str | None = None) -> dict[str, int]:
        """Requests the model client retried, per role (one stream, or all)."""
        ...

    async def pending_state(self, stream: str | None = None) -> PendingState:
        """Pending observations: how many, their failed attempts, when the next retry is due."""
        ...

    async def recent_ratings(self, stream: str | None, limit: int) -> list[int]:
        """The importance the rater gave the latest `limit` observations it rated, newest first (of a stream,
        or of every stream): the flat-rater alarm's input (memstream.calibration)."""
        ...

    async def counts(self, stream: str | None = None) -> Counts:
        """Counts by kind and status, the importance histogram and fallback ratings."""
        ...

    # -- reply traces

    async def save_trace(self, trace: NewTrace) -> int:
        """Record what a reply was built from (one row per memory used, for deletion) and what it answered; the
        trace's id."""
        ...

    async def delete_trace(self, trace_id: int) -> None:
        """Delete a reply's trace (a reply never delivered)."""
        ...

    async def link_reply(self, trace_id: int, message_ids: Sequence[str], reply_memory_id: int | None) -> None:
        """Attach the Discord message ids of a sent reply to its trace (and the first to its memory)."""
        ...

    async def trace(self, *, trace_id: int | None = None, message_id: str | None = None) -> ReplyTrace | None:
        """A reply trace by its id or by the message id of any part of the reply."""
        ...

    # -- meta

    async def get_meta(self, key: str) -> str | None:
        """A value of the meta table (embedding_dimensions, ...)."""
        ...

    async def set_meta(self, key: str, value: str) -> None:
        """Set a value of the meta table."""
        ...

    # -- the embedding model

    def use_embedding_model(self, model: str | None) -> None:
        """The model that makes the embeddings written from now on. The store records the model of its first
        embedding (a store older than the record adopts this one at its next write of an embedding); a write of
        an embedding while another model is recorded is refused (StoreError naming both, nothing written).
        None: no check."""
        ...

    async def check_embedding_model(self) -> None:
        """StoreError (naming both models) when the store's embeddings were made by another model than the one
        in use: a query embedded by it cannot be ranked against them."""
        ...

    async def reembed_todo(self, stream: str, model: str, limit: int) -> list[tuple[int, str]]:
        """(id, text) of the next `limit` embedded memories of `stream` (in id order) not yet re-embedded with
        `model` by reembed (a run interrupted resumes where it stopped)."""
        ...

    async def reembed_left(self, stream: str, model: str) -> int:
        """How many embedded memories of `stream` are not yet re-embedded with `model`."""
        ...

    async def reembed(self, stream: str, model: str, items: Sequence[tuple[int, npt.NDArray[np.float32]]]) -> None:
        """Replace these memories' embeddings (made by `model`) and record how far the stream is, in one
        transaction; announces StreamDropped(stream). From then until finish_reembed, every other write of an
        embedding and every check_embedding_model is refused (a stream may hold both models' vectors)."""
        ...

    async def finish_reembed(self, model: str, dimensions: int | None) -> None:
        """Every stream is re-embedded: record `model` (and its `dimensions`) as the store's, clear the progress."""
        ...

    # -- whole rows, for copying a persona between backends (memstream copy)

    async def table_rows(self, table: Table, after: Sequence[Any] | None, limit: int) -> list[tuple[Any, ...]]:
        """Up to `limit` rows of `table` (its columns as in tables.TABLES) whose key is after `after` (all,
        if None), in key order, text compared bytewise; embeddings as float32 arrays."""
        ...

    async def put_rows(self, table: Table, rows: Sequence[Sequence[Any]]) -> None:
        """Write rows as they are (same ids) in one transaction; a row whose key is already there is left
        alone, so writing a batch twice stores it once."""
        ...

    async def last_key(self, table: Table) -> tuple[Any, ...] | None:
        """The largest key in `table`, in table_rows' order (None if empty)."""
        ...

    async def count_rows(self, table: Table) -> int:
        """Rows in `table`."""
        ...

    async def id_floor(self, table: Table) -> int:
        """The largest id `table` ever gave, deleted ones included (0 for a table without ids)."""
        ...

    async def raise_id_floor(self, table: Table, floor: int) -> None:
        """New ids of `table` start above `floor` (never lowered)."""
        ...

    async def optimize(self) -> None:
        """After a bulk write (a copy): let the database plan and read well from the start (PostgreSQL:
        VACUUM ANALYZE, which sets the visibility map and the planner's statistics; SQLite: PRAGMA optimize)."""
        ...
