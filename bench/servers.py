"""Cold and hot together (issue 29): one process serving many streams under the resident budget.

    python -m bench.servers [--streams 1000] [--memories 10000000] [--minutes 10 | --queries N]
                            [--profile hybrid|spec] [--budget-mb 1024] [--clients 4] [--writes 2] [--quick] [--check]

One persona file (bench.persona: SQLite, the product's layout; stream sizes Zipf-distributed, clipped to
2k-50k) served by one MemoryStream (the public API; the fake OpenAI server in its own process, reached over a
real socket by the product's OpenAI client, embeds each query at the file's dimension) with the resident budget
`--budget-mb`. `--clients` clients each ask a question, wait for the answer, ask the next; each question goes
to a stream drawn by a Zipf law of query rates (rate ~ 1/rank) over the streams in a random order, independent
of their sizes: the busiest server is not the largest. Observations arrive meanwhile (`--writes` a second, to
streams drawn by the same rates: busy servers talk more), rated and embedded by the fake server.

A query is hot when its stream was resident as it was asked, cold when it had to be loaded (first time or
reload). Measured in the same run, after a warm-up (`--warmup` seconds, not in the latencies):
  - peak RSS: the larger of VmHWM and the largest VmRSS sampled every 0.1 s, less the baseline (the process with the
    persona open, a query answered and its stream dropped: no stream loaded) and less the no-budget stream
    below (its own bytes), against the budget: target <= 1.2 x budget; the same for RssAnon alone (the
    anonymous memory: without the file's pages SQLite's reads map, which the page cache can take back);
  - p50 / p99 / max latency of hot and cold queries (cold by stream size), reloads per minute;
  - (a) the busiest stream of 10k memories or more (else the busiest), queried also through a second index
    over the same store with no budget (resident_mb = 0), right after each hot query of it, same question: hot
    p99 with the budget over hot p99 without, target <= 2;
  - (b) the stream closest to 10k memories dropped and queried `--ready-runs` times with the traffic
    paused (drop + query, the query's embedding included), target median < 100 ms.

Prints one JSON line, then a table; `--check` exits 1 when a target is missed. What the run wrote (its
observations, the model usage rows) is deleted from the cached file afterwards, so the next run sees the
same streams (the touches' last access times stay).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import re
import sqlite3
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from bench.fake_server import spawned
from bench.persona import LAYOUTS, build, sizes_in, zipf_sizes
from bench.servers_table import table
from memstream import MemoryStream, ModelConfig, PersonaConfig, StreamConfig
from memstream.errors import MemstreamError
from memstream.index import _kernels as kernels
from memstream.index.retriever import Retriever
from memstream.index.vector_index import VectorIndex
from memstream.records import Source

PEOPLE = ("Klaus", "Maria", "Isabella", "Tom", "Sam", "Ayesha", "Carlos", "Jennifer")
THINGS = ("party", "coffee", "painting", "gallery", "exam", "festival", "chess", "bakery", "garden", "dinner")
DAYS = ("tonight", "tomorrow", "on Friday", "this weekend", "next week")
QUESTIONS = ("what did {who} say about the {what}?", "is anyone going to the {what} {day}?",
             "do you remember the {what} with {who}?", "{who} mentioned the {what} {day}, what was that about?")
TALK = ("{who} is bringing cake to the {what} {day}", "anyone up for {what} {day}?", "lol the {what} was great",
        "I can't make it to the {what} {day}, sorry {who}", "good morning everyone", "{who} won at {what} again")
TARGETS = {"rss_over_budget": 1.2, "hot_p99_ratio": 2.0, "ready_ms": 100.0}
SIZE_BANDS = ((2_000, 5_000), (5_000, 20_000), (20_000, 50_001))


@dataclass(frozen=True)
class Plan:
    """What to run."""

    streams: int = 1000
    memories: int = 10_000_000
    minutes: float = 10.0
    queries: int | None = None  # stop after this many queries (counted after the warm-up) instead
    profile: str = "hybrid"
    budget_mb: int = 1024
    clients: int = 4
    writes: float = 2.0  # observations a second
    warmup: float = 60.0  # seconds
    ready_runs: int = 7
    model_latency: float = 0.0  # seconds the fake server adds to each call
    rate_exponent: float = 1.0
    seed: int = 0
    dim: int = 384
    layout: str = "interleaved"  # bench.persona.LAYOUTS


# 300k memories need about 900 MiB with hybrid: a quarter of that makes the quick run reload
QUICK = {"streams": 100, "memories": 300_000, "minutes": 1.5, "warmup": 15.0, "budget_mb": 256}


class Sampler(threading.Thread):
    """VmRSS and the resident book's total, sampled every 0.1 s, and the reader processes' own memory (their
    RssAnon: the matrices they write are the persona process's, their libraries' pages shared); largest values."""

    def __init__(self, book: Callable[[], int], readers: Callable[[], list[int]]) -> None:
        super().__init__(daemon=True)
        self.book, self.readers, self.rss_peak, self.anon_peak, self.book_peak = book, readers, 0.0, 0.0, 0
        self.readers_peak, self.readers_most = 0.0, 0
        self._stop_event = threading.Event()

    def run(self) -> None:
        while not self._stop_event.wait(0.1):
            self.rss_peak = max(self.rss_peak, status_mb("VmRSS"))
            self.anon_peak = max(self.anon_peak, status_mb("RssAnon"))
            self.book_peak = max(self.book_peak, self.book())
            pids = self.readers()
            self.readers_most = max(self.readers_most, len(pids))
            self.readers_peak = max(self.readers_peak, sum(status_mb("RssAnon", pid) for pid in pids))

    def stop(self) -> None:
        self._stop_event.set()
        self.join()


def status_mb(key: str, pid: int | str = "self") -> float:
    """A figure of /proc/PID/status (VmRSS, VmHWM), in MiB (0 for a process that is gone)."""
    try:
        found = re.search(rf"{key}:\s+(\d+)", Path(f"/proc/{pid}/status").read_text())
    except OSError:
        return 0.0
    return int(found.group(1)) / 1024 if found else 0.0


@dataclass
class Traffic:
    """What the clients and the writer saw."""

    hot: list[float] = field(default_factory=list)
    cold: list[tuple[int, float]] = field(default_factory=list)  # (stream size, seconds)
    chosen_hot: list[float] = field(default_factory=list)  # the chosen stream's hot queries, with the budget
    free_hot: list[float] = field(default_factory=list)  # the same queries without it
    results: list[int] = field(default_factory=list)  # how many memories each query returned
    writes: list[float] = field(default_factory=list)
    write_errors: int = 0
    warm_queries: int = 0
    measuring: bool = False


def summary(seconds: list[float]) -> dict[str, float | int]:
    """Count, p50, p99 and max, in ms."""
    if not seconds:
        return {"n": 0}
    ms = np.asarray(seconds) * 1e3
    return {"n": len(ms), "p50": round(float(np.percentile(ms, 50)), 2),
            "p99": round(float(np.percentile(ms, 99)), 2), "max": round(float(ms.max()), 2)}


def question(rng: np.random.Generator, lines: tuple[str, ...] = QUESTIONS) -> str:
    """A line of chat."""
    pick = lines[int(rng.integers(len(lines)))]
    return pick.format(who=PEOPLE[int(rng.integers(len(PEOPLE)))], what=THINGS[int(rng.integers(len(THINGS)))],
                       day=DAYS[int(rng.integers(len(DAYS)))])


class Server:
    """The persona under traffic: its MemoryStream, the no-budget index beside it, the streams' rates."""

    def __init__(self, plan: Plan, memory: MemoryStream, sizes: dict[str, int]) -> None:
        self.plan, self.memory, self.sizes = plan, memory, sizes
        self.names = list(sizes)
        self.rng = np.random.default_rng([plan.seed, len(sizes)])
        ranks = self.rng.permutation(len(self.names))  # the busiest (rank 0) need not be the largest
        weights = 1.0 / (ranks + 1.0) ** plan.rate_exponent
        self.rates = weights / weights.sum()
        by_rate = [self.names[i] for i in np.argsort(ranks)]
        self.chosen = next((s for s in by_rate if sizes[s] >= 10_000), by_rate[0])
        self.ready_stream = min(self.names, key=lambda s: (abs(sizes[s] - 10_000), s == self.chosen))
        self.free_index = VectorIndex.for_config(memory.store, memory.config, resident_bytes=0)
        self.free = Retriever(memory.store, self.free_index, memory.models, memory.config, memory.clock)
        self.traffic = Traffic()

    def pick(self) -> str:
        """A stream, by the query rates."""
        return self.names[int(self.rng.choice(len(self.names), p=self.rates))]

    async def client(self, stop: Callable[[], bool]) -> None:
        """Ask, wait, ask again until `stop`; each answer timed as hot or cold (the chosen stream's hot ones
        asked again without the budget)."""
        t = self.traffic
        while not stop():
            stream, text = self.pick(), question(self.rng)
            hot = self.memory.index.loaded(stream) is not None
            start = time.perf_counter()
            found = await self.memory.retrieve(text, stream=stream)
            took = time.perf_counter() - start
            if not t.measuring:
                t.warm_queries += 1
                continue
            t.results.append(len(found))
            if not hot:
                t.cold.append((self.sizes[stream], took))
                continue
            t.hot.append(took)
            if stream == self.chosen:
                start = time.perf_counter()
                free = await self.free.retrieve(text, stream=stream)
                t.free_hot.append(time.perf_counter() - start)
                t.chosen_hot.append(took)
                t.results.append(len(free))

    async def writer(self, stop: Callable[[], bool]) -> None:
        """Observations at `writes` a second (each waited for: rated and embedded by the fake server)."""
        period = 1.0 / self.plan.writes if self.plan.writes > 0 else None
        while period is not None and not stop():
            began = time.perf_counter()
            who = int(self.rng.integers(len(PEOPLE)))
            source = Source(author=PEOPLE[who], author_id=str(who + 1), channel="c100", channel_id="100")
            try:
                await self.memory.observe(question(self.rng, TALK), stream=self.pick(), source=source)
                if self.traffic.measuring:
                    self.traffic.writes.append(time.perf_counter() - began)
            except MemstreamError:  # counted: a failed write is a figure of the run, not its end
                self.traffic.write_errors += 1
            await asyncio.sleep(max(0.0, period - (time.perf_counter() - began)))

    async def ready_times(self) -> list[float]:
        """The 10k stream dropped and asked again, with nothing else running."""
        times = []
        for _ in range(self.plan.ready_runs):
            self.memory.index.drop(self.ready_stream)
            start = time.perf_counter()
            await self.memory.retrieve(question(self.rng), stream=self.ready_stream)
            times.append(time.perf_counter() - start)
        return times


