"""Case: what a user would pick instead of memstream, timed in the same run on the same embeddings.

    python -m bench.peers [--sizes 100000,1000000] [--reps 15]     (or python -m bench --cases peers)

Per size, in one process, over the bench's random unit vectors (bench.data, 384 dims), top 5 for one query:

- `MemoryStream.retrieve`: the public path (embed the query, score every memory with the `spec` profile, the
  default of StreamConfig and of the other cases, fetch and touch the winners in the file) over a copy of the
  bench's store file;
- the floor: the fastest plain pass over the matrix that store loaded (np.sum split over the cores, a compiled
  sum split over the cores: bench.timing.Floors), for scale;
- `numpy`: the spec's formula written plainly in numpy (ByHand below): all three terms, min-max normalised;
- `usearch`: usearch's exact search (inner product: the vectors are unit length), relevance only;
- `faiss`: faiss's IndexFlatIP, relevance only;
- `vec0`: sqlite-vec's vec0 virtual table over the same vectors (`embedding MATCH ? AND k = 5`, cosine),
  relevance only, in a file built once beside the store file, loaded as the store loads sqlite-vec.

usearch and faiss are optional (`pip install -e '.[peers]'`): a peer that is not installed is skipped with a
line saying so. Each kind is timed in rounds (bench.timing.rounds_async), after a pause that lets the threads
of the kind before stop spinning. The ratios are each peer's median over MemoryStream.retrieve's; the
relevance-only peers answer an easier question (no recency, no importance) and write nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import os
import shutil
import statistics
import sys
import tempfile
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import sqlite_vec

from bench.data import DATA, NOW, STREAM, Columns, columns, query, store_file
from bench.timing import Floors, rounds_async
from memstream import MemoryStream, RoleModel, Store
from memstream.clock import from_timestamp
from memstream.config import StreamConfig
from memstream.index import _kernels as kernels
from memstream.index import _pages as pages
from memstream.store import sqlite_module, to_blob
from memstream.testing import FakeClock, FakeEmbedder, ScriptedChat

K = 5
QUERY = "who was at the party at the gallery?"
SETTLE_S = 0.2  # OpenBLAS's threads spin for about 0.1 s after a product (docs/performance.md)
INSTALL = "not installed: pip install -e '.[peers]'"
LABELS = {"floor": "floor: a plain pass over the same float32 bytes",
          "retrieve": "MemoryStream.retrieve (spec: all three terms, exact)",
          "numpy": "the spec formula written plainly in numpy",
          "usearch": "usearch exact search, relevance only",
          "faiss": "faiss IndexFlatIP, relevance only",
          "vec0": "sqlite-vec vec0 KNN, relevance only"}


def _minmax(values: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
    low, high = values.min(), values.max()
    if high > low:
        scaled: npt.NDArray[np.float32] = (values - low) / (high - low)
        return scaled
    return np.full_like(values, 0.5)  # the spec: a term equal for all memories is 0.5 for all


class ByHand:
    """The spec's formula as a numpy user would write it, as fast as we could: float32 throughout, the
    importance term (query-free) normalised once, recency as one exp, BLAS for the cosines (the rows are unit
    length), argpartition for the top k."""

    def __init__(self, data: Columns, config: StreamConfig) -> None:
        self.ids, self.embeddings, self.last = data.ids, data.embeddings, data.last_accessed
        self.log_decay = np.float32(math.log(config.decay))
        self.w_rec, self.w_rel = np.float32(config.weight_recency), np.float32(config.weight_relevance)
        self.importance = np.float32(config.weight_importance) * _minmax(data.importance)

    def __call__(self, q: npt.NDArray[np.float32], now: float) -> list[int]:
        hours = ((now - self.last) / 3600.0).astype(np.float32)
        recency = np.exp(hours * self.log_decay)
        score = self.w_rec * _minmax(recency) + self.importance + self.w_rel * _minmax(self.embeddings @ q)
        top = np.argpartition(score, -K)[-K:]
        return [int(i) for i in self.ids[top[np.argsort(-score[top])]]]


def vec0_file(n: int, dim: int) -> Path:
    """A cached SQLite file with a vec0 table of the store file's embeddings (rowid = the memory's id)."""
    source = store_file(n, dim)
    path = DATA / f"vec0-{n}x{dim}-seed0.db"
    if not path.exists():
        partial = path.with_suffix(".partial")
        partial.unlink(missing_ok=True)
        conn = _connect(str(partial))
        conn.execute(f"CREATE VIRTUAL TABLE peers USING vec0(embedding float[{dim}] distance_metric=cosine)")
        conn.execute("ATTACH DATABASE ? AS source", (f"file:{source}?mode=ro",))
        conn.execute("INSERT INTO peers(rowid, embedding) SELECT id, embedding FROM source.memories "
                     "WHERE stream = ? AND status = 'ready' ORDER BY id", (STREAM,))
        conn.commit()
        conn.close()
        os.replace(partial, path)
    return path


def _connect(path: str) -> Any:
    """A connection with sqlite-vec loaded, through the binding the store uses (pysqlite3 where the stdlib
    cannot load extensions)."""
    conn = sqlite_module().connect(path, uri=True)
    conn.enable_load_extension(True)
    conn.load_extension(sqlite_vec.loadable_path())
    conn.enable_load_extension(False)
    return conn


def _peers(data: Columns, q: npt.NDArray[np.float32], n: int, dim: int, cores: int,
           cleanup: contextlib.ExitStack) -> tuple[dict[str, Callable[[], list[int]]], dict[str, str]]:
    """The relevance-only peers that are installed (each a call giving the top k ids), and why any is not."""
    runs: dict[str, Callable[[], list[int]]] = {}
    skipped: dict[str, str] = {}
    try:
        from usearch.index import MetricKind, search
    except ImportError:
        skipped["usearch"] = INSTALL
    else:
        def by_usearch() -> list[int]:
            found = search(data.embeddings, q, K, MetricKind.IP, exact=True, threads=cores)
            return [int(i) for i in data.ids[found.keys]]
        runs["usearch"] = by_usearch
    try:
        import faiss
    except ImportError:
        skipped["faiss"] = INSTALL
    else:
        flat = faiss.IndexFlatIP(dim)
        flat.add(data.embeddings)
        runs["faiss"] = lambda: [int(i) for i in data.ids[flat.search(q[None, :], K)[1][0]]]
    conn = _connect(f"file:{vec0_file(n, dim)}?mode=ro")
    cleanup.callback(conn.close)
    blob = to_blob(q)
    runs["vec0"] = lambda: [row[0] for row in conn.execute(
        "SELECT rowid FROM peers WHERE embedding MATCH ? AND k = ? ORDER BY distance", (blob, K))]
    return runs, skipped


async def _measure(n: int, dim: int, reps: int) -> dict[str, Any]:
    data = columns(n, dim)
    q, config = query(dim), StreamConfig()
    relevance_top = [int(i) for i in data.ids[np.argsort(-(data.embeddings @ q))[:K]]]
    by_hand = ByHand(data, config)
    cores = len(os.sched_getaffinity(0))
    cleanup = contextlib.ExitStack()
    peers, skipped = _peers(data, q, n, dim, cores, cleanup)
    folder = Path(tempfile.mkdtemp(prefix="bench-peers-"))
    cleanup.callback(shutil.rmtree, folder, ignore_errors=True)
    path = folder / store_file(n, dim).name  # a copy: retrieve touches what it returns
    shutil.copyfile(store_file(n, dim), path)
    role = RoleModel(ScriptedChat(default="5"), "none")
    memory = MemoryStream(await Store.open(path), FakeEmbedder(dim, fixed={QUERY: q.tolist()}), rater=role,
                          reflector=role, agent=role, name="Bench", summary="", config=config,
                          clock=FakeClock(from_timestamp(NOW)), auto_reflect=False)
    try:
        kernels.warm()
        # Before any touch: the answer the others are checked against (explain touches nothing).
        spec_top = [m.memory.id for m in await memory.explain(QUERY, stream=STREAM)]
        await memory.retrieve(QUERY, stream=STREAM)
        await asyncio.to_thread(pages.wait)  # the loaded matrix in huge pages, as a while after loading
        loaded = await memory.retriever.index.get(STREAM)
        with ThreadPoolExecutor(cores) as pool:
            floors = Floors([block for _, block in loaded.blocks()], pool, cores)
            runs: dict[str, Any] = {**floors.passes,
                                    "retrieve": lambda: memory.retrieve(QUERY, stream=STREAM),
                                    "numpy": lambda: by_hand(q, NOW), **peers}
            times = await rounds_async(runs, reps, settle=SETTLE_S)
        agree = {"numpy": by_hand(q, NOW) == spec_top, **{name: run() == relevance_top for name, run in peers.items()}}
    finally:
        await memory.close()
        cleanup.close()
    med = {name: statistics.median(values) for name, values in times.items()}
    med["floor"] = min(med.pop("floor_sum"), med.pop("floor_loops"))
    return {"n": n, "dim": dim, "reps": reps, "cores": cores, "ms": med,
            "over_retrieve": {name: value / med["retrieve"] for name, value in med.items()},
            "agree": agree, "skipped": skipped, "top": spec_top}


def run_case(n: int, dim: int, reps: int) -> dict[str, Any]:
    """One size: every approach's median ms, its ratio to MemoryStream.retrieve, whether its top 5 agree
    (numpy's with memstream's, the relevance-only peers' with a plain sort by cosine), what was skipped."""
    vec0_file(n, dim)  # built (and cached) before anything is timed
    return asyncio.run(_measure(n, dim, reps))


def lines(cases: list[dict[str, Any]]) -> list[str]:
    """The peers table: a row per approach, a column per size (ms, and the ratio to MemoryStream.retrieve)."""
    sizes = [f"{c['n'] // 1000:,}k x {c['dim']}" if c["n"] < 1_000_000 else f"{c['n'] // 1_000_000}M x {c['dim']}"
             for c in cases]
    out = [f"{'top 5, median ms (x MemoryStream.retrieve)':<56}" + "".join(f"{s:>20}" for s in sizes)]
    for name, label in LABELS.items():
        cells = []
        for case in cases:
            if name in case["ms"]:
                mark = "" if case["agree"].get(name, True) else " DIFFERS"
                cells.append(f"{case['ms'][name]:.1f} ({case['over_retrieve'][name]:.2f}x){mark}")
            else:
                cells.append("skipped")
        out.append(f"{label:<56}" + "".join(f"{cell:>20}" for cell in cells))
    for name, why in sorted({k: v for case in cases for k, v in case["skipped"].items()}.items()):
        out.append(f"   {name}: {why}")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.peers", description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="100000,1000000")
    parser.add_argument("--dim", type=int, default=384)
    parser.add_argument("--reps", type=int, default=15)
    args = parser.parse_args(argv)
    try:
        sizes = [int(s) for s in args.sizes.split(",")]
    except ValueError:
        parser.error(f"--sizes: whole numbers separated by commas, got {args.sizes!r}")
    cases = [run_case(n, args.dim, args.reps) for n in sizes]
    print("\n".join(lines(cases)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
