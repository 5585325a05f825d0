"""The `hybrid` profile's context terms (context.py, cues.py), added to a memory's relevance:

    relevance = rel0 + N * max(rel0 of its neighbours, 0 if none) + W_name * named + W_time * timed
    rel0      = (1 - L) * minmax(cosine) + L * bm25 / max(bm25)       (hybrid.py's relevance before this)

N = neighbour_weight (its neighbours: the memories just before and after it in its channel, said within
neighbour_gap_minutes of it, and the message it replies to where Discord says so), W_name = name_weight
(named: written by someone the query names), W_time = time_weight (timed: a "when" question, and the memory
holds a time). Each is 0 to switch it off.

For pass 1 (hybrid.rank_hybrid): every row's terms from the float32 cosines, within a bound (a maximum of
values each within e of their exact value is within e of its exact value); for pass 2: the exact terms of the
candidates, by the reference's operations in its order.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from memstream.config import StreamConfig
from memstream.errors import StoreError
from memstream.index.cues import asks_when
from memstream.index.vectors import StreamVectors
from memstream.store.arrays import F64, I64

__all__ = ["Levers", "levers"]


@dataclass(frozen=True)
class Levers:
    """What a query's context terms need, for the rows of one stream."""

    neighbour: float  # N: 0 leaves neighbours out
    prev: I64  # per row: the neighbour before (-1: none within the gap)
    next: I64
    parent: I64  # per row: the message it replies to (-1: none here)
    names: F64 | None  # per row: W_name * named (None: 0 for all)
    times: F64 | None  # per row: W_time * timed (None: 0 for all)

    def best(self, rel0: F64, rows: I64 | None = None) -> F64:
        """max(rel0 of the neighbours, 0) for `rows` (every row if None), from every row's rel0."""
        out: F64 = np.zeros(rel0.size if rows is None else rows.size)
        for near in (self.prev, self.next, self.parent):
            at = near if rows is None else near[rows]
            out = np.maximum(out, np.where(at >= 0, rel0[np.maximum(at, 0)], 0.0))
        return out

    def neighbour_rows(self, rows: I64) -> I64:
        """The neighbours of these rows (the row itself where it has none): before, after, then the parent."""
        out: I64 = np.concatenate([np.where(near[rows] >= 0, near[rows], rows)
                                   for near in (self.prev, self.next, self.parent)])
        return out

    def boost(self, out: F64 | None = None) -> F64:
        """Every row's names and times terms summed (for pass 1: not in the reference's order), in `out` if given."""
        if out is None:
            out = np.zeros(self.prev.size)
        else:
            out.fill(0.0)
        for boost in (self.names, self.times):
            if boost is not None:
                out += boost
        return out

    def add(self, rel0: F64, best: F64, rows: I64 | None = None) -> F64:
        """rel0 with the context terms added, one at a time in the reference's order."""
        out: F64 = rel0 + self.neighbour * best if self.neighbour else rel0
        for boost in (self.names, self.times):
            if boost is not None:
                out = out + (boost if rows is None else boost[rows])
        return out


def levers(vectors: StreamVectors, text: str | None, config: StreamConfig) -> Levers | None:
    """The context terms of a query over this stream (None: every term is 0 for every row)."""
    n_weight, name_weight, time_weight = config.neighbour_weight, config.name_weight, config.time_weight
    if config.weight_relevance == 0 or not (n_weight or name_weight or time_weight):
        return None
    context = vectors.context
    if context is None:
        raise StoreError("this stream was loaded without its context (VectorIndex(context=True))")
    n = vectors.n
    named = context.named_rows(text, n) if text and name_weight else None
    names: F64 | None = None
    if named is not None:
        names = vectors.scratch.take("names", n, np.float64, zero=True)
        names[named] = name_weight
    times = None
    if text and time_weight and asks_when(text):  # (time_weight * each flag as 0.0 or 1.0)
        times = np.multiply(context.timed[:n], time_weight, out=vectors.scratch.take("times", n, np.float64))
    if not n_weight and names is None and times is None:
        return None
    if n_weight:
        prev, after, parent = context.neighbours(vectors.created, config.neighbour_gap_minutes * 60.0)
    else:
        prev = after = parent = np.full(n, -1, np.int64)
    return Levers(n_weight, prev, after, parent, names, times)
