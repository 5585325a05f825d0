"""The retriever: a query embedded, its stream ranked (ranking.py), the winners read and touched in the store.

`retrieve` is what the reflector and the agent call (RetrieverLike); `explain` ranks the same way and touches
nothing (inspection: `/recall`-style previews, `memstream explain`).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Collection, Iterable, Sequence
from datetime import datetime
from typing import Protocol

import numpy as np
import numpy.typing as npt

from memstream.clock import Clock, to_timestamp
from memstream.config import StreamConfig
from memstream.errors import StoreError
from memstream.index.exact import Ranked
from memstream.index.ranking import rank
from memstream.index.vector_index import VectorIndex
from memstream.models.roles import Models
from memstream.records import Memory, ScoredMemory
from memstream.store import Store
from memstream.store.policy import collected_touches

__all__ = ["Retriever", "RetrieverLike"]

# Below this many rows, handing the product to a thread costs more than the product itself.
_THREAD_ROWS = 20_000


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
        """The top k memories for `query` (leaving out `exclude`); their last access becomes now.

        Two hops to the store besides the ranking: its check for other processes' writes, then one write that
        reads the winners, touches them and counts the query's embedding call (`Store.retrieved`). A stream not
        in memory starts loading before the query is embedded (VectorIndex.prefetch)."""
        limit = k or self.config.k
        now = to_timestamp(at or self.clock.now())
        await self.store.check_embedding_model()  # a query of another model cannot rank these vectors
        self.index.prefetch(stream)  # a cold stream loads while the query is embedded
        try:
            with self.models.deferred_usage():  # counted in memory here, written with the touch
                embedded = await self.models.embed([query], stream=stream)
            ids, ranked = await self._ranked(embedded[0], stream, limit + len(exclude), at, query)
            chosen = [i for i, memory_id in enumerate(ids) if memory_id not in exclude][:limit]
            with self.models.usage_to_write() as usage:  # the touch reaches the index as the store announces it
                self.index.hint(stream, [ids[i] for i in chosen], [int(ranked.rows[i]) for i in chosen])
                found = await self.store.retrieved([ids[i] for i in chosen], now, usage=usage)
        except BaseException:
            with contextlib.suppress(StoreError):  # what was counted (a failed call too) is kept; the first error
                await self.models.flush_usage()    # is the one to report
            raise
        return [item for item, _ in _scored(ids, ranked, found, chosen)]

    async def explain(self, query: str, *, stream: str, k: int | None = None,
                      at: datetime | None = None) -> list[ScoredMemory]:
        """The same ranking, read-only."""
        await self.store.check_embedding_model()
        self.index.prefetch(stream)
        embedded = await self.models.embed([query], stream=stream)
        return await self.explain_vector(embedded[0], stream=stream, k=k, at=at, text=query)

    async def explain_vector(self, query: npt.NDArray[np.float32], *, stream: str, k: int | None = None,
                             at: datetime | None = None, text: str | None = None) -> list[ScoredMemory]:
        """Rank by an already embedded query (and its `text`, for lexical relevance), read-only."""
        ids, ranked = await self._ranked(query, stream, k or self.config.k, at, text)
        found = await self.store.get_many(ids)
        return [item for item, _ in _scored(ids, ranked, found, range(len(ids)))]

    async def _ranked(self, query: npt.NDArray[np.float32], stream: str, k: int,
                      at: datetime | None, text: str | None = None) -> tuple[list[int], Ranked]:
        """The top k of a stream: their ids, and their rows and score parts."""
        now = to_timestamp(at or self.clock.now())
        # Inside a reflection, its own retrievals' touches (committed with its insights) count already.
        async with self.index.locked(stream, uncommitted=collected_touches()) as vectors:
            if vectors.n == 0:
                return [], rank(vectors, query, now, self.config, 0)
            if query.shape[-1] != vectors.dim:
                raise StoreError(f"the query has {query.shape[-1]} dimensions, the stream {vectors.dim}")
            if vectors.n >= _THREAD_ROWS:
                ranked = await asyncio.to_thread(rank, vectors, query, now, self.config, k, text=text)
            else:
                ranked = rank(vectors, query, now, self.config, k, text=text)
            return vectors.ids[ranked.rows].tolist(), ranked


def _scored(ids: Sequence[int], ranked: Ranked, found: dict[int, Memory],
            chosen: Iterable[int]) -> list[tuple[ScoredMemory, int]]:
    """The chosen places of a ranking as scored memories (with their rows), leaving out memories not found."""
    return [
        (ScoredMemory(found[ids[i]], float(ranked.score[i]), float(ranked.recency[i]), float(ranked.importance[i]),
                      float(ranked.relevance[i]), float(ranked.cosine[i])), int(ranked.rows[i]))
        for i in chosen if ids[i] in found
    ]
