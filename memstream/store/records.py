"""The records a store takes and gives besides memories: a memory about to be written, a stream's arrays."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from memstream.records import Source

__all__ = ["NewMemory", "StreamArrays", "UsageRow"]

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

    def blocks(self) -> list[npt.NDArray[np.float32]]:
        """The embeddings as a list of blocks of rows, in row order."""
        return list(self.embeddings) if isinstance(self.embeddings, list) else [self.embeddings]

    def matrix(self) -> npt.NDArray[np.float32]:
        """The embeddings as one matrix (a copy if they are in several blocks)."""
        if isinstance(self.embeddings, list):
            return np.concatenate(self.embeddings) if self.embeddings else np.empty((0, 0), np.float32)
        return self.embeddings
