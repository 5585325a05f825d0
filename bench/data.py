"""Benchmark data: random unit vectors and generated texts from fixed seeds, cached SQLite files."""

from __future__ import annotations

import asyncio
import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import numpy.typing as npt

from memstream.records import Source
from memstream.store import NewMemory, Store, StreamArrays

DATA = Path(__file__).resolve().parent / "data"
STREAM = "guild:1"
START = 1_672_531_200.0  # 2023-01-01 UTC: a year of memories before NOW
NOW = START + 365 * 86400.0
_WORDS = ("party", "tonight", "coffee", "Klaus", "painting", "gallery", "rain", "breakfast", "Isabella",
          "Valentine", "library", "exam", "music", "bakery", "garden", "river", "walk", "dinner", "market",
          "study", "chess", "festival", "poem", "bicycle")

# Who said it and where: 8 people over 8 channels, in bursts of 25 messages a channel (the hybrid profile's
# neighbours and names have something to find).
_PEOPLE = ("Klaus", "Maria", "Isabella", "Tom", "Sam", "Ayesha", "Carlos", "Jennifer")


@dataclass(frozen=True)
class Columns:
    """A stream's memories, column-wise, as the store would hold them."""

    ids: npt.NDArray[np.int64]
    embeddings: npt.NDArray[np.float32]
    importance: npt.NDArray[np.float32]
    last_accessed: npt.NDArray[np.float64]
    created: npt.NDArray[np.float64]

    def arrays(self) -> StreamArrays:
        """The same as StreamArrays."""
        return StreamArrays(self.ids, self.embeddings, self.importance, self.last_accessed, self.created)


def unit_vectors(rng: np.random.Generator, n: int, dim: int) -> npt.NDArray[np.float32]:
    """n random unit vectors (float32)."""
    out = np.empty((n, dim), np.float32)
    for start in range(0, n, 65536):
        part = rng.standard_normal((min(65536, n - start), dim), dtype=np.float32)
        part /= np.linalg.norm(part, axis=1, keepdims=True)
        out[start:start + len(part)] = part
    return out


def columns(n: int, dim: int, seed: int = 0) -> Columns:
    """n memories over a year: creation times spread evenly, a tenth retrieved since, importance 1..10."""
    rng = np.random.default_rng([seed, n, dim])
    created = np.sort(rng.uniform(START, NOW - 3600.0, n))
    last = created.copy()
    touched = rng.random(n) < 0.1
    last[touched] = rng.uniform(created[touched], NOW)
    importance = rng.integers(1, 11, n).astype(np.float32)
    return Columns(np.arange(1, n + 1, dtype=np.int64), unit_vectors(rng, n, dim), importance, last, created)


def text(i: int) -> str:
    """A generated observation text."""
    words = [_WORDS[(i * 7 + j * 13) % len(_WORDS)] for j in range(4 + i % 5)]
    return f"Observation {i}: someone talked about " + " ".join(words)


def source(i: int) -> Source:
    """Where generated observation i was said, and by whom."""
    person = (i * 5 + i // 3) % len(_PEOPLE)
    channel = str(100 + (i // 25) % 8)
    return Source(author=_PEOPLE[person], author_id=str(person + 1), channel=f"c{channel}", channel_id=channel)


def query(dim: int, seed: int = 1) -> npt.NDArray[np.float32]:
    """A random unit query vector."""
    return unit_vectors(np.random.default_rng([seed, dim]), 1, dim)[0]


async def write_store(path: Path, data: Columns, chunk: int = 20_000) -> None:
    """Write these memories to a new store file through Store.insert (executemany, one transaction a chunk)."""
    async with await Store.open(path) as store:
        for start in range(0, len(data.ids), chunk):
            end = min(start + chunk, len(data.ids))
            batch = [NewMemory(stream=STREAM, kind="observation", text=text(i), created_at=float(data.created[i]),
                               importance=int(data.importance[i]), importance_source="rater",
                               embedding=data.embeddings[i], source=source(i)) for i in range(start, end)]
            await store.insert(batch)
        touched = np.flatnonzero(data.last_accessed != data.created)
        rows = [(float(data.last_accessed[i]), int(data.ids[i])) for i in touched]
        await store.conn.executemany("UPDATE memories SET last_accessed_at = ? WHERE id = ?", rows)
        await store.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")


def store_file(n: int, dim: int, seed: int = 0) -> Path:
    """A cached store file of n memories (built on first use under bench/data/)."""
    path = DATA / f"stream-{n}x{dim}-seed{seed}-sources.db"
    if not path.exists():
        DATA.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(".partial")
        for leftover in (partial, Path(f"{partial}-wal"), Path(f"{partial}-shm")):
            leftover.unlink(missing_ok=True)
        with ThreadPoolExecutor(1) as pool:  # callable from inside an event loop too
            pool.submit(asyncio.run, write_store(partial, columns(n, dim, seed))).result()
        os.replace(partial, path)
    return path
