"""Store events (memstream/store/events.py): delivered after COMMIT, once each and in order, nothing on
rollback; the in-memory index, fed by nothing else, stays what a rebuild from the store would be."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memstream import CompletionError, MemoryStream, Observation, RoleModel, Source, Store, StreamConfig
from memstream.clock import to_timestamp
from memstream.index.vector_index import VectorIndex
from memstream.index.vectors import StreamVectors
from memstream.store import NewMemory
from memstream.store.events import (
    ChangedElsewhere,
    MemoriesReady,
    MemoriesRemoved,
    MemoriesTouched,
    MemoryUpdated,
    StoreEvent,
    StreamDropped,
)
from memstream.testing import FakeClock, FakeEmbedder, ScriptedChat

STREAM = "guild:1"
DIM = 8


class Recorder:
    """A listener that keeps every delivery (one list per commit)."""

    def __init__(self) -> None:
        self.deliveries: list[list[StoreEvent]] = []

    def committed(self, events: Sequence[StoreEvent]) -> None:
        self.deliveries.append(list(events))


def _ready(text: str, stream: str = STREAM, at: float = 100.0) -> NewMemory:
    vector = np.arange(1, DIM + 1, dtype=np.float32) + len(text)
    return NewMemory(stream=stream, kind="observation", text=text, created_at=at, importance=4,
                     importance_source="given", embedding=vector)


async def test_a_rolled_back_transaction_delivers_nothing(store: Store) -> None:
    heard = Recorder()
    store.listen(heard)
    [kept] = await store.insert([_ready("kept")])
    heard.deliveries.clear()
    with pytest.raises(RuntimeError):
        async with store.transaction():
            await store.insert([_ready("never")])
            await store.touch([kept], 500.0)
            await store.update_text(kept, "edited", np.ones(DIM, np.float32))
            await store.delete([kept])
            raise RuntimeError("rolled back")
    assert heard.deliveries == []
    assert (await store.get(kept)).text == "kept"


async def test_a_commit_delivers_each_event_once_in_order_after_commit(store: Store) -> None:
    heard = Recorder()
    stop = store.listen(heard)
    async with store.transaction():
        first, second = await store.insert([_ready("one"), _ready("two", at=200.0)])
        await store.touch([first], 300.0)
        await store.update_text(second, "two, edited", np.full(DIM, 2.0, np.float32))
        await store.delete([first])
        assert heard.deliveries == []  # nothing before COMMIT
    [events] = heard.deliveries
    assert [type(e) for e in events] == [MemoriesReady, MemoriesTouched, MemoryUpdated, MemoriesRemoved]
    ready, touched, updated, removed = events
    assert isinstance(ready, MemoriesReady) and ready.ids.tolist() == [first, second]
    assert ready.texts == ("one", "two") and ready.created.tolist() == [100.0, 200.0]
    assert ready.last_accessed.tolist() == [100.0, 200.0] and ready.importance.tolist() == [4.0, 4.0]
    two = _ready("two").embedding
    assert two is not None and np.array_equal(ready.embeddings[1], two)
    assert isinstance(touched, MemoriesTouched) and (touched.ids, touched.at) == ((first,), 300.0)
    assert isinstance(updated, MemoryUpdated) and (updated.memory_id, updated.text) == (second, "two, edited")
    assert removed == MemoriesRemoved((first,))
    await store.purge_stream(STREAM)
    assert heard.deliveries[-1] == [StreamDropped(STREAM)]
    stop()
    await store.insert([_ready("unheard")])
    assert len(heard.deliveries) == 2


async def test_a_write_outside_a_transaction_delivers_at_once_and_a_pending_memory_nothing(store: Store) -> None:
    heard = Recorder()
    store.listen(heard)
    [pending] = await store.insert([NewMemory(stream=STREAM, kind="observation", text="p", created_at=1.0)])
    assert heard.deliveries == []  # pending: nothing for an index yet
    assert await store.complete_many(STREAM, [(pending, 7, "rater", np.ones(DIM, np.float32))]) == [pending]
    [[ready]] = heard.deliveries
    assert isinstance(ready, MemoriesReady) and ready.ids.tolist() == [pending]
    assert (ready.texts, ready.importance.tolist()) == (("p",), [7.0])


async def test_another_connection_s_commit_is_announced_as_changed_elsewhere(database: Path | str) -> None:
    mine, theirs = await Store.open(database), await Store.open(database)
    try:
        heard = Recorder()
        mine.listen(heard)
        await mine.insert([_ready("mine")])
        await mine.load_stream(STREAM)  # (PostgreSQL tracks the streams this process loaded)
        assert await mine.changed_elsewhere([STREAM]) == set()
        heard.deliveries.clear()
        await theirs.insert([_ready("theirs")])
        assert await mine.changed_elsewhere([STREAM]) == {STREAM}
        assert heard.deliveries == [[ChangedElsewhere(frozenset({STREAM}))]]
    finally:
        await mine.close()
        await theirs.close()


async def test_a_failed_reflection_announces_nothing_and_the_index_keeps_its_last_accesses(
        store: Store, clock: FakeClock) -> None:
    def insights(prompt: str, model: str) -> str:
        raise CompletionError("the reflector is down", retryable=True)

    chat = ScriptedChat(default="5").on("most salient", "What does Maria like?").on("high-level insights", insights)
    role = RoleModel(chat, "m")
    memory = MemoryStream(store, FakeEmbedder(dim=DIM), rater=role, reflector=role, agent=role, name="Isabella",
                          summary="Runs a cafe.", clock=clock, auto_reflect=False)
    await memory.observe_many([Observation(f"Maria paints picture {i}", STREAM) for i in range(6)])
    await memory.retrieve("paint", stream=STREAM)  # loaded
    clock.advance(hours=3)
    before = (await memory.index.get(STREAM)).last_accessed.copy()
    heard = Recorder()
    store.listen(heard)
    with pytest.raises(CompletionError):
        await memory.reflect(STREAM)
    assert [e for delivery in heard.deliveries for e in delivery] == []
    loaded = memory.index.loaded(STREAM)
    assert loaded is not None and loaded.last_accessed.tolist() == before.tolist()
    await _assert_index_is_a_rebuild(memory, STREAM)


# -- an index fed only by events equals one rebuilt from the store ----------------------------------

_OPS = st.lists(st.tuples(st.sampled_from(["observe", "retrieve", "edit", "forget", "purge", "elsewhere",
                                           "elsewhere-forget", "advance", "rewind"]),
                          st.integers(0, 30)), min_size=1, max_size=14)
_examples = itertools.count()


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=_OPS)
async def test_an_index_fed_by_events_equals_a_rebuild_after_any_writes(database: Path | str,
                                                                       ops: list[tuple[str, int]]) -> None:
    stream = f"guild:{next(_examples)}"  # a fresh stream per example, in one database
    clock = FakeClock()
    store, other = await Store.open(database), await Store.open(database)
    role = RoleModel(ScriptedChat(default="6"), "m")
    memory = MemoryStream(store, FakeEmbedder(dim=DIM), rater=role, reflector=role, agent=role, name="Isabella",
                          summary="Runs a cafe.", clock=clock, auto_reflect=False,
                          config=StreamConfig(profile="hybrid"))
    try:
        made, stale = 0, False  # stale: another process wrote since this index last asked the store
        await memory.observe_many([Observation("the first word", stream, source=Source(message_id="m0"))])
        await memory.retrieve("word", stream=stream)  # the index holds the stream from here on
        for op, n in ops:
            clock.advance(minutes=1)  # every touch moves a last access
            loaded = memory.index.loaded(stream)
            ids = [] if loaded is None else sorted(loaded.ids.tolist())
            if op == "observe":
                made += 1
                await memory.observe_many([Observation(f"note {made} about {n} cats", stream,
                                                       source=Source(message_id=f"m{made}"))])
            elif op == "retrieve":  # a query asks the store what other processes changed
                await memory.retrieve(f"cats {n}", stream=stream, k=1 + n % 4)
                stale = False
            elif op == "edit" and made:
                await memory.edit_message(stream, f"m{n % (made + 1)}", f"edited to {n} dogs")
            elif op == "forget" and ids:
                await memory.forget([ids[n % len(ids)]])
            elif op == "purge":
                await memory.purge(stream)
            elif op == "elsewhere":
                vector = np.linspace(-1, 1, DIM, dtype=np.float32) * (n + 1)
                await other.insert([NewMemory(stream=stream, kind="observation", text=f"from another process {n}",
                                              created_at=to_timestamp(clock.now()), importance=3,
                                              importance_source="given", embedding=vector)])
            elif op == "elsewhere-forget" and ids:
                await other.delete([ids[n % len(ids)]])
            elif op == "advance":
                clock.advance(hours=n)
            elif op == "rewind":  # a clock set back (--at): touches then land before memories were made
                clock.advance(hours=-n - 1)
            stale = stale or op.startswith("elsewhere")
            fed = memory.index.loaded(stream)
            if fed is not None and not stale:
                _assert_same(fed, await _rebuilt(other, stream))  # after each write, before any reload
        _assert_same(await memory.index.get(stream), await _rebuilt(other, stream))  # what a query uses now
    finally:
        await memory.close()
        await other.close()


async def _rebuilt(store: Store, stream: str) -> StreamVectors:
    """A stream's matrix and lexical index built from the store now (another connection's view of the file)."""
    arrays = await store.load_stream(stream, texts=True)
    vectors = StreamVectors(arrays, copy=False)
    vectors.index_texts(arrays.ids.tolist(), arrays.texts or [])
    return vectors


async def _assert_index_is_a_rebuild(memory: MemoryStream, stream: str) -> None:
    """The running index holds what one rebuilt from the store now holds, row for row (by id)."""
    live = await memory.index.get(stream)
    fresh = VectorIndex(memory.store, lexical=memory.index.lexical)
    try:
        rebuilt = await fresh.get(stream)
    finally:
        fresh.close()
    _assert_same(live, rebuilt)


def _assert_same(live: StreamVectors, rebuilt: StreamVectors) -> None:
    mine, theirs = np.argsort(live.ids), np.argsort(rebuilt.ids)
    assert live.ids[mine].tolist() == rebuilt.ids[theirs].tolist()
    if live.n:
        assert np.array_equal(live.embeddings[mine], rebuilt.embeddings[theirs])
    assert live.importance[mine].tolist() == rebuilt.importance[theirs].tolist()
    assert live.last_accessed[mine].tolist() == rebuilt.last_accessed[theirs].tolist()
    assert live.created[mine].tolist() == rebuilt.created[theirs].tolist()
    assert live.inverse_norms[mine].tolist() == rebuilt.inverse_norms[theirs].tolist()
    if live.terms is not None or rebuilt.terms is not None:
        assert live.terms is not None and rebuilt.terms is not None
        for query in ("cats", "dogs edited", "word", "another process"):
            a, b = live.terms.score(query, live.n), rebuilt.terms.score(query, rebuilt.n)
            assert a[mine].tolist() == b[theirs].tolist(), query
