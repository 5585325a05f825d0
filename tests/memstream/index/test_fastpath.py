"""The fast path (float32 pass + exact re-scoring) returns exactly what rank_reference returns, and the
in-memory matrices stay in step with the store through every kind of write."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable, Sequence
from datetime import timedelta
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memstream.clock import to_timestamp
from memstream.config import StreamConfig
from memstream.index import _kernels as kernels
from memstream.index import _scan as scan
from memstream.index._terms import Scoring
from memstream.index.ranking import rank
from memstream.index.reference import rank_reference
from memstream.index.vectors import SCREEN_ROWS, StreamVectors
from memstream.models.llm import Completion
from memstream.models.roles import RoleModel
from memstream.store import SQLiteStore, Store, StreamArrays
from memstream.stream import MemoryStream, Observation
from memstream.testing import FakeClock, FakeEmbedder, ScriptedChat
from tests.conftest import MakeMemory

Row = tuple[int, float, float, float, list[float]]  # id, created, last accessed, importance, embedding
T0 = 1_676_275_200.0  # 2023-02-13 08:00 UTC


def _reference_rows(vectors: StreamVectors) -> list[Row]:
    """What the reference sees: the rows exactly as held (float32 values as Python floats)."""
    return [(int(i), float(c), float(a), float(m), e.tolist()) for i, c, a, m, e in
            zip(vectors.ids, vectors.created, vectors.last_accessed, vectors.importance, vectors.embeddings,
                strict=True)]


def _vectors(rows: Sequence[Row], screen_rows: int = SCREEN_ROWS) -> StreamVectors:
    """The rows as a stream; with screen_rows=0, one whose pass 1 reads its int16 screen (screen.py)."""
    return StreamVectors(StreamArrays(
        ids=np.array([r[0] for r in rows], dtype=np.int64),
        embeddings=np.array([r[4] for r in rows], dtype=np.float32),
        importance=np.array([r[3] for r in rows], dtype=np.float32),
        last_accessed=np.array([r[2] for r in rows], dtype=np.float64),
        created=np.array([r[1] for r in rows], dtype=np.float64),
    ), screen_rows=screen_rows)


def _assert_same(vectors: StreamVectors, query: Sequence[float], now: float, config: StreamConfig, k: int) -> None:
    """Both paths (compiled loops and numpy) give the reference's answer, with the same parts."""
    expected = rank_reference(_reference_rows(vectors), [float(x) for x in np.float32(query)], now, config, k)
    answers = []
    for compiled in (True, False):
        ranked = rank(vectors, np.asarray(query, dtype=np.float32), now, config, k, compiled=compiled)
        assert [int(vectors.ids[row]) for row in ranked.rows] == expected, f"compiled={compiled}"
        answers.append([part.tolist() for part in (ranked.rows, ranked.score, ranked.recency, ranked.importance,
                                                   ranked.relevance, ranked.cosine)])
    assert answers[0] == answers[1]


# -- random streams, hypothesis --------------------------------------------------------------------

_COMPONENT = st.one_of(st.integers(-4, 4).map(float),
                       st.floats(-1, 1, allow_nan=False, width=32, allow_subnormal=False))
_WEIGHT = st.sampled_from([0.0, 0.5, 1.0, 2.0, 3.7])


@st.composite
def streams(draw: st.DrawFn) -> tuple[list[Row], list[float], float, StreamConfig, int]:
    dim = draw(st.integers(1, 6))
    vector = st.lists(_COMPONENT, min_size=dim, max_size=dim)
    n = draw(st.integers(1, 14))
    ids = draw(st.lists(st.integers(1, 10**6), min_size=n, max_size=n, unique=True))
    # A few distinct values of each term, so that ties (equal terms, equal scores, twins) are common.
    embeddings = draw(st.lists(vector, min_size=1, max_size=4))
    hours = draw(st.lists(st.integers(0, 300), min_size=1, max_size=4))
    importances = draw(st.lists(st.integers(1, 10), min_size=1, max_size=3))
    rows = []
    for memory_id in ids:
        created = T0 + draw(st.sampled_from(hours)) * 3600.0 + draw(st.sampled_from([0.0, 0.25, 1800.0]))
        accessed = created + draw(st.sampled_from([0.0, 0.0, 3600.0, 36000.5]))
        rows.append((memory_id, created, accessed, float(draw(st.sampled_from(importances))),
                     draw(st.sampled_from(embeddings))))
    query = draw(st.one_of(vector, st.sampled_from(embeddings)))
    latest = max(r[2] for r in rows)
    now = latest + draw(st.sampled_from([0.0, -3600.0 * 20, 3600.0, 3600.0 * 500]))  # before some accesses too
    config = StreamConfig(weight_recency=draw(_WEIGHT), weight_importance=draw(_WEIGHT),
                          weight_relevance=draw(_WEIGHT), decay=draw(st.sampled_from([0.9, 0.995, 0.99999, 1.0])))
    return rows, query, now, config, draw(st.integers(1, n + 2))