async def serve(plan: Plan, path: Path) -> dict[str, Any]:
    """The run; its figures (what it wrote deleted from the file afterwards, even when it fails)."""
    sizes = sizes_in(path)
    mark = _mark(path)
    try:
        server, result = await _serve(plan, path, sizes)
    finally:
        _restore(path, sizes, mark)
    return _figures(plan, server, sizes, result)


async def _serve(plan: Plan, path: Path, sizes: dict[str, int]) -> tuple[Server, dict[str, Any]]:
    async with spawned(plan.model_latency, plan.dim) as base_url:
        persona = PersonaConfig(name="Isabella", summary="Isabella runs Hobbs Cafe.", database=path,
                                models=ModelConfig(base_url=base_url, max_retries=0, timeout=60),
                                memory=StreamConfig.for_profile(plan.profile, resident_mb=plan.budget_mb))
        memory = await MemoryStream.open(persona, environ={}, auto_reflect=False)
        server = None
        try:
            kernels.warm()
            smallest = min(sizes, key=lambda s: sizes[s])
            await memory.retrieve("good morning", stream=smallest)
            memory.index.drop(smallest)
            gc.collect()
            baseline, baseline_anon = status_mb("VmRSS"), status_mb("RssAnon")
            server = Server(plan, memory, sizes)
            for _ in range(2):  # loaded, and its screen built (by a query once the compiled loops are ready)
                await server.free.retrieve("good morning", stream=server.chosen)
            free_mb = server.free_index.resident.total() / 2**20
            result = await _traffic(plan, server)
            result.update(baseline_rss_mb=round(baseline, 1), baseline_anon_mb=round(baseline_anon, 1),
                          no_budget_stream_mb=round(free_mb, 1))
            return server, result
        finally:
            if server is not None:
                server.free_index.close()
            await memory.close()


