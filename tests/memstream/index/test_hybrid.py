"""The `hybrid` profile: its ranking is exactly the plain-Python reference's, and its lexical index stays in step
with every insert, edit, deletion and purge, leaving no word of a forgotten memory in memory or on disk."""

from __future__ import annotations

import random
from collections.abc import AsyncIterator
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memstream import ConfigError, MemoryStream, Observation, RoleModel, Source, Store, StreamConfig
from memstream.clock import to_timestamp
from memstream.index import _kernels as kernels
from memstream.index.hybrid import rank_hybrid_reference
from memstream.index.lexical import StreamTerms, bm25_reference
from memstream.index.ranking import rank
from memstream.index.vector_index import VectorIndex
from memstream.index.vectors import SCREEN_ROWS, StreamVectors
from memstream.index.words import STOP_WORDS, terms
from memstream.testing import FakeClock, FakeEmbedder, ScriptedChat
from tests.memstream.test_privacy import leftovers

HYBRID = StreamConfig.for_profile("hybrid")
WORDS = ["colour", "colours", "ultraviolet", "party", "cafe", "tonight", "paint", "painting", "sunrise", "said",
         "the", "a", "of", "and", "I", "Klaus", "Maria", "Will", "will", "when", "yesterday", "2023", "<@1>", "<@9>"]
# Authors: Klaus (id 1), Maria (by name only), Will (a name that is also a common word); <@9> never wrote.
AUTHORS = [None, ("Klaus", "1"), ("Maria", None), ("Will", "3"), (None, "4")]
Case = tuple[list[tuple[int, float, float, float, list[float], str]], list[float], str, float, StreamConfig, int,
             list[Source | None]]
STREAM = "guild:1"
SECRET = "ZQXVultraviolet7"


def _text(draw: st.DrawFn) -> str:
    return " ".join(draw(st.lists(st.sampled_from(WORDS), max_size=8)))


def _source(draw: st.DrawFn) -> Source | None:
    if not draw(st.booleans()):
        return None
    author = draw(st.sampled_from(AUTHORS))
    channel = draw(st.sampled_from([None, "c1", "c2"]))
    name, author_id = author if author is not None else (None, None)
    return Source(author=name, author_id=author_id, channel_id=channel)


@st.composite
def streams(draw: st.DrawFn) -> Case:
    n = draw(st.integers(1, 14))
    dim = draw(st.integers(2, 5))
    vector = st.lists(st.sampled_from([-1.0, -0.5, 0.0, 0.25, 0.5, 1.0, 2.0]), min_size=dim, max_size=dim)
    shared = draw(vector)  # some memories share an embedding, a time or a text: ties
    memories = []
    for memory_id in draw(st.lists(st.integers(1, 10**6), min_size=n, max_size=n, unique=True)):
        created = draw(st.sampled_from([0.0, 3600.0, 7200.5])) + draw(st.integers(0, 3000)) * draw(
            st.sampled_from([60.0, 3600.0]))  # minutes apart (a conversation) or hours
        embedding = shared if draw(st.booleans()) else draw(vector)
        memories.append((memory_id, created, created, float(draw(st.integers(1, 10))), embedding, _text(draw)))
    query = draw(vector)
    text = draw(st.sampled_from(["", "the a of and", "ultraviolet", "said", "when will Will paint?", "<@9> party",
                                 "when did <@1> and Maria say it?"])) if draw(st.booleans()) else _text(draw)
    now = max(m[1] for m in memories) + draw(st.integers(-100, 100)) * 3600.0
    weight = st.sampled_from([0.0, 0.05, 0.2, 1.0, 2.5])
    config = StreamConfig.for_profile(
        "hybrid", weight_recency=draw(weight), weight_importance=draw(weight), weight_relevance=draw(weight),
        lexical_weight=draw(st.sampled_from([0.0, 0.4, 1.0])), decay=draw(st.sampled_from([0.99, 0.995, 1.0])),
        neighbour_weight=draw(st.sampled_from([0.0, 0.4, 1.0])), name_weight=draw(st.sampled_from([0.0, 0.2])),
        time_weight=draw(st.sampled_from([0.0, 0.3])), neighbour_gap_minutes=draw(st.sampled_from([0.0, 60.0, 1e9])))
    sources = [_source(draw) for _ in memories]
    return memories, query, text, now, config, draw(st.integers(1, n + 2)), sources


