"""Scoring profiles: how recency, importance and relevance become the three parts of a memory's score.

`spec` is the paper's formula exactly: exponential recency since last access (0.995 per hour), the stored
importance and cosine relevance, each min-max normalized over the whole stream.

`actr` is for personas that live for months. Min-max normalizing an exponential recency over a long stream
gives nearly a full point to the last day and nearly nothing to everything older, which swamps relevance.
`actr` keeps every part in log-odds units, with no whole-stream normalization:

    recency    = ln(t_created^-d + t_accessed^-d)   ACT-R base-level activation, t in hours (>= 1 minute),
                                                      d = actr_decay (0.5); a never-retrieved memory counts
                                                      its creation only
    importance = ln(importance)                      an importance of 10 is ten times the prior odds of 1
    relevance  = cosine / relevance_temperature      0.05: a cosine 0.05 higher is e times the odds

score = w_rec*recency + w_imp*importance + w_rel*relevance. A power law forgets slowly: going from a day old
to a month old costs 1.7 units, the same as 0.085 of cosine, so an old, relevant memory stays reachable.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from memstream.config import StreamConfig

__all__ = ["PROFILES", "min_max", "score_parts"]

PROFILES = ("spec", "actr")
Floats = npt.NDArray[np.float64]
_MIN_HOURS = 1.0 / 60.0


def min_max(values: Floats) -> Floats:
    """Scale to 0..1 over the stream; where every value is equal, 0.5 for all."""
    if values.size == 0:
        return values
    low, high = float(values.min()), float(values.max())
    if high - low <= 0.0:
        return np.full_like(values, 0.5)
    out: Floats = (values - low) / (high - low)
    return out


def _hours(now: float, then: npt.NDArray[np.float64]) -> Floats:
    out: Floats = np.maximum(now - then, 0.0) / 3600.0
    return out


def score_parts(config: StreamConfig, *, cosine: Floats, importance: Floats, last_accessed: Floats,
                created: Floats, now: float) -> tuple[Floats, Floats, Floats]:
    """The (recency, importance, relevance) parts of every memory, on the profile's scale."""
    if config.profile == "actr":
        return _actr(config, cosine, importance, last_accessed, created, now)
    return _spec(config, cosine, importance, last_accessed, created, now)


def _spec(config: StreamConfig, cosine: Floats, importance: Floats, last_accessed: Floats, created: Floats,
          now: float) -> tuple[Floats, Floats, Floats]:
    since_access = np.power(config.decay, _hours(now, last_accessed))
    if config.recency_from == "created":
        recency = np.power(config.decay, _hours(now, created))
    elif config.recency_from == "both":
        recency = (since_access + np.power(config.decay, _hours(now, created))) / 2.0
    else:
        recency = since_access
    return min_max(recency), min_max(importance), min_max(cosine)


def _actr(config: StreamConfig, cosine: Floats, importance: Floats, last_accessed: Floats, created: Floats,
          now: float) -> tuple[Floats, Floats, Floats]:
    d = config.actr_decay
    since_created = np.maximum(_hours(now, created), _MIN_HOURS)
    since_access = np.maximum(_hours(now, last_accessed), _MIN_HOURS)
    accessed = last_accessed > created
    strength = since_created ** -d + np.where(accessed, since_access ** -d, 0.0)
    recency: Floats = np.log(strength)
    return recency, np.log(np.maximum(importance, 1.0)), cosine / config.relevance_temperature