class Phase:
    """Warm-up, then the measured part: when it began, the reloads so far then; when it ends."""

    def __init__(self, plan: Plan, server: Server) -> None:
        self.plan, self.server = plan, server
        self.started = time.monotonic() + plan.warmup
        self.reloads = 0

    def stop(self) -> bool:
        """Whether the traffic stops now (starting the measured part when the warm-up is over)."""
        now, traffic = time.monotonic(), self.server.traffic
        if not traffic.measuring and now >= self.started:
            traffic.measuring = True
            self.started, self.reloads = now, self.server.memory.index.resident.reloads
        if self.plan.queries is not None:
            return traffic.measuring and len(traffic.hot) + len(traffic.cold) >= self.plan.queries
        return now >= self.started + self.plan.minutes * 60


async def _traffic(plan: Plan, server: Server) -> dict[str, Any]:
    """The clients and the writer for the warm-up then the measured time; then the ready times, quietly."""
    sampler = Sampler(server.memory.index.resident.total,
                      lambda: [] if getattr(server.memory.store, "readers", None) is None
                      else server.memory.store.readers.pids())
    sampler.start()
    phase = Phase(plan, server)
    await asyncio.gather(server.writer(phase.stop), *(server.client(phase.stop) for _ in range(plan.clients)))
    minutes = (time.monotonic() - phase.started) / 60
    stats = server.memory.index.resident.stats()
    ready = await server.ready_times()
    sampler.stop()
    return {"minutes": minutes, "reloads": stats.reloads - phase.reloads, "drops": stats.drops,
            "rss_peak_sampled_mb": sampler.rss_peak, "anon_peak_mb": sampler.anon_peak, "vm_hwm_mb": status_mb("VmHWM"),
            "book_peak_mb": sampler.book_peak / 2**20, "ready": ready, "readers_peak_mb": sampler.readers_peak,
            "readers": sampler.readers_most}


