"""Exact retrieval: every memory of a stream scored on recency, importance and relevance.

`rank` gives the same top k as `rank_reference`, the spec's formula computed memory by memory in float64,
bit for bit. It gets there in two passes: a float32 pass over the whole matrix (at the memory-bandwidth
floor) scores every memory within a proven error bound, then the few memories that bound cannot separate
from the top k, and the extremes that the min-max normalization needs, are scored again with the very
operations of the reference. Ties go to the newer memory, then the higher id.

That is the default scoring (profile `spec`, recency from last access). The other profiles and recency
options (profiles.py) are scored from the same float32 pass over the matrix, in float64 from there on.
"""

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

__all__ = ["Ranked", "Retriever", "RetrieverLike", "exact_cosines", "min_max", "rank", "rank_reference"]

F32 = npt.NDArray[np.float32]
F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]
# Below this many rows, handing the product to a thread costs more than the product itself.
_THREAD_ROWS = 20_000
_U32 = 2.0**-24  # unit roundoff of float32
_U64 = 2.0**-53  # unit roundoff of float64
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


def _scaled(values: F64, low: float, high: float) -> F64:
    if high - low <= 0.0:
        return np.full(values.shape, 0.5)
    out: F64 = (values - low) / (high - low)
    return out


# -- the reference ---------------------------------------------------------------------------------


def _cosine(a: Sequence[float], b: Sequence[float]) -> float:
    # Sums run left to right on purpose (Python 3.12's sum() of floats is compensated): the fast path
    # reproduces exactly these operations for the memories it scores exactly.
    dot = na = nb = 0.0
    for x, y in zip(a, b, strict=True):
        dot += x * y
    for x in a:
        na += x * x
    for y in b:
        nb += y * y
    na, nb = math.sqrt(na), math.sqrt(nb)
    return 0.0 if na == 0 or nb == 0 else dot / (na * nb)


def _norm(values: list[float]) -> list[float]:
    low, high = min(values), max(values)
    return [0.5] * len(values) if high - low <= 0 else [(v - low) / (high - low) for v in values]


def rank_reference(memories: Sequence[tuple[int, float, float, float, Sequence[float]]],
                   query: Sequence[float], now: float, config: StreamConfig, k: int) -> list[int]:
    """The spec's formula one memory at a time in plain Python: the test oracle and a benchmark baseline.

    `memories` are (id, created, last_accessed, importance, embedding); returns the top k ids.
    """
    if not memories:
        return []
    rec = _norm([config.decay ** (max(now - m[2], 0.0) / 3600.0) for m in memories])
    imp = _norm([float(m[3]) for m in memories])
    rel = _norm([_cosine(m[4], query) for m in memories])
    scored = []
    for i, m in enumerate(memories):
        score = config.weight_recency * rec[i] + config.weight_importance * imp[i] + config.weight_relevance * rel[i]
        scored.append((-score, -m[1], -m[0]))
    scored.sort()
    return [-s[2] for s in scored[:k]]


# -- the fast path ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Approx:
    """Pass 1: every memory's score up to one shared constant, each within `slack` of the exact one."""

    score: F64
    slack: float
    cos: F32 | None  # None: the query is zero, every cosine is exactly 0
    cos_error: float
    cos_min: float
    cos_max: float


def exact_cosines(vectors: StreamVectors, rows: I64, query: F64) -> F64:
    """Cosines of these rows with the query, by the reference's operations (float64, summed in order)."""
    out = np.zeros(rows.size, np.float64)
    q_norm = math.sqrt(float(np.cumsum(query * query)[-1]))
    if q_norm == 0.0 or rows.size == 0:
        return out
    for start in range(0, rows.size, _EXACT_CHUNK):
        part = vectors.gather(rows[start:start + _EXACT_CHUNK]).astype(np.float64)
        dot = np.cumsum(part * query, axis=1)[:, -1]
        norms = np.sqrt(np.cumsum(part * part, axis=1)[:, -1])
        np.divide(dot, norms * q_norm, out=out[start:start + part.shape[0]], where=norms != 0.0)
    return out


def _cosines(vectors: StreamVectors, unit: F32) -> F32:
    """cos(row, query) in float32 for every row: one pass over the matrix."""
    out = np.empty(vectors.n, np.float32)
    for start, block in vectors.blocks():
        np.matmul(block, unit, out=out[start:start + len(block)])
    np.multiply(out, vectors.inverse_norms, out=out)
    return out


