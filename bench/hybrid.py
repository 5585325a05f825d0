"""Case: the `hybrid` profile's speed against the dense path and the memory-bandwidth floor.

    python -m bench.hybrid [--sizes 100000,1000000] [--reps 15]

Per size, in one process: the floor (the faster of np.sum over the embeddings split over every core and a
BLAS product with a vector of ones: the fastest plain passes over those bytes that can be written here),
then `rank` with the `spec` profile (compiled loops) and with the `hybrid` profile (the same float32 pass,
BM25 over the stream's lexical index, the exact second pass), interleaved run by run, then the public
MemoryStream.retrieve with each profile, over a store file each. Texts are bench.data's generated ones:
each of 24 topic words is in about a quarter of the stream, a hard case for posting lists; the query names
three. Targets: hybrid within 1.5x of dense, the dense retrieve path within 1.3x of the floor.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from bench.data import NOW, STREAM, columns, query, store_file, text
from memstream import MemoryStream, RoleModel, Store, kernels
from memstream.clock import from_timestamp
from memstream.config import StreamConfig
from memstream.retrieve import rank
from memstream.testing import FakeClock, FakeEmbedder, ScriptedChat
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
    times: dict[str, list[float]] = {"dense": [], "hybrid": []}
    with ThreadPoolExecutor(cores) as pool:
        def floor() -> object:
            return list(pool.map(np.sum, parts))

        def dense() -> object:
            return rank(vectors, q, NOW, dense_config, K)

        def hybrid() -> object:
            return rank(vectors, q, NOW, hybrid_config, K, text=QUERY)

        # The floor on its own, before any BLAS call: OpenBLAS's threads keep spinning for a while after a
        # product and would slow a pass timed right after one (68 ms at 1M instead of 48-53 here).
        ones = np.ones(dim, np.float32)
        floors = {"floor_sum": floor, "floor_gemv": lambda: [block @ ones for _, block in vectors.blocks()]}
        for name, fn in floors.items():  # the sum first: the product leaves BLAS threads spinning
            fn()
            times[name] = [_ms(fn) for _ in range(reps)]
        for fn in (dense, hybrid):
            fn()
        for _ in range(reps):
            for name, fn in (("dense", dense), ("hybrid", hybrid)):
                times[name].append(_ms(fn))
    times.update(asyncio.run(_public(n, dim, reps)))
    med = {name: statistics.median(values) for name, values in times.items()}
    med["floor"] = min(med["floor_sum"], med["floor_gemv"])
    return {"n": n, "dim": dim, "index_build_s": build_s, **{f"{k}_ms": v for k, v in med.items()},
            "hybrid_over_dense": med["hybrid"] / med["dense"], "dense_over_floor": med["dense"] / med["floor"],
            "retrieve_over_floor": med["retrieve"] / med["floor"],
            "retrieve_hybrid_over_dense": med["retrieve_hybrid"] / med["retrieve"]}


async def _public(n: int, dim: int, reps: int) -> dict[str, list[float]]:
    """MemoryStream.retrieve, the public path (embed, score, fetch, touch in the file), over a store file."""
    # One file each: a write by one store (retrieve touches) makes the other reload its stream.
    source = store_file(n, dim)
    folder = Path(tempfile.mkdtemp(prefix="bench-hybrid-"))
    paths = [source, folder / source.name]
    shutil.copyfile(source, paths[1])
    embedder = FakeEmbedder(dim, fixed={QUERY: query(dim).tolist()})
    role = RoleModel(ScriptedChat(default="5"), "none")
    streams = {}
    for path, name, config in ((paths[0], "retrieve", StreamConfig()),
                               (paths[1], "retrieve_hybrid", StreamConfig.for_profile("hybrid"))):
        store = await Store.open(path)
        streams[name] = MemoryStream(store, embedder, rater=role, reflector=role, agent=role, name="Bench",
                                     summary="", config=config, clock=FakeClock(from_timestamp(NOW)),
                                     auto_reflect=False)
        await streams[name].retrieve(QUERY, stream=STREAM)  # loads the stream (and its lexical index)
    times: dict[str, list[float]] = {name: [] for name in streams}
    try:
        for _ in range(reps):
            for name, memory in streams.items():
                start = time.perf_counter()
                await memory.retrieve(QUERY, stream=STREAM)
                times[name].append((time.perf_counter() - start) * 1e3)
    finally:
        for memory in streams.values():
            await memory.close()
        shutil.rmtree(folder, ignore_errors=True)
    return times


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.hybrid")
    parser.add_argument("--sizes", default="100000,1000000")
    parser.add_argument("--dim", type=int, default=384)
    parser.add_argument("--reps", type=int, default=15)
    args = parser.parse_args(argv)
    print(f"{'n':>9} {'floor':>7} {'rank':>7} {'hybrid':>7} {'ratio':>6} {'rank/floor':>10} | {'retrieve':>8} "
          f"{'hybrid':>7} {'ratio':>6} {'retrieve/floor':>14} | {'index build':>11}")
    for n in (int(s) for s in args.sizes.split(",")):
        r = run_case(n, args.dim, args.reps)
        print(f"{n:>9} {r['floor_ms']:>7.1f} {r['dense_ms']:>7.1f} {r['hybrid_ms']:>7.1f} "
              f"{r['hybrid_over_dense']:>6.2f} {r['dense_over_floor']:>10.2f} | {r['retrieve_ms']:>8.1f} "
              f"{r['retrieve_hybrid_ms']:>7.1f} {r['retrieve_hybrid_over_dense']:>6.2f} "
              f"{r['retrieve_over_floor']:>14.2f} | {r['index_build_s']:>10.1f}s")
    print("milliseconds, medians; rank = retrieve.rank (spec, compiled), hybrid = the same with the hybrid profile;"
          " retrieve = MemoryStream.retrieve over the store file")
    return 0


if __name__ == "__main__":
    sys.exit(main())