@settings(max_examples=400, deadline=None, derandomize=True, database=None)
@given(streams())
def test_fast_path_equals_reference_on_random_streams(case: tuple[list[Row], list[float], float, StreamConfig,
                                                                  int]) -> None:
    rows, query, now, config, k = case
    _assert_same(_vectors(rows), query, now, config, k)
    screened = _vectors(rows, screen_rows=0)
    _assert_same(screened, query, now, config, k)
    assert (screened._screen is not None) == bool(np.any(np.float32(query)))  # (built by a query)


def test_the_compiled_loops_are_in_use() -> None:
    # numba is a dependency: without it (or with MEMSTREAM_JIT=0) the numpy path would serve every query.
    assert kernels.available()


def test_a_stream_of_thousands_of_equal_scores_overflows_the_loops_and_the_numpy_path_answers() -> None:
    rows = [(i, T0, T0 + 60.0, 5.0, [0.5, 0.5, 0.0]) for i in range(1, 6001)]
    vectors = _vectors(rows)
    unit = np.array([1.0, 0.0, 0.0], np.float32)
    source = scan.Source(list(vectors.blocks()), vectors.inverse_norms, 1e-5)
    scoring = Scoring(T0 + 3600, 0.995, 1.0, 1.0, 1.0, T0 + 60.0, T0 + 60.0, 5.0, 5.0)
    found = scan.first_pass(source, unit, vectors.importance, 0.0, vectors.importance, scoring, 5)
    assert found is None  # 6,000 candidates do not fit in the loop's room
    _assert_same(vectors, [1.0, 0.0, 0.0], T0 + 3600, StreamConfig(), 5)
    ranked = rank(vectors, np.array([1.0, 0.0, 0.0], np.float32), T0 + 3600, StreamConfig(), 5)
    assert [int(vectors.ids[r]) for r in ranked.rows] == [6000, 5999, 5998, 5997, 5996]


def test_a_single_memory() -> None:
    vectors = _vectors([(7, T0, T0, 3.0, [0.6, 0.8])])
    ranked = rank(vectors, np.array([1.0, 0.0], np.float32), T0 + 3600, StreamConfig(), 5)
    assert ranked.rows.tolist() == [0]
    assert (ranked.recency[0], ranked.importance[0], ranked.relevance[0], ranked.score[0]) == (0.5, 0.5, 0.5, 1.5)
    _assert_same(vectors, [1.0, 0.0], T0 + 3600, StreamConfig(), 5)


def test_all_equal_terms_go_by_the_newer_memory_then_the_higher_id() -> None:
    rows = [(i, T0 + (i % 3) * 60.0, T0 + 7200.0, 4.0, [0.3, -0.2, 0.9]) for i in range(1, 10)]
    vectors = _vectors(rows)
    ranked = rank(vectors, np.array([0.1, 0.2, 0.3], np.float32), T0 + 9000, StreamConfig(), 4)
    assert [int(vectors.ids[r]) for r in ranked.rows] == [8, 5, 2, 7]
    assert set(ranked.score.tolist()) == {1.5}
    _assert_same(vectors, [0.1, 0.2, 0.3], T0 + 9000, StreamConfig(), 9)


