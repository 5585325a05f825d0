"""Retrieval: the spec's score over every memory, normalization edge cases, ties, and touching."""

from __future__ import annotations

import itertools
import math
import random
from datetime import timedelta

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from memstream.clock import to_timestamp
from memstream.config import StreamConfig
from memstream.errors import ProviderError, StoreError
from memstream.index.profiles import min_max
from memstream.index.ranking import rank
from memstream.index.reference import rank_reference
from memstream.index.vectors import StreamVectors
from memstream.models.embed import normalize_rows
from memstream.store import StreamArrays
from memstream.testing import FakeClock, FakeEmbedder
from tests.conftest import MakeMemory
from tests.memstream.helpers import cosine_vector, e0

# -- normalization ---------------------------------------------------------------------------------


def test_min_max_scales_to_unit_range() -> None:
    assert min_max(np.array([2.0, 4.0, 3.0])).tolist() == [0.0, 1.0, 0.5]


@pytest.mark.parametrize("values", [[7.0], [3.0, 3.0, 3.0], [0.0, 0.0]])
def test_min_max_of_equal_values_is_one_half(values: list[float]) -> None:
    assert min_max(np.array(values)).tolist() == [0.5] * len(values)


def test_min_max_of_nothing_is_nothing() -> None:
    assert min_max(np.array([], dtype=np.float64)).size == 0


async def test_a_single_memory_scores_one_half_on_every_part(make_memory: MakeMemory, clock: FakeClock) -> None:
    memory = make_memory()
    only = await memory.observe("Maria painted a portrait", importance=4)
    clock.advance(hours=5)
    [item] = await memory.explain("what did Maria paint?")
    assert item.memory.id == only.id
    assert (item.recency, item.importance, item.relevance) == (0.5, 0.5, 0.5)
    assert item.score == pytest.approx(1.5)


async def test_equal_importance_leaves_recency_and_relevance_to_decide(
    make_memory: MakeMemory, clock: FakeClock
) -> None:
    fixed = {"query": e0(), "a": cosine_vector(0.9), "b": cosine_vector(0.1), "c": cosine_vector(0.5),
             "d": cosine_vector(0.3)}
    memory = make_memory(embedder=FakeEmbedder(dim=3, fixed=fixed))
    for hours, text in ((40, "a"), (2, "b"), (20, "c"), (9, "d")):
        await memory.observe(text, at=clock.now() - timedelta(hours=hours), importance=6)
    ranked = await memory.explain("query", k=4)
    assert {item.importance for item in ranked} == {0.5}
    for item in ranked:
        assert item.score == pytest.approx(item.recency + item.relevance + 0.5)
    without = make_memory(embedder=FakeEmbedder(dim=3, fixed=fixed), config=StreamConfig(weight_importance=0))
    assert [i.memory.id for i in await without.explain("query", k=4)] == [i.memory.id for i in ranked]


async def test_equal_scores_go_to_the_newer_memory(make_memory: MakeMemory, clock: FakeClock) -> None:
    embedder = FakeEmbedder(dim=3, fixed={"query": e0(), "same": cosine_vector(0.5)})
    memory = make_memory(embedder=embedder)
    start = clock.now()
    # The newer memory is stored first, so it has the *lower* id: the tie rule is about time, not ids.
    newer = await memory.observe("same", at=start - timedelta(hours=1), importance=3)
    older = await memory.observe("same", at=start - timedelta(hours=9), importance=3)
    assert newer.id < older.id
    # Retrieving both gives them the same last access, so every part of their scores is equal.
    await memory.retrieve("query", k=2)
    ranked = await memory.explain("query", k=2)
    assert ranked[0].score == ranked[1].score
    assert [item.memory.id for item in ranked] == [newer.id, older.id]
    # With equal creation times too, the higher id wins.
    twin = await memory.observe("same", at=start - timedelta(hours=1), importance=3)
    await memory.retrieve("query", k=3)
    assert [item.memory.id for item in await memory.explain("query", k=3)] == [twin.id, newer.id, older.id]


# -- the vectorized ranking equals the reference, one memory at a time -----------------------------

_VECTOR = st.integers(-5, 5)


@st.composite
def streams(draw: st.DrawFn) -> tuple[list[tuple[int, float, float, float, list[float]]], list[float], float,
                                       StreamConfig, int]:
    n = draw(st.integers(1, 12))
    dim = draw(st.integers(2, 6))
    ids = draw(st.lists(st.integers(1, 10**6), min_size=n, max_size=n, unique=True))
    memories = []
    for memory_id in ids:
        created = draw(st.integers(0, 2000)) * 3600.0 + draw(st.sampled_from([0.0, 0.5, 1800.0]))
        accessed = created + draw(st.integers(0, 500)) * 3600.0
        importance = float(draw(st.integers(1, 10)))
        embedding = [float(x) for x in draw(st.lists(_VECTOR, min_size=dim, max_size=dim))]
        memories.append((memory_id, created, accessed, importance, embedding))
    query = [float(x) for x in draw(st.lists(_VECTOR, min_size=dim, max_size=dim).filter(any))]
    now = max(m[2] for m in memories) + draw(st.integers(-50, 100)) * 3600.0
    weight = st.sampled_from([0.0, 0.5, 1.0, 2.0, 3.7])
    config = StreamConfig(weight_recency=draw(weight), weight_importance=draw(weight),
                          weight_relevance=draw(weight), decay=draw(st.sampled_from([0.9, 0.99, 0.995, 1.0])))
    return memories, query, now, config, draw(st.integers(1, n + 2))


