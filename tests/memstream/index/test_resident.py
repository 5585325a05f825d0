"""The resident budget (memstream/index/resident.py): under any queries and writes across many streams the
process holds at most its budget plus one stream; a dropped stream reloads exactly what the store holds (writes
made meanwhile, here or in another process, included; deleted memories gone), and ranks as a fresh index does."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from memstream import MemoryStream, Observation, RoleModel, Source, Store, StreamConfig
from memstream.clock import to_timestamp
from memstream.index.ranking import rank
from memstream.index.resident import Resident, load_room
from memstream.index.vector_index import VectorIndex
from memstream.index.vectors import StreamVectors
from memstream.store import NewMemory, SQLiteStore, StreamArrays
from memstream.testing import FakeClock, FakeEmbedder, ScriptedChat

DIM = 8
STREAMS = 5


def _memory(store: Store, clock: FakeClock, budget: int) -> MemoryStream:
    """A hybrid persona (matrix and lexical index per stream) whose process holds `budget` bytes of streams
    (set in bytes here: `[memory] resident_mb` counts MiB, far more than these small streams)."""
    role = RoleModel(ScriptedChat(default="6"), "m")
    memory = MemoryStream(store, FakeEmbedder(dim=DIM), rater=role, reflector=role, agent=role, name="Isabella",
                          summary="Runs a cafe.", clock=clock, auto_reflect=False,
                          config=StreamConfig(profile="hybrid"))
    memory.index.resident.budget = budget
    return memory


async def _rebuilt(store: Store, stream: str) -> StreamVectors:
    arrays = await store.load_stream(stream, texts=True)
    vectors = StreamVectors(arrays, copy=False)
    vectors.index_texts(arrays.ids.tolist(), arrays.texts or [])
    return vectors


def _assert_same(live: StreamVectors, rebuilt: StreamVectors) -> None:
    mine, theirs = np.argsort(live.ids), np.argsort(rebuilt.ids)
    assert live.ids[mine].tolist() == rebuilt.ids[theirs].tolist()
    if live.n:
        assert np.array_equal(live.embeddings[mine], rebuilt.embeddings[theirs])
    for name in ("importance", "last_accessed", "created", "inverse_norms"):
        assert getattr(live, name)[mine].tolist() == getattr(rebuilt, name)[theirs].tolist(), name
    assert live.terms is not None and rebuilt.terms is not None
    for query in ("cats", "dogs", "note", "another process", "word"):
        assert live.terms.score(query, live.n)[mine].tolist() == rebuilt.terms.score(query, rebuilt.n)[theirs].tolist()


async def _reference(store: Store, memory: MemoryStream, stream: str, query: str, k: int) -> list[int]:
    """The top k of a stream as an index loaded fresh from the store ranks it."""
    live = memory.index  # the same parts as the live index keeps (lexical, grounding, context)
    fresh = VectorIndex(store, lexical=live.lexical, grounding=live.grounding, language=live.language,
                        context=live.context, resident_bytes=0)
    try:
        vectors = await fresh.get(stream)
        if vectors.n == 0:
            return []
        [vector] = await FakeEmbedder(dim=DIM).embed_batch([query])
        ranked = rank(vectors, vector, to_timestamp(memory.clock.now()), memory.config, k, text=query)
        return [int(i) for i in vectors.ids[ranked.rows].tolist()]
    finally:
        fresh.close()


def _assert_within_budget(memory: MemoryStream, streams: list[str]) -> None:
    """The book is true (the sizes of the streams held) and holds at most the budget plus one stream."""
    book = memory.index.resident
    held = [v for v in (memory.index.loaded(s) for s in streams) if v is not None]
    assert book.total() == sum(v.nbytes() for v in held)
    stats = book.stats()
    assert stats.streams == len(held)
    assert stats.bytes <= book.budget + stats.largest


# -- the book alone -----------------------------------------------------------------------------------


def test_the_book_drops_streams_larger_than_the_budget_first_then_the_least_recently_used() -> None:
    book = Resident(100)
    for stream, size in (("a", 30), ("huge", 150), ("b", 30), ("c", 30)):
        book.account(stream, size)
    book.touch("a")  # order now: huge, b, c, a
    assert book.over("c", lambda s: False) == ["huge"]  # 240 - 150 = 90: within
    assert book.over("c", lambda s: s == "huge") == ["b", "a"]  # huge busy: b then a, never c
    assert book.over("huge", lambda s: False) == ["b", "c", "a"]  # only the one kept may stay above
    assert Resident(0).over("a", lambda s: False) == []  # no budget
    with pytest.raises(ValueError, match="resident budget"):
        Resident(-1)


def test_the_book_counts_drops_reloads_and_pins() -> None:
    book = Resident(10)
    book.account("a", 5)
    with book.pinned("a"), book.pinned("a"):
        assert book.is_pinned("a")
    assert not book.is_pinned("a")
    book.evicted("a")
    book.forget("a")
    book.account("a", 6)
    book.account("a", 7)  # a write, not a reload
    assert book.stats().to_json() == {"streams": 1, "bytes": 7, "budget": 10, "largest": 7, "drops": 1,
                                      "reloads": 1}


async def test_resident_mb_sets_the_budget_and_zero_keeps_every_stream(store: Store, clock: FakeClock) -> None:
    role = RoleModel(ScriptedChat(default="6"), "m")
    for mb in (3, 0):
        memory = MemoryStream(store, FakeEmbedder(dim=DIM), rater=role, reflector=role, agent=role, name="I",
                              summary="s", clock=clock, config=StreamConfig(resident_mb=mb), auto_reflect=False)
        assert memory.index.resident.budget == mb << 20
        await memory.close()


# -- a process with many streams under a small budget -------------------------------------------------


async def _seed(memory: MemoryStream, streams: list[str], each: int = 3) -> None:
    for s in streams:
        await memory.observe_many([Observation(f"note {j} in {s} about cats", s, source=Source(message_id=f"{s}-{j}"))
                                   for j in range(each)])


async def test_a_stream_dropped_for_the_budget_reloads_what_another_process_wrote(database: Path | str,
                                                                                 clock: FakeClock) -> None:
    store, other = await Store.open(database), await Store.open(database)
    memory = _memory(store, clock, budget=1)  # room for one stream at a time
    try:
        await _seed(memory, ["guild:a", "guild:b"])
        await memory.retrieve("cats", stream="guild:a")
        await memory.retrieve("cats", stream="guild:b")
        assert memory.index.loaded("guild:a") is None and memory.index.loaded("guild:b") is not None
        a_ids = sorted((await _rebuilt(other, "guild:a")).ids.tolist())
        [theirs] = await other.insert([NewMemory(stream="guild:a", kind="observation", text="from another process",
                                                 created_at=to_timestamp(clock.now()), importance=9,
                                                 importance_source="given", embedding=np.ones(DIM, np.float32))])
        await other.delete([a_ids[0]])
        await other.touch([a_ids[1]], to_timestamp(clock.now()) + 60.0)
        found = await memory.retrieve("another process", stream="guild:a", k=10)
        assert theirs in [m.memory.id for m in found] and a_ids[0] not in [m.memory.id for m in found]
        _assert_same(await memory.index.get("guild:a"), await _rebuilt(other, "guild:a"))
        stats = memory.index.resident.stats()
        assert (stats.reloads, stats.streams) == (1, 1) and stats.drops >= 1  # (SQLite: b dropped as changed)
    finally:
        await memory.close()
        await other.close()


async def test_deleting_a_dropped_stream_s_memory_leaves_nothing_when_it_reloads(store: Store,
                                                                                clock: FakeClock) -> None:
    memory = _memory(store, clock, budget=1)
    try:
        await _seed(memory, ["guild:a", "guild:b"])
        await memory.observe_many([Observation("a secret about zebras", "guild:a", source=Source(message_id="z"))])
        await memory.retrieve("zebras", stream="guild:a")
        [secret] = [m.memory.id for m in await memory.retrieve("zebras", stream="guild:a", k=1)]
        await memory.retrieve("cats", stream="guild:b")  # guild:a dropped
        assert memory.index.loaded("guild:a") is None
        assert await memory.forget_messages(["z"]) == [secret]  # its event finds no matrix to change
        found = await memory.retrieve("zebras", stream="guild:a", k=10)
        assert secret not in [m.memory.id for m in found]
        reloaded = memory.index.loaded("guild:a")
        assert reloaded is not None and secret not in reloaded.ids.tolist()
        assert reloaded.terms is not None and not reloaded.terms.score("zebras secret", reloaded.n).any()
    finally:
        await memory.close()


async def test_a_stream_larger_than_the_budget_is_scored_then_dropped_first(store: Store, clock: FakeClock) -> None:
    memory = _memory(store, clock, budget=1)
    try:
        await _seed(memory, ["guild:big", "guild:small"], each=4)
        assert [m.memory.text for m in await memory.retrieve("note 2", stream="guild:big", k=1)]
        assert memory.index.loaded("guild:big") is not None  # kept while nothing else is needed
        await memory.retrieve("cats", stream="guild:small")
        assert memory.index.loaded("guild:big") is None and memory.index.loaded("guild:small") is not None
    finally:
        await memory.close()


class _WatchedStore(SQLiteStore):
    """A store that notes, as each load begins, what the budget's book holds (`book`, set by the test)."""

    book: Resident
    at_load: list[int]

    async def load_stream(self, stream: str, *, texts: bool = False, sources: bool = False,
                          each: Callable[[list[str]], None] | None = None) -> StreamArrays:
        self.at_load.append(self.book.total())
        return await super().load_stream(stream, texts=texts, sources=sources, each=each)