def _figures(plan: Plan, server: Server, sizes: dict[str, int], run: dict[str, Any]) -> dict[str, Any]:
    t, budget = server.traffic, plan.budget_mb
    peak = max(run["vm_hwm_mb"], run["rss_peak_sampled_mb"])  # (the kernel updates VmHWM lazily)
    # (the reader processes' own memory counts: they serve this process)
    over = peak - run["baseline_rss_mb"] - run["no_budget_stream_mb"] + run["readers_peak_mb"]
    anon = run["anon_peak_mb"] - run["baseline_anon_mb"] - run["no_budget_stream_mb"]  # without file pages
    hot, free = summary(t.chosen_hot), summary(t.free_hot)
    ready_ms = float(np.median(run["ready"])) * 1e3
    figures: dict[str, Any] = {
        "plan": {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(plan).items()},
        "streams": len(sizes), "memories": sum(sizes.values()), "minutes": round(run["minutes"], 2),
        "queries": len(t.hot) + len(t.cold), "hot_queries": len(t.hot), "cold_queries": len(t.cold),
        "warmup_queries": t.warm_queries, "k_results": sorted(set(t.results)),
        "hot": summary(t.hot), "cold": summary([s for _, s in t.cold]),
        "cold_by_size": {f"{lo}-{hi - 1}": summary([s for n, s in t.cold if lo <= n < hi]) for lo, hi in SIZE_BANDS},
        "reloads": run["reloads"], "drops": run["drops"],
        "reloads_per_minute": round(run["reloads"] / max(run["minutes"], 1e-9), 1),
        "cold_per_minute": round(len(t.cold) / max(run["minutes"], 1e-9), 1),
        "writes": summary(t.writes), "write_errors": t.write_errors,
        "budget_mb": budget, "baseline_rss_mb": run["baseline_rss_mb"], "vm_hwm_mb": round(run["vm_hwm_mb"], 1),
        "rss_peak_sampled_mb": round(run["rss_peak_sampled_mb"], 1), "rss_peak_mb": round(peak, 1),
        "rss_over_baseline_mb": round(over, 1), "reader_processes": run["readers"],
        "readers_anon_peak_mb": round(run["readers_peak_mb"], 1),
        "anon_peak_mb": round(run["anon_peak_mb"], 1), "baseline_anon_mb": run["baseline_anon_mb"],
        "anon_over_budget": round(anon / budget, 3) if budget else None, "book_peak_mb": round(run["book_peak_mb"], 1),
        "no_budget_stream_mb": run["no_budget_stream_mb"],
        "rss_over_budget": round(over / budget, 3) if budget else None,
        "chosen_stream": {"stream": server.chosen, "memories": sizes[server.chosen],
                          "share_of_queries": round(float(server.rates[server.names.index(server.chosen)]), 4)},
        "chosen_hot_budget": hot, "chosen_hot_no_budget": free,
        "hot_p99_ratio": round(hot["p99"] / free["p99"], 3) if hot["n"] and free["n"] else None,
        "ready_stream": {"stream": server.ready_stream, "memories": sizes[server.ready_stream]},
        "ready_ms": round(ready_ms, 2), "ready_runs_ms": [round(s * 1e3, 2) for s in run["ready"]],
        "sizes": {"largest": max(sizes.values()), "median": int(np.median(list(sizes.values()))),
                  "smallest": min(sizes.values())},
    }
    figures["missed"] = missed(figures)
    return figures


