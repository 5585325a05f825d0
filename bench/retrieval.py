"""Case 1: exact retrieval (every memory scored, the spec's formula, top 5) against the memory-bandwidth floor.

Per size, in one process, on 1 and on 2 cores (the process's affinity: memstream takes a thread a core): the
floor (the fastest plain pass over the same bytes of float32 embeddings with as many threads: np.sum split, a
compiled sum split, a BLAS product with a vector of ones) and memstream's `rank`, in rounds of blocks
(bench.timing.rounds), BLAS and memstream's numpy path timed after them (BLAS threads spin for a while after
a product); the same formula in one SQL statement with sqlite-vec's vec_distance_cosine, and the paper's way,
a per-memory Python loop (`rank_reference`, on 10k memories only: it is too slow beyond).
"""

from __future__ import annotations

import contextlib
import os
import statistics
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import numpy.typing as npt
import sqlite_vec
from threadpoolctl import threadpool_limits

from bench.data import NOW, STREAM, Columns, columns, query, store_file
from bench.timing import Floors, ms, rounds
from memstream.config import StreamConfig
from memstream.index import _kernels as kernels
from memstream.index import _pages as pages
from memstream.index.ranking import rank
from memstream.index.reference import rank_reference
from memstream.index.vectors import StreamVectors
from memstream.store import sqlite_module, to_blob

K = 5
LOOP_N = 10_000
SQL = """
WITH base AS MATERIALIZED (
    SELECT id, created_at, pow(:decay, max(:now - last_accessed_at, 0.0) / 3600.0) AS rec,
           importance * 1.0 AS imp, 1.0 - vec_distance_cosine(embedding, :query) AS rel
    FROM memories WHERE stream = :stream AND status = 'ready'
), lim AS (
    SELECT min(rec) AS r0, max(rec) AS r1, min(imp) AS i0, max(imp) AS i1, min(rel) AS c0, max(rel) AS c1 FROM base
)
SELECT id FROM base, lim ORDER BY
    :wr * (CASE WHEN r1 > r0 THEN (rec - r0) / (r1 - r0) ELSE 0.5 END)
    + :wi * (CASE WHEN i1 > i0 THEN (imp - i0) / (i1 - i0) ELSE 0.5 END)
    + :wc * (CASE WHEN c1 > c0 THEN (rel - c0) / (c1 - c0) ELSE 0.5 END) DESC, created_at DESC, id DESC
LIMIT :k
"""


@contextlib.contextmanager
def on_cores(count: int) -> Iterator[None]:
    """The calling thread (and the threads it starts) on `count` of the process's cores: memstream's pass 1
    takes a thread a core it may run on (memstream/index/_scan.py), so `rank` and the floor use the same number."""
    saved = os.sched_getaffinity(0)
    os.sched_setaffinity(0, sorted(saved)[:count])
    try:
        yield
    finally:
        os.sched_setaffinity(0, saved)


def sql_connection(path: str) -> Any:
    """A plain connection to a store file, with sqlite-vec."""
    conn = sqlite_module().connect(f"file:{path}?mode=ro", uri=True)
    conn.enable_load_extension(True)
    conn.load_extension(sqlite_vec.loadable_path())
    return conn


def sql_rank(conn: Any, q: npt.NDArray[np.float32], config: StreamConfig) -> list[int]:
    """The spec's formula in one statement."""
    args = {"decay": config.decay, "now": NOW, "query": to_blob(q), "stream": STREAM, "k": K,
            "wr": config.weight_recency, "wi": config.weight_importance, "wc": config.weight_relevance}
    return [row[0] for row in conn.execute(SQL, args).fetchall()]


def loop_rank(data: Columns, n: int, q: npt.NDArray[np.float32], config: StreamConfig) -> Callable[[], list[int]]:
    """rank_reference over the first n memories (inputs converted to Python lists beforehand)."""
    memories = [(int(data.ids[i]), float(data.created[i]), float(data.last_accessed[i]), float(data.importance[i]),
                 data.embeddings[i].tolist()) for i in range(n)]
    as_list = q.tolist()
    return lambda: rank_reference(memories, as_list, NOW, config, K)


def run_case(n: int, dim: int, reps: int, threads: list[int], sql_reps: int, loop_reps: int) -> dict[str, Any]:
    """One size: every approach, medians in ms, and whether their top k agree."""
    data = columns(n, dim)
    vectors = StreamVectors(data.arrays(), copy=False)
    q, config = query(dim), StreamConfig()
    out: dict[str, Any] = {"n": n, "dim": dim, "bytes": n * dim * 4, "reps": reps, "threads": {}}
    kernels.warm()
    top = [int(i) for i in vectors.ids[rank(vectors, q, NOW, config, K, compiled=True).rows]]
    pages.wait()  # the screen the query built (if any) in huge pages, as a while after loading
    out["top"] = top
    out["numpy_agrees"] = top == [int(i) for i in vectors.ids[rank(vectors, q, NOW, config, K, compiled=False).rows]]
    with ThreadPoolExecutor(max(threads)) as pool:
        for t in threads:
            with on_cores(t), threadpool_limits(t, "blas"):
                floors = Floors([block for _, block in vectors.blocks()], pool, t)
                times = rounds({**floors.passes, "rank": lambda: rank(vectors, q, NOW, config, K, compiled=True)},
                               reps)
                # BLAS on its own, after the rest: its threads spin for a while after a product
                times["floor_gemv"] = floors.gemv(reps)
                numpy_path = [ms(lambda: rank(vectors, q, NOW, config, K, compiled=False)) for _ in range(reps + 1)]
                times["rank_numpy"] = numpy_path[1:]
            medians = {name: statistics.median(values) for name, values in times.items()}
            passes = [name for name in medians if name.startswith("floor_")]
            floor_name = min(passes, key=lambda name: medians[name])
            out["threads"][str(t)] = {
                "rank_ms": medians["rank"], "rank_numpy_ms": medians["rank_numpy"],
                "floor_ms": medians[floor_name], "floor_kernel": floor_name,
                "floor_all_ms": {name: medians[name] for name in passes},
                "ratio": medians["rank"] / medians[floor_name],
                "floor_gb_s": n * dim * 4 / medians[floor_name] / 1e6,
            }
    conn = sql_connection(str(store_file(n, dim)))
    sql_top = sql_rank(conn, q, config)
    out["sql_ms"] = statistics.median(ms(lambda: sql_rank(conn, q, config)) for _ in range(sql_reps))
    out["sql_agrees"] = sql_top == top
    conn.close()
    if loop_reps:
        # The per-memory loop is far too slow for large N: it runs on the first LOOP_N memories, and is
        # checked against rank on those same memories.
        m = min(n, LOOP_N)
        subset = StreamVectors(Columns(data.ids[:m], data.embeddings[:m], data.importance[:m],
                                       data.last_accessed[:m], data.created[:m]).arrays())
        loop = loop_rank(data, m, q, config)
        loop_top = loop()
        out["loop_ms"] = statistics.median(ms(loop) for _ in range(loop_reps))
        out["loop_n"] = m
        out["loop_agrees"] = loop_top == [int(i) for i in subset.ids[rank(subset, q, NOW, config, K).rows]]
    return out
