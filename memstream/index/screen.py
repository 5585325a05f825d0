"""A stream's matrix at half the bytes, for pass 1: each row as int16 codes times one scale.

Pass 1 of a query (_scan.py) reads every row of the stream, so it runs at the speed of memory, and reading
half the bytes takes about half the time. It only needs each row's cosine within a known bound (exact.py:
the rows that bound cannot separate from the k best, and from the stream's smallest and largest cosine, are
scored again from the float32 rows). So the screen keeps, per row, codes = round(row / scale) with scale =
the row's largest |component| / 32767, and factor = scale / |row|: (codes . unit query) * factor is the
row's cosine within `error` (the stream's largest |row - scale * codes| / |row|, about 2e-5 to 2e-4 for
embeddings) plus float32 rounding (`cosine_error`).

Its blocks mirror StreamVectors' (same first rows, same sizes) and every write to the rows is written here
too. It costs half a copy of the matrix in memory, so it is built only for streams where pass 1 is long:
StreamVectors.screen().
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterator, Sequence

import numpy as np

from memstream.index import _kernels as kernels
from memstream.index import _pages as pages
from memstream.index import _scan as scan
from memstream.store.arrays import F32, I16

__all__ = ["Screen", "cosine_error"]

_U32 = 2.0**-24  # unit roundoff of float32
_CHUNK = 8192


def cosine_error(dim: int, error: float = 0.0) -> float:
    """|pass 1's float32 cosine - the reference's cosine| for every row: at most dim ulps (any summation
    order, FMA or not) plus the roundings of the unit query and the inverse norm (or factor), twice that for
    margin; over a screen, its `error` twice more (the codes' sums are off by at most (1 + error) times as
    much as the row's)."""
    return (dim + 32) * 2 * _U32 * (1.0 + error) + 2.0 * error


class Screen:
    """The int16 codes of a stream's rows in blocks, each row's factor, and the stream's largest error."""

    def __init__(self, dim: int, starts: Sequence[int], sizes: Sequence[int]) -> None:
        self.dim = dim
        self.error = 0.0  # only grows (a removed row's error may stay): a bound, not the exact largest
        self._starts: list[int] = []
        self._blocks: list[I16] = []
        self._factors: F32 = np.zeros(max(64, sum(sizes)), np.float32)
        self.n = 0
        for start, size in zip(starts, sizes, strict=True):
            self.add_block(start, size)

    def blocks(self) -> Iterator[tuple[int, I16]]:
        """(first row, the filled rows' codes) for each block, in row order."""
        for start, block in zip(self._starts, self._blocks, strict=True):
            if start >= self.n:
                return
            yield start, block[: min(len(block), self.n - start)]

    @property
    def factors(self) -> F32:
        """scale / |row| for each row, in float32."""
        return self._factors[: self.n]

    def add_block(self, start: int, size: int) -> None:
        """Room for `size` more rows from row `start` (StreamVectors added a block of that size)."""
        self._starts.append(start)
        self._blocks.append(pages.huge_empty((size, self.dim), np.int16))

    def drop_block(self) -> None:
        """The last block is gone from StreamVectors (rows removed)."""
        self._starts.pop()
        self._blocks.pop()

    def write(self, start: int, matrix: F32) -> None:
        """Rows start.. of the stream are now `matrix` (float32 rows)."""
        matrix = np.ascontiguousarray(matrix, dtype=np.float32)
        end = start + len(matrix)
        self._room(end)
        self._done([self._quantize(start, matrix)], end)

    def fill(self, blocks: Sequence[tuple[int, F32]]) -> None:
        """Write these (first row, rows) blocks (a stream's, StreamVectors.blocks()), split over the cores: the
        first query of a 340k-row stream built its screen in 0.60 s in one thread."""
        pieces = [(start + lo, block[lo:lo + _CHUNK]) for start, block in blocks
                  for lo in range(0, len(block), _CHUNK)]
        end = max((start + len(rows) for start, rows in pieces), default=0)
        self._room(end)
        errors = [0.0] * len(pieces)

        def one(j: int) -> None:
            errors[j] = self._quantize(*pieces[j])

        scan.each(len(pieces), one)
        self._done(errors, end)

    def _room(self, end: int) -> None:
        if end > len(self._factors):
            grown = np.zeros(max(end, 2 * len(self._factors)), np.float32)
            grown[: self.n] = self._factors[: self.n]
            self._factors = grown

    def _quantize(self, start: int, matrix: F32) -> float:
        """Codes and factors of rows start.. (disjoint rows may be written from several threads at once); the
        largest error among them."""
        quantize = kernels.loops()["quantize"]
        worst = 0.0
        done = 0
        while done < len(matrix):
            b = bisect_right(self._starts, start + done) - 1
            block, offset = self._blocks[b], start + done - self._starts[b]
            take = min(len(block) - offset, len(matrix) - done, _CHUNK)
            error = quantize(matrix[done:done + take], block[offset:offset + take], self._factors, start + done)
            worst = max(worst, float(error))
            done += take
        return worst

    def _done(self, errors: Sequence[float], end: int) -> None:
        self.error = max(self.error, *errors)
        self.n = max(self.n, end)

    def truncate(self, n: int) -> None:
        """The stream holds n rows now (the last ones were removed)."""
        self.n = min(self.n, n)
