"""Per-query arrays of a large stream, reused from one query to the next.

A query of the `hybrid` profile writes a few arrays of one value per row (the cosines of pass 1, BM25, the keyword
and context terms). Fresh ones cost a page fault every 4 KB on their first write: with malloc's mmap threshold held
at 128 KiB (_release.bound_heap) each is a new mapping, and at 1M memories (4-8 MB each) the faults took a query
from 12.6 to 22.9 ms at 300k rows. A stream of 128k rows or more keeps one of each, written over by each query
(scoring a stream is serialized: VectorIndex); smaller streams' arrays are fresh each time (a few page faults).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

__all__ = ["SCRATCH_ROWS", "Scratch"]

SCRATCH_ROWS = 1 << 17


class Scratch:
    """Named arrays of one stream's rows, for the length of one query: never kept past it."""

    def __init__(self) -> None:
        self._held: dict[str, npt.NDArray[Any]] = {}

    def take(self, name: str, n: int, dtype: Any, *, zero: bool = False) -> npt.NDArray[Any]:
        """An array of n values of `dtype` (zeros with `zero`, else as the last query left it)."""
        if n < SCRATCH_ROWS:
            return np.zeros(n, dtype) if zero else np.empty(n, dtype)
        found = self._held.get(name)
        if found is None or found.dtype != np.dtype(dtype) or len(found) < n:
            found = self._held[name] = np.empty(n + n // 8, dtype)  # (room to grow by an eighth)
        out = found[:n]
        if zero:
            out.fill(0)
        return out

    def nbytes(self) -> int:
        """Bytes held between queries."""
        return sum(array.nbytes for array in self._held.values())