def _recency_pass(vectors: StreamVectors, now: float, config: StreamConfig, score: F64) -> tuple[float, float]:
    """Add the recency term (up to a constant) to `score`; returns (its error bound, its magnitude)."""
    weight, lim = config.weight_recency, vectors.limits()
    low, high = lim["last_min"], lim["last_max"]
    if weight == 0 or config.decay == 1.0 or low == high or low >= now:
        return 0.0, 0.0  # recency is exactly equal for all: 0.5 everywhere
    y, t0 = vectors.recency_proxy(config.decay)
    lam = -math.log(config.decay) / 3600.0
    top = min(high, now)
    y_hi, y_lo = math.exp(lam * (top - t0)), math.exp(lam * (low - t0))
    # Relative error of y and of the reference's pow(): a few ulps plus the rounding of the exponent.
    exponent = lam * max(abs(low - t0), abs(top - t0), now - low) + 1.0
    rho = (16.0 + 4.0 * exponent) * _U64
    ratio = y_lo / y_hi if y_hi > 0.0 else 1.0
    error = weight * 8.0 * rho / (1.0 - ratio) if ratio < 1.0 else math.inf
    if not (error <= weight / 4 and math.isfinite(y_hi)):
        return weight / 2, 0.0  # too narrow to trust: leave recency to the exact pass
    scale = weight / (y_hi - y_lo)
    np.multiply(np.minimum(y, y_hi) if high > now else y, scale, out=score)
    return error, scale * y_hi


def _approximate(vectors: StreamVectors, query: F32, q_norm: float, now: float, config: StreamConfig) -> _Approx:
    score = np.zeros(vectors.n, np.float64)
    slack, magnitude = _recency_pass(vectors, now, config, score)
    lim = vectors.limits()
    if config.weight_importance > 0 and lim["imp_max"] > lim["imp_min"]:
        scale = config.weight_importance / (lim["imp_max"] - lim["imp_min"])
        score += vectors.importance * scale
        magnitude += scale * max(abs(lim["imp_min"]), abs(lim["imp_max"]))
    if q_norm == 0.0:
        return _Approx(score, _rounding(slack, magnitude, config), None, 0.0, 0.0, 0.0)
    cos = _cosines(vectors, (query.astype(np.float64) / q_norm).astype(np.float32))
    low, high = float(cos.min()), float(cos.max())
    # |float32 cosine - reference cosine| <= dim ulps (any summation order, FMA or not) plus the roundings of
    # the unit query and the inverse norm; twice that for margin.
    error = (vectors.dim + 32) * 2 * _U32 if vectors.trusted and math.isfinite(low + high) else math.inf
    weight = config.weight_relevance
    if weight > 0:
        spread = high - low
        if math.isfinite(error) and spread > 8 * error:
            scale = weight / spread
            score += np.multiply(cos, scale, dtype=np.float64)
            slack += weight * 4 * error / spread
            magnitude += scale * max(abs(low), abs(high))
        else:
            slack += weight / 2
    return _Approx(score, _rounding(slack, magnitude, config), cos, error, low, high)


def _rounding(slack: float, magnitude: float, config: StreamConfig) -> float:
    weights = config.weight_recency + config.weight_importance + config.weight_relevance
    return (slack + 16 * _U64 * (magnitude + weights)) * (1 + 1e-6)


def _candidates(score: F64, slack: float, k: int) -> I64:
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


def _recency_range(vectors: StreamVectors, now: float, decay: float) -> tuple[float, float]:
    """The reference's min and max recency over the stream (its pow() at the extreme last accesses)."""
    if decay == 1.0:
        return 1.0, 1.0
    lim = vectors.limits()

    def recency(rows: I64) -> list[float]:
        return [decay ** (max(now - at, 0.0) / 3600.0) for at in vectors.last_accessed[rows].tolist()]

    # pow() is monotonic except, perhaps, between values within an ulp: look at every access time that
    # close to the extremes (for a decay below 0.99997 that is only the extremes themselves).
    window = 8 * 2 * _U64 * 3600.0 / -math.log(decay)
    if window < float(np.spacing(max(abs(lim["last_min"]), abs(lim["last_max"])))):
        hi = decay ** (max(now - lim["last_max"], 0.0) / 3600.0)
        lo = decay ** (max(now - lim["last_min"], 0.0) / 3600.0)
        return lo, hi
    last = vectors.last_accessed
    return (min(recency(np.flatnonzero(last <= lim["last_min"] + window))),
            max(recency(np.flatnonzero(last >= lim["last_max"] - window))))


def _top(score: F64, created: F64, ids: I64, k: int) -> I64:
    """Rows of the k best scores; ties go to the newer memory (then the higher id)."""
    n = score.size
    if k < n:
        threshold = np.partition(score, n - k)[n - k]
        candidates = np.flatnonzero(score >= threshold)
    else:
        candidates = np.arange(n)
    order = np.lexsort((-ids[candidates], -created[candidates], -score[candidates]))
    return candidates[order[:k]].astype(np.int64)


def _rank_profile(vectors: StreamVectors, query: F32, q_norm: float, now: float, config: StreamConfig,
                  k: int) -> Ranked:
    """Any profile: parts from profiles.score_parts over float32 cosines."""
    if q_norm == 0.0:
        cosine = np.zeros(vectors.n, np.float64)
    else:
        cosine = _cosines(vectors, (query.astype(np.float64) / q_norm).astype(np.float32)).astype(np.float64)
    parts = score_parts(config, cosine=cosine, importance=vectors.importance, last_accessed=vectors.last_accessed,
                        created=vectors.created, now=now)
    score = (config.weight_recency * parts[0] + config.weight_importance * parts[1]
             + config.weight_relevance * parts[2])
    rows = _top(score, vectors.created, vectors.ids, k)
    return Ranked(rows, score[rows], parts[0][rows], parts[1][rows], parts[2][rows], cosine[rows])


