"""A large stream's per-query arrays are reused from one query to the next (memstream/index/_scratch.py): what a
query leaves in them never reaches the next one's answer, which is what a fresh copy of the stream answers."""

from __future__ import annotations

import numpy as np

from memstream import Source, StreamConfig
from memstream.index._scratch import SCRATCH_ROWS, Scratch
from memstream.index.ranking import rank
from memstream.index.vectors import StreamVectors
from memstream.store import StreamArrays

NOW = 2_000_000.0
WORDS = ["coffee", "jazz", "market", "rain", "garden", "train", "piano", "soup"]


def test_a_small_stream_gets_fresh_arrays_and_a_large_one_the_same_ones() -> None:
    scratch = Scratch()
    small = scratch.take("a", 10, np.float64)
    assert not np.shares_memory(small, scratch.take("a", 10, np.float64)) and scratch.nbytes() == 0
    large = scratch.take("a", SCRATCH_ROWS, np.float64)
    large[:] = 7.0
    again = scratch.take("a", SCRATCH_ROWS, np.float64)
    assert np.shares_memory(large, again) and again[0] == 7.0  # the same memory, as the last query left it
    assert not scratch.take("a", SCRATCH_ROWS, np.float64, zero=True).any()
    assert not np.shares_memory(again, scratch.take("b", SCRATCH_ROWS, np.float64))  # a name each
    grown = scratch.take("a", SCRATCH_ROWS + SCRATCH_ROWS // 4, np.float64)  # past the eighth of room: grown
    assert len(grown) == SCRATCH_ROWS + SCRATCH_ROWS // 4 and not np.shares_memory(grown, large)
    assert scratch.take("c", SCRATCH_ROWS, np.float32).dtype == np.float32
    room = [(size + size // 8) * width for size, width in ((len(grown), 8), (SCRATCH_ROWS, 8), (SCRATCH_ROWS, 4))]
    assert scratch.nbytes() == sum(room)  # what it holds between queries, counted in the stream's size


def _stream(n: int, seed: int = 0) -> StreamVectors:
    rng = np.random.default_rng(seed)
    ids = np.arange(1, n + 1, dtype=np.int64)
    texts = [f"{WORDS[i % 8]} and {WORDS[(i * 7) % 8]} with {('Ana', 'Bo', 'Cy')[i % 3]}"
             + (" at 5pm" if i % 11 == 0 else "") for i in range(n)]
    arrays = StreamArrays(ids=ids, importance=rng.integers(1, 11, n).astype(np.float32),
                          last_accessed=NOW - rng.uniform(0, 1e6, n),
                          created=(NOW - 1e6 + ids * 3.0).astype(np.float64),
                          embeddings=rng.standard_normal((n, 8)).astype(np.float32))
    vectors = StreamVectors(arrays)
    sources = {int(i): Source(author=("Ana", "Bo", "Cy")[int(i) % 3], author_id=str(int(i) % 3),
                              channel="general", channel_id="c1") for i in ids}
    vectors.index_texts(ids.tolist(), texts)
    vectors.index_context(ids.tolist(), texts).set_sources(sources, ids.tolist())
    return vectors


def test_queries_in_a_row_over_a_large_stream_answer_as_a_fresh_stream_does() -> None:
    vectors = _stream(SCRATCH_ROWS)
    config = StreamConfig.for_profile("hybrid")
    rng = np.random.default_rng(1)
    questions = ["what did Ana say about coffee", "when was the jazz", "piano", "", "when did Bo mention rain"]
    for compiled, asked in ((True, questions), (False, questions[:2])):
        for question in asked:
            query = rng.standard_normal(8).astype(np.float32)
            got = rank(vectors, query, NOW, config, 5, text=question, compiled=compiled)
            want = rank(_stream(SCRATCH_ROWS), query, NOW, config, 5, text=question, compiled=compiled)
            assert got.rows.tolist() == want.rows.tolist() and np.array_equal(got.score, want.score), question
    assert vectors.scratch.nbytes() > 0 and vectors.nbytes() > _stream(SCRATCH_ROWS).nbytes()  # kept, counted