async def test_a_dropped_stream_gets_room_before_its_reload_not_after(tmp_path: Path, clock: FakeClock) -> None:
    store = await _WatchedStore.open(tmp_path / "watched.db")
    memory = _memory(store, clock, budget=0)
    store.book, store.at_load = memory.index.resident, []
    try:
        await _seed(memory, ["guild:a", "guild:b", "guild:c"], each=4)
        for stream in ("guild:a", "guild:b"):
            await memory.retrieve("cats", stream=stream)
        one = memory.index.resident.total() // 2
        memory.index.resident.budget = 2 * one + one // 2  # two streams and a half
        store.at_load.clear()
        await memory.retrieve("cats", stream="guild:c")  # never loaded: the budget is passed by it until it loads
        assert memory.index.loaded("guild:a") is None  # then the least recently used goes
        # room for two streams, and for a third as it reloads with what its load holds meanwhile
        memory.index.resident.budget = 2 * one + load_room(one, texts=True) + one // 2
        await memory.retrieve("cats", stream="guild:a")  # a reload: b makes room for it first
        assert memory.index.loaded("guild:b") is None
        held_c = memory.index.loaded("guild:c")
        assert held_c is not None
        # What was held as each load began: a and b before c's first load; c alone before a's reload
        assert store.at_load == [2 * one, held_c.nbytes()]
        _assert_within_budget(memory, ["guild:a", "guild:b", "guild:c"])
    finally:
        await memory.close()