def _vectors(memories: list[tuple[int, float, float, float, list[float]]]) -> StreamVectors:
    return StreamVectors(StreamArrays(
        ids=np.array([m[0] for m in memories], dtype=np.int64),
        embeddings=np.array([m[4] for m in memories], dtype=np.float32),
        importance=np.array([m[3] for m in memories], dtype=np.float32),
        last_accessed=np.array([m[2] for m in memories], dtype=np.float64),
        created=np.array([m[1] for m in memories], dtype=np.float64),
    ))


def _cos(a: list[float], b: list[float]) -> float:
    na, nb = math.hypot(*a), math.hypot(*b)
    return 0.0 if na == 0 or nb == 0 else sum(x * y for x, y in zip(a, b, strict=True)) / (na * nb)


@settings(max_examples=100, deadline=None, derandomize=True, database=None)
@given(streams())
def test_rank_equals_rank_reference(case: tuple[list[tuple[int, float, float, float, list[float]]], list[float],
                                                float, StreamConfig, int]) -> None:
    memories, query, now, config, k = case
    vectors = _vectors(memories)
    q = normalize_rows(query)[0]
    # float32 embeddings against float64: keep away from relevance ranges so narrow that min-max would
    # magnify rounding (both are right then, to their precision).
    cos64 = [_cos(m[4], query) for m in memories]
    cos32 = vectors.embeddings @ q
    assume((max(cos64) - min(cos64) > 1e-2) or float(np.ptp(cos32)) == 0.0)

    expected = rank_reference(memories, query, now, config, k)
    ranked = rank(vectors, q, now, config, k)
    got = [int(vectors.ids[row]) for row in ranked.rows]
    full = rank(vectors, q, now, config, len(memories))
    score = {int(vectors.ids[row]): float(s) for row, s in zip(full.rows, full.score, strict=True)}

    assert len(got) == len(expected) == min(k, len(memories))
    assert got == [int(vectors.ids[row]) for row in full.rows][: len(got)]  # partition = full sort
    for mine, theirs in zip(got, expected, strict=True):
        # Equal ids, or a swap between scores equal up to float32 rounding.
        assert mine == theirs or score[mine] == pytest.approx(score[theirs], abs=1e-4)
    assert ranked.score.tolist() == sorted(ranked.score.tolist(), reverse=True)
    created = {m[0]: m[1] for m in memories}
    for first, second in itertools.pairwise(got):
        if score[first] == score[second]:  # an exact tie goes to the newer memory, then the higher id
            assert (created[first], first) > (created[second], second)


async def test_retriever_over_the_store_equals_rank_reference(make_memory: MakeMemory, clock: FakeClock) -> None:
    rng = random.Random(20230213)
    for round_ in range(3):
        stream = f"guild:{round_}"
        fixed = {f"m{round_}-{i}": [rng.gauss(0, 1) for _ in range(8)] for i in range(40)}
        query = f"query {round_}"
        fixed[query] = [rng.gauss(0, 1) for _ in range(8)]
        config = StreamConfig(weight_recency=rng.uniform(0, 2), weight_importance=rng.uniform(0, 2),
                              weight_relevance=rng.uniform(0, 2), decay=rng.uniform(0.95, 0.999), k=7)
        memory = make_memory(embedder=FakeEmbedder(dim=8, fixed=fixed), config=config)
        start = clock.now()
        for text in fixed:
            if text != query:
                at = start - timedelta(hours=rng.uniform(0, 300))
                await memory.observe(text, stream=stream, at=at, importance=rng.randint(1, 10))
        stored = await memory.recent(stream, limit=100)
        memories = [(m.id, to_timestamp(m.created_at), to_timestamp(m.last_accessed_at), float(m.importance or 0),
                     fixed[m.text]) for m in stored]

        ranked = await memory.explain(query, stream=stream)

        now = to_timestamp(clock.now())
        assert [item.memory.id for item in ranked] == rank_reference(memories, fixed[query], now, config, 7)


# -- configuration ---------------------------------------------------------------------------------


async def test_weights_decide_what_wins(make_memory: MakeMemory, clock: FakeClock) -> None:
    embedder = FakeEmbedder(dim=3, fixed={"query": e0(), "important": cosine_vector(0.2),
                                          "relevant": cosine_vector(0.9), "recent": cosine_vector(0.1)})
    winners = {}
    for name, weights in {"importance": (0, 1, 0), "relevance": (0, 0, 1), "recency": (1, 0, 0)}.items():
        config = StreamConfig(weight_recency=weights[0], weight_importance=weights[1], weight_relevance=weights[2])
        memory = make_memory(embedder=embedder, config=config)
        stream = f"weights:{name}"
        start = clock.now()
        await memory.observe("important", stream=stream, at=start - timedelta(hours=30), importance=9)
        await memory.observe("relevant", stream=stream, at=start - timedelta(hours=20), importance=2)
        await memory.observe("recent", stream=stream, at=start - timedelta(hours=1), importance=1)
        winners[name] = (await memory.explain("query", stream=stream, k=1))[0].memory.text
    assert winners == {"importance": "important", "relevance": "relevant", "recency": "recent"}