def test_a_zero_query_and_zero_rows_have_cosine_zero() -> None:
    rows = [(1, T0, T0, 2.0, [0.0, 0.0]), (2, T0 + 60, T0 + 60, 2.0, [1.0, 0.0]), (3, T0, T0 + 90, 9.0, [0.0, 2.0])]
    vectors = _vectors(rows)
    for query in ([0.0, 0.0], [1.0, 1.0], [-1.0, 0.5]):
        _assert_same(vectors, query, T0 + 4000, StreamConfig(), 3)
    zero = rank(vectors, np.zeros(2, np.float32), T0 + 4000, StreamConfig(), 3)
    assert set(zero.relevance.tolist()) == {0.5} and set(zero.cosine.tolist()) == {0.0}


def test_scores_of_the_fast_path_are_the_reference_formula_in_float64() -> None:
    rng = np.random.default_rng(3)
    rows = [(i, T0 + i * 600.0, T0 + i * 900.0, float(rng.integers(1, 11)), rng.standard_normal(16).tolist())
            for i in range(1, 200)]
    vectors = _vectors(rows)
    query = rng.standard_normal(16).astype(np.float32)
    now = T0 + 86400 * 3
    config = StreamConfig()
    ranked = rank(vectors, query, now, config, 5)
    held = _reference_rows(vectors)
    rec = [config.decay ** (max(now - r[2], 0.0) / 3600.0) for r in held]
    for row, recency in zip(ranked.rows.tolist(), ranked.recency.tolist(), strict=True):
        assert recency == (rec[row] - min(rec)) / (max(rec) - min(rec))


@pytest.mark.parametrize(("n", "dim"), [(3000, 24), (30_000, 8), (3000, 384)])
def test_large_random_streams_and_many_queries(n: int, dim: int) -> None:
    rng = np.random.default_rng(n)
    embeddings = rng.standard_normal((n, dim)).astype(np.float32)
    embeddings /= np.linalg.norm(embeddings, axis=1, keepdims=True)
    created = T0 + rng.uniform(0, 86400 * 60, n)
    arrays = StreamArrays(np.arange(1, n + 1, dtype=np.int64), embeddings,
                          rng.integers(1, 11, n).astype(np.float32), created.copy(), created)
    for screen_rows in (SCREEN_ROWS, 0):  # (30,000 rows: from the screen either way)
        vectors = StreamVectors(arrays, screen_rows=screen_rows)
        for q in range(4):
            query = rng.standard_normal(dim).astype(np.float32)
            config = StreamConfig(weight_recency=[1.0, 0.2, 3.0, 1.0][q], decay=[0.995, 0.9, 0.999, 1.0][q], k=7)
            _assert_same(vectors, query.tolist(), T0 + 86400 * 61, config, 7)
        assert (vectors._screen is not None) == (n >= screen_rows)


@pytest.mark.parametrize("screen_rows", [10**9, 0, 2000])
def test_blocks_appends_removals_and_touches_keep_the_answer_exact(screen_rows: int) -> None:
    # screen_rows 0: the screen is built at the first query and kept in step with every write from then on;
    # 2000: it is built once the stream has grown that large, over blocks already there; 10**9: never.
    rng = np.random.default_rng(11)
    vectors = StreamVectors(screen_rows=screen_rows)
    next_id = 1
    for round_ in range(30):
        count = int(rng.integers(1, 300))
        vectors.append(np.arange(next_id, next_id + count), rng.standard_normal((count, 5)).astype(np.float32),
                       rng.integers(1, 11, count), np.full(count, T0 + round_ * 3600.0),
                       np.full(count, T0 + round_ * 3600.0))
        next_id += count
        if round_ % 3 == 0:
            vectors.remove(rng.choice(vectors.ids, size=min(40, vectors.n), replace=False).tolist())
        if round_ % 4 == 1:
            touched = rng.choice(vectors.ids, size=min(5, vectors.n), replace=False).tolist()
            vectors.touch(touched, T0 + round_ * 3600.0 + 10.0)
        if round_ % 5 == 2:
            vectors.update(int(rng.choice(vectors.ids)), rng.standard_normal(5).astype(np.float32))
        query = rng.standard_normal(5).tolist()
        _assert_same(vectors, query, T0 + (round_ + 1) * 3600.0, StreamConfig(), 5)
    assert len(vectors._blocks) > 1  # the matrix spans blocks
    assert (vectors._screen is not None) == (screen_rows <= 2000)
    assert len(set(vectors.ids.tolist())) == vectors.n


