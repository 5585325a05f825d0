"""The two passes shared by the exact rankings (spec.py, hybrid.py), and what they return.

An exact ranking gives the same top k as its plain-Python reference (reference.py, hybrid.py), bit for bit. It
gets there in two passes: a float32 pass over the whole matrix (or, for a large stream, over its half-size
int16 screen: screen.py) scores every memory within a proven error bound (`approximate_cosines`, then the
profile's own scales), then the few memories that bound cannot separate from the top k (`candidates`), and the
extremes that the min-max normalization needs, are scored again with the very operations of the reference
(`exact_cosines`, `pow_range`). Ties go to the newer memory, then the higher id.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from memstream.index import _scan as scan
from memstream.index._terms import U64
from memstream.index.screen import cosine_error
from memstream.index.vectors import StreamVectors
from memstream.store.arrays import F32, F64, I64

__all__ = ["Ranked", "approximate_cosines", "candidates", "cosines", "cosines_range", "error_bound",
           "exact_cosines", "pow_range", "query_norm", "scaled"]

_EXACT_CHUNK = 2048


@dataclass(frozen=True)
class Ranked:
    """Rows of a stream in rank order, with their normalized parts and score."""

    rows: I64
    score: F64
    recency: F64
    importance: F64
    relevance: F64
    cosine: F64


def scaled(values: F64, low: float, high: float) -> F64:
    """Min-max by the given extremes; where they are equal, 0.5 for all."""
    if high - low <= 0.0:
        return np.full(values.shape, 0.5)
    out: F64 = (values - low) / (high - low)
    return out


def _row_sums_in_order(terms: F64) -> F64:
    """Column sums of a C-contiguous (dim, m) array, each summed first to last like the reference's loop.

    numpy reduces along the outer axis of a C-contiguous array one row after another (pairwise summation
    applies only along the contiguous axis); `_IN_ORDER` checks that on this numpy at import, and cumsum,
    slower but sequential by definition, is the fallback.
    """
    if _IN_ORDER and terms.shape[1] >= 2:
        summed: F64 = np.add.reduce(terms, axis=0)
        return summed
    ordered: F64 = np.cumsum(terms, axis=0)[-1]
    return ordered


def _reduce_is_in_order() -> bool:
    rng = np.random.default_rng(0)
    for m, dim in ((2, 1536), (3, 384), (64, 100), (256, 384)):
        terms = rng.standard_normal((dim, m)) * 10.0 ** rng.integers(-8, 8, (dim, m))
        if not np.array_equal(np.add.reduce(terms, axis=0), np.cumsum(terms, axis=0)[-1]):
            return False
    return True


_IN_ORDER = _reduce_is_in_order()


def query_norm(query: F64) -> float:
    """The reference's norm of the query: squares summed first to last."""
    return math.sqrt(float(np.cumsum(query * query)[-1])) if query.size else 0.0


def exact_cosines(vectors: StreamVectors, rows: I64, query: F64, q_norm: float | None = None) -> F64:
    """Cosines of these rows with the query, by the reference's operations (float64, summed in order)."""
    out = np.zeros(rows.size, np.float64)
    if q_norm is None:
        q_norm = query_norm(query)
    if q_norm == 0.0 or rows.size == 0:
        return out
    column = query.reshape(-1, 1)
    for start in range(0, rows.size, _EXACT_CHUNK):
        # Rows as columns, products and squares side by side: one in-order reduction for both.
        part = np.array(vectors.gather(rows[start:start + _EXACT_CHUNK]).T, dtype=np.float64, order="C")
        m = part.shape[1]
        terms = np.empty((part.shape[0], 2 * m), np.float64)
        np.multiply(part, column, out=terms[:, :m])
        np.multiply(part, part, out=terms[:, m:])
        sums = _row_sums_in_order(terms)
        norms = np.sqrt(sums[m:])
        np.divide(sums[:m], norms * q_norm, out=out[start:start + m], where=norms != 0.0)
    return out


def cosines(vectors: StreamVectors, unit: F32, compiled: bool = False) -> F32:
    """cos(row, query) in float32 for every row: one pass over the matrix (_scan.py's if `compiled`)."""
    return cosines_range(vectors, unit, compiled)[0]