def _vectors(memories: list[tuple[int, float, float, float, list[float], str]],
             screen_rows: int = SCREEN_ROWS, sources: list[Source | None] | None = None) -> StreamVectors:
    vectors = StreamVectors(screen_rows=screen_rows)
    vectors.terms = StreamTerms()
    vectors.index_context([], [])
    vectors.append([m[0] for m in memories], np.array([m[4] for m in memories], dtype=np.float32),
                   [m[3] for m in memories], [m[2] for m in memories], [m[1] for m in memories],
                   [m[5] for m in memories])
    assert vectors.context is not None
    given = sources or [None] * len(memories)
    vectors.context.set_sources({m[0]: s for m, s in zip(memories, given, strict=True) if s is not None},
                                [m[0] for m in memories])
    return vectors


@settings(max_examples=300, deadline=None, derandomize=True, database=None)
@given(streams())
def test_hybrid_rank_is_exactly_the_references(case: Case) -> None:
    memories, query, text, now, config, k, sources = case
    kernels.warm()  # (the screen is read by the compiled pass only)
    expected = rank_hybrid_reference(memories, query, text, now, config, k, sources)
    for screen_rows, compiled in ((SCREEN_ROWS, False), (SCREEN_ROWS, True), (0, True)):
        vectors = _vectors(memories, screen_rows, sources)  # screen_rows 0: pass 1 reads the int16 screen
        ranked = rank(vectors, np.array(query, dtype=np.float32), now, config, k, text=text, compiled=compiled)
        assert [int(vectors.ids[row]) for row in ranked.rows] == expected, f"{screen_rows=} {compiled=}"
        assert (vectors._screen is not None) == (screen_rows == 0 and bool(np.any(np.float32(query))))


def test_one_memory_and_no_lexical_match_and_stop_words_only() -> None:
    one = [(7, 0.0, 0.0, 5.0, [1.0, 0.0], "Klaus said hi")]
    assert [int(r) for r in rank(_vectors(one), np.array([1.0, 0.0], np.float32), 10.0, HYBRID, 5, text="x").rows] \
        == [0]
    rng = random.Random(5)
    memories = [(i, i * 60.0, i * 60.0, 5.0, [rng.gauss(0, 1) for _ in range(4)], f"note {i} about tea")
                for i in range(1, 40)]
    vectors = _vectors(memories)
    query = np.array([0.3, -0.2, 0.9, 0.1], np.float32)
    dense = rank(vectors, query, 3600.0, HYBRID, 5, text=None).rows.tolist()
    for text in ("the of and I", "nothing matches zebra", ""):  # lexical is 0 for all: the dense ranking
        assert rank(vectors, query, 3600.0, HYBRID, 5, text=text).rows.tolist() == dense


def test_a_term_in_half_the_stream_or_more_weighs_nothing_and_is_not_read() -> None:
    index = StreamTerms()
    index.add(0, [f"Klaus said thing{i}" for i in range(10)] + ["Maria wrote"])
    assert not index.score("said", 11).any()
    assert {"the", "and", "i"} <= STOP_WORDS and terms("The cafe AND the paintings, I said") == ["cafe", "paint",
                                                                                                   "said"]


def test_the_keyword_index_stems_with_snowball_in_the_persona_language() -> None:
    assert len({*terms("studies studied studying"), *terms("study")}) == 1  # one term: Snowball's "studi"
    assert terms("happily running") == ["happili", "run"]
    index = StreamTerms()
    index.add(0, ["Caroline studies art", "Melanie paints", "a third", "and a fourth"])
    assert index.score("who studied?", 4).tolist()[0] > 0.0
    assert terms("les chats mangeaient", "french") == ["le", "chat", "mang"]  # no stop words but English ones
    assert terms("The studies", "none") == ["the", "studies"]  # whole words, no stop words either
    with pytest.raises(ConfigError, match="stemmer must be a Snowball language"):
        StreamConfig(stemmer="klingon")