async def test_a_stream_loaded_for_the_first_time_gets_room_once_its_rows_are_read(tmp_path: Path,
                                                                                   clock: FakeClock) -> None:
    memory = _memory(await Store.open(tmp_path / "first.db"), clock, budget=0)
    try:
        await _seed(memory, ["guild:a", "guild:b", "guild:c"], each=6)
        for stream in ("guild:a", "guild:b"):
            await memory.retrieve("cats", stream=stream)
        held = memory.index.resident.total()
        memory.index.resident.budget = held + held // 4  # two streams and a half
        memory.index.resident.peak = 0
        await memory.retrieve("cats", stream="guild:c")  # never loaded: its size unknown until its rows are read
        assert memory.index.loaded("guild:a") is None
        # a was dropped once c's rows were read, before c was counted: never more than the budget held at once
        assert 0 < memory.index.resident.peak <= memory.index.resident.budget
    finally:
        await memory.close()


def test_the_book_expects_a_dropped_stream_back_at_its_size() -> None:
    book = Resident(100)
    book.account("a", 40)
    book.account("b", 40)
    assert book.expected("a") == 0  # held: nothing more to make room for
    book.evicted("a")
    book.forget("a")
    assert book.expected("a") == 40 and book.expected("never") == 0
    assert book.over("a", lambda s: False, incoming=40) == []  # 40 + 40 fits
    book.account("c", 30)
    assert book.over("a", lambda s: False, incoming=40) == ["b"]  # 70 + 40 does not: the least recently used


async def test_a_stream_being_scored_is_never_dropped(store: Store, clock: FakeClock) -> None:
    memory = _memory(store, clock, budget=1)
    try:
        await _seed(memory, ["guild:a", "guild:b"])
        async with memory.index.locked("guild:a") as held:
            await memory.index.get("guild:b")  # over the budget: only b could go, and it is the one just loaded
            await memory.observe_many([Observation("new cats", "guild:b", source=Source(message_id="n"))])
            assert memory.index.loaded("guild:a") is held
        assert memory.index.loaded("guild:b") is None  # once a's query is over, the budget holds again
        _assert_within_budget(memory, ["guild:a", "guild:b"])
    finally:
        await memory.close()


async def test_queries_of_many_streams_at_once_rank_as_a_fresh_index(database: Path | str,
                                                                      clock: FakeClock) -> None:
    store, other = await Store.open(database), await Store.open(database)
    memory = _memory(store, clock, budget=1)  # every load drops the others not in use
    streams = [f"guild:{i}" for i in range(6)]
    try:
        await _seed(memory, streams, each=5)
        queries = [(s, f"cats {i}") for i, s in enumerate(streams)] * 3
        expected = [await _reference(other, memory, s, q, 3) for s, q in queries]
        found = await asyncio.gather(*(memory.explain(q, stream=s, k=3) for s, q in queries))
        assert [[m.memory.id for m in f] for f in found] == expected
        _assert_within_budget(memory, streams)
        assert memory.index.resident.stats().streams == 1 and memory.index.resident.drops > 0
    finally:
        await memory.close()
        await other.close()


