"""The `spec` profile's ranking: the paper's formula, exactly, by the two passes of exact.py.

`rank_spec` gives the same top k as `rank_reference` (reference.py), the spec's formula computed memory by
memory in float64, bit for bit. Pass 1 scores every memory in float32 within a proven error bound: recency from
each row's cached exponential (StreamVectors.recency_proxy), importance, and the float32 cosine, each scaled by
_terms.py's rules; pass 2 scores again, with the reference's own operations, the memories that bound cannot
separate from the top k and the extremes the min-max normalization needs. Both passes run as compiled loops
(_kernels.py, pass 1 split over the cores by _scan.py) once they are loaded, as numpy otherwise: the same answer.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from memstream.config import StreamConfig
from memstream.index import _kernels as kernels
from memstream.index import _scan as scan
from memstream.index._terms import Columns, Scoring, importance_terms, recency_terms, relevance_terms
from memstream.index.exact import (
    Ranked,
    candidates,
    cosines,
    error_bound,
    exact_cosines,
    pow_range,
    query_norm,
    scaled,
)
from memstream.index.screen import cosine_error
from memstream.index.vectors import StreamVectors
from memstream.store.arrays import F32, F64, I64

__all__ = ["rank_spec"]


def rank_spec(vectors: StreamVectors, query: F32, now: float, config: StreamConfig, k: int, *,
              compiled: bool) -> Ranked:
    """The top k rows (0 < k <= vectors.n) for a float32 query of the stream's dimension, exactly
    rank_reference's answer; by _kernels.py's loops where `compiled` (the same answer)."""
    if compiled:
        ranked = _rank_compiled(vectors, query, now, config, k)
        if ranked is not None:
            return ranked
    q64 = query.astype(np.float64)
    return _rank_numpy(vectors, query, q64, query_norm(q64), now, config, k)


def _rank_numpy(vectors: StreamVectors, query: F32, q64: F64, q_norm: float, now: float, config: StreamConfig,
                k: int) -> Ranked:
    """Both passes in numpy."""
    approx = _approximate(vectors, query, q_norm, now, config)
    return _exact(vectors, q64, q_norm, now, config, k, candidates(approx.score, approx.slack, k), approx)


@dataclass(frozen=True)
class _Approx:
    """Pass 1: every memory's score up to one shared constant, each within `slack` of the exact one."""

    score: F64
    slack: float
    cos: F32 | None  # None: the query is zero, every cosine is exactly 0
    cos_error: float
    cos_min: float
    cos_max: float


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
    return recency_terms(config.weight_recency, config.decay, lim["last_min"], lim["last_max"], now, t0)


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
    imp_scale, imp_magnitude = importance_terms(config.weight_importance, lim["imp_min"], lim["imp_max"])
    return _QueryFree(rec_scale, y_cap, imp_scale, slack, magnitude + imp_magnitude)


def _terms(vectors: StreamVectors, now: float, config: StreamConfig, cos_low: float, cos_high: float,
           error: float) -> _Terms:
    """Pass 1's scales and slack, given the float32 cosines' range and error (cosines unused if error is inf;
    error 0 with an empty range: every cosine is exactly equal)."""
    pre = _query_free_terms(vectors, now, config)
    weights = config.weight_recency + config.weight_importance + config.weight_relevance
    cos_scale, slack = relevance_terms(cos_low, cos_high, error, config.weight_relevance, pre.slack, pre.magnitude,
                                       weights)
    return _Terms(pre.rec_scale, pre.y_cap, pre.imp_scale, cos_scale, slack)


def _approximate(vectors: StreamVectors, query: F32, q_norm: float, now: float, config: StreamConfig) -> _Approx:
    cos: F32 | None = None
    low = high = 0.0
    error = math.inf
    if q_norm != 0.0:
        cos = cosines(vectors, (query.astype(np.float64) / q_norm).astype(np.float32))
        low, high = float(cos.min()), float(cos.max())
        error = error_bound(vectors, low, high)
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


def _recency_range(vectors: StreamVectors, now: float, decay: float) -> tuple[float, float]:
    """The reference's min and max recency over the stream (its pow() at the extreme last accesses)."""
    lim = vectors.limits()
    return pow_range(vectors.last_accessed, lim["last_min"], lim["last_max"], now, decay)


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
    """The numpy path's two passes as compiled loops (_kernels.py) around the product; None for a zero query
    (the numpy path handles it)."""
    q64, q_norm, unit = kernels.prepare(query)
    if q_norm == 0.0:
        return None
    decay = config.decay
    y, t0 = vectors.recency_proxy(decay) if decay != 1.0 else (vectors.importance, 0.0)
    scoring = _scoring(vectors, now, config)
    blocks = list(vectors.blocks())
    found = scan.first_pass(_source(vectors, blocks), unit, y, t0, vectors.importance, scoring, k)
    if found is None:  # thousands of rows within the error bound of the k-th: the numpy path copes
        return _rank_numpy(vectors, query, q64, q_norm, now, config, k)
    if len(blocks) == 1:
        matrix, offset = blocks[0][1], 0
    else:
        matrix, offset = vectors.gather(np.concatenate([found.rows, found.extremes])), -1
    columns = Columns(vectors.last_accessed, vectors.importance, vectors.created, vectors.ids)
    top, parts = kernels.finish(matrix, offset, found, q64, q_norm, columns, scoring, k)
    return Ranked(top, parts[0], parts[1], parts[2], parts[3], parts[4])


def _scoring(vectors: StreamVectors, now: float, config: StreamConfig) -> Scoring:
    """The query's scalars for the loops, all floats (one compiled signature whatever types the config holds)."""
    lim = vectors.limits()
    return Scoring(float(now), float(config.decay), float(config.weight_recency), float(config.weight_importance),
                   float(config.weight_relevance), lim["last_min"], lim["last_max"], lim["imp_min"], lim["imp_max"])


def _source(vectors: StreamVectors, blocks: list[tuple[int, F32]]) -> scan.Source:
    """What pass 1 reads: the stream's screen if it has one (half the bytes, a wider bound), else its rows."""
    screen = vectors.screen()
    read: list[tuple[int, scan.Rows]]
    if screen is None:
        read, factors, error = blocks, vectors.inverse_norms, cosine_error(vectors.dim)
    else:
        read, factors, error = list(screen.blocks()), screen.factors, cosine_error(vectors.dim, screen.error)
    return scan.Source(read, factors, error if vectors.trusted else math.inf)


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
    recency = scaled(raw, r_lo, r_hi)
    importance = scaled(vectors.importance[rows], lim["imp_min"], lim["imp_max"])
    relevance = scaled(cos, c_lo, c_hi)
    score = (config.weight_recency * recency + config.weight_importance * importance
             + config.weight_relevance * relevance)
    order = np.lexsort((-vectors.ids[rows], -vectors.created[rows], -score))[:k]
    return Ranked(rows[order], score[order], recency[order], importance[order], relevance[order], cos[order])