def rank(vectors: StreamVectors, query: npt.ArrayLike, now: float, config: StreamConfig, k: int) -> Ranked:
    """The score of every memory, the top k rows with their parts; with the default profile, exactly
    rank_reference's answer."""
    k = min(k, vectors.n)
    if k <= 0:
        empty = np.zeros(0, np.float64)
        return Ranked(np.zeros(0, np.int64), empty, empty, empty, empty, empty)
    q = np.ascontiguousarray(query, dtype=np.float32).reshape(-1)
    if q.size != vectors.dim:
        raise StoreError(f"the query has {q.size} dimensions, the stream {vectors.dim}")
    q64 = q.astype(np.float64)
    q_norm = math.sqrt(float(np.cumsum(q64 * q64)[-1]))
    if config.profile != "spec" or config.recency_from != "access":
        return _rank_profile(vectors, q, q_norm, now, config, k)
    approx = _approximate(vectors, q, q_norm, now, config)
    return _exact(vectors, q64, now, config, k, _candidates(approx.score, approx.slack, k), approx)


def _exact(vectors: StreamVectors, query: F64, now: float, config: StreamConfig, k: int, rows: I64,
           approx: _Approx) -> Ranked:
    """Pass 2: the candidates scored by the reference's operations, then sorted by its rule."""
    if approx.cos is None:
        cos, c_lo, c_hi = np.zeros(rows.size), 0.0, 0.0
    else:
        if math.isfinite(approx.cos_error):
            margin = 2 * approx.cos_error
            low_rows = np.flatnonzero(approx.cos <= approx.cos_min + margin)
            high_rows = np.flatnonzero(approx.cos >= approx.cos_max - margin)
        else:
            low_rows = high_rows = np.arange(vectors.n, dtype=np.int64)
        # One exact pass over the rows that can hold the extremes and the candidates.
        exact = exact_cosines(vectors, np.concatenate([low_rows, high_rows, rows]).astype(np.int64), query)
        c_lo = float(exact[: low_rows.size].min())
        c_hi = float(exact[low_rows.size: low_rows.size + high_rows.size].max())
        cos = exact[low_rows.size + high_rows.size:]
    r_lo, r_hi = _recency_range(vectors, now, config.decay)
    lim = vectors.limits()
    decay = config.decay
    raw = np.array([decay ** (max(now - at, 0.0) / 3600.0) for at in vectors.last_accessed[rows].tolist()])
    recency = _scaled(raw, r_lo, r_hi)
    importance = _scaled(vectors.importance[rows], lim["imp_min"], lim["imp_max"])
    relevance = _scaled(cos, c_lo, c_hi)
    score = (config.weight_recency * recency + config.weight_importance * importance
             + config.weight_relevance * relevance)
    order = np.lexsort((-vectors.ids[rows], -vectors.created[rows], -score))[:k]
    return Ranked(rows[order], score[order], recency[order], importance[order], relevance[order], cos[order])


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
        embedded = await self.models.embed([query], stream=stream)
        found = await self._ranked(embedded[0], stream, limit + len(exclude), at)
        found = [item for item in found if item[0].memory.id not in exclude][:limit]
        now = to_timestamp(at or self.clock.now())
        ids = [item.memory.id for item, _ in found]
        await self.store.touch(ids, now)
        await self.index.touch(stream, ids, now, rows=[row for _, row in found])
        return [item for item, _ in found]

    async def explain(self, query: str, *, stream: str, k: int | None = None,
                      at: datetime | None = None) -> list[ScoredMemory]:
        """The same ranking, read-only."""
        embedded = await self.models.embed([query], stream=stream)
        return await self.explain_vector(embedded[0], stream=stream, k=k, at=at)

    async def explain_vector(self, query: npt.NDArray[np.float32], *, stream: str, k: int | None = None,
                             at: datetime | None = None) -> list[ScoredMemory]:
        """Rank by an already embedded query, read-only."""
        return [item for item, _ in await self._ranked(query, stream, k or self.config.k, at)]

    async def _ranked(self, query: npt.NDArray[np.float32], stream: str, k: int,
                      at: datetime | None) -> list[tuple[ScoredMemory, int]]:
        now = to_timestamp(at or self.clock.now())
        async with self.index.locked(stream) as vectors:
            if vectors.n == 0:
                return []
            if query.shape[-1] != vectors.dim:
                raise StoreError(f"the query has {query.shape[-1]} dimensions, the stream {vectors.dim}")
            if vectors.n >= _THREAD_ROWS:
                ranked = await asyncio.to_thread(rank, vectors, query, now, self.config, k)
            else:
                ranked = rank(vectors, query, now, self.config, k)
            ids = vectors.ids[ranked.rows].tolist()
        found = await self.store.get_many(ids)
        return [
            (ScoredMemory(found[memory_id], float(ranked.score[i]), float(ranked.recency[i]),
                          float(ranked.importance[i]), float(ranked.relevance[i]), float(ranked.cosine[i])),
             int(ranked.rows[i]))
            for i, memory_id in enumerate(ids) if memory_id in found
        ]
