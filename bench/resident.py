"""What one stream costs a process (the resident budget, memstream/index/resident.py), and how long a dropped
stream takes to come back: `python -m bench.resident [N] [DIM] [--postgres]` prints one JSON line.

A stream of N memories (bench.data's, 10k x 384 by default) is loaded as the `hybrid` profile (or `--profile
spec`) loads it (matrix, lexical index) and queried until it has built its screen (as a stream queried once the
compiled loops are ready does); bytes per memory are StreamVectors.nbytes (what the budget counts) and this
process's resident memory grown meanwhile (VmRSS). Then the stream is dropped and reloaded `--reloads` times:
the median and largest reload (the store's load, the lexical index, the first query), what a cold stream's next
query waits.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import statistics
import time
from pathlib import Path
from typing import Any

from bench.data import NOW, STREAM, query, store_file
from bench.opening import QUERY_TEXT
from bench.postgres import make_copy
from memstream.clock import from_timestamp
from memstream.config import StreamConfig
from memstream.index import _kernels as kernels
from memstream.index.retriever import Retriever
from memstream.index.vector_index import VectorIndex
from memstream.models.roles import Models, RoleModel
from memstream.store import Store
from memstream.testing import FakeClock, FakeEmbedder, ScriptedChat
from tests import postgres


def _rss_mb() -> float:
    status = Path("/proc/self/status").read_text()
    found = re.search(r"VmRSS:\s+(\d+)", status)
    return int(found.group(1)) / 1024 if found else 0.0


async def run(location: str, reloads: int = 7, profile: str = "hybrid") -> dict[str, Any]:
    """Load, measure, then drop and reload the stream `reloads` times."""
    config = StreamConfig.for_profile(profile)
    store = await Store.open(location)
    try:
        kernels.warm()  # (their own memory is the process's, not the stream's)
        before = _rss_mb()
        index = VectorIndex.for_config(store, config, resident_bytes=0)
        vectors = await index.get(STREAM)
        chat = ScriptedChat()
        models = Models(store, FakeEmbedder(dim=vectors.dim), rater=RoleModel(chat, "r"),
                        reflector=RoleModel(chat, "r"), agent=RoleModel(chat, "a"))
        retriever = Retriever(store, index, models, config, FakeClock(from_timestamp(NOW)))
        for _ in range(2):  # the screen is built by a query once the compiled loops are ready
            await retriever.explain_vector(query(vectors.dim), stream=STREAM, text=QUERY_TEXT)
        screen = vectors.screen() is not None
        n, nbytes, rss = vectors.n, index.resident.total(), _rss_mb() - before
        times = []
        for _ in range(reloads):
            index.drop(STREAM)
            start = time.perf_counter()
            await retriever.explain_vector(query(vectors.dim), stream=STREAM, text=QUERY_TEXT)
            times.append(time.perf_counter() - start)
        return {"n": n, "dim": vectors.dim, "screen": screen, "nbytes_per_memory": nbytes / n,
                "rss_per_memory": rss * 2**20 / n, "reload_median_ms": statistics.median(times) * 1e3,
                "reload_max_ms": max(times) * 1e3, "store": "postgresql" if "://" in location else "sqlite",
                "profile": profile}
    finally:
        await store.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m bench.resident")
    parser.add_argument("n", nargs="?", type=int, default=10_000)
    parser.add_argument("dim", nargs="?", type=int, default=384)
    parser.add_argument("--postgres", action="store_true",
                        help="the stream copied to a PostgreSQL database (bench.postgres's server)")
    parser.add_argument("--reloads", type=int, default=7)
    parser.add_argument("--profile", default="hybrid", choices=("spec", "hybrid"))
    args = parser.parse_args()
    sqlite_file = store_file(args.n, args.dim)
    if not args.postgres:
        print(json.dumps(asyncio.run(run(str(sqlite_file), args.reloads, args.profile))))
    else:
        with postgres.server() as admin:
            postgres.make_template(admin)
            url = postgres.create(admin)
            try:
                asyncio.run(make_copy(sqlite_file, url))
                print(json.dumps(asyncio.run(run(url, args.reloads, args.profile))))
            finally:
                postgres.drop(admin, url)
