"""The model roles (rater, reflector, agent, embedding) behind one metered door."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator, Sequence
from contextvars import ContextVar
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from memstream.errors import EmbeddingError, ProviderError
from memstream.models.embed import Embedder, RetryMeter, TokenMeter, normalize_rows
from memstream.models.llm import ChatModel, call_count
from memstream.store import Store, UsageRow
from memstream.store.policy import bounded_count

__all__ = ["ROLES", "Models", "RoleModel"]

log = logging.getLogger("memstream.models.roles")
ROLES = ("rater", "reflector", "agent")
_deferred: ContextVar[bool] = ContextVar("memstream_deferred_usage", default=False)


@dataclass(frozen=True)
class RoleModel:
    """A chat model and the model name to ask it for."""

    chat: ChatModel
    model: str


class Models:
    """Calls the models of each role and counts calls, failures and tokens per stream in the store."""

    def __init__(self, store: Store, embedder: Embedder, *, rater: RoleModel, reflector: RoleModel,
                 agent: RoleModel) -> None:
        self.store, self.embedder = store, embedder
        self.roles = {"rater": rater, "reflector": reflector, "agent": agent}
        self._usage: dict[tuple[str, str], list[int]] = {}
        self._dimensions: int | None = None  # the store's embedding size, once it has one

    async def complete(self, role: str, prompt: str, *, stream: str) -> str:
        """Ask the model of `role`; ProviderError on failure (counted)."""
        target = self.roles[role]
        try:
            result = await target.chat.complete(prompt, model=target.model)
        except ProviderError:
            await self._count(stream, role, failures=1)
            raise
        await self._count(stream, role, prompt_tokens=result.prompt_tokens,
                          completion_tokens=result.completion_tokens, retries=result.retries)
        return result.text

    # -- usage -------------------------------------------------------------------------------------

    @contextlib.contextmanager
    def deferred_usage(self) -> Iterator[None]:
        """Inside this block (this task and the tasks it starts) calls are counted in memory only: a write
        takes them with `take_usage` into its own transaction, and `flush_usage` writes the rest.

        A burst of thousands of observations then costs one usage write per batch, not one per call.
        """
        token = _deferred.set(True)
        try:
            yield
        finally:
            _deferred.reset(token)

    async def _count(self, stream: str, role: str, *, failures: int = 0, prompt_tokens: int = 0,
                     completion_tokens: int = 0, retries: int = 0) -> None:
        # Every model (a plugin's too) comes through here: what it reports is bounded per call.
        counts = (1, failures, *(call_count(n) for n in (prompt_tokens, completion_tokens, retries)))
        self._add(stream, role, counts)
        if not _deferred.get():
            await self.flush_usage()

    def take_usage(self) -> list[UsageRow]:
        """The calls counted and not yet written (they are then the caller's to write)."""
        rows = [(stream, role, c[0], c[1], c[2], c[3], c[4]) for (stream, role), c in self._usage.items()]
        self._usage = {}
        return rows

    def restore_usage(self, rows: Sequence[UsageRow]) -> None:
        """Put back counts taken by a write that failed."""
        for stream, role, *counts in rows:
            self._add(stream, role, counts)

    def _add(self, stream: str, role: str, counts: Sequence[int]) -> None:
        """Add to the counts not yet written, each staying a count the store can hold (COUNT_CEILING)."""
        row = self._usage.setdefault((stream, role), [0, 0, 0, 0, 0])
        for i, value in enumerate(counts):
            row[i] = bounded_count(row[i] + bounded_count(value))

    async def flush_usage(self) -> None:
        """Write every count not yet written."""
        rows = self.take_usage()
        try:
            await self.store.record_usage_many(rows)
        except BaseException:
            self.restore_usage(rows)
            raise

    async def embed(self, texts: Sequence[str], *, stream: str, any_size: bool = False) -> npt.NDArray[np.float32]:
        """Unit-length embeddings for `texts`, in one call to the embedder. A model server's vectors are untrusted
        input: the wrong count or shape, NaN, or a size other than the store's (unless `any_size`: a re-embedding
        into another model) is EmbeddingError, a failed call, never written."""
        try:
            vectors = await self.embedder.embed_batch(list(texts))
            matrix = np.asarray(vectors, dtype=np.float32)
            if matrix.ndim != 2 or matrix.shape[0] != len(texts) or matrix.shape[1] == 0:
                raise EmbeddingError(f"the embedder returned shape {matrix.shape} for {len(texts)} texts")
            if not np.isfinite(matrix).all():
                raise EmbeddingError("the embedder returned NaN or infinite values")
            if not any_size:
                await self._sized(matrix)
        except ProviderError:
            await self._count(stream, "embedding", failures=1)
            raise
        tokens = self.embedder.take_tokens() if isinstance(self.embedder, TokenMeter) else 0
        retries = self.embedder.take_retries() if isinstance(self.embedder, RetryMeter) else 0
        await self._count(stream, "embedding", prompt_tokens=tokens, retries=retries)
        return normalize_rows(matrix)

    async def _sized(self, matrix: npt.NDArray[np.float32]) -> None:
        """EmbeddingError unless the vectors have the store's size (any size while the store has none yet)."""
        if self._dimensions is None:
            known = await self.store.get_meta("embedding_dimensions")
            if known is None:
                return
            self._dimensions = int(known)  # a store's size changes only by a re-embedding, in its own process
        if matrix.shape[1] != self._dimensions:
            raise EmbeddingError(f"the embedding model answered with vectors of {matrix.shape[1]} dimensions, the "
                                 f"store's have {self._dimensions}; the answer is not used")
