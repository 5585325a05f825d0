"""Pass 1 split over the cores (_scan.py): the same answer as the numpy path on large streams in several blocks,
errors in a worker raised to the caller, concurrent passes that do not wait on each other forever."""

from __future__ import annotations

import itertools
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from memstream.config import StreamConfig
from memstream.index import _kernels as kernels
from memstream.index import _scan as scan
from memstream.index.ranking import rank
from memstream.index.vectors import StreamVectors
from memstream.store import StreamArrays

T0 = 1_676_275_200.0


def _stream(n: int, dim: int, blocks: list[int], seed: int = 0) -> StreamVectors:
    """n memories of a year, in blocks of these sizes (as a load in several processes gives them)."""
    rng = np.random.default_rng(seed)
    matrix = rng.standard_normal((n, dim)).astype(np.float32)
    matrix[rng.integers(0, n, 50)] = matrix[7]  # twins: equal cosines
    created = np.sort(rng.uniform(T0, T0 + 365 * 86400.0, n))
    last = created.copy()
    touched = rng.random(n) < 0.1
    last[touched] = rng.uniform(created[touched], T0 + 365 * 86400.0)
    bounds = np.cumsum([0, *blocks])
    assert bounds[-1] == n
    parts = [matrix[a:b] for a, b in itertools.pairwise(bounds)]
    return StreamVectors(StreamArrays(np.arange(1, n + 1, dtype=np.int64), parts,
                                      rng.integers(1, 11, n).astype(np.float32), last, created), copy=False)


@pytest.mark.parametrize("blocks", [[60_000], [25_000, 3, 34_997], [8191, 8193, 43_616]])
def test_large_streams_in_blocks_rank_as_the_numpy_path(blocks: list[int]) -> None:
    assert kernels.available()
    vectors = _stream(60_000, 16, blocks)
    assert len(list(vectors.blocks())) == len(blocks)
    assert scan._threads(vectors.n) == min(scan.cores(), 3)
    rng = np.random.default_rng(1)
    now = T0 + 366 * 86400.0
    for config in (StreamConfig(), StreamConfig(weight_recency=0.0), StreamConfig(weight_relevance=3.0, decay=0.99)):
        for query in (rng.standard_normal(16).astype(np.float32), vectors.gather([7])[0]):
            compiled = rank(vectors, query, now, config, 5, compiled=True)
            plain = rank(vectors, query, now, config, 5, compiled=False)
            assert compiled.rows.tolist() == plain.rows.tolist()
            assert compiled.score.tolist() == plain.score.tolist()


def test_cosines_over_blocks_match_the_product_and_report_their_range() -> None:
    vectors = _stream(40_000, 8, [10_000, 30_000])
    unit = np.full(8, 8 ** -0.5, np.float32)
    out = np.empty(vectors.n, np.float32)
    low, high, nan = scan.cosines(list(vectors.blocks()), unit, vectors.inverse_norms, out)
    expected = np.concatenate([block @ unit for _, block in vectors.blocks()]) * vectors.inverse_norms
    assert np.allclose(out, expected, atol=1e-5)
    assert (low, high, nan) == (float(out.min()), float(out.max()), False)


def test_an_error_in_one_thread_reaches_the_caller_and_no_thread_waits_forever() -> None:
    def work(i: int, wait: object) -> int:
        if i == 1:
            raise ValueError("a broken share")
        wait()  # type: ignore[operator]
        return i

    with pytest.raises(ValueError, match="a broken share"):
        scan._on_cores(2, work)
    assert scan._on_cores(2, lambda i, wait: (wait(), i)[1]) == [0, 1]


def test_passes_from_several_threads_at_once_each_get_their_own_answer() -> None:
    vectors = _stream(50_000, 8, [50_000])
    config, now = StreamConfig(), T0 + 366 * 86400.0
    queries = [np.random.default_rng(s).standard_normal(8).astype(np.float32) for s in range(6)]
    expected = [rank(vectors, q, now, config, 5, compiled=False).rows.tolist() for q in queries]
    barrier = threading.Barrier(len(queries))

    def one(i: int) -> list[int]:
        barrier.wait()
        return rank(vectors, queries[i], now, config, 5, compiled=True).rows.tolist()

    with ThreadPoolExecutor(len(queries)) as pool:
        assert list(pool.map(one, range(len(queries)), timeout=60)) == expected
