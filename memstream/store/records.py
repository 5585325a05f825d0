"""The records a store takes and gives besides memories: a memory or a reply's trace about to be written, a
stream's arrays, a row of model usage."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from memstream.records import Source, TraceItem
from memstream.store import _load

__all__ = ["NewMemory", "NewTrace", "StreamArrays", "UsageRow", "part_arrays", "sink_arrays"]

# (stream, role, calls, failures, prompt tokens, completion tokens, retries)
UsageRow = tuple[str, str, int, int, int, int, int]


@dataclass(frozen=True)
class NewMemory:
    """A memory about to be written."""

    stream: str
    kind: str
    text: str
    created_at: float
    importance: int | None = None
    importance_source: str | None = None
    depth: int = 0
    source: Source = field(default_factory=Source)
    embedding: npt.NDArray[np.float32] | None = None


@dataclass(frozen=True)
class NewTrace:
    """A reply's trace about to be written (a ReplyTrace once stored): what the reply was built from and what
    it answered."""

    stream: str
    at: float
    query: str
    items: tuple[TraceItem, ...]
    reply_memory_id: int | None = None
    query_memory_id: int | None = None
    query_message_id: str | None = None
    query_author_id: str | None = None


@dataclass
class StreamArrays:
    """Everything retrieval needs of one stream, column-wise."""

    ids: npt.NDArray[np.int64]
    # One (n, dim) matrix, or consecutive blocks of rows (a load in several processes gives one each).
    embeddings: npt.NDArray[np.float32] | list[npt.NDArray[np.float32]]
    importance: npt.NDArray[np.float32]
    last_accessed: npt.NDArray[np.float64]
    created: npt.NDArray[np.float64]
    inverse_norms: npt.NDArray[np.float32] | None = None  # 1/|row| (0 for a zero row), if known
    texts: list[str] | None = None  # each row's text, when the load was asked for them (the lexical index)
    # Each row's source as a tuple in Source's field order, when the load was asked for them and read them in
    # the same pass (None: ask Store.sources).
    sources: list[tuple[str | None, ...]] | None = None

    def blocks(self) -> list[npt.NDArray[np.float32]]:
        """The embeddings as a list of blocks of rows, in row order."""
        return list(self.embeddings) if isinstance(self.embeddings, list) else [self.embeddings]

    def matrix(self) -> npt.NDArray[np.float32]:
        """The embeddings as one matrix (a copy if they are in several blocks)."""
        if isinstance(self.embeddings, list):
            return np.concatenate(self.embeddings) if self.embeddings else np.empty((0, 0), np.float32)
        return self.embeddings


def sink_arrays(sink: _load.Sink) -> StreamArrays:
    """The filled rows of a sink as StreamArrays (views), with its texts if it kept them."""
    n = sink.n
    return StreamArrays(sink.ids[:n], sink.embeddings[:n], sink.importance[:n], sink.last[:n], sink.created[:n],
                        sink.inverse_norms[:n], None if sink.texts is None else sink.texts[:n],
                        None if sink.sources is None else sink.sources[:n])


def part_arrays(parts: Sequence[_load.Part], dim: int, *, texts: bool = False) -> StreamArrays:
    """Parts read by several readers as StreamArrays: the embeddings stay in their blocks."""
    if not parts:
        return sink_arrays(_load.Sink(0, dim, texts=texts))

    def column(name: str) -> npt.NDArray[Any]:
        return np.concatenate([part.columns[name] for part in parts])

    blocks = [part.embeddings for part in parts if len(part.embeddings)]
    embeddings: npt.NDArray[np.float32] | list[npt.NDArray[np.float32]] = (
        blocks if len(blocks) > 1 else blocks[0] if blocks else np.empty((0, dim), np.float32))
    joined = [text for part in parts for text in part.texts or ()] if texts else None
    sources = ([fields for part in parts for fields in part.sources or ()]
               if all(part.sources is not None for part in parts) else None)
    return StreamArrays(column("ids"), embeddings, column("importance"),
                        column("last"), column("created"), column("inverse_norms"), joined, sources)
