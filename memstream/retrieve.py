"""Exact retrieval: every memory of a stream scored on recency, importance and relevance."""

from __future__ import annotations

import asyncio
import math
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol

import numpy as np
import numpy.typing as npt

from memstream.clock import Clock, to_timestamp
from memstream.config import StreamConfig
from memstream.errors import StoreError
from memstream.models import Models
from memstream.profiles import min_max, score_parts
from memstream.records import ScoredMemory
from memstream.store import Store
from memstream.vectors import StreamVectors, VectorIndex

__all__ = ["Ranked", "Retriever", "RetrieverLike", "min_max", "rank", "rank_reference"]

# Below this many rows, thread hand-off costs more than the product itself.
_THREAD_ROWS = 20_000


@dataclass(frozen=True)
class Ranked:
    """Rows of a stream in rank order, with their normalized parts and score."""

    rows: npt.NDArray[np.int64]
    score: npt.NDArray[np.float64]
    recency: npt.NDArray[np.float64]
    importance: npt.NDArray[np.float64]
    relevance: npt.NDArray[np.float64]
    cosine: npt.NDArray[np.float64]


def _top(score: npt.NDArray[np.float64], created: npt.NDArray[np.float64], ids: npt.NDArray[np.int64],
         k: int) -> npt.NDArray[np.int64]:
    """Rows of the k best scores; ties go to the newer memory (then the higher id)."""
    n = score.size
    if k < n:
        threshold = np.partition(score, n - k)[n - k]
        candidates = np.flatnonzero(score >= threshold)
    else:
        candidates = np.arange(n)
    order = np.lexsort((-ids[candidates], -created[candidates], -score[candidates]))
    return candidates[order[:k]].astype(np.int64)


def rank(vectors: StreamVectors, query: npt.NDArray[np.float32], now: float, config: StreamConfig,
         k: int) -> Ranked:
    """The score of every memory (the spec's formula, or the configured profile); the top k rows."""
    cosine = (vectors.embeddings @ query).astype(np.float64)
    parts = score_parts(config, cosine=cosine, importance=vectors.importance.astype(np.float64),
                        last_accessed=vectors.last_accessed, created=vectors.created, now=now)
    score = (config.weight_recency * parts[0] + config.weight_importance * parts[1]
             + config.weight_relevance * parts[2])
    rows = _top(score, vectors.created, vectors.ids, k)
    return Ranked(rows, score[rows], parts[0][rows], parts[1][rows], parts[2][rows], cosine[rows])


def rank_reference(memories: Sequence[tuple[int, float, float, float, Sequence[float]]],
                   query: Sequence[float], now: float, config: StreamConfig, k: int) -> list[int]:
    """The paper's way, one memory at a time in plain Python: a test oracle and a benchmark baseline.

    `memories` are (id, created, last_accessed, importance, embedding); returns the top k ids.
    """
    def cos(a: Sequence[float], b: Sequence[float]) -> float:
        na = math.sqrt(sum(x * x for x in a))
        nb = math.sqrt(sum(x * x for x in b))
        return 0.0 if na == 0 or nb == 0 else sum(x * y for x, y in zip(a, b, strict=True)) / (na * nb)

    def norm(values: list[float]) -> list[float]:
        low, high = min(values), max(values)
        return [0.5] * len(values) if high - low <= 0 else [(v - low) / (high - low) for v in values]

    if not memories:
        return []
    rec = norm([config.decay ** (max(now - m[2], 0.0) / 3600.0) for m in memories])
    imp = norm([float(m[3]) for m in memories])
    rel = norm([cos(m[4], query) for m in memories])
    scored = []
    for i, m in enumerate(memories):
        score = config.weight_recency * rec[i] + config.weight_importance * imp[i] + config.weight_relevance * rel[i]
        scored.append((-score, -m[1], -m[0]))
    scored.sort()
    return [-s[2] for s in scored[:k]]


class RetrieverLike(Protocol):
    """What the reflector and the agent need of a retriever."""

    async def retrieve(self, query: str, *, stream: str, k: int | None = None,
                       at: datetime | None = None) -> list[ScoredMemory]: ...


class Retriever:
    """Scores every memory of a stream for a query; `retrieve` touches the winners, `explain` does not."""

    def __init__(self, store: Store, index: VectorIndex, models: Models, config: StreamConfig,
                 clock: Clock) -> None:
        self.store, self.index, self.models, self.config, self.clock = store, index, models, config, clock

    async def retrieve(self, query: str, *, stream: str, k: int | None = None, at: datetime | None = None,
                       exclude: Collection[int] = ()) -> list[ScoredMemory]:
        """The top k memories for `query` (leaving out `exclude`); their last access becomes now."""
        limit = k or self.config.k
        found = await self.explain(query, stream=stream, k=limit + len(exclude), at=at)
        found = [item for item in found if item.memory.id not in exclude][:limit]
        now = to_timestamp(at or self.clock.now())
        ids = [item.memory.id for item in found]
        await self.store.touch(ids, now)
        vectors = self.index.loaded(stream)
        if vectors is not None:
            vectors.touch(ids, now)
        return found

    async def explain(self, query: str, *, stream: str, k: int | None = None,
                      at: datetime | None = None) -> list[ScoredMemory]:
        """The same ranking, read-only."""
        embedded = await self.models.embed([query], stream=stream)
        return await self.explain_vector(embedded[0], stream=stream, k=k, at=at)

    async def explain_vector(self, query: npt.NDArray[np.float32], *, stream: str, k: int | None = None,
                             at: datetime | None = None) -> list[ScoredMemory]:
        """Rank by an already embedded query, read-only."""
        vectors = await self.index.get(stream)
        if vectors.n == 0:
            return []
        if query.shape[-1] != vectors.dim:
            raise StoreError(f"the query has {query.shape[-1]} dimensions, the stream {vectors.dim}")
        now = to_timestamp(at or self.clock.now())
        limit = min(k or self.config.k, vectors.n)
        if vectors.n >= _THREAD_ROWS:
            ranked = await asyncio.to_thread(rank, vectors, query, now, self.config, limit)
        else:
            ranked = rank(vectors, query, now, self.config, limit)
        ids = [int(vectors.ids[row]) for row in ranked.rows]
        found = await self.store.get_many(ids)
        return [
            ScoredMemory(found[memory_id], float(ranked.score[i]), float(ranked.recency[i]),
                         float(ranked.importance[i]), float(ranked.relevance[i]), float(ranked.cosine[i]))
            for i, memory_id in enumerate(ids) if memory_id in found
        ]
