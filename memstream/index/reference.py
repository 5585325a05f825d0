"""The spec's formula one memory at a time in plain Python: the test oracle that every fast path matches.

Every operation is spelled out in float64 and in a fixed order (sums left to right), so that the fast paths
(spec.py, hybrid.py) can reproduce the very same floats for the memories they score exactly.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from memstream.config import StreamConfig
from memstream.records import Source

__all__ = ["cosine", "neighbour_best", "normalized", "rank_reference"]


def cosine(a: Sequence[float], b: Sequence[float]) -> float:
    """The reference's cosine similarity (0 if either vector is zero)."""
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


def normalized(values: list[float]) -> list[float]:
    """Min-max over the list; where every value is equal, 0.5 for all."""
    low, high = min(values), max(values)
    return [0.5] * len(values) if high - low <= 0 else [(v - low) / (high - low) for v in values]


def rank_reference(memories: Sequence[tuple[int, float, float, float, Sequence[float]]],
                   query: Sequence[float], now: float, config: StreamConfig, k: int) -> list[int]:
    """The spec's formula one memory at a time in plain Python: the test oracle and a benchmark baseline.

    `memories` are (id, created, last_accessed, importance, embedding); returns the top k ids.
    """
    if not memories:
        return []
    rec = normalized([config.decay ** (max(now - m[2], 0.0) / 3600.0) for m in memories])
    imp = normalized([float(m[3]) for m in memories])
    rel = normalized([cosine(m[4], query) for m in memories])
    scored = []
    for i, m in enumerate(memories):
        score = config.weight_recency * rec[i] + config.weight_importance * imp[i] + config.weight_relevance * rel[i]
        scored.append((-score, -m[1], -m[0]))
    scored.sort()
    return [-s[2] for s in scored[:k]]


def neighbour_best(ids: Sequence[int], created: Sequence[float], channels: Sequence[str | None],
                   relevance: Sequence[float], gap: float,
                   sources: Sequence[Source | None] = ()) -> list[float]:
    """For each memory, the best relevance of its neighbours (0.0 if none): the memories just before and after
    it in its channel (ordered by creation, then id) said within `gap` seconds of it, and the message it replies
    to (`sources`' reply_to, found by message id among these memories)."""
    by_channel: dict[str, list[int]] = {}
    for i, channel in enumerate(channels):
        if channel is not None:
            by_channel.setdefault(channel, []).append(i)
    best = [0.0] * len(ids)
    for members in by_channel.values():
        members.sort(key=lambda i: (created[i], ids[i]))
        for at, i in enumerate(members):
            for j in members[max(at - 1, 0):at] + members[at + 1:at + 2]:
                if abs(created[i] - created[j]) <= gap:
                    best[i] = max(best[i], relevance[j])
    by_message = {s.message_id: i for i, s in enumerate(sources) if s is not None and s.message_id}
    for i, s in enumerate(sources):
        if s is not None and s.reply_to and s.reply_to != s.message_id and s.reply_to in by_message:
            best[i] = max(best[i], relevance[by_message[s.reply_to]])
    return best
