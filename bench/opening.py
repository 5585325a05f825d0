"""Case 2: opening a store. Run in a fresh process per measurement, so that nothing else the benchmark holds
counts in its resident memory: `python -m bench.opening PATH [PROCESSES] [--profile hybrid]` prints one JSON
line.

Ready means: Store.open, the stream's matrix loaded (with the `hybrid` profile, its lexical index built from
the texts too, as for a persona made by `memstream init`), and the first query answered
(Retriever.explain_vector). PROCESSES is Store.open's load_processes (default: memstream's choice; 1 = read in
this process only, the baseline). Reader processes write the embeddings into shared memory that this process
then maps: the peak resident memory of the readers (getrusage of children, once the store has ended them)
counts those shared pages again, so it is reported beside this process's, not added to it. `cpu_s` is the
processor time this process and its readers spent (not a database server's), the readers' until they ended.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench.data import NOW, STREAM, query
from memstream.clock import from_timestamp
from memstream.config import StreamConfig
from memstream.index.retriever import Retriever
from memstream.index.vector_index import VectorIndex
from memstream.models.roles import Models, RoleModel
from memstream.store import Store
from memstream.testing import FakeClock, FakeEmbedder, ScriptedChat

QUERY_TEXT = "party tonight at the gallery"  # words of the generated texts (bench.data), for lexical relevance


def _memory_mb() -> dict[str, float]:
    status = Path("/proc/self/status").read_text()
    return {key: int(re.search(rf"{key}:\s+(\d+)", status).group(1)) / 1024 for key in ("VmRSS", "VmHWM")}  # type: ignore[union-attr]


def _cpu_s() -> float:
    own, workers = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + workers.ru_utime + workers.ru_stime


async def _open(path: str, processes: int | None, profile: str = "spec") -> dict[str, Any]:
    config = StreamConfig.for_profile(profile)
    before = _memory_mb()
    cpu = _cpu_s()
    start = time.perf_counter()
    store = await Store.open(path, load_processes=processes)
    opened = time.perf_counter()
    index = VectorIndex.for_config(store, config)
    vectors = await index.get(STREAM)
    loaded = time.perf_counter()
    chat = ScriptedChat()
    models = Models(store, FakeEmbedder(dim=vectors.dim), rater=RoleModel(chat, "r"),
                    reflector=RoleModel(chat, "r"), agent=RoleModel(chat, "a"))
    retriever = Retriever(store, index, models, config, FakeClock(from_timestamp(NOW)))
    found = await retriever.explain_vector(query(vectors.dim), stream=STREAM, text=QUERY_TEXT)
    answered = time.perf_counter()
    after = _memory_mb()
    await store.close()  # (which ends the reader processes: their time and peak are counted once they have ended)
    cpu = _cpu_s() - cpu
    raw = vectors.n * vectors.dim * 4 / 2**20
    return {"n": vectors.n, "dim": vectors.dim, "profile": profile, "cpu_s": cpu, "open_s": opened - start,
            "load_s": loaded - opened, "first_query_s": answered - loaded, "ready_s": answered - start,
            "top": [m.memory.id for m in found], "raw_mb": raw, "rss_before_mb": before["VmRSS"],
            "rss_mb": after["VmRSS"], "peak_rss_mb": after["VmHWM"], "peak_ratio": after["VmHWM"] / raw,
            "rss_ratio": after["VmRSS"] / raw, "processes": len(list(vectors.blocks())),
            "workers_peak_rss_mb": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024}


def drop_from_page_cache(path: Path) -> None:
    """Ask the kernel to forget the file's cached pages (a cold open), where it allows it."""
    for name in (path, Path(f"{path}-wal")):
        if name.exists():
            fd = os.open(name, os.O_RDONLY)
            try:
                os.fsync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def measure(path: Path | str, *, cold: bool, processes: int | None = None, profile: str = "spec") -> dict[str, Any]:
    """Open the store (a file, or a database URL) in a new process; cold drops the file from the page cache
    first."""
    if cold:
        drop_from_page_cache(Path(path))
    command = [sys.executable, "-m", "bench.opening", str(path), *([str(processes)] if processes else []),
               "--profile", profile]
    done = subprocess.run(command, capture_output=True, text=True, check=True,
                          cwd=Path(__file__).resolve().parent.parent)
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    result["cold"] = cold
    return result


def plain_read_s(path: Path) -> float:
    """Seconds to read the file's bytes once (from the page cache, when it is warm): the I/O floor."""
    start = time.perf_counter()
    with open(path, "rb", buffering=0) as f:
        buffer = bytearray(16 << 20)
        while f.readinto(buffer):
            pass
    return time.perf_counter() - start


def run(path: Path, warm_runs: int = 3) -> dict[str, Any]:
    """Warm runs with memstream's choice of processes and with one process (the baseline), then a cold one."""
    measure(path, cold=False)  # warms the page cache
    chosen = [measure(path, cold=False) for _ in range(warm_runs)]
    single = [measure(path, cold=False, processes=1) for _ in range(warm_runs)]
    floor = min(plain_read_s(path) for _ in range(3))
    cold = measure(path, cold=True)
    ready = statistics.median(r["ready_s"] for r in chosen)
    ready_single = statistics.median(r["ready_s"] for r in single)
    return {"runs": chosen + single + [cold], "ready_s": ready, "ready_single_s": ready_single,
            "speedup": ready_single / ready, "file_read_s": floor, "ready_over_read": ready / floor,
            "peak_ratio": max(r["peak_ratio"] for r in chosen + single + [cold])}


if __name__ == "__main__":
    np.seterr(all="raise")
    parser = argparse.ArgumentParser(prog="python -m bench.opening")
    parser.add_argument("path", help="a store file or a postgresql:// URL")
    parser.add_argument("processes", nargs="?", type=int, help="Store.open's load_processes")
    parser.add_argument("--profile", default="spec", choices=("spec", "hybrid"))
    args = parser.parse_args()
    print(json.dumps(asyncio.run(_open(args.path, args.processes, args.profile))))