@settings(max_examples=200, deadline=None, derandomize=True, database=None)
@given(st.lists(st.tuples(st.sampled_from(["add", "remove", "edit"]), st.integers(0, 50), st.integers(0, 10**6)),
                max_size=40), st.lists(st.sampled_from(WORDS), max_size=4))
def test_the_index_equals_a_rebuild_after_any_writes(ops: list[tuple[str, int, int]], query: list[str]) -> None:
    rng = random.Random(len(ops))
    vectors = StreamVectors()
    vectors.terms = StreamTerms()
    texts: dict[int, str] = {}
    apply_writes(vectors, texts, ops, WORDS, width=7)
    rng.shuffle(query)
    assert_scores_are_the_reference(vectors, texts, " ".join(query))


def apply_writes(vectors: StreamVectors, texts: dict[int, str], ops: list[tuple[str, int, int]], words: list[str], *,
                 width: int) -> None:
    """Add, remove or edit memories (ids after the largest in `texts`, texts of up to width - 1 of `words`), in
    `vectors` and in `texts` alike."""
    next_id = max(texts, default=0) + 1
    for op, pick, seed in ops:
        said = " ".join(random.Random(seed).choices(words, k=seed % width))
        if op == "add" or not texts:
            vectors.append([next_id], np.ones((1, 3), np.float32), [5.0], [0.0], [0.0], [said])
            texts[next_id] = said
            next_id += 1
        elif op == "remove":
            gone = sorted(texts)[pick % len(texts)]
            vectors.remove([gone])
            del texts[gone]
        else:
            edited = sorted(texts)[pick % len(texts)]
            vectors.update(edited, np.ones(3, np.float32), said)
            texts[edited] = said


def assert_scores_are_the_reference(vectors: StreamVectors, texts: dict[int, str], query: str) -> None:
    """The lexical index's scores are bm25_reference's over the texts held, with _kernels.py's loop and numpy."""
    assert vectors.terms is not None
    ids = vectors.ids.tolist()
    reference = bm25_reference([texts[i] for i in ids], query)
    for compiled in (True, False):
        scores = vectors.terms.score(query, vectors.n, compiled=compiled)
        got = {int(vectors.ids[r]): float(scores[r]) for r in np.flatnonzero(scores)}
        assert {i: s for i, s in zip(ids, reference, strict=True) if s} == got, f"compiled={compiled}"


CONTEXT = StreamConfig.for_profile("hybrid", neighbour_weight=1.0, name_weight=0.2, time_weight=0.3)


@settings(max_examples=150, deadline=None, derandomize=True, database=None)
@given(st.lists(st.tuples(st.sampled_from(["add", "add", "remove", "edit"]), st.integers(0, 50),
                          st.integers(0, 10**6)), max_size=30),
       st.sampled_from(["paint the sunrise", "when did Klaus say it", "<@1> party", "the of and", "Will said"]))
