"""What the store tells the indexes that live beside it: typed events of what was committed.

Every write of a backend announces what it changed (memories ready, touched, updated, removed, a stream
dropped, the evidence of reflections saved). Inside a transaction the announcements are held and delivered to
every listener after its COMMIT, in the order they were made; a transaction that rolls back delivers nothing.
A write outside a transaction (one statement, committed on its own) delivers at once. What other processes
committed is delivered too, as `ChangedElsewhere`, when the store notices it (`Store.changed_elsewhere`).

Listeners are synchronous and must not fail: they run inside the store's commit, before the next
transaction of this process can begin, so each sees the writes in the order they were committed.
`Announcer` is the part both backends share; a backend supplies one primitive, `_open_events` (the events of
the transaction a write joins, or None).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from memstream.store.arrays import F32, F64, I64
from memstream.store.records import NewMemory
from memstream.store.tables import Table

__all__ = ["Announcer", "ChangedElsewhere", "EvidenceSaved", "MemoriesReady", "MemoriesRemoved", "MemoriesTouched",
           "MemoryUpdated", "StoreEvent", "StoreListener", "StreamDropped", "dropped_streams", "evidence_saved",
           "ready_event", "ready_inserted", "touched_at", "touched_rows"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, eq=False)
class MemoriesReady:
    """Memories of one stream became ready (rated and embedded): rows for the in-memory indexes."""

    stream: str
    ids: I64
    embeddings: F32  # (len(ids), dim), as stored
    importance: F64
    last_accessed: F64
    created: F64
    texts: tuple[str, ...]


@dataclass(frozen=True)
class MemoriesTouched:
    """These memories were last accessed at `at` (a retrieval returned them); `stream` None: any stream."""

    stream: str | None
    ids: tuple[int, ...]
    at: float


@dataclass(frozen=True, eq=False)
class MemoryUpdated:
    """A memory's text and embedding were replaced (an edited message)."""

    stream: str
    memory_id: int
    embedding: F32
    text: str


@dataclass(frozen=True)
class EvidenceSaved:
    """Reflections were saved: each (id, the memories it cites in citation order). Announced after their
    MemoriesReady, in the same transaction."""

    stream: str
    reflections: tuple[tuple[int, tuple[int, ...]], ...]


@dataclass(frozen=True)
class MemoriesRemoved:
    """These memories are gone (from whichever streams held them)."""

    ids: tuple[int, ...]


@dataclass(frozen=True)
class StreamDropped:
    """A stream was purged, or its rows were replaced wholesale: whatever is held of it is stale."""

    stream: str


@dataclass(frozen=True)
class ChangedElsewhere:
    """Another process (or another connection to the same file) committed writes to these streams."""

    streams: frozenset[str]


StoreEvent = (MemoriesReady | MemoriesTouched | MemoryUpdated | EvidenceSaved | MemoriesRemoved | StreamDropped
              | ChangedElsewhere)


class StoreListener(Protocol):
    """Hears what a store committed, in commit order."""

    def committed(self, events: Sequence[StoreEvent]) -> None:
        """The events of one commit (or one notice of other processes' commits)."""


def ready_event(stream: str, ids: Sequence[int], embeddings: Sequence[F32], importance: Sequence[float],
                times: Sequence[tuple[float, float]], texts: Sequence[str]) -> MemoriesReady:
    """A MemoriesReady from rows: `times` are (last accessed, created) per memory."""
    matrix = np.stack([np.asarray(v, dtype=np.float32).reshape(-1) for v in embeddings]) if len(ids) else \
        np.zeros((0, 0), np.float32)
    when = np.asarray(times, dtype=np.float64).reshape(-1, 2)
    return MemoriesReady(stream, np.asarray(ids, dtype=np.int64), matrix, np.asarray(importance, dtype=np.float64),
                         when[:, 0].copy(), when[:, 1].copy(), tuple(texts))


def ready_inserted(ids: Sequence[int], memories: Sequence[NewMemory]) -> list[MemoriesReady]:
    """The memories inserted ready (an insight, a memory given whole), one MemoriesReady per stream."""
    ready: dict[str, list[tuple[int, NewMemory]]] = {}
    for memory_id, m in zip(ids, memories, strict=True):
        if m.importance is not None and m.embedding is not None:
            ready.setdefault(m.stream, []).append((memory_id, m))
    return [ready_event(stream, [i for i, _ in group], [m.embedding for _, m in group if m.embedding is not None],
                        [m.importance or 0 for _, m in group], [(m.created_at, m.created_at) for _, m in group],
                        [m.text for _, m in group])
            for stream, group in ready.items()]


def touched_rows(rows: Iterable[Sequence[Any]]) -> list[MemoriesTouched]:
    """What a touch wrote, as its UPDATE returned it (stream, id, last access): one MemoriesTouched per stream
    and time. The time is the store's (a last access never goes back before its memory was made), so an index
    fed by the events holds what the store holds."""
    by_key: dict[tuple[str, float], list[int]] = {}
    for stream, memory_id, at in rows:
        by_key.setdefault((str(stream), float(at)), []).append(int(memory_id))
    return [MemoriesTouched(stream, tuple(sorted(ids)), at) for (stream, at), ids in sorted(by_key.items())]


def touched_at(stream: str, touches: dict[int, float]) -> list[MemoriesTouched]:
    """A reflection's collected touches (id: time) as one MemoriesTouched per time."""
    by_time: dict[float, list[int]] = {}
    for memory_id, at in sorted(touches.items()):
        by_time.setdefault(at, []).append(memory_id)
    return [MemoriesTouched(stream, tuple(ids), at) for at, ids in sorted(by_time.items())]


def evidence_saved(stream: str, ids: Sequence[int], cited: Sequence[Sequence[int]]) -> EvidenceSaved:
    """What save_reflection wrote: each new reflection and what it cites."""
    return EvidenceSaved(stream, tuple((int(i), tuple(int(c) for c in found)) for i, found in zip(ids, cited,
                                                                                                 strict=True)))


def dropped_streams(table: Table, rows: Sequence[Sequence[Any]]) -> list[StreamDropped]:
    """Rows written as they are (a copy) replace what an index holds of their streams: one StreamDropped each."""
    if table.name != "memories" or not rows:
        return []
    at = table.columns.index("stream")
    return [StreamDropped(stream) for stream in sorted({str(row[at]) for row in rows})]


class Announcer:
    """The listeners of a store, and its announcements: held by the open transaction, delivered after COMMIT."""

    def __init__(self) -> None:
        self._listeners: list[StoreListener] = []

    def listen(self, listener: StoreListener) -> Callable[[], None]:
        """Deliver this store's committed events to `listener` from now on; returns what stops it."""
        self._listeners.append(listener)

        def stop() -> None:
            if listener in self._listeners:
                self._listeners.remove(listener)

        return stop

    def _open_events(self) -> list[StoreEvent] | None:
        """The events of the transaction a write made now joins (None: it commits on its own)."""
        raise NotImplementedError

    def _announce(self, *events: StoreEvent) -> None:
        """What a write changed: held by the open transaction, or delivered now if it committed on its own."""
        held = self._open_events()
        if held is not None:
            held.extend(events)
        else:
            self._deliver(events)

    def _deliver(self, events: Sequence[StoreEvent]) -> None:
        if not events:
            return
        for listener in list(self._listeners):
            try:
                listener.committed(events)
            except Exception:  # a listener's bug must not undo or hide a commit that happened
                log.exception("a store listener failed on %d event(s)", len(events))