async def test_k_and_decay_are_configurable(make_memory: MakeMemory, clock: FakeClock) -> None:
    memory = make_memory(config=StreamConfig(k=2, decay=1.0))
    for n in range(6):
        await memory.observe(f"note {n}", at=clock.now() - timedelta(hours=n), importance=1 + n)
    ranked = await memory.explain("note")
    assert len(ranked) == 2
    assert {item.recency for item in ranked} == {0.5}  # no decay: every memory is equally recent
    assert len(await memory.explain("note", k=4)) == 4
    default = make_memory()
    assert len(await default.explain("note")) == 5  # the spec's default k


async def test_recency_decays_from_last_access_at_0995_per_hour(make_memory: MakeMemory, clock: FakeClock) -> None:
    memory = make_memory()
    start = clock.now()
    for hours in (0, 10, 40):
        await memory.observe(f"event {hours}", at=start - timedelta(hours=hours), importance=5)
    ranked = await memory.explain("event", k=3)
    by_age = {item.memory.text: item.recency for item in ranked}
    low, high = 0.995**40, 1.0
    assert by_age["event 0"] == pytest.approx(1.0)
    assert by_age["event 40"] == pytest.approx(0.0)
    assert by_age["event 10"] == pytest.approx((0.995**10 - low) / (high - low))


# -- touching --------------------------------------------------------------------------------------


async def test_explain_touches_nothing_and_retrieve_touches_exactly_the_returned(
    make_memory: MakeMemory, clock: FakeClock
) -> None:
    memory = make_memory()
    observed = []
    for n in range(6):
        observed.append(await memory.observe(f"Maria saw bird number {n}", importance=1 + n))
        clock.advance(hours=2)
    before = {m.id: m.last_accessed_at for m in observed}
    assert all(m.last_accessed_at == m.created_at for m in observed)

    explained = await memory.explain("bird", k=3)
    assert len(explained) == 3
    after_explain = {m.id: m.last_accessed_at for m in (await memory.store.get_many(list(before))).values()}
    assert after_explain == before

    clock.advance(hours=1)
    returned = {item.memory.id for item in await memory.retrieve("bird", k=3)}
    assert len(returned) == 3
    now = clock.now()
    for memory_id, stored in (await memory.store.get_many(list(before))).items():
        expected = now if memory_id in returned else before[memory_id]
        assert stored.last_accessed_at == expected
    loaded = memory.index.loaded("default")
    assert loaded is not None
    in_memory = dict(zip(loaded.ids.tolist(), loaded.last_accessed.tolist(), strict=True))
    assert {i for i, at in in_memory.items() if at == to_timestamp(now)} == returned


async def test_retrieve_at_a_given_time_touches_at_that_time(make_memory: MakeMemory, clock: FakeClock) -> None:
    memory = make_memory()
    first = await memory.observe("lunch with Klaus", importance=3)
    later = clock.now() + timedelta(hours=7)
    await memory.retrieve("lunch", at=later)
    assert (await memory.store.get(first.id)).last_accessed_at == later


async def test_streams_do_not_mix_and_empty_streams_return_nothing(make_memory: MakeMemory) -> None:
    memory = make_memory()
    await memory.observe("a secret in guild one", stream="guild:1", importance=5)
    assert await memory.retrieve("secret", stream="guild:2") == []
    assert [m.memory.text for m in await memory.retrieve("secret", stream="guild:1")] == ["a secret in guild one"]


async def test_a_query_of_another_dimension_is_a_store_error(make_memory: MakeMemory) -> None:
    memory = make_memory()
    await memory.observe("something", importance=5)
    with pytest.raises(StoreError, match="dimensions"):
        await memory.retriever.explain_vector(np.ones(5, dtype=np.float32), stream="default")


async def test_each_retrieval_counts_its_embedding_call_once_failed_ones_too(make_memory: MakeMemory,
                                                                             embedder: FakeEmbedder) -> None:
    memory = make_memory()
    await memory.observe("Maria painted a portrait", importance=4)
    before = (await memory.store.usage("default"))["embedding"]
    for _ in range(3):
        await memory.retrieve("what did Maria paint?")
    after = (await memory.store.usage("default"))["embedding"]
    assert after.calls - before.calls == 3
    embedder.fail_with = ProviderError("the embedding server is down")
    with pytest.raises(ProviderError):
        await memory.retrieve("what did Maria paint?")
    failed = (await memory.store.usage("default"))["embedding"]
    assert (failed.calls - after.calls, failed.failures - after.failures) == (1, 1)