_OPS = st.lists(st.tuples(st.sampled_from(["observe", "retrieve", "retrieve", "explain", "explain", "forget",
                                           "elsewhere", "elsewhere-forget", "advance"]),
                          st.integers(0, STREAMS - 1), st.integers(0, 30)), min_size=4, max_size=25)
_examples = itertools.count()


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=_OPS, room=st.integers(1, 2))
async def test_the_budget_holds_and_nothing_is_lost_under_any_queries_and_writes(
        database: Path | str, ops: list[tuple[str, int, int]], room: int) -> None:
    example = next(_examples)
    streams = [f"guild:{example}-{i}" for i in range(STREAMS)]
    clock = FakeClock()
    store, other = await Store.open(database), await Store.open(database)
    memory = _memory(store, clock, budget=0)
    try:
        await _seed(memory, streams, each=4)
        await memory.retrieve("cats", stream=streams[0])
        one = (memory.index.loaded(streams[0]) or StreamVectors()).nbytes()
        memory.index.resident.budget = room * one  # about `room` streams from here on
        made = 0
        for op, i, n in ops:
            stream = streams[i]
            clock.advance(minutes=1)
            ids = sorted((await _rebuilt(other, stream)).ids.tolist())
            if op == "observe":
                made += 1
                await memory.observe_many([Observation(f"note {made} about {n} dogs", stream,
                                                       source=Source(message_id=f"m{made}"))])
            elif op == "retrieve":  # ranks, and writes its winners' last access
                expected = await _reference(other, memory, stream, f"cats {n}", 1 + n % 4)
                found = await memory.retrieve(f"cats {n}", stream=stream, k=1 + n % 4)
                assert [m.memory.id for m in found] == expected
            elif op == "explain":
                expected = await _reference(other, memory, stream, f"dogs {n}", 1 + n % 4)
                found = await memory.explain(f"dogs {n}", stream=stream, k=1 + n % 4)
                assert [m.memory.id for m in found] == expected
            elif op == "forget" and ids:
                await memory.forget([ids[n % len(ids)]])
            elif op == "elsewhere":
                await other.insert([NewMemory(stream=stream, kind="observation", text=f"from another process {n}",
                                              created_at=to_timestamp(clock.now()), importance=1 + n % 10,
                                              importance_source="given",
                                              embedding=np.linspace(-1, 1, DIM, dtype=np.float32) * (n + 1))])
            elif op == "elsewhere-forget" and ids:
                await other.delete([ids[n % len(ids)]])
            elif op == "advance":
                clock.advance(hours=n)
            _assert_within_budget(memory, streams)
        event(f"streams dropped for the budget: {'some' if memory.index.resident.drops else 'none'}")
        for stream in streams:  # what each stream's next query uses is what the store holds
            _assert_same(await memory.index.get(stream), await _rebuilt(other, stream))
            _assert_within_budget(memory, streams)
    finally:
        await memory.close()
        await other.close()


class _WaitingEmbedder(FakeEmbedder):
    """An embedder slower than a load: it answers a query once `ready()` holds (or gives up after 5 s)."""

    def __init__(self, dim: int) -> None:
        super().__init__(dim=dim)
        self.ready: Callable[[], bool] = lambda: True
        self.waited: list[bool] = []

    async def embed_batch(self, texts: Sequence[str]) -> npt.NDArray[np.float32]:
        for _ in range(500):
            if self.ready():
                break
            await asyncio.sleep(0.01)
        self.waited.append(self.ready())
        return await super().embed_batch(texts)


async def test_a_cold_stream_loads_while_its_query_is_embedded(tmp_path: Path, clock: FakeClock) -> None:
    store = await Store.open(tmp_path / "prefetch.db")
    embedder = _WaitingEmbedder(DIM)
    role = RoleModel(ScriptedChat(default="6"), "m")
    memory = MemoryStream(store, embedder, rater=role, reflector=role, agent=role, name="Isabella",
                          summary="Runs a cafe.", clock=clock, auto_reflect=False,
                          config=StreamConfig(profile="hybrid"))
    try:
        await _seed(memory, ["guild:a", "guild:b"], each=5)
        memory.index.drop("guild:a")
        embedder.waited.clear()
        embedder.ready = lambda: memory.index.loaded("guild:a") is not None  # answered once the stream is in
        found = await memory.retrieve("cats", stream="guild:a")
        assert embedder.waited == [True] and len(found) == 5  # loaded before the embedding came back
        assert [m.memory.id for m in found] == [m.memory.id for m in await memory.explain("cats", stream="guild:a")]
        embedder.ready = lambda: True  # a stream that is in memory is not loaded again
        assert memory.index.loaded("guild:a") is not None
        before = memory.index.loaded("guild:a")
        await memory.retrieve("cats", stream="guild:a")
        assert memory.index.loaded("guild:a") is before
    finally:
        await memory.close()
