"""Exact retrieval: every memory of a stream scored on recency, importance and relevance.

`rank` gives the same top k as `rank_reference`, the spec's formula computed memory by memory in float64,
bit for bit. It gets there in two passes: a float32 pass over the whole matrix (or, for a large stream, over
its half-size int16 screen: screen.py) scores every memory within a proven error bound, then the few
memories that bound cannot separate from the top k, and the extremes that the min-max normalization needs,
are scored again with the very operations of the reference. Ties go to the newer memory, then the higher id.

That is the default scoring (profile `spec`, recency from last access). The other profiles and recency
options (profiles.py) are scored from the same float32 pass over the matrix, in float64 from there on.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol

import numpy as np
import numpy.typing as npt

from memstream.clock import Clock, to_timestamp
from memstream.config import StreamConfig
from memstream.errors import StoreError
from memstream.index import _kernels as kernels
from memstream.index import _scan as scan
from memstream.index.profiles import min_max, score_parts
from memstream.index.screen import cosine_error
from memstream.index.vector_index import VectorIndex
from memstream.index.vectors import StreamVectors
from memstream.models.roles import Models
from memstream.records import Memory, ScoredMemory
from memstream.store import Store
from memstream.store.arrays import F32, F64, I64
from memstream.store.policy import collected_touches

__all__ = ["Ranked", "Retriever", "RetrieverLike", "exact_cosines", "min_max", "rank", "rank_reference"]

# Below this many rows, handing the product to a thread costs more than the product itself.
_THREAD_ROWS = 20_000
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


def _cosines(vectors: StreamVectors, unit: F32, compiled: bool = False) -> F32:
    """cos(row, query) in float32 for every row: one pass over the matrix (scan.py's if `compiled`)."""
    return cosines_range(vectors, unit, compiled)[0]


def cosines_range(vectors: StreamVectors, unit: F32, compiled: bool = False) -> tuple[F32, float, float]:
    """_cosines, with their smallest and largest (both NaN if any cosine is)."""
    out = np.empty(vectors.n, np.float32)
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
        return cos, low, high, _cosine_error(vectors, low, high)
    out = np.empty(vectors.n, np.float32)
    low, high, nan = scan.cosines(list(screen.blocks()), unit, screen.factors, out)
    if nan:
        return out, math.nan, math.nan, math.inf
    return out, low, high, _cosine_error(vectors, low, high, screen.error)


def _numpy_cosines(vectors: StreamVectors, unit: F32, out: F32) -> tuple[F32, float, float]:
    for start, block in vectors.blocks():
        np.matmul(block, unit, out=out[start:start + len(block)])
    np.multiply(out, vectors.inverse_norms, out=out)
    return out, float(out.min()), float(out.max())


@dataclass(frozen=True)
class _Terms:
    """How pass 1 scores a row: min(y, y_cap) * rec_scale + importance * imp_scale + cosine * cos_scale, a
    term whose scale is 0 being left out (constant, or left to the exact pass), and how far that can be
    from the exact score (up to one constant shared by all rows)."""

    rec_scale: float
    y_cap: float
    imp_scale: float
    cos_scale: float
    slack: float


def _recency_terms(vectors: StreamVectors, now: float, config: StreamConfig) -> tuple[float, float, float, float]:
    """The recency term of pass 1: (scale, cap on y, error bound, magnitude); scale 0 leaves it out."""
    lim = vectors.limits()
    if config.weight_recency == 0 or config.decay == 1.0 or lim["last_min"] == lim["last_max"]:
        return 0.0, math.inf, 0.0, 0.0
    _, t0 = vectors.recency_proxy(config.decay)
    return kernels.recency_terms(config.weight_recency, config.decay, lim["last_min"], lim["last_max"], now, t0)


def _cosine_error(vectors: StreamVectors, low: float, high: float, screen_error: float = 0.0) -> float:
    """|float32 cosine - reference cosine| for every row (from the screen: `screen_error` its error), or inf if
    float32 cannot be trusted here (screen.cosine_error)."""
    trusted = vectors.trusted and math.isfinite(low + high)
    return cosine_error(vectors.dim, screen_error) if trusted else math.inf


@dataclass(frozen=True)
class _QueryFree:
    """The recency and importance terms of pass 1, which do not depend on the query."""

    rec_scale: float
    y_cap: float
    imp_scale: float
    slack: float
    magnitude: float


def _query_free_terms(vectors: StreamVectors, now: float, config: StreamConfig) -> _QueryFree:
    rec_scale, y_cap, slack, magnitude = _recency_terms(vectors, now, config)
    lim = vectors.limits()
    imp_scale, imp_magnitude = kernels.importance_terms(config.weight_importance, lim["imp_min"], lim["imp_max"])
    return _QueryFree(rec_scale, y_cap, imp_scale, slack, magnitude + imp_magnitude)


def _terms(vectors: StreamVectors, now: float, config: StreamConfig, cos_low: float, cos_high: float,
           error: float) -> _Terms:
    """Pass 1's scales and slack, given the float32 cosines' range and error (cosines unused if error is inf;
    error 0 with an empty range: every cosine is exactly equal)."""
    pre = _query_free_terms(vectors, now, config)
    weights = config.weight_recency + config.weight_importance + config.weight_relevance
    cos_scale, slack = kernels.relevance_terms(cos_low, cos_high, error, config.weight_relevance, pre.slack,
                                               pre.magnitude, weights)
    return _Terms(pre.rec_scale, pre.y_cap, pre.imp_scale, cos_scale, slack)


def _approximate(vectors: StreamVectors, query: F32, q_norm: float, now: float, config: StreamConfig) -> _Approx:
    cos: F32 | None = None
    low = high = 0.0
    error = math.inf
    if q_norm != 0.0:
        cos = _cosines(vectors, (query.astype(np.float64) / q_norm).astype(np.float32))
        low, high = float(cos.min()), float(cos.max())
        error = _cosine_error(vectors, low, high)
    terms = _terms(vectors, now, config, low, high, error if cos is not None else 0.0)
    score = np.zeros(vectors.n, np.float64)
    if terms.rec_scale:
        y, _ = vectors.recency_proxy(config.decay)
        np.multiply(np.minimum(y, terms.y_cap) if math.isfinite(terms.y_cap) else y, terms.rec_scale, out=score)
    if terms.imp_scale:
        score += vectors.importance * terms.imp_scale
    if terms.cos_scale and cos is not None:
        score += np.multiply(cos, terms.cos_scale, dtype=np.float64)
    if cos is None:
        return _Approx(score, terms.slack, None, 0.0, 0.0, 0.0)
    return _Approx(score, terms.slack, cos, error, low, high)


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
    lim = vectors.limits()
    return pow_range(vectors.last_accessed, lim["last_min"], lim["last_max"], now, decay)


def pow_range(times: F64, low: float, high: float, now: float, decay: float) -> tuple[float, float]:
    """min and max over `times` (whose extremes are low and high) of the reference's
    decay ** (max(now - t, 0) / 3600), computed by the reference's own pow()."""
    if decay == 1.0:
        return 1.0, 1.0

    def recency(rows: I64) -> list[float]:
        return [decay ** (max(now - at, 0.0) / 3600.0) for at in times[rows].tolist()]

    # pow() is monotonic except, perhaps, between values within an ulp: look at every time that close to
    # the extremes (for a decay below 0.99997 that is only the extremes themselves).
    window = 8 * 2 * _U64 * 3600.0 / -math.log(decay)
    if window < float(np.spacing(max(abs(low), abs(high)))):
        return decay ** (max(now - low, 0.0) / 3600.0), decay ** (max(now - high, 0.0) / 3600.0)
    return (min(recency(np.flatnonzero(times <= low + window))),
            max(recency(np.flatnonzero(times >= high - window))))


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
        unit = (query.astype(np.float64) / q_norm).astype(np.float32)
        cosine = _cosines(vectors, unit, compiled=kernels.ready()).astype(np.float64)
    parts = score_parts(config, cosine=cosine, importance=vectors.importance, last_accessed=vectors.last_accessed,
                        created=vectors.created, now=now)
    score = (config.weight_recency * parts[0] + config.weight_importance * parts[1]
             + config.weight_relevance * parts[2])
    rows = _top(score, vectors.created, vectors.ids, k)
    return Ranked(rows, score[rows], parts[0][rows], parts[1][rows], parts[2][rows], cosine[rows])


def rank(vectors: StreamVectors, query: npt.ArrayLike, now: float, config: StreamConfig, k: int, *,
         compiled: bool | None = None, text: str | None = None) -> Ranked:
    """The score of every memory, the top k rows with their parts; with the default profile, exactly
    rank_reference's answer (with `hybrid`, hybrid.rank_hybrid_reference's, `text` being the query's words).
    `compiled` chooses kernels.py's loops or numpy (default: the loops once they are loaded); both give the
    same answer."""
    k = min(k, vectors.n)
    if k <= 0:
        empty = np.zeros(0, np.float64)
        return Ranked(np.zeros(0, np.int64), empty, empty, empty, empty, empty)
    q = np.ascontiguousarray(query, dtype=np.float32).reshape(-1)
    if q.size != vectors.dim:
        raise StoreError(f"the query has {q.size} dimensions, the stream {vectors.dim}")
    if config.profile == "hybrid":
        from memstream.index.hybrid import rank_hybrid  # (it builds on this module)

        return rank_hybrid(vectors, q, text, now, config, k, compiled=kernels.ready() if compiled is None else compiled)
    spec = config.profile == "spec" and config.recency_from == "access"
    if spec and (kernels.ready() if compiled is None else compiled):
        ranked = _rank_compiled(vectors, q, now, config, k)
        if ranked is not None:
            return ranked
    q64 = q.astype(np.float64)
    q_norm = query_norm(q64)
    if not spec:
        return _rank_profile(vectors, q, q_norm, now, config, k)
    approx = _approximate(vectors, q, q_norm, now, config)
    return _exact(vectors, q64, q_norm, now, config, k, _candidates(approx.score, approx.slack, k), approx)


def _exact(vectors: StreamVectors, query: F64, q_norm: float, now: float, config: StreamConfig, k: int,
           rows: I64, approx: _Approx) -> Ranked:
    """Pass 2 of the numpy path: see _finish."""
    if approx.cos is None:
        return _finish(vectors, query, q_norm, now, config, k, rows, None)
    if math.isfinite(approx.cos_error):
        margin = 2 * approx.cos_error
        extremes = np.flatnonzero((approx.cos <= approx.cos_min + margin) | (approx.cos >= approx.cos_max - margin))
    else:
        extremes = np.arange(vectors.n, dtype=np.int64)
    return _finish(vectors, query, q_norm, now, config, k, rows, extremes.astype(np.int64))


def _rank_compiled(vectors: StreamVectors, query: F32, now: float, config: StreamConfig, k: int) -> Ranked | None:
    """The numpy path's two passes as compiled loops (kernels.py) around the product; None for a zero query
    (the numpy path handles it)."""
    q64, q_norm, unit = kernels.prepare(query)
    if q_norm == 0.0:
        return None
    decay = config.decay
    y, t0 = vectors.recency_proxy(decay) if decay != 1.0 else (vectors.importance, 0.0)
    lim = vectors.limits()
    last_range, imp_range = (lim["last_min"], lim["last_max"]), (lim["imp_min"], lim["imp_max"])
    weights = (config.weight_recency, config.weight_importance, config.weight_relevance)
    blocks = list(vectors.blocks())
    screen = vectors.screen()
    read: list[tuple[int, scan.Rows]]
    if screen is None:
        read, factors, dim_error = blocks, vectors.inverse_norms, cosine_error(vectors.dim)
    else:  # half the bytes, a wider bound
        read, factors, dim_error = list(screen.blocks()), screen.factors, cosine_error(vectors.dim, screen.error)
    found = scan.first_pass(read, unit, factors, y, t0, vectors.importance, now, decay, weights, last_range,
                            imp_range, dim_error if vectors.trusted else math.inf, k)
    if found is None:  # thousands of rows within the error bound of the k-th: the numpy path copes
        approx = _approximate(vectors, query, q_norm, now, config)
        return _exact(vectors, q64, q_norm, now, config, k, _candidates(approx.score, approx.slack, k), approx)
    rows, extremes = found
    if len(blocks) == 1:
        matrix, offset = blocks[0][1], 0
    else:
        matrix, offset = vectors.gather(np.concatenate([rows, extremes])), -1
    top, parts = kernels.finish(matrix, offset, rows, extremes, q64, q_norm, vectors.last_accessed,
                                vectors.importance, vectors.created, vectors.ids, now, decay, weights, last_range,
                                imp_range, k)
    return Ranked(top, parts[0], parts[1], parts[2], parts[3], parts[4])


def _finish(vectors: StreamVectors, query: F64, q_norm: float, now: float, config: StreamConfig, k: int,
            rows: I64, extremes: I64 | None) -> Ranked:
    """Pass 2: the candidates scored by the reference's operations, then sorted by its rule.

    `extremes` are the rows that can hold the stream's smallest or largest cosine (None: the query is zero,
    every cosine is 0); one exact pass covers them and the candidates, and the extremes of that superset are
    the stream's.
    """
    if extremes is None:
        cos, c_lo, c_hi = np.zeros(rows.size), 0.0, 0.0
    else:
        exact = exact_cosines(vectors, np.concatenate([rows, extremes]), query, q_norm)
        cos = exact[: rows.size]
        c_lo, c_hi = float(exact.min()), float(exact.max())
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
        """The top k memories for `query` (leaving out `exclude`); their last access becomes now.

        Two hops to the store besides the ranking: its check for other processes' writes, then one write that
        reads the winners, touches them and counts the query's embedding call (`Store.retrieved`)."""
        limit = k or self.config.k
        now = to_timestamp(at or self.clock.now())
        try:
            with self.models.deferred_usage():  # counted in memory here, written with the touch
                embedded = await self.models.embed([query], stream=stream)
            ids, ranked = await self._ranked(embedded[0], stream, limit + len(exclude), at, query)
            chosen = [i for i, memory_id in enumerate(ids) if memory_id not in exclude][:limit]
            usage = self.models.take_usage()
            self.index.hint(stream, [ids[i] for i in chosen], [int(ranked.rows[i]) for i in chosen])
            try:  # the touch reaches the index as the store announces it
                found = await self.store.retrieved([ids[i] for i in chosen], now, usage=usage)
            except BaseException:
                self.models.restore_usage(usage)
                raise
        except BaseException:
            with contextlib.suppress(StoreError):  # what was counted (a failed call too) is kept; the first error
                await self.models.flush_usage()    # is the one to report
            raise
        return [item for item, _ in _scored(ids, ranked, found, chosen)]

    async def explain(self, query: str, *, stream: str, k: int | None = None,
                      at: datetime | None = None) -> list[ScoredMemory]:
        """The same ranking, read-only."""
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
