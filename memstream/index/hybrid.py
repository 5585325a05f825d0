"""The `hybrid` profile's ranking (profiles.py): dense and lexical relevance, recency from creation.

`rank_hybrid` gives the same top k as `rank_hybrid_reference`, the profile computed memory by memory in
float64. As for `spec` (spec.py), by exact.py's two passes: a float32 pass over the matrix scores every memory
within a bound, and the memories that bound cannot separate from the top k, with the extremes the normalization
needs, are scored again with the reference's own operations. The lexical scores are the reference's already
(lexical.py), and recency from creation needs no power per memory per query: one cached exponential per row,
rescaled. A reflection's grounding (grounding.py) is query-free too: its term joins that cached part.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np
import numpy.typing as npt

from memstream.config import StreamConfig
from memstream.errors import StoreError
from memstream.index import _kernels as kernels
from memstream.index import _scan as scan
from memstream.index._terms import Candidates, Scales
from memstream.index.cues import asks_when, author_key, channel_key, holds_time, named
from memstream.index.exact import (
    Ranked,
    approximate_cosines,
    candidates,
    exact_cosines,
    pow_range,
    query_norm,
    scaled,
)
from memstream.index.grounding import Grounding, grounding_reference
from memstream.index.levers import Levers, levers
from memstream.index.lexical import bm25_reference
from memstream.index.profiles import min_max
from memstream.index.reference import cosine, neighbour_best, normalized
from memstream.index.vectors import StreamVectors
from memstream.records import Source
from memstream.store.arrays import F64, I64

__all__ = ["rank_hybrid", "rank_hybrid_reference"]

_PROXY_ERROR = 1e-9  # |min-max of the cached exponential - min-max of the reference's pow()|, generously


class _Lexical(NamedTuple):
    """Every row's BM25 score for the query (0 where no term matches), and the largest."""

    scores: F64
    top: float


def rank_hybrid_reference(memories: Sequence[tuple[int, float, float, float, Sequence[float], str]],
                          query: Sequence[float], query_text: str, now: float, config: StreamConfig,
                          k: int, sources: Sequence[Source | None] | None = None, *,
                          evidence: Mapping[int, Sequence[int]] | None = None) -> list[int]:
    """The profile one memory at a time in plain Python: the test oracle.

    `memories` are (id, created, last_accessed, importance, embedding, text), `sources` where each came from
    (None: nowhere known); `evidence` maps each reflection of the stream to what it cites (grounding.py; None:
    none); returns the top k ids.
    """
    if not memories:
        return []
    rec = normalized([config.decay ** (max(now - m[1], 0.0) / 3600.0) for m in memories])
    imp = normalized([float(m[3]) for m in memories])
    cos = normalized([cosine(m[4], query) for m in memories])
    lex = bm25_reference([m[5] for m in memories], query_text, config.stemmer)
    top, share = max(lex), config.lexical_weight
    grounded = grounding_reference(evidence or {})
    rel0 = []
    for i in range(len(memories)):
        relevance = (1.0 - share) * cos[i]
        if top > 0.0:
            relevance = relevance + share * (lex[i] / top)
        rel0.append(relevance)
    found = list(sources) if sources is not None else [None] * len(memories)
    best = neighbour_best([m[0] for m in memories], [m[1] for m in memories],
                          [None if s is None else channel_key(s) for s in found], rel0,
                          config.neighbour_gap_minutes * 60.0, found)
    authors = [None if s is None else author_key(s) for s in found]
    people = {(key, s.author or "") for key, s in zip(authors, found, strict=True) if key is not None and s}
    named_keys = named(query_text, people) if query_text else set()
    when = bool(query_text) and asks_when(query_text)
    scored = []
    for i, m in enumerate(memories):
        relevance = rel0[i] + config.neighbour_weight * best[i]
        relevance = relevance + config.name_weight * (1.0 if authors[i] in named_keys else 0.0)
        relevance = relevance + config.time_weight * (1.0 if when and holds_time(m[5]) else 0.0)
        score = config.weight_recency * rec[i] + config.weight_importance * imp[i] + config.weight_relevance * relevance
        if config.grounding_weight > 0:
            score = score - config.grounding_weight * (1.0 - grounded.get(m[0], 1.0))
        scored.append((-score, -m[1], -m[0]))
    scored.sort()
    return [-s[2] for s in scored[:k]]


def _lexical(vectors: StreamVectors, text: str | None, config: StreamConfig, compiled: bool) -> _Lexical:
    """Every row's BM25 score for the query (0 where no term matches) and the largest."""
    if config.lexical_weight == 0 or config.weight_relevance == 0 or not text:
        return _Lexical(np.zeros(vectors.n, np.float64), 0.0)
    if vectors.terms is None:
        raise StoreError("this stream was loaded without its lexical index (VectorIndex(lexical=True))")
    scores = vectors.terms.score(text, vectors.n, compiled, out=vectors.scratch.take("bm25", vectors.n, np.float64))
    return _Lexical(scores, float(scores.max()) if scores.size else 0.0)


