"""The per-stream matrices of one store, loaded on first use and kept in step with it by its events.

VectorIndex is a StoreListener (memstream/store/events.py): the only writer of the matrices it holds.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable, Mapping, Sequence

import numpy as np

from memstream.config import StreamConfig
from memstream.index import _kernels as kernels
from memstream.index import _pages as pages
from memstream.index import _release as release
from memstream.index.context import StreamContext
from memstream.index.gathering import Gathering
from memstream.index.grounding import Grounding
from memstream.index.profiles import uses_context, uses_grounding, uses_lexical
from memstream.index.resident import RESIDENT_MB, Resident, bytes_per_memory, load_room
from memstream.index.vectors import SCREEN_BYTES, StreamVectors
from memstream.records import Source
from memstream.store import Store, StreamArrays
from memstream.store.events import (
    EvidenceSaved,
    MemoriesReady,
    MemoriesRemoved,
    MemoriesTouched,
    MemoryUpdated,
    StoreEvent,
    StreamDropped,
)

__all__ = ["VectorIndex"]

log = logging.getLogger(__name__)
# A stream this large makes the compiled retrieval loops worth loading (kernels.warm).
_WARM_ROWS = 20_000
# Seconds after a loaded stream's first query before its context's maps for writes are built (_complete_soon).
_COMPLETE_AFTER = 0.25

Op = Callable[[StreamVectors], None]


class VectorIndex:
    """The per-stream matrices of one store, loaded on first use and kept in step with it by listening to it.

    The index is a StoreListener (memstream/store/events.py): the store announces what each transaction
    committed, after its COMMIT, and nothing else writes to a matrix. Scoring (`locked`) and writes to one
    stream take turns: a write that arrives while the stream is being scored waits for the scoring to end (it
    never waits for the store). Writes that arrive while a stream is being loaded are kept and replayed on the
    loaded matrix (each is idempotent), so none is lost to the race between the load's snapshot and the write.
    """

    def __init__(self, store: Store, *, lexical: bool = False, grounding: bool = False,
                 screen_bytes: int = SCREEN_BYTES, language: str = "english", context: bool = False,
                 resident_bytes: int = RESIDENT_MB << 20) -> None:
        self.store = store
        self.lexical = lexical  # keep a lexical index of each stream beside its matrix
        self.language = language  # its stemmer (lexical.py)
        self.grounding = grounding  # and each reflection's grounding (grounding.py)
        self.context = context  # and each stream's authors, neighbours and time words (context.py)
        self.screen_bytes = screen_bytes  # for each stream's screen (StreamVectors.screen)
        self._streams: dict[str, StreamVectors] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        self._loading: dict[str, asyncio.Task[StreamVectors]] = {}
        self._journals: dict[str, list[Op]] = {}
        self._waiting: dict[str, list[Op]] = {}  # writes that came while the stream was being scored
        self._generation: dict[str, int] = {}
        self._hints: dict[str, dict[int, int]] = {}  # where the last winners were: id -> row
        self.resident = Resident(resident_bytes)  # the budget: which streams stay loaded (resident.py)
        if resident_bytes:
            release.bound_heap()  # what a dropped stream held can go back to the system (_release.py)
        # Loads take turns: a load holds its rows and their temporaries before the budget can count them, so
        # several at once (cold queries of several servers) would take the process past it by as many streams.
        self._turn = asyncio.Semaphore(1)
        self._background: set[asyncio.Task[None]] = set()  # prefetches, completions: cancelled by close
        self._stop = store.listen(self)

    @classmethod
    def for_config(cls, store: Store, config: StreamConfig, *, resident_bytes: int | None = None) -> VectorIndex:
        """The index a profile needs (its lexical index, grounding, the levers' context; its stemmer, screen and
        resident budget), as MemoryStream builds it: benches and tests build theirs the same way."""
        return cls(store, lexical=uses_lexical(config), grounding=uses_grounding(config),
                   screen_bytes=config.screen_mb << 20, language=config.stemmer, context=uses_context(config),
                   resident_bytes=config.resident_mb << 20 if resident_bytes is None else resident_bytes)

    def close(self) -> None:
        """Stop listening to the store (the matrices are left to the garbage collector)."""
        for task in self._background:
            task.cancel()
        self._stop()
        for stream in list(self._streams):
            self.resident.forget(stream)
        self._streams.clear()

    async def get(self, stream: str) -> StreamVectors:
        """The matrix of a stream, loading it from the store the first time, and again after another
        process wrote to the file (memories added, forgotten or edited elsewhere are seen at once: the
        store announces them as ChangedElsewhere, which drops the matrix)."""
        await self.store.changed_elsewhere([*self._streams, *self._loading])  # (tracked from the first query on)
        found = self._streams.get(stream)
        if found is not None:
            self.resident.touch(stream)
            return found
        task = self._loading.get(stream)
        if task is None:
            self._make_room(stream)
            self._journals[stream] = []
            task = asyncio.ensure_future(self._load(stream))
            self._loading[stream] = task
        return await asyncio.shield(task)

    def prefetch(self, stream: str) -> None:
        """Start loading a stream that is not in memory, without waiting for it: a query's load then runs while
        its text is being embedded (a model server's round trip, often longer than the load), and the query finds
        the stream loaded or loading. A failed load is not reported here: the query's own `get` meets it."""
        if stream in self._streams or stream in self._loading:
            return
        task = asyncio.ensure_future(self._prefetched(stream))
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _prefetched(self, stream: str) -> None:
        with contextlib.suppress(Exception):
            await self.get(stream)

    async def _load(self, stream: str) -> StreamVectors:
        async with self._turn:
            return await self._load_now(stream)

    async def _load_now(self, stream: str) -> StreamVectors:
        generation = self._generation.get(stream, 0)
        try:
            # The rows and the reflections' evidence, read at once: evidence saved between the two reads, or
            # after them, comes as an event meanwhile (journaled below, since before either read began).
            # (a backend that reads in parts hands over each part's texts as they come: gathered meanwhile)
            gathering = Gathering(self.language if self.lexical else None, self.context)
            arrays, evidence = await asyncio.gather(
                self.store.load_stream(stream, texts=self.lexical or self.context, sources=self.context,
                                       each=gathering.feed),
                self.store.evidence_links(stream) if self.grounding else _nothing())
            if len(arrays.ids):  # (its rows are read: room for what they will hold, before the rest is built)
                self._make_room(stream, len(arrays.ids), arrays.blocks()[0].shape[1])
            vectors = await asyncio.to_thread(StreamVectors, arrays, copy=False, screen_bytes=self.screen_bytes)
            vectors.screen_after = 1  # its screen built by its second query, not its first (StreamVectors.screen)
            pages.collapse_in_background(vectors)
            if self.lexical or self.context:
                ids = arrays.ids.tolist()
                context = await asyncio.to_thread(self._index, vectors, arrays, ids, gathering)
                if context is not None and arrays.sources is None:  # (a backend that reads them apart)
                    context.set_sources(await self.store.sources(stream), ids)
            if evidence is not None:
                vectors.grounding = Grounding(evidence)
            for op in self._journals.get(stream, []):
                op(vectors)
            if self._generation.get(stream, 0) == generation:
                self._streams[stream] = vectors
                self._account(stream, vectors)
            return vectors
        finally:
            self._loading.pop(stream, None)
            self._journals.pop(stream, None)

    def _index(self, vectors: StreamVectors, arrays: StreamArrays, ids: list[int],
               gathered: Gathering) -> StreamContext | None:
        """A loaded stream's lexical index and context, linked to the sources its load read, in a worker thread:
        not yet visible to any query or write (those that come meanwhile are journaled), and off the event loop
        (linking a 50k stream's sources takes ~80 ms that hot queries would otherwise wait through)."""
        context = vectors.index(ids, arrays.texts or [], language=self.language if self.lexical else None,
                                context=self.context, gathered=gathered)
        if context is not None and arrays.sources is not None:
            context.load_sources(ids, arrays.sources)
        return context

    @contextlib.asynccontextmanager
    async def locked(self, stream: str, *,
                     uncommitted: Mapping[int, float] | None = None) -> AsyncIterator[StreamVectors]:
        """The matrix of a stream, with no write to it until the block ends. `uncommitted`: last accesses
        (id: time) this task wrote but has not committed yet (a reflection's own retrievals), seen inside the
        block only. The budget does not drop the stream from its load to the end of the block."""
        with self.resident.pinned(stream):
            async with self._locked(stream, uncommitted) as vectors:
                yield vectors
        self._account(stream, vectors)  # what the query built counts too (its screen, its caches)

    @contextlib.asynccontextmanager
    async def _locked(self, stream: str, uncommitted: Mapping[int, float] | None) -> AsyncIterator[StreamVectors]:
        vectors = await self.get(stream)
        sources = await self._sources(stream, vectors)
        async with self._lock(stream):
            self._flush(stream)
            current = self._streams.get(stream, vectors)
            if sources is not None and current.context is not None:
                current.context.set_sources(*sources)
            undo = current.overlay(uncommitted) if uncommitted else None
            try:
                yield current
            finally:
                if undo is not None:
                    undo()
                self._flush(stream)
                if current.n >= _WARM_ROWS:
                    # After the first query, not before it: loading the loops holds the GIL for a while.
                    kernels.warm(background=True)
            if current.context is not None and current.context.incomplete():
                self._complete_soon(stream, current)

    def _complete_soon(self, stream: str, vectors: StreamVectors) -> None:
        """Shortly after a loaded stream's first query, what its load left to its context for writes
        (StreamContext.complete), in a worker thread under the stream's lock (writes meanwhile wait their turn,
        as during a query), unless the stream is dropped first. Not at once: the query that loaded the stream
        has its touch and trace still to write. A write that comes before completes it where it applies."""
        async def complete() -> None:
            await asyncio.sleep(_COMPLETE_AFTER)
            async with self._lock(stream):
                context = vectors.context
                if self._streams.get(stream) is vectors and context is not None and context.incomplete():
                    await asyncio.to_thread(context.complete)
                self._flush(stream)

        task = asyncio.ensure_future(complete())
        self._background.add(task)  # (cancelled by close)
        task.add_done_callback(self._background.discard)

    async def _sources(self, stream: str, vectors: StreamVectors) -> tuple[dict[int, Source], list[int]] | None:
        """The sources of the rows that came after the load, read from the store (None: there are none)."""
        if vectors.context is None:
            return None
        asked = vectors.context.unknown()
        return (await self.store.sources(stream, asked), asked) if asked else None

    def loaded(self, stream: str) -> StreamVectors | None:
        """The matrix if loaded."""
        return self._streams.get(stream)

    def hint(self, stream: str, ids: Sequence[int], rows: Sequence[int]) -> None:
        """Where these memories were when last ranked: their touch, when the store announces it, need not
        look for them (a hint, checked before use)."""
        self._hints[stream] = dict(zip((int(i) for i in ids), (int(r) for r in rows), strict=True))

    def drop(self, stream: str) -> None:
        """Forget the matrix of a stream (a load in progress is not kept); the next query reloads it."""
        self._streams.pop(stream, None)
        self._waiting.pop(stream, None)
        self._hints.pop(stream, None)
        self._generation[stream] = self._generation.get(stream, 0) + 1
        self.resident.forget(stream)

    # -- the resident budget (resident.py) ---------------------------------------------------------

    def _account(self, stream: str, vectors: StreamVectors) -> None:
        """A stream was loaded or written: note its size, and drop others while the total is over the budget
        (never this one, nor one being scored, loaded or written)."""
        if self._streams.get(stream) is not vectors:
            return
        self.resident.account(stream, vectors.nbytes())
        self._evict(self.resident.over(stream, self._busy))

    def _make_room(self, stream: str, rows: int = 0, dim: int = 0) -> None:
        """Before a stream's reload, drop others until it fits within the budget at the size it had, with what
        its load holds meanwhile; once its rows are read (`rows` of `dim`), until it fits at the size they say
        (bytes_per_memory), with what building its lexical index and context holds."""
        texts = self.lexical or self.context
        kept = self.resident.expected(stream)
        expected = kept + load_room(kept, texts=texts)
        if rows:
            said = rows * bytes_per_memory(dim, lexical=texts)
            expected = max(expected, said + load_room(said, texts=texts, read=True))
        if kept or rows:
            self._evict(self.resident.over(stream, self._busy, incoming=expected))

    def _evict(self, victims: Sequence[str]) -> None:
        for victim in victims:
            self.resident.evicted(victim)
            self.drop(victim)
        if victims:
            release.soon()  # what they held, back to the system

    def _busy(self, stream: str) -> bool:
        lock = self._locks.get(stream)
        return (lock is not None and lock.locked()) or stream in self._loading or self.resident.is_pinned(stream)

    # -- the listener ------------------------------------------------------------------------------

    def committed(self, events: Sequence[StoreEvent]) -> None:
        """What the store committed, applied in order to the matrices loaded or being loaded."""
        for event in events:
            if isinstance(event, MemoriesReady):
                self._ready(event)
            elif isinstance(event, MemoriesTouched):
                self._touched(event)
            elif isinstance(event, MemoryUpdated):
                self._write(event.stream, _updated(event))
            elif isinstance(event, EvidenceSaved):
                self._write(event.stream, _grounded(event))
            elif isinstance(event, MemoriesRemoved):
                for stream in sorted(set(self._streams) | set(self._journals)):
                    self._write(stream, _removed(event))
            elif isinstance(event, StreamDropped):
                self.drop(event.stream)
            else:
                for stream in sorted(event.streams):
                    self.drop(stream)

    def _ready(self, event: MemoriesReady) -> None:
        texts = list(event.texts)

        def op(vectors: StreamVectors) -> None:  # a memory becomes ready once: no check needed live
            vectors.append(event.ids, event.embeddings, event.importance, event.last_accessed, event.created, texts)

        def replay(vectors: StreamVectors) -> None:  # the load's snapshot may hold it already
            fresh = ~np.isin(event.ids, vectors.ids)
            if fresh.any():
                vectors.append(event.ids[fresh], event.embeddings[fresh], event.importance[fresh],
                               event.last_accessed[fresh], event.created[fresh],
                               [w for w, f in zip(texts, fresh.tolist(), strict=True) if f])

        self._write(event.stream, op, replay)

    def _touched(self, event: MemoriesTouched) -> None:
        streams = [event.stream] if event.stream is not None else sorted(set(self._streams) | set(self._journals))
        for stream in streams:
            hint = self._hints.get(stream, {})
            rows = [hint[i] for i in event.ids] if all(i in hint for i in event.ids) else None
            self._write(stream, _touch(event, rows))

    def _write(self, stream: str, op: Op, replay: Op | None = None) -> None:
        """Apply a write to the loaded matrix now, or after the scoring under way; keep it (`replay`, if
        given) for the load in progress."""
        if stream in self._journals:
            self._journals[stream].append(replay or op)
        vectors = self._streams.get(stream)
        if vectors is None:
            return
        if self._lock(stream).locked():
            self._waiting.setdefault(stream, []).append(op)
        else:
            self._run(stream, vectors, op)

    def _flush(self, stream: str) -> None:
        for op in self._waiting.pop(stream, []):
            vectors = self._streams.get(stream)
            if vectors is None:
                return
            self._run(stream, vectors, op)

    def _run(self, stream: str, vectors: StreamVectors, op: Op) -> None:
        try:
            op(vectors)
        except Exception:  # the matrix may be half-written: the store has it right, reload from there
            log.exception("the in-memory index of stream %r could not apply a committed write; reloading it", stream)
            self.drop(stream)
            return
        self._account(stream, vectors)

    def _lock(self, stream: str) -> asyncio.Lock:
        return self._locks.setdefault(stream, asyncio.Lock())


async def _nothing() -> None:
    return None


def _updated(event: MemoryUpdated) -> Op:
    return lambda vectors: vectors.update(event.memory_id, event.embedding, event.text)


def _grounded(event: EvidenceSaved) -> Op:
    def op(vectors: StreamVectors) -> None:  # (setting a value: replayed on a load's snapshot, the same)
        if vectors.grounding is not None:
            vectors.grounding.add(event.reflections)

    return op


def _removed(event: MemoriesRemoved) -> Op:
    return lambda vectors: vectors.remove(event.ids)


def _touch(event: MemoriesTouched, rows: Sequence[int] | None) -> Op:
    return lambda vectors: vectors.touch(event.ids, event.at, rows)
