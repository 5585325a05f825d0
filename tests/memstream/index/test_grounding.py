"""The `hybrid` profile's guard against runaway reflection (memstream/index/grounding.py): a reflection built on
reflections weighs less by the rule, exactly as the plain-Python reference computes it over the whole stream, kept
in step with the store when evidence is forgotten; `grounding_weight = 0` switches it off; `spec` has no such
knob."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memstream import Store, StreamConfig
from memstream.errors import ConfigError
from memstream.index import _kernels as kernels
from memstream.index.grounding import Grounding, grounding_reference
from memstream.index.hybrid import rank_hybrid_reference
from memstream.index.lexical import StreamTerms
from memstream.index.ranking import rank
from memstream.index.vector_index import VectorIndex
from memstream.index.vectors import StreamVectors
from memstream.store import NewMemory

STREAM = "guild:1"
WORDS = ["picnic", "park", "sunday", "rain", "klaus", "likes", "the", "we"]
Row = tuple[int, float, float, float, list[float], str]

# a, b, c observations; r1 from a and b; r2 from r1 only; r3 from a, b, r1, r2... (ids stand for memories)
EVIDENCE = {10: [1, 2], 11: [10], 12: [1, 2, 10, 11], 13: [11], 14: []}
EXPECTED = {10: 1.0, 11: 0.5, 12: (1.0 + 1.0 + 0.5 + 0.25) / 4, 13: 0.25, 14: 0.0}


def test_the_rule_by_hand() -> None:
    assert grounding_reference(EVIDENCE) == EXPECTED
    assert Grounding(EVIDENCE).value == EXPECTED
    one_by_one = Grounding()
    one_by_one.add(EVIDENCE.items())
    assert one_by_one.value == EXPECTED
    one_by_one.discard([11, 13])
    assert one_by_one.column(np.array([1, 10, 11, 12, 14], np.int64)).tolist() == [1.0, 1.0, 1.0, EXPECTED[12], 0.0]


def test_the_knob_belongs_to_hybrid_and_its_default_is_on() -> None:
    assert StreamConfig.for_profile("hybrid").grounding_weight == 0.5
    assert StreamConfig().grounding_weight == 0.0
    with pytest.raises(ConfigError, match="hybrid"):
        StreamConfig(grounding_weight=0.5)
    with pytest.raises(ConfigError, match="grounding_weight must be"):
        StreamConfig.for_profile("hybrid", grounding_weight=-1.0)


@st.composite
def streams(draw: st.DrawFn) -> tuple[list[Row], dict[int, list[int]], list[float], str, float, StreamConfig, int]:
    n = draw(st.integers(1, 16))
    dim = draw(st.integers(2, 4))
    vector = st.lists(st.sampled_from([-1.0, -0.5, 0.0, 0.5, 1.0, 2.0]), min_size=dim, max_size=dim)
    memories: list[Row] = []
    evidence: dict[int, list[int]] = {}
    for memory_id in range(1, n + 1):
        created = float(draw(st.integers(0, 50)) * 3600 + memory_id)
        text = " ".join(draw(st.lists(st.sampled_from(WORDS), max_size=5)))
        memories.append((memory_id, created, created, float(draw(st.integers(1, 10))), draw(vector), text))
        if memory_id > 1 and draw(st.booleans()):  # a reflection, citing earlier memories (reflections too)
            evidence[memory_id] = draw(st.lists(st.integers(1, memory_id - 1), max_size=4, unique=True))
    weight = st.sampled_from([0.0, 0.05, 0.2, 1.0])
    config = StreamConfig.for_profile(
        "hybrid", weight_recency=draw(weight), weight_importance=draw(weight), weight_relevance=draw(weight),
        grounding_weight=draw(st.sampled_from([0.0, 0.5, 1.0, 3.0])))
    now = max(m[1] for m in memories) + 3600.0
    query_text = " ".join(draw(st.lists(st.sampled_from(WORDS), max_size=3)))
    return memories, evidence, draw(vector), query_text, now, config, draw(st.integers(1, n + 1))


def _vectors(memories: list[Row], grounding: Grounding) -> StreamVectors:
    vectors = StreamVectors()
    vectors.terms = StreamTerms()
    vectors.grounding = grounding
    vectors.index_context([], [])  # hybrid's levers beside the grounding (no sources: none named, no neighbours)
    vectors.append([m[0] for m in memories], np.array([m[4] for m in memories], dtype=np.float32),
                   [m[3] for m in memories], [m[2] for m in memories], [m[1] for m in memories],
                   [m[5] for m in memories])
    return vectors


@settings(max_examples=200, deadline=None, derandomize=True, database=None)
@given(streams())
def test_reflections_on_reflections_rank_exactly_as_the_reference(
        case: tuple[list[Row], dict[int, list[int]], list[float], str, float, StreamConfig, int]) -> None:
    memories, evidence, query, text, now, config, k = case
    kernels.warm()
    expected = rank_hybrid_reference(memories, query, text, now, config, k, evidence=evidence)
    built, kept = Grounding(evidence), Grounding()  # as a load builds it, and as the store's events keep it
    kept.add(sorted(evidence.items()))
    assert built.value == kept.value == grounding_reference(evidence)
    for grounding in (built, kept):
        for compiled in (False, True):
            vectors = _vectors(memories, grounding)
            ranked = rank(vectors, np.array(query, dtype=np.float32), now, config, k, text=text, compiled=compiled)
            assert [int(vectors.ids[row]) for row in ranked.rows] == expected


# -- over the store, kept in step by its events -----------------------------------------------------------------

DIM = 4
QUERY = np.array([1.0, 0.0, 0.0, 0.0], np.float32)


def _memory(text: str, embedding: list[float], kind: str = "observation", depth: int = 0,
            at: float = 1000.0) -> NewMemory:
    return NewMemory(stream=STREAM, kind=kind, text=text, created_at=at, importance=5,
                     importance_source="derived" if kind == "reflection" else "given", depth=depth,
                     embedding=np.array(embedding, np.float32))


async def _top(index: VectorIndex, config: StreamConfig, k: int = 2) -> list[int]:
    async with index.locked(STREAM) as vectors:
        ranked = rank(vectors, QUERY, 10_000.0, config, k, text="picnic")
        return [int(vectors.ids[row]) for row in ranked.rows]


async def _reference(store: Store, config: StreamConfig, k: int = 2) -> list[int]:
    """The reference over what the store holds now."""
    pages = [page async for page in store.stream_pages(STREAM)]
    ready = [m for page in pages for m in page if m.status == "ready"]
    memories = [(m.id, m.created_at.timestamp(), m.last_accessed_at.timestamp(), float(m.importance or 0),
                 (await store.load_vector(m.id)).tolist(), m.text) for m in ready]
    return rank_hybrid_reference(memories, QUERY.tolist(), "picnic", 10_000.0, config, k,
                                 evidence=await store.evidence_links(STREAM))


async def test_a_reflection_on_reflections_gives_way_to_what_happened_and_follows_deletions(store: Store) -> None:
    on = StreamConfig.for_profile("hybrid")
    off = StreamConfig.for_profile("hybrid", grounding_weight=0.0)
    index = VectorIndex(store, lexical=True, grounding=True, context=True)
    a, b = await store.insert([_memory("we had a picnic in the park", [0.9, 0.3, 0, 0]),
                               _memory("the picnic was on sunday", [0.8, 0.5, 0, 0])])
    await _top(index, on)  # loaded before the reflections: they reach it as the store's events
    [r1] = await store.save_reflection(STREAM, [(_memory("Klaus likes picnics", [0.9, 0.2, 0, 0], "reflection",
                                                         1, 2000.0), [a, b])], 2000.0)
    [r2] = await store.save_reflection(STREAM, [(_memory("Klaus likes the picnic park", [1.0, 0.05, 0, 0],
                                                         "reflection", 2, 3000.0), [r1])], 3000.0)
    [r3] = await store.save_reflection(STREAM, [(_memory("picnics picnic picnic", [1.0, 0.0, 0, 0],
                                                         "reflection", 3, 4000.0), [r2, r1])], 4000.0)
    assert await store.evidence_links(STREAM) == {r1: [a, b], r2: [r1], r3: [r2, r1]}
    async with index.locked(STREAM) as vectors:
        assert vectors.grounding is not None
        assert vectors.grounding.value == {r1: 1.0, r2: 0.5, r3: (0.25 + 0.5) / 2}

    assert await _top(index, off) == await _reference(store, off) == [r3, r2]  # the guard off: the drift wins
    assert await _top(index, on) == await _reference(store, on) == [r1, a]  # on: the grounded insight, then a

    # a load from the store agrees with the events
    fresh = VectorIndex(store, lexical=True, grounding=True, context=True)
    assert await _top(fresh, on) == [r1, a]
    async with fresh.locked(STREAM) as vectors:
        assert vectors.grounding is not None and vectors.grounding.value[r3] == (0.25 + 0.5) / 2

    assert sorted(await store.delete([a])) == sorted([a, r1, r2, r3])  # what was built on `a` goes with it
    for kept in (index, fresh):
        async with kept.locked(STREAM) as vectors:
            assert vectors.grounding is not None and vectors.grounding.value == {}
            assert vectors.ids.tolist() == [b]
        assert await _top(kept, on) == await _reference(store, on) == [b]


async def test_an_edit_of_what_a_reflection_cites_takes_its_grounding_with_it(store: Store) -> None:
    on = StreamConfig.for_profile("hybrid")
    index = VectorIndex(store, lexical=True, grounding=True, context=True)
    a, b = await store.insert([_memory("we had a picnic in the park", [0.9, 0.3, 0, 0]),
                               _memory("the picnic was on sunday", [0.8, 0.5, 0, 0])])
    [r1] = await store.save_reflection(STREAM, [(_memory("Klaus likes picnics", [0.9, 0.2, 0, 0], "reflection",
                                                         1, 2000.0), [a])], 2000.0)
    [r2] = await store.save_reflection(STREAM, [(_memory("picnic picnic", [1.0, 0.0, 0, 0], "reflection", 2,
                                                         3000.0), [r1, b])], 3000.0)
    async with index.locked(STREAM) as vectors:
        assert vectors.grounding is not None and vectors.grounding.value == {r1: 1.0, r2: 0.75}
    async with store.transaction():  # an edited message, as MemoryStream.edit_message writes it
        await store.delete([a], keep=[a])  # what was drawn from the old text goes
        await store.update_text(a, "we had lunch at home")  # pending again, out of retrieval
    async with index.locked(STREAM) as vectors:
        assert vectors.grounding is not None and vectors.grounding.value == {}
        assert vectors.ids.tolist() == [b]
    assert await store.evidence_links(STREAM) == {}
    assert await _top(index, on) == await _reference(store, on) == [b]