def missed(figures: dict[str, Any]) -> list[str]:
    """The targets a run missed, one line each."""
    out = []
    for key, limit in TARGETS.items():
        value = figures.get(key)
        if value is None:
            out.append(f"{key}: not measured")
        elif value > limit if key != "ready_ms" else value >= limit:
            out.append(f"{key} {value} (target {'<' if key == 'ready_ms' else '<='} {limit})")
    return out


def _mark(path: Path) -> tuple[int, list[tuple[str, int, int]]]:
    """Where the file's ids stood before a run: the highest given or reserved, and the streams' open blocks (what
    the run writes takes ids above the one or in what was left of the others: memstream.store.idblocks)."""
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        top = int(conn.execute("SELECT COALESCE(MAX(seq), 0) FROM sqlite_sequence WHERE name = 'memories'")
                  .fetchone()[0])
        has_blocks = conn.execute("SELECT 1 FROM sqlite_master WHERE name = 'id_blocks'").fetchone() is not None
        blocks = conn.execute("SELECT stream, next, stop FROM id_blocks").fetchall() if has_blocks else []
    finally:
        conn.close()
    return top, [(str(s), int(a), int(b)) for s, a, b in blocks]


def _restore(path: Path, sizes: dict[str, int], mark: tuple[int, list[tuple[str, int, int]]]) -> None:
    """Delete what the run wrote, so the cached file holds the same streams for the next run."""
    top, blocks = mark
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("BEGIN")
        conn.execute("DELETE FROM memories WHERE id > ?", (top,))
        conn.executemany("DELETE FROM memories WHERE id >= ? AND id < ?", [(a, b) for _, a, b in blocks])
        if conn.execute("SELECT 1 FROM sqlite_master WHERE name = 'id_blocks'").fetchone() is not None:
            conn.execute("DELETE FROM id_blocks")
            conn.executemany("INSERT INTO id_blocks (stream, next, stop) VALUES (?, ?, ?)", blocks)
        conn.executemany("UPDATE stream_numbers SET last = ? WHERE stream = ?", [(n, s) for s, n in sizes.items()])
        conn.execute("UPDATE sqlite_sequence SET seq = ? WHERE name = 'memories'", (top,))
        for table in ("stream_state", "model_usage", "model_usage_daily", "faults"):
            conn.execute(f"DELETE FROM {table}")
        conn.execute("COMMIT")
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    finally:
        conn.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.servers", description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--streams", type=int, default=None, help="streams in the persona (default 1000)")
    parser.add_argument("--memories", type=int, default=None, help="memories in all (default 10,000,000)")
    parser.add_argument("--minutes", type=float, default=None, help="measured minutes (default 10)")
    parser.add_argument("--queries", type=int, default=None, help="stop after this many measured queries instead")
    parser.add_argument("--warmup", type=float, default=None, help="seconds before measuring (default 60)")
    parser.add_argument("--profile", choices=("hybrid", "spec"), default="hybrid")
    parser.add_argument("--budget-mb", type=int, default=None,
                        help="resident_mb (default 1024, the product's default; 256 with --quick)")
    parser.add_argument("--layout", choices=LAYOUTS, default=None,
                        help="interleaved (default: rows in time order across streams, as a live bot writes them) "
                             "or grouped (each stream's rows together, as an import writes them)")
    parser.add_argument("--clients", type=int, default=4, help="clients asking at once (default 4)")
    parser.add_argument("--writes", type=float, default=2.0, help="observations a second (default 2)")
    parser.add_argument("--model-latency", type=float, default=0.0, help="seconds the fake server adds a call")
    parser.add_argument("--ready-runs", type=int, default=7)
    parser.add_argument("--quick", action="store_true", help="100 streams, 300k memories, 1.5 minutes, 256 MiB")
    parser.add_argument("--check", action="store_true", help="exit 1 when a target is missed")
    ns = parser.parse_args(sys.argv[1:] if argv is None else argv)
    given = {k: v for k, v in vars(ns).items() if k in Plan.__dataclass_fields__ and v is not None}
    plan = Plan(**{**(QUICK if ns.quick else {}), **given})
    problem = _problem(plan)
    if problem:
        parser.error(problem)
    began = time.perf_counter()
    path = build(plan.streams, plan.memories, plan.dim, plan.seed, layout=plan.layout, verbose=True)
    print(f"persona file {path} ({path.stat().st_size / 2**30:.1f} GiB) ready in {time.perf_counter() - began:.0f} s",
          file=sys.stderr, flush=True)
    figures = asyncio.run(serve(plan, path))
    print(json.dumps(figures))
    print(table(figures))
    return 1 if ns.check and figures["missed"] else 0


def _problem(plan: Plan) -> str | None:
    """What is wrong with a plan, in one line (None: nothing)."""
    try:
        zipf_sizes(plan.streams, plan.memories)
    except ValueError as exc:
        return str(exc)
    if plan.minutes <= 0 or plan.warmup < 0 or plan.clients < 1 or plan.writes < 0 or plan.budget_mb < 0:
        return "--minutes and --clients are above 0; --warmup, --writes and --budget-mb are 0 or more"
    if (plan.queries is not None and plan.queries < 1) or plan.ready_runs < 1:
        return "--queries and --ready-runs are 1 or more"
    return None


if __name__ == "__main__":
    raise SystemExit(main())
