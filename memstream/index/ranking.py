"""`rank`: the top k memories of a stream for a query, by the stream's scoring profile (profiles.py).

The default profile, `spec` with recency from last access, is ranked exactly (spec.py: the same answer as
rank_reference, bit for bit), and so is `hybrid` (hybrid.py). The other profiles and recency options are
scored from the same float32 pass over the matrix, in float64 from there on.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from memstream.config import StreamConfig
from memstream.errors import StoreError
from memstream.index import _kernels as kernels
from memstream.index.exact import Ranked, cosines, query_norm
from memstream.index.hybrid import rank_hybrid
from memstream.index.profiles import score_parts
from memstream.index.spec import rank_spec
from memstream.index.vectors import StreamVectors
from memstream.store.arrays import F32, F64, I64

__all__ = ["rank"]


def rank(vectors: StreamVectors, query: npt.ArrayLike, now: float, config: StreamConfig, k: int, *,
         compiled: bool | None = None, text: str | None = None) -> Ranked:
    """The score of every memory, the top k rows with their parts; with the default profile, exactly
    rank_reference's answer (with `hybrid`, hybrid.rank_hybrid_reference's, `text` being the query's words).
    `compiled` chooses _kernels.py's loops or numpy (default: the loops once they are loaded); both give the
    same answer."""
    k = min(k, vectors.n)
    if k <= 0:
        empty = np.zeros(0, np.float64)
        return Ranked(np.zeros(0, np.int64), empty, empty, empty, empty, empty)
    q = np.ascontiguousarray(query, dtype=np.float32).reshape(-1)
    if q.size != vectors.dim:
        raise StoreError(f"the query has {q.size} dimensions, the stream {vectors.dim}")
    if config.profile == "hybrid":
        return rank_hybrid(vectors, q, text, now, config, k, compiled=kernels.ready() if compiled is None else compiled)
    if config.profile == "spec" and config.recency_from == "access":
        return rank_spec(vectors, q, now, config, k, compiled=kernels.ready() if compiled is None else compiled)
    return _rank_profile(vectors, q, query_norm(q.astype(np.float64)), now, config, k)


def _rank_profile(vectors: StreamVectors, query: F32, q_norm: float, now: float, config: StreamConfig,
                  k: int) -> Ranked:
    """Any profile: parts from profiles.score_parts over float32 cosines."""
    if q_norm == 0.0:
        cosine = np.zeros(vectors.n, np.float64)
    else:
        unit = (query.astype(np.float64) / q_norm).astype(np.float32)
        cosine = cosines(vectors, unit, compiled=kernels.ready()).astype(np.float64)
    parts = score_parts(config, cosine=cosine, importance=vectors.importance, last_accessed=vectors.last_accessed,
                        created=vectors.created, now=now)
    score = (config.weight_recency * parts[0] + config.weight_importance * parts[1]
             + config.weight_relevance * parts[2])
    rows = _top(score, vectors.created, vectors.ids, k)
    return Ranked(rows, score[rows], parts[0][rows], parts[1][rows], parts[2][rows], cosine[rows])


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