def _recency(vectors: StreamVectors, now: float, decay: float) -> tuple[F64, float]:
    """Every row's min-max recency from creation, and how far it may be from the reference's."""
    created = vectors.created
    if decay == 1.0:
        return np.full(vectors.n, 0.5), 0.0
    y, t0 = vectors.creation_proxy(decay)
    if now >= t0:  # decay ** ((now - created) / 3600) = y * decay ** ((now - t0) / 3600): the factor cancels
        return min_max(y), _PROXY_ERROR
    return min_max(np.power(decay, np.maximum(now - created, 0.0) / 3600.0)), _PROXY_ERROR


def _grounding(vectors: StreamVectors, config: StreamConfig) -> Grounding | None:
    """The stream's grounding when the profile weighs it (None: every memory counts as grounded)."""
    return vectors.grounding if config.grounding_weight > 0 else None


def _query_free(vectors: StreamVectors, now: float, config: StreamConfig) -> tuple[F64, float]:
    """w_rec * recency + w_imp * importance - w_g * (1 - grounding) for every row (possibly shared), and its error
    bound. From the newest creation on, it does not depend on the time of the query: it is computed once per set
    of rows (and of groundings)."""
    wr, wi, wg = config.weight_recency, config.weight_importance, config.grounding_weight
    grounding = _grounding(vectors, config)

    def make() -> F64:
        recency, _ = _recency(vectors, now, config.decay)
        lim = vectors.limits()
        out: F64 = wr * recency + wi * scaled(vectors.importance, lim["imp_min"], lim["imp_max"])
        if grounding is not None:
            out -= wg * (1.0 - grounding.column(vectors.ids))
        return out

    if config.decay != 1.0 and now < float(vectors.created.max()):
        return make(), wr * _PROXY_ERROR
    version = None if grounding is None else (wg, grounding.version)
    return vectors.memo(("hybrid", config.decay, wr, wi, version), make), wr * _PROXY_ERROR


def rank_hybrid(vectors: StreamVectors, query: npt.NDArray[np.float32], text: str | None, now: float,
                config: StreamConfig, k: int, *, compiled: bool = False) -> Ranked:
    """The top k rows of the stream under the `hybrid` profile, exactly rank_hybrid_reference's answer, by
    _kernels.py's loops where `compiled` (the same answer)."""
    q64 = query.astype(np.float64)
    q_norm = query_norm(q64)
    lexical = _lexical(vectors, text, config, compiled)
    lever = levers(vectors, text, config)
    share, wl = config.lexical_weight, config.weight_relevance
    base, slack = _query_free(vectors, now, config)  # (shared: not to be written to)
    score: F64 | None = None
    extremes: I64 | None = None
    if q_norm != 0.0:
        cos, low, high, error = approximate_cosines(vectors, (q64 / q_norm).astype(np.float32), compiled)
        if high - low > 4 * error:
            # up to a constant shared by every row (which cannot change the candidates)
            cos_scale = wl * (1.0 - share) / (high - low)
            # each of the cosine, the low and the high is off by at most `error`
            rel_error = (1.0 - share) * 4 * error / (high - low - 2 * error)
            slack += wl * rel_error
            margin = 2 * error
            lex_scale = wl * share / lexical.top if lexical.top > 0.0 else 0.0
            added = None
            if lever is not None:  # a neighbour's rel0 is off by as much as a row's own
                slack += wl * lever.neighbour * rel_error
                if not compiled:
                    spread = (cos.astype(np.float64) - low) / (high - low)  # (float64: no rounding beyond the bound)
                    added = _context(lever, _rel0(spread, share, lexical), wl)
            if compiled:
                keywords, scale = lexical.scores, lex_scale
                if lever is not None:  # the keyword and context terms in one compiled pass
                    keywords, scale = vectors.scratch.take("keywords", vectors.n, np.float64), 1.0
                    boost = lever.boost(vectors.scratch.take("boost", vectors.n, np.float64))
                    kernels.loops()["context"](cos, low, high - low, share, lexical.scores,
                                               1.0 / lexical.top if lexical.top > 0.0 else 0.0, lex_scale,
                                               lever.prev, lever.next, lever.parent, boost, lever.neighbour,
                                               wl, keywords)
                found = _compiled_candidates(cos, base, keywords, cos_scale, scale, 2 * (slack + 1e-12),
                                             (low + margin, high - margin), k)
                if found is not None:
                    return _exact(vectors, q64, q_norm, now, config, k, found, lexical, lever)
            if compiled and lever is not None:  # (more candidates than the compiled pass keeps)
                spread = (cos.astype(np.float64) - low) / (high - low)
                added = _context(lever, _rel0(spread, share, lexical), wl)
            score = np.multiply(cos, cos_scale, dtype=np.float64)
            score += base
            if added is not None:
                score += added
            extremes = np.flatnonzero((cos <= low + margin) | (cos >= high - margin)).astype(np.int64)
        else:
            slack = math.inf
            extremes = np.arange(vectors.n, dtype=np.int64)
    if score is None:  # every cosine is 0 (or none is trusted): every rel0 is exactly known (or slack is inf)
        score = base.copy()
        if lever is not None and math.isfinite(slack):
            score += _context(lever, _rel0(np.full(vectors.n, 0.5), share, lexical), wl)
    if lexical.top > 0.0:
        score += lexical.scores * (wl * share / lexical.top)
    rows = candidates(score, slack + 1e-12, k) if math.isfinite(slack) else np.arange(vectors.n, dtype=np.int64)
    found = Candidates(rows, np.zeros(0, np.int64) if extremes is None else extremes)
    return _exact(vectors, q64, q_norm, now, config, k, found, lexical, lever)