def test_neighbours_names_and_times_stay_exact_after_any_writes(ops: list[tuple[str, int, int]], query: str) -> None:
    """Appends, edits and deletions (rows moving), replies to messages here, gone or still to come: the ranking
    is the reference's over what is left; a forgotten memory is nobody's neighbour nor parent, and its text
    reaches no score."""
    vectors = StreamVectors()
    vectors.terms = StreamTerms()
    context = vectors.index_context([], [])
    live: dict[int, tuple[int, float, float, float, list[float], str]] = {}
    sources: dict[int, Source | None] = {}
    next_id = 1
    for op, pick, seed in ops:
        rng = random.Random(seed)
        words = " ".join(rng.choices(WORDS, k=seed % 7))
        if op == "add" or not live:
            vector = [rng.choice([-1.0, 0.5, 1.0, 2.0]) for _ in range(3)]
            created = float(rng.randrange(0, 40)) * 1200.0
            live[next_id] = (next_id, created, created, float(rng.randint(1, 10)), vector, words)
            parent = rng.choice([None, f"m{rng.randrange(1, next_id + 3)}"])  # earlier, itself, later, or none
            sources[next_id] = Source(author=rng.choice(["Klaus", "Will", None]), author_id=rng.choice(["1", None]),
                                      channel_id=rng.choice(["c1", "c2", None]), message_id=f"m{next_id}",
                                      reply_to=parent) if seed % 5 else None
            vectors.append([next_id], np.array([vector], np.float32), [live[next_id][3]], [created], [created],
                           [words])
            if seed % 3:  # the source may come later (VectorIndex reads it from the store before a query)
                given = sources[next_id]
                context.set_sources({} if given is None else {next_id: given}, [next_id])
            next_id += 1
        elif op == "remove":
            gone = sorted(live)[pick % len(live)]
            vectors.remove([gone])
            del live[gone], sources[gone]
        else:
            edited = sorted(live)[pick % len(live)]
            vectors.update(edited, np.array(live[edited][4], np.float32), words)
            live[edited] = (*live[edited][:5], words)
    context.set_sources({i: s for i, s in sources.items() if s is not None}, context.unknown())
    ids = sorted(live)
    expected = rank_hybrid_reference([live[i] for i in ids], [1.0, 0.5, -1.0], query, 48_000.0, CONTEXT, 4,
                                     [sources[i] for i in ids])
    for compiled in (False, True):
        ranked = rank(vectors, np.array([1.0, 0.5, -1.0], np.float32), 48_000.0, CONTEXT, 4, text=query,
                      compiled=compiled)
        assert [int(vectors.ids[row]) for row in ranked.rows] == expected


def test_a_forgotten_message_is_nobodys_neighbour() -> None:
    """A, B, C said in a row in one channel: B lifts A and C; once B is gone, A and C are each other's."""
    memories = [(1, 0.0, 0.0, 5.0, [0.0, 1.0], "tea"), (2, 60.0, 60.0, 5.0, [1.0, 0.0], "the answer"),
                (3, 120.0, 120.0, 5.0, [0.0, 1.0], "tea"), (4, 180.0, 180.0, 5.0, [0.0, 1.0], "tea"),
                (5, 9000.0, 9000.0, 5.0, [0.0, 1.0], "tea")]
    sources: list[Source | None] = [Source(channel_id="c")] * 5
    vectors = _vectors(memories, sources=sources)
    config = StreamConfig.for_profile("hybrid", neighbour_weight=0.5, weight_recency=0.0, weight_importance=0.0)
    ranked = rank(vectors, np.array([1.0, 0.0], np.float32), 10_000.0, config, 5, text="answer")
    parts = dict(zip(vectors.ids[ranked.rows].tolist(), ranked.relevance.tolist(), strict=True))
    assert parts[1] == parts[3] == 0.5 and parts[4] == parts[5] == 0.0  # 4 is beside 3 only; 5 is an hour away
    vectors.remove([2])
    ranked = rank(vectors, np.array([1.0, 0.0], np.float32), 10_000.0, config, 5, text="answer")
    parts = dict(zip(vectors.ids[ranked.rows].tolist(), ranked.relevance.tolist(), strict=True))
    # every cosine alike (min-max 0.5, rel0 0.6 * 0.5): no trace of the answer anywhere; 1, 3 and 4 lifted alike
    assert parts[1] == parts[3] == parts[4] == 0.3 + 0.5 * 0.3 and parts[5] == 0.3


# -- in a memory stream on a file ------------------------------------------------------------------


@pytest.fixture
async def hybrid(tmp_path: Path, clock: FakeClock) -> AsyncIterator[MemoryStream]:
    store = await Store.open(tmp_path / "persona.db")
    role = RoleModel(ScriptedChat(default="5"), "r")
    stream = MemoryStream(store, FakeEmbedder(), rater=role, reflector=role, agent=role, name="Isabella",
                          summary="Runs a cafe.", clock=clock, config=HYBRID, auto_reflect=False)
    yield stream
    await stream.close()


