"""The model roles (rater, reflector, agent, embedding) behind one metered door."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from memstream.embed import Embedder, TokenMeter, normalize_rows
from memstream.errors import EmbeddingError, ProviderError
from memstream.llm import ChatModel
from memstream.store import Store

__all__ = ["ROLES", "Models", "RoleModel"]

log = logging.getLogger("memstream.models")
ROLES = ("rater", "reflector", "agent")


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

    async def complete(self, role: str, prompt: str, *, stream: str) -> str:
        """Ask the model of `role`; ProviderError on failure (counted)."""
        target = self.roles[role]
        try:
            result = await target.chat.complete(prompt, model=target.model)
        except ProviderError:
            await self.store.record_usage(stream, role, failures=1)
            raise
        await self.store.record_usage(stream, role, prompt_tokens=result.prompt_tokens,
                                      completion_tokens=result.completion_tokens)
        return result.text

    async def embed(self, texts: Sequence[str], *, stream: str) -> npt.NDArray[np.float32]:
        """Unit-length embeddings for `texts`, in one call to the embedder."""
        try:
            vectors = await self.embedder.embed_batch(list(texts))
        except ProviderError:
            await self.store.record_usage(stream, "embedding", failures=1)
            raise
        tokens = self.embedder.take_tokens() if isinstance(self.embedder, TokenMeter) else 0
        await self.store.record_usage(stream, "embedding", prompt_tokens=tokens)
        matrix = np.asarray(vectors, dtype=np.float32)
        if matrix.ndim != 2 or matrix.shape[0] != len(texts) or matrix.shape[1] == 0:
            raise EmbeddingError(f"the embedder returned shape {matrix.shape} for {len(texts)} texts")
        if not np.isfinite(matrix).all():
            raise EmbeddingError("the embedder returned NaN or infinite values")
        return normalize_rows(matrix)
