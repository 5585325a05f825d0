"""Case: the `hybrid` profile's speed against the dense path and the memory-bandwidth floor.

    python -m bench.hybrid [--sizes 100000,1000000] [--reps 15]

Per size, in one process: the floor (np.sum over the embeddings split over every core: the fastest plain
pass over those bytes that can be written here), then the dense path (`rank` with the `spec` profile,
compiled loops) and the hybrid path (`rank` with the `hybrid` profile: the same float32 pass, BM25 over the
stream's lexical index, the exact second pass), interleaved run by run. Texts are bench.data's generated
ones: each of 24 topic words is in about a quarter of the stream, a hard case for posting lists; the query
names three. Prints medians and the ratios hybrid/dense (target <= 1.5) and dense/floor (target <= 1.3).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from bench.data import NOW, columns, query, text
from memstream import kernels
from memstream.config import StreamConfig
from memstream.retrieve import rank
from memstream.vectors import StreamVectors

K = 5
QUERY = "did anyone go to the party at the gallery tonight?"


def _ms(fn: Any) -> float:
    start = time.perf_counter()
    fn()
    return (time.perf_counter() - start) * 1e3


def run_case(n: int, dim: int, reps: int) -> dict[str, Any]:
    data = columns(n, dim)
    vectors = StreamVectors(data.arrays(), copy=False)
    started = time.perf_counter()
    vectors.index_texts(vectors.ids.tolist(), [text(int(i)) for i in vectors.ids])
    build_s = time.perf_counter() - started
    q = query(dim)
    dense_config, hybrid_config = StreamConfig(), StreamConfig.for_profile("hybrid")
    kernels.warm()
    cores = len(os.sched_getaffinity(0))
    parts = [p for _, block in vectors.blocks() for p in np.array_split(block, cores)]
    times: dict[str, list[float]] = {"floor": [], "dense": [], "hybrid": []}
    with ThreadPoolExecutor(cores) as pool:
        def floor() -> object:
            return list(pool.map(np.sum, parts))

        def dense() -> object:
            return rank(vectors, q, NOW, dense_config, K)

        def hybrid() -> object:
            return rank(vectors, q, NOW, hybrid_config, K, text=QUERY)

        # The floor on its own, before any BLAS call: OpenBLAS's threads keep spinning for a while after a
        # product and would slow a pass timed right after one (68 ms at 1M instead of 48-53 here).
        floor()
        times["floor"] = [_ms(floor) for _ in range(reps)]
        for fn in (dense, hybrid):
            fn()
        for _ in range(reps):
            for name, fn in (("dense", dense), ("hybrid", hybrid)):
                times[name].append(_ms(fn))
    med = {name: statistics.median(values) for name, values in times.items()}
    return {"n": n, "dim": dim, "index_build_s": build_s, **{f"{k}_ms": v for k, v in med.items()},
            "hybrid_over_dense": med["hybrid"] / med["dense"], "dense_over_floor": med["dense"] / med["floor"]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.hybrid")
    parser.add_argument("--sizes", default="100000,1000000")
    parser.add_argument("--dim", type=int, default=384)
    parser.add_argument("--reps", type=int, default=15)
    args = parser.parse_args(argv)
    print(f"{'n':>9} {'floor ms':>9} {'dense ms':>9} {'hybrid ms':>10} {'hybrid/dense':>13} {'dense/floor':>12} "
          f"{'index build s':>14}")
    for n in (int(s) for s in args.sizes.split(",")):
        r = run_case(n, args.dim, args.reps)
        print(f"{n:>9} {r['floor_ms']:>9.1f} {r['dense_ms']:>9.1f} {r['hybrid_ms']:>10.1f} "
              f"{r['hybrid_over_dense']:>13.2f} {r['dense_over_floor']:>12.2f} {r['index_build_s']:>14.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
