"""In-memory float32 matrices, one per stream, loaded from the store and kept in step with it.

The store stays the source of truth: every write goes to SQLite first, then here.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from memstream.embed import normalize_rows
from memstream.store import Store, StreamArrays

__all__ = ["StreamVectors", "VectorIndex"]


class StreamVectors:
    """The ready memories of one stream, column-wise, with room to grow."""

    def __init__(self, arrays: StreamArrays) -> None:
        n = len(arrays.ids)
        dim = arrays.embeddings.shape[1] if arrays.embeddings.ndim == 2 else 0
        self._cap = max(n, 64)
        self.n = 0
        self.dim = dim
        self._ids = np.zeros(self._cap, np.int64)
        self._emb = np.zeros((self._cap, dim), np.float32)
        self._imp = np.zeros(self._cap, np.float32)
        self._last = np.zeros(self._cap, np.float64)
        self._created = np.zeros(self._cap, np.float64)
        self._rows: dict[int, int] = {}
        if n:
            self.append(arrays.ids, arrays.embeddings, arrays.importance, arrays.last_accessed, arrays.created)

    @property
    def ids(self) -> npt.NDArray[np.int64]:
        """Memory ids, row by row."""
        return self._ids[: self.n]

    @property
    def embeddings(self) -> npt.NDArray[np.float32]:
        """Unit-length embeddings, row by row."""
        return self._emb[: self.n]

    @property
    def importance(self) -> npt.NDArray[np.float32]:
        """Importance 1..10, row by row."""
        return self._imp[: self.n]

    @property
    def last_accessed(self) -> npt.NDArray[np.float64]:
        """Last access, seconds since the epoch."""
        return self._last[: self.n]

    @property
    def created(self) -> npt.NDArray[np.float64]:
        """Creation time, seconds since the epoch."""
        return self._created[: self.n]

    def _reserve(self, extra: int, dim: int) -> None:
        if self.dim == 0 and self.n == 0:
            self.dim = dim
            self._emb = np.zeros((self._cap, dim), np.float32)
        if self.n + extra <= self._cap:
            return
        cap = max(self._cap * 2, self.n + extra)
        for name in ("_ids", "_imp", "_last", "_created"):
            old = getattr(self, name)
            new = np.zeros(cap, old.dtype)
            new[: self.n] = old[: self.n]
            setattr(self, name, new)
        emb = np.zeros((cap, self.dim), np.float32)
        emb[: self.n] = self._emb[: self.n]
        self._emb, self._cap = emb, cap

    def append(self, ids: Sequence[int] | npt.NDArray[np.int64], embeddings: npt.ArrayLike,
               importance: npt.ArrayLike, last_accessed: npt.ArrayLike, created: npt.ArrayLike) -> None:
        """Add rows (embeddings are normalized here)."""
        vectors = normalize_rows(embeddings)
        count = len(ids)
        if count == 0:
            return
        self._reserve(count, vectors.shape[1])
        start, end = self.n, self.n + count
        self._ids[start:end] = ids
        self._emb[start:end] = vectors
        self._imp[start:end] = importance
        self._last[start:end] = last_accessed
        self._created[start:end] = created
        for offset, memory_id in enumerate(np.asarray(ids).tolist()):
            self._rows[memory_id] = start + offset
        self.n = end

    def touch(self, ids: Sequence[int], at: float) -> None:
        """Set last access of these memories."""
        for memory_id in ids:
            row = self._rows.get(memory_id)
            if row is not None:
                self._last[row] = at

    def update(self, memory_id: int, embedding: npt.ArrayLike) -> None:
        """Replace one memory's embedding."""
        row = self._rows.get(memory_id)
        if row is not None:
            self._emb[row] = normalize_rows(embedding)[0]

    def remove(self, ids: Sequence[int]) -> None:
        """Drop rows; the order of the rest is kept."""
        rows = [self._rows[i] for i in ids if i in self._rows]
        if not rows:
            return
        keep = np.ones(self.n, bool)
        keep[rows] = False
        kept = int(keep.sum())
        for name in ("_ids", "_emb", "_imp", "_last", "_created"):
            array = getattr(self, name)
            array[:kept] = array[: self.n][keep]
        self.n = kept
        self._rows = {int(memory_id): row for row, memory_id in enumerate(self._ids[:kept].tolist())}


class VectorIndex:
    """The per-stream matrices of one store, loaded on first use."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self._streams: dict[str, StreamVectors] = {}
        self._lock = asyncio.Lock()

    async def get(self, stream: str) -> StreamVectors:
        """The matrix of a stream, loading it from the store the first time."""
        found = self._streams.get(stream)
        if found is not None:
            return found
        async with self._lock:
            found = self._streams.get(stream)
            if found is None:
                found = StreamVectors(await self.store.load_stream(stream))
                self._streams[stream] = found
            return found

    def loaded(self, stream: str) -> StreamVectors | None:
        """The matrix if loaded (writes to unloaded streams need not touch memory)."""
        return self._streams.get(stream)

    def drop(self, stream: str) -> None:
        """Forget the loaded matrix of a stream."""
        self._streams.pop(stream, None)

    def remove(self, ids: Sequence[int]) -> None:
        """Drop memories from whichever loaded stream holds them."""
        for vectors in self._streams.values():
            vectors.remove(ids)
