"""A persona serving many streams in one SQLite file (bench.servers' data): `streams` streams whose sizes follow a
Zipf law clipped to 2k-50k and add up to `memories`, cached under bench/data/ keyed by the parameters. The rows
are written as a live bot writes them (interleaved: in creation order across all streams, each row with the id the
store gives it, the next of its stream's block: memstream.store.idblocks), with `--layout sequential` as stores
before migration 0010 wrote them (ids in creation order across all streams: each stream's rows spread over the
whole file), or with `--layout grouped` stream by stream (as an import writes them: each stream's rows together).

`python -m bench.persona [--streams 1000] [--memories 10000000] [--layout L]` builds the file and prints its path
and how long it took. The rows are bulk-inserted straight into the product's schema (Store.open creates it):
numpy makes the vectors and times, one executemany a 100k-row transaction, journal off while building (WAL, the
product's default, once done); each stream's `number`s are given, so the numbering trigger never runs.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sqlite3
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import sqlite_vec

from bench.data import DATA, NOW, START, source, text
from memstream.store import Store
from memstream.store.idblocks import allocate
from memstream.store.sqlite.binding import sqlite_module

SMALLEST, LARGEST = 2_000, 50_000
CHUNK = 100_000
# interleaved: in creation order across the persona, as a live bot writes them (ids in blocks per stream);
# sequential: the same with ids in creation order (files written before migration 0010); grouped: stream by
# stream (as an import writes them: each stream's rows contiguous in the file)
LAYOUTS = ("interleaved", "sequential", "grouped")
_INSERT = ("INSERT INTO memories (id, stream, kind, text, created_at, last_accessed_at, importance, "
           "importance_source, depth, author, author_id, channel, channel_id, status, embedding, number) "
           "VALUES (?, ?, 'observation', ?, ?, ?, ?, 'rater', 0, ?, ?, ?, ?, 'ready', ?, ?)")


def stream_name(k: int) -> str:
    """The k-th stream (0 the largest)."""
    return f"guild:{1000 + k}"


def zipf_sizes(streams: int, memories: int, exponent: float = 1.0) -> npt.NDArray[np.int64]:
    """Stream sizes, largest first: c / rank**exponent clipped to [SMALLEST, LARGEST], c chosen so that they add
    up to `memories` exactly (the rounding's remainder spread one by one over the unclipped streams)."""
    if not SMALLEST * streams <= memories <= LARGEST * streams:
        raise ValueError(f"{memories} memories cannot be {streams} streams of {SMALLEST}-{LARGEST}: "
                         f"between {SMALLEST * streams} and {LARGEST * streams}")
    ranks = np.arange(1, streams + 1, dtype=np.float64) ** -exponent
    low, high = 0.0, LARGEST * float(streams) ** exponent * 2
    for _ in range(200):
        c = (low + high) / 2
        if np.clip(c * ranks, SMALLEST, LARGEST).sum() < memories:
            low = c
        else:
            high = c
    sizes = np.clip(np.floor(high * ranks), SMALLEST, LARGEST).astype(np.int64)
    free = np.flatnonzero((sizes > SMALLEST) & (sizes < LARGEST)) if memories != sizes.sum() else np.array([], int)
    step = 1 if memories > sizes.sum() else -1
    i = 0
    while sizes.sum() != memories:
        at = free[i % len(free)] if len(free) else i % streams
        if SMALLEST <= sizes[at] + step <= LARGEST:
            sizes[at] += step
        i += 1
    return sizes


def path_for(streams: int, memories: int, dim: int = 384, seed: int = 0, folder: Path = DATA,
             layout: str = "interleaved") -> Path:
    """Where the persona file of these parameters is cached."""
    return folder / f"servers-{streams}x{memories}x{dim}-seed{seed}{'' if layout == 'interleaved' else '-' + layout}.db"


class _Plan:
    """Every memory's stream, creation time, number in its stream and id, in the order written; and the streams'
    open blocks after it (interleaved) and the highest id given or reserved."""

    def __init__(self, sizes: npt.NDArray[np.int64], seed: int, layout: str) -> None:
        self.labels, self.created, self.numbers = _order(sizes, seed, layout)
        if layout == "interleaved":
            made = allocate(self.labels.tolist(), {}, 0)
            self.ids = np.asarray(made.ids, np.int64)
            self.blocks = {int(k): block for k, block in made.blocks.items()}
            self.top = made.top
        else:
            self.ids = np.arange(1, len(self.labels) + 1, dtype=np.int64)
            self.blocks, self.top = {}, len(self.labels)


def _order(sizes: npt.NDArray[np.int64], seed: int, layout: str) -> tuple[npt.NDArray[np.int32],
                                                                          npt.NDArray[np.float64],
                                                                          npt.NDArray[np.int64]]:
    """Every memory's stream, creation time and number in its stream, in the order written (creation order across
    the persona, or stream by stream when grouped)."""
    rng = np.random.default_rng([seed, len(sizes), int(sizes.sum())])
    labels = np.repeat(np.arange(len(sizes), dtype=np.int32), sizes)
    created = rng.uniform(START, NOW - 3600.0, len(labels))
    order = np.argsort(created, kind="stable") if layout != "grouped" else np.lexsort((created, labels))
    labels, created = labels[order], created[order]
    by_stream = np.argsort(labels, kind="stable")
    starts = np.concatenate(([0], np.cumsum(sizes)[:-1]))
    numbers = np.empty(len(labels), np.int64)
    numbers[by_stream] = np.arange(len(labels)) - np.repeat(starts, sizes) + 1
    return labels, created, numbers


def _rows(sizes: npt.NDArray[np.int64], dim: int, seed: int, plan: _Plan) -> Iterator[list[tuple[Any, ...]]]:
    labels, created, numbers, ids = plan.labels, plan.created, plan.numbers, plan.ids
    names = [stream_name(k) for k in range(len(sizes))]
    sources = [source(i) for i in range(200)]  # source(i) repeats every 200 (8 people, 8 channels of 25)
    for start in range(0, len(labels), CHUNK):
        end = min(start + CHUNK, len(labels))
        rng = np.random.default_rng([seed, dim, start])
        vectors = rng.standard_normal((end - start, dim), dtype=np.float32)
        vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
        made = created[start:end]
        last = made.copy()
        touched = rng.random(end - start) < 0.1
        last[touched] = rng.uniform(made[touched], NOW)
        importance = rng.integers(1, 11, end - start)
        rows = []
        for j in range(end - start):
            i = start + j
            s = sources[i % 200]
            rows.append((int(ids[i]), names[labels[i]], text(i), float(made[j]), float(last[j]), int(importance[j]),
                         s.author, s.author_id, s.channel, s.channel_id, vectors[j].tobytes(), int(numbers[i])))
        yield rows


def build(streams: int, memories: int, dim: int = 384, seed: int = 0, *, folder: Path = DATA,
          layout: str = "interleaved", verbose: bool = False) -> Path:
    """The cached persona file (built on first use; a half-built one is never left under the final name)."""
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {', '.join(LAYOUTS)}, got {layout!r}")
    path = path_for(streams, memories, dim, seed, folder, layout)
    if path.exists():
        return path
    sizes = zipf_sizes(streams, memories)
    folder.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".partial")
    for leftover in (partial, Path(f"{partial}-wal"), Path(f"{partial}-shm")):
        leftover.unlink(missing_ok=True)
    began = time.perf_counter()

    async def schema() -> None:
        async with await Store.open(partial):
            pass

    with ThreadPoolExecutor(1) as pool:  # callable from inside an event loop too
        pool.submit(asyncio.run, schema()).result()
    module: Any = sqlite_module()
    conn: sqlite3.Connection = module.connect(str(partial), isolation_level=None)
    conn.enable_load_extension(True)
    conn.load_extension(sqlite_vec.loadable_path())
    for pragma in ("journal_mode=OFF", "synchronous=OFF", "cache_size=-1000000", "temp_store=MEMORY"):
        conn.execute(f"PRAGMA {pragma}")
    done = 0
    plan = _Plan(sizes, seed, layout)
    for rows in _rows(sizes, dim, seed, plan):
        conn.execute("BEGIN")
        conn.executemany(_INSERT, rows)
        conn.execute("COMMIT")
        done += len(rows)
        if verbose:
            print(f"{done}/{memories} rows, {time.perf_counter() - began:.0f} s", flush=True)
    conn.execute("BEGIN")
    conn.executemany("INSERT INTO stream_numbers (stream, last) VALUES (?, ?)",
                     [(stream_name(k), int(n)) for k, n in enumerate(sizes)])
    conn.executemany("INSERT INTO id_blocks (stream, next, stop) VALUES (?, ?, ?)",
                     [(stream_name(k), *block) for k, block in plan.blocks.items()])
    conn.execute("DELETE FROM sqlite_sequence WHERE name = 'memories'")  # (its row, made by the inserts)
    conn.execute("INSERT INTO sqlite_sequence (name, seq) VALUES ('memories', ?)", (plan.top,))
    conn.execute("INSERT INTO meta (key, value) VALUES ('embedding_dimensions', ?) ON CONFLICT (key) DO UPDATE "
                 "SET value = excluded.value", (str(dim),))
    conn.execute("COMMIT")
    conn.execute("ANALYZE")
    conn.execute("PRAGMA journal_mode=WAL")
    conn.close()
    os.replace(partial, path)
    if verbose:
        print(f"built {path} ({path.stat().st_size / 2**30:.1f} GiB) in {time.perf_counter() - began:.0f} s")
    return path


def sizes_in(path: Path) -> dict[str, int]:
    """Each stream's size in a built file (largest first)."""
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        rows = conn.execute("SELECT stream, last FROM stream_numbers ORDER BY last DESC, stream").fetchall()
    finally:
        conn.close()
    return {str(stream): int(n) for stream, n in rows}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m bench.persona", description=__doc__)
    parser.add_argument("--streams", type=int, default=1000)
    parser.add_argument("--memories", type=int, default=10_000_000)
    parser.add_argument("--dim", type=int, default=384)
    parser.add_argument("--layout", choices=LAYOUTS, default="interleaved")
    args = parser.parse_args()
    try:
        zipf_sizes(args.streams, args.memories)
    except ValueError as exc:
        parser.error(str(exc))
    print(build(args.streams, args.memories, args.dim, layout=args.layout, verbose=True))