# -- the matrix stays in step with the store -------------------------------------------------------


async def _assert_in_step(memory: MemoryStream, stream: str) -> None:
    loaded = memory.index.loaded(stream)
    assert loaded is not None
    stored = await memory.store.load_stream(stream)
    mine, theirs = np.argsort(loaded.ids), np.argsort(stored.ids)
    assert loaded.ids[mine].tolist() == stored.ids[theirs].tolist()
    assert np.array_equal(loaded.embeddings[mine], stored.embeddings[theirs])
    assert loaded.importance[mine].tolist() == stored.importance[theirs].tolist()
    assert loaded.last_accessed[mine].tolist() == stored.last_accessed[theirs].tolist()
    assert loaded.created[mine].tolist() == stored.created[theirs].tolist()


async def test_matrix_in_step_after_observe_retrieve_edit_forget_and_reflect(make_memory: MakeMemory,
                                                                             clock: FakeClock) -> None:
    chat = ScriptedChat().on("Reply with a single integer", "9").on("most salient", "What does Maria like?")
    chat.on("high-level insights", "Maria likes painting (because of 1, 2)")
    memory = make_memory(chat=chat, config=StreamConfig(reflection_threshold=10_000))
    stream = "guild:1"
    first = await memory.observe("Maria painted the river", stream=stream)
    await memory.retrieve("painting", stream=stream)  # loads the stream
    items = [Observation(f"Maria saw bird {i}", stream=stream, at=clock.now() - timedelta(hours=i),
                         source=_source(f"m{i}")) for i in range(70)]
    await memory.observe_many(items)
    await _assert_in_step(memory, stream)
    clock.advance(hours=2)
    await memory.retrieve("bird", stream=stream, k=7)
    await _assert_in_step(memory, stream)
    await memory.edit_message(stream, "m3", "Maria saw a heron")
    await memory.forget([first.id], stream=stream)
    await memory.forget_messages(["m5", "m9"])
    await _assert_in_step(memory, stream)
    reflection = await memory.reflect(stream)
    assert reflection is not None and reflection.insights
    await _assert_in_step(memory, stream)
    fresh = make_memory(chat=chat)
    assert [m.memory.id for m in await fresh.explain("bird", stream=stream, k=5)] == \
        [m.memory.id for m in await memory.explain("bird", stream=stream, k=5)]


def _source(message_id: str) -> object:
    from memstream.records import Source

    return Source(author="Klaus", author_id="42", message_id=message_id)


class _SlowLoadStore(SQLiteStore):
    """A store whose loads wait for a signal, so writes can land while a stream is being loaded."""

    release: asyncio.Event

    async def load_stream(self, stream: str, *, texts: bool = False, sources: bool = False,
                          each: Callable[[list[str]], None] | None = None) -> StreamArrays:
        arrays = await super().load_stream(stream, texts=texts, sources=sources, each=each)
        await self.release.wait()
        return arrays


async def test_writes_during_a_load_are_replayed_not_lost(tmp_path: Path, clock: FakeClock) -> None:
    store = await _SlowLoadStore.open(tmp_path / "slow.db")
    store.release = asyncio.Event()
    chat = ScriptedChat().on("Reply with a single integer", "4")
    memory = MemoryStream(store, FakeEmbedder(dim=8), rater=RoleModel(chat, "r"), reflector=RoleModel(chat, "r"),
                          agent=RoleModel(chat, "a"), name="Maria", summary="A painter.", clock=clock,
                          auto_reflect=False)
    try:
        early = await memory.observe_many([Observation(f"early {i}", stream="s") for i in range(5)])
        loading = asyncio.ensure_future(memory.index.get("s"))
        await asyncio.sleep(0.05)  # the load has read its snapshot and waits
        late = await memory.observe_many([Observation(f"late {i}", stream="s") for i in range(5)])
        await memory.forget([early[0].id, late[0].id])
        clock.advance(hours=1)
        await store.touch([early[1].id], to_timestamp(clock.now()))  # the index hears it from the store
        store.release.set()
        await loading
        await _assert_in_step(memory, "s")
        assert memory.index.loaded("s") is not None and memory.index.loaded("s").n == 8  # type: ignore[union-attr]
    finally:
        await store.close()