def cosines_range(vectors: StreamVectors, unit: F32, compiled: bool = False) -> tuple[F32, float, float]:
    """`cosines`, with their smallest and largest (both NaN if any cosine is). In a large stream the cosines are
    its scratch (_scratch.py): valid until its next query."""
    out = vectors.scratch.take("cosines", vectors.n, np.float32)
    if compiled:
        low, high, nan = scan.cosines(list(vectors.blocks()), unit, vectors.inverse_norms, out)
        return (out, math.nan, math.nan) if nan else (out, low, high)
    return _numpy_cosines(vectors, unit, out)


def approximate_cosines(vectors: StreamVectors, unit: F32,
                        compiled: bool = False) -> tuple[F32, float, float, float]:
    """Every row's cosine within a bound, for pass 1: from the stream's screen if it has one (`compiled`
    only); with their smallest and largest (NaN if any cosine is) and the bound (inf: none can be trusted)."""
    screen = vectors.screen() if compiled else None
    if screen is None:
        cos, low, high = cosines_range(vectors, unit, compiled)
        return cos, low, high, error_bound(vectors, low, high)
    out = vectors.scratch.take("cosines", vectors.n, np.float32)
    low, high, nan = scan.cosines(list(screen.blocks()), unit, screen.factors, out)
    if nan:
        return out, math.nan, math.nan, math.inf
    return out, low, high, error_bound(vectors, low, high, screen.error)


def _numpy_cosines(vectors: StreamVectors, unit: F32, out: F32) -> tuple[F32, float, float]:
    # A row or query beyond float32's range gives inf or NaN here: said by the NaN smallest and largest (the
    # caller then trusts no float32 cosine and ranks exactly), not by a floating-point warning.
    with np.errstate(invalid="ignore", over="ignore"):
        for start, block in vectors.blocks():
            np.matmul(block, unit, out=out[start:start + len(block)])
        np.multiply(out, vectors.inverse_norms, out=out)
    return out, float(out.min()), float(out.max())


def error_bound(vectors: StreamVectors, low: float, high: float, screen_error: float = 0.0) -> float:
    """|float32 cosine - reference cosine| for every row (from the screen: `screen_error` its error), or inf if
    float32 cannot be trusted here (screen.cosine_error)."""
    trusted = vectors.trusted and math.isfinite(low + high)
    return cosine_error(vectors.dim, screen_error) if trusted else math.inf


def candidates(score: F64, slack: float, k: int) -> I64:
    """Every row whose exact score could be among the k best."""
    n = score.size
    if k >= n:
        return np.arange(n, dtype=np.int64)
    rows = np.arange(n, dtype=np.int64)
    width = 1024
    if n >= 8 * width:
        # The k-th largest of the block maxima is at most the k-th largest score: a cheap first cut.
        blocks = n // width
        maxima = score[: blocks * width].reshape(blocks, width).max(axis=1)
        if blocks >= k:
            bound = float(np.partition(maxima, blocks - k)[blocks - k])
            rows = np.flatnonzero(score >= bound - 2 * slack).astype(np.int64)
    sub = score[rows]
    kth = float(np.partition(sub, sub.size - k)[sub.size - k])
    return rows[sub >= kth - 2 * slack]


def pow_range(times: F64, low: float, high: float, now: float, decay: float) -> tuple[float, float]:
    """min and max over `times` (whose extremes are low and high) of the reference's
    decay ** (max(now - t, 0) / 3600), computed by the reference's own pow()."""
    if decay == 1.0:
        return 1.0, 1.0

    def recency(rows: I64) -> list[float]:
        return [decay ** (max(now - at, 0.0) / 3600.0) for at in times[rows].tolist()]

    # pow() is monotonic except, perhaps, between values within an ulp: look at every time that close to
    # the extremes (for a decay below 0.99997 that is only the extremes themselves).
    window = 8 * 2 * U64 * 3600.0 / -math.log(decay)
    if window < float(np.spacing(max(abs(low), abs(high)))):
        return decay ** (max(now - low, 0.0) / 3600.0), decay ** (max(now - high, 0.0) / 3600.0)
    return (min(recency(np.flatnonzero(times <= low + window))),
            max(recency(np.flatnonzero(times >= high - window))))