def _rel0(cos: npt.NDArray[np.floating[Any]], share: float, lexical: _Lexical, rows: I64 | None = None) -> F64:
    """Relevance before the context terms, from min-max cosines, in the reference's operations."""
    out: F64 = (1.0 - share) * cos.astype(np.float64, copy=False)
    if lexical.top > 0.0:
        out = out + share * ((lexical.scores if rows is None else lexical.scores[rows]) / lexical.top)
    return out


def _context(lever: Levers, rel0: F64, weight: float) -> F64:
    """weight * (every row's relevance with its context terms - its rel0), for pass 1."""
    added: F64 = lever.neighbour * lever.best(rel0) if lever.neighbour else np.zeros(rel0.size)
    for boost in (lever.names, lever.times):
        if boost is not None:
            added += boost
    added *= weight
    return added


def _compiled_candidates(cos: npt.NDArray[np.float32], base: F64, lexical: F64, cos_scale: float, lex_scale: float,
                         gap: float, cuts: tuple[float, float], k: int) -> Candidates | None:
    """What the numpy lines after it compute, in one compiled pass (_loops' `candidates`, with the query-free
    part as its `y` and BM25 as its `importance`): the rows whose score is within `gap` of the k-th best, and
    those at or beyond `cuts`, which can hold the extreme cosines; None if more than scan.ROOM of either."""
    loops = kernels.loops()
    room = min(scan.ROOM, cos.size)
    best, rows, extremes = np.full(k, -np.inf), np.empty(room, np.int64), np.empty(room, np.int64)
    scales = Scales(1.0, math.inf, lex_scale, cos_scale, gap, *cuts)
    count, ext = loops["candidates"](cos, 0, cos.size, base, lexical, scales, best, rows, extremes)
    if count > room or ext > room:
        return None
    kept = loops["cut"](cos, rows[:count], base, lexical, scales, best[0] - gap)
    return Candidates(rows[:kept], extremes[:ext])


def _exact(vectors: StreamVectors, query: F64, q_norm: float, now: float, config: StreamConfig, k: int,
           found: Candidates, lexical: _Lexical, lever: Levers | None = None) -> Ranked:
    """The candidates scored by the reference's operations, then sorted by its rule."""
    rows = found.rows
    near = lever.neighbour_rows(rows) if lever is not None and lever.neighbour else np.zeros(0, np.int64)
    if q_norm == 0.0:  # every cosine is 0
        cos, near_cos, c_lo, c_hi = np.zeros(rows.size), np.zeros(near.size), 0.0, 0.0
    else:
        exact = exact_cosines(vectors, np.concatenate([rows, near, found.extremes]), query, q_norm)
        cos, near_cos = exact[: rows.size], exact[rows.size: rows.size + near.size]
        c_lo, c_hi = float(exact.min()), float(exact.max())
    created = vectors.created
    decay = config.decay
    r_lo, r_hi = pow_range(created, float(created.min()), float(created.max()), now, decay)
    raw = np.array([decay ** (max(now - at, 0.0) / 3600.0) for at in created[rows].tolist()])
    recency = scaled(raw, r_lo, r_hi)
    lim = vectors.limits()
    importance = scaled(vectors.importance[rows], lim["imp_min"], lim["imp_max"])
    share = config.lexical_weight
    relevance = _rel0(scaled(cos, c_lo, c_hi), share, lexical, rows)
    if lever is not None:
        best = np.zeros(rows.size)
        if lever.neighbour:
            near_rel = _rel0(scaled(near_cos, c_lo, c_hi), share, lexical, near)
            for part, links in enumerate((lever.prev, lever.next, lever.parent)):
                found_rel = near_rel[part * rows.size: (part + 1) * rows.size]
                best = np.maximum(best, np.where(links[rows] >= 0, found_rel, 0.0))
        relevance = lever.add(relevance, best, rows)
    score = (config.weight_recency * recency + config.weight_importance * importance
             + config.weight_relevance * relevance)
    grounding = _grounding(vectors, config)
    if grounding is not None:
        score = score - config.grounding_weight * (1.0 - grounding.column(vectors.ids[rows]))
    order = np.lexsort((-vectors.ids[rows], -created[rows], -score))[:k]
    return Ranked(rows[order], score[order], recency[order], importance[order], relevance[order], cos[order])