# -- ingestion: one rating call each, batched embeddings, bounded concurrency, usage counted ---------


class _CountingChat:
    """Rates everything 6 after yielding to the loop, and records how many calls were in flight at most."""

    def __init__(self) -> None:
        self.calls = 0
        self.in_flight = 0
        self.most = 0

    async def complete(self, prompt: str, *, model: str) -> Completion:
        self.calls += 1
        self.in_flight += 1
        self.most = max(self.most, self.in_flight)
        await asyncio.sleep(0.001)
        self.in_flight -= 1
        return Completion("6", 10, 1)


class _CountingEmbedder(FakeEmbedder):
    def __init__(self, chat: _CountingChat) -> None:
        super().__init__(dim=16)
        self.chat = chat

    async def embed_batch(self, texts: Sequence[str]) -> np.ndarray:  # type: ignore[type-arg]
        self.chat.in_flight += 1
        self.chat.most = max(self.chat.most, self.chat.in_flight)
        await asyncio.sleep(0.001)
        self.chat.in_flight -= 1
        return await super().embed_batch(texts)


@pytest.mark.parametrize("limit", [1, 5, 16])
async def test_a_burst_is_rated_once_each_embedded_in_batches_with_bounded_calls(store: Store, clock: FakeClock,
                                                                                  limit: int) -> None:
    chat = _CountingChat()
    embedder = _CountingEmbedder(chat)
    memory = MemoryStream(store, embedder, rater=RoleModel(chat, "r"), reflector=RoleModel(chat, "r"),  # type: ignore[arg-type]
                          agent=RoleModel(chat, "a"), name="Maria", summary="A painter.", clock=clock,  # type: ignore[arg-type]
                          config=StreamConfig(max_concurrency=limit), auto_reflect=False)
    burst = [Observation(f"message {i}", stream="guild:1" if i % 3 else "dm:9") for i in range(250)]
    memories = await memory.observe_many(burst)
    assert all(m.status == "ready" for m in memories) and len({m.id for m in memories}) == 250
    assert chat.calls == 250
    per_stream = {"guild:1": sum(1 for i in range(250) if i % 3), "dm:9": sum(1 for i in range(250) if not i % 3)}
    assert len(embedder.calls) == sum(math.ceil(n / 32) for n in per_stream.values())
    assert all(len(batch) <= 32 for batch in embedder.calls)
    assert chat.most <= limit
    usage = await store.usage()
    assert usage["rater"].calls == 250 and usage["rater"].prompt_tokens == 2500
    assert usage["embedding"].calls == len(embedder.calls)
    state = await store.state("guild:1")
    assert state.importance_since_reflection == 6 * per_stream["guild:1"]
    assert len((await store.load_stream("guild:1")).ids) == per_stream["guild:1"]


def test_near_ties_below_float32_resolution_are_decided_exactly() -> None:
    # A cluster of embeddings a few float32 ulps apart among spread-out ones: the float32 pass trusts its
    # cosines (their spread is wide) yet cannot order the cluster, which holds the winners.
    rng = np.random.default_rng(17)
    base = rng.standard_normal(64).astype(np.float32)
    noise = rng.integers(-3, 4, (3000, 64)).astype(np.float32) * np.spacing(np.abs(base))
    embeddings = np.concatenate([(base + noise).astype(np.float32),
                                 rng.standard_normal((1000, 64)).astype(np.float32)])
    rows = [(i + 1, T0, T0, 5.0, embeddings[i].tolist()) for i in range(len(embeddings))]
    for vectors in (_vectors(rows), _vectors(rows, screen_rows=0)):
        for seed in range(5):
            query = (base + np.random.default_rng(seed).standard_normal(64).astype(np.float32) * 1e-3).tolist()
            _assert_same(vectors, query, T0 + 3600, StreamConfig(), 5)
            _assert_same(vectors, query, T0 + 3600, StreamConfig(weight_importance=0, weight_recency=0), 20)