async def assert_in_step(memory: MemoryStream, stream: str, queries: list[str]) -> None:
    """The running index scores as one rebuilt from the file now, and as the reference over the stored texts."""
    fresh = VectorIndex(memory.store, lexical=True)
    live, rebuilt = await memory.index.get(stream), await fresh.get(stream)
    stored = {m.id: m.text for m in await memory.recent(stream, limit=10_000)}
    assert sorted(live.ids.tolist()) == sorted(rebuilt.ids.tolist()) == sorted(stored)
    for query in queries:
        scored = []
        for vectors in (live, rebuilt):
            assert vectors.terms is not None
            scores = vectors.terms.score(query, vectors.n)
            scored.append({int(vectors.ids[r]): float(scores[r]) for r in np.flatnonzero(scores)})
        ids = sorted(stored)
        reference = bm25_reference([stored[i] for i in ids], query)
        assert scored[0] == scored[1] == {i: s for i, s in zip(ids, reference, strict=True) if s}


async def test_forget_edit_and_purge_keep_the_lexical_index_in_step_and_leave_no_bytes(
        hybrid: MemoryStream, tmp_path: Path) -> None:
    db = tmp_path / "persona.db"
    observations = [Observation(f"Klaus said: my favourite colour is {SECRET}", STREAM, source=Source(message_id="m1")),
                    Observation("Maria said: the cafe party is tonight", STREAM, source=Source(message_id="m2")),
                    Observation("Klaus said: I paint the sunrise", STREAM, source=Source(message_id="m3")),
                    Observation(f"Maria said: {SECRET} again", "guild:2", source=Source(message_id="m4"))]
    await hybrid.observe_many(observations)
    queries = [SECRET.lower(), "colour party", "paint sunrise cafe", "klaus said"]
    await assert_in_step(hybrid, STREAM, queries)
    [top] = await hybrid.retrieve(f"what is {SECRET}?", stream=STREAM, k=1)
    assert SECRET in top.memory.text

    await hybrid.forget_messages(["m1"])
    await assert_in_step(hybrid, STREAM, queries)
    assert all(SECRET not in item.memory.text for item in await hybrid.explain(SECRET, stream=STREAM, k=5))

    await hybrid.edit_message(STREAM, "m3", "Klaus said: I paint ultraviolet skies")
    await assert_in_step(hybrid, STREAM, [*queries, "ultraviolet skies"])
    [top] = await hybrid.explain("ultraviolet skies", stream=STREAM, k=1)
    assert top.memory.text.endswith("ultraviolet skies")

    await hybrid.purge("guild:2")
    assert await hybrid.explain(SECRET, stream="guild:2") == []
    await hybrid.close()
    assert leftovers(db, SECRET) == []


async def test_the_profile_passes_the_specs_example_through_the_stream(hybrid: MemoryStream, clock: FakeClock) -> None:
    """Old, important and relevant beats recent and trivial, over the store and the lexical index."""
    await hybrid.observe("Klaus Mueller is writing a research paper on gentrification", importance=8,
                         at=clock.now())
    clock.advance(hours=48)
    for i in range(20):
        await hybrid.observe(f"ate toast number {i}", importance=1)
        clock.advance(hours=1)
    [top] = await hybrid.explain("What is Klaus working on?", k=1)
    assert top.memory.text.startswith("Klaus Mueller")
    assert to_timestamp(top.memory.created_at) < to_timestamp(clock.now()) - 48 * 3600


def test_a_forgotten_author_is_not_kept_in_the_context() -> None:
    memories = [(1, 0.0, 0.0, 5.0, [1.0, 0.0], "hello"), (2, 60.0, 60.0, 5.0, [0.0, 1.0], "bye")]
    vectors = _vectors(memories, sources=[Source(author="Bob", author_id="7"), Source(author="Ann")])
    context = vectors.context
    assert context is not None and context.named_rows("what did bob say", 2) is not None
    vectors.remove([1])
    assert context.named_rows("what did bob say", 1) is None and context.named_rows("<@7>", 1) is None
    assert "7" not in context._codes and all("Bob" not in name for _, name in context._names)
