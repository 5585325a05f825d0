"""Case 2: opening a store. Run in a fresh process per measurement, so that nothing else the benchmark holds
counts in its resident memory: `python -m bench.opening PATH` prints one JSON line.

Ready means: Store.open, the stream's matrix loaded, and the first query answered (Retriever.explain_vector).
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench.data import NOW, STREAM, query
from memstream.clock import from_timestamp
from memstream.config import StreamConfig
from memstream.models import Models, RoleModel
from memstream.retrieve import Retriever
from memstream.store import Store
from memstream.testing import FakeClock, FakeEmbedder, ScriptedChat
from memstream.vectors import VectorIndex


def _memory_mb() -> dict[str, float]:
    status = Path("/proc/self/status").read_text()
    return {key: int(re.search(rf"{key}:\s+(\d+)", status).group(1)) / 1024 for key in ("VmRSS", "VmHWM")}  # type: ignore[union-attr]


async def _open(path: str) -> dict[str, Any]:
    before = _memory_mb()
    start = time.perf_counter()
    store = await Store.open(path)
    opened = time.perf_counter()
    index = VectorIndex(store)
    vectors = await index.get(STREAM)
    loaded = time.perf_counter()
    chat = ScriptedChat()
    models = Models(store, FakeEmbedder(dim=vectors.dim), rater=RoleModel(chat, "r"),
                    reflector=RoleModel(chat, "r"), agent=RoleModel(chat, "a"))
    retriever = Retriever(store, index, models, StreamConfig(), FakeClock(from_timestamp(NOW)))
    found = await retriever.explain_vector(query(vectors.dim), stream=STREAM)
    answered = time.perf_counter()
    after = _memory_mb()
    await store.close()
    raw = vectors.n * vectors.dim * 4 / 2**20
    return {"n": vectors.n, "dim": vectors.dim, "open_s": opened - start,
            "load_s": loaded - opened, "first_query_s": answered - loaded, "ready_s": answered - start,
            "top": [m.memory.id for m in found], "raw_mb": raw, "rss_before_mb": before["VmRSS"],
            "rss_mb": after["VmRSS"], "peak_rss_mb": after["VmHWM"], "peak_ratio": after["VmHWM"] / raw,
            "rss_ratio": after["VmRSS"] / raw}


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


def measure(path: Path, *, cold: bool) -> dict[str, Any]:
    """Open the store in a new process; cold drops the file from the page cache first."""
    if cold:
        drop_from_page_cache(path)
    done = subprocess.run([sys.executable, "-m", "bench.opening", str(path)], capture_output=True, text=True,
                          check=True, cwd=Path(__file__).resolve().parent.parent)
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    result["cold"] = cold
    return result


if __name__ == "__main__":
    np.seterr(all="raise")
    print(json.dumps(asyncio.run(_open(sys.argv[1]))))
