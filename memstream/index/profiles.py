"""Scoring profiles: how recency, importance and relevance become the three parts of a memory's score.

`spec` is the paper's formula exactly: exponential recency since last access (0.995 per hour), the stored
importance and cosine relevance, each min-max normalized over the whole stream, weights 1, 1, 1.

`hybrid` is for a persona that lives for months (measured on real conversations: README, "Retrieval over
months"). Each part is normalized over the whole stream as in `spec`, but:

    relevance  = (1 - L) * minmax(cosine) + L * bm25 / max(bm25)    L = lexical_weight (0.4); bm25: lexical.py
                 + the context terms (levers.py): 0.4 x the best relevance of its channel neighbours within an
                 hour, 0.2 if a person the query names wrote it, 0.2 if the query asks "when" and it holds a time
    recency    = minmax(decay ** hours since *creation*)              being retrieved wins a memory nothing
    importance = minmax(importance)
    score      = 0.05 * recency + 0.2 * importance + 1 * relevance - G * (1 - grounding)    G = grounding_weight (0.5)

with those weights unless the persona file sets them. `grounding` is 1 for an observation and an insight drawn
from observations, 0.5 for an insight drawn from such insights, less the further from what happened
(grounding.py): reflections on reflections cannot crowd out what happened (the spec's runaway reflection);
`grounding_weight = 0` switches it off. Keywords find what embeddings miss (names,
places, rare words); recency from creation cannot make stale favourites (a memory retrieved often is not
retrieved more for it), and its small weight breaks ties towards the newer memory instead of burying the old.

`memstream eval` also reports two baselines, so a user sees what each part earns on their own data:
`relevance` (plain vector search: spec with weights 0, 0, 1) and `lexical` (BM25 alone).
"""

from __future__ import annotations

from dataclasses import fields, replace

import numpy as np
import numpy.typing as npt

from memstream.config import BASELINES, PROFILE_NAMES, StreamConfig
from memstream.store.arrays import F64

__all__ = ["BASELINES", "PROFILES", "configured", "min_max", "score_parts", "uses_context", "uses_grounding",
           "uses_lexical"]

PROFILES = PROFILE_NAMES
_SCORING = ("profile", "weight_recency", "weight_importance", "weight_relevance", "recency_from", "lexical_weight",
            "grounding_weight", "neighbour_weight", "neighbour_gap_minutes", "name_weight", "time_weight")


def configured(config: StreamConfig, profile: str) -> StreamConfig:
    """`config` scored with another profile (or baseline): that profile's own defaults for every scoring
    knob, the persona's for everything else. The persona's own profile is returned as it is."""
    if profile == config.profile:
        return config
    keep = {f.name: getattr(config, f.name) for f in fields(StreamConfig) if f.name not in _SCORING}
    if profile in BASELINES:
        return replace(StreamConfig(), **{**keep, **BASELINES[profile]})
    return StreamConfig.for_profile(profile, **keep)


def uses_grounding(config: StreamConfig) -> bool:
    """Whether scoring needs each reflection's grounding (grounding.py)."""
    return config.profile == "hybrid" and config.grounding_weight > 0


def uses_lexical(config: StreamConfig) -> bool:
    """Whether scoring needs the lexical index."""
    return config.profile == "hybrid" and config.lexical_weight > 0 and config.weight_relevance > 0


def uses_context(config: StreamConfig) -> bool:
    """Whether scoring needs each stream's context (context.py: authors, neighbours, time words)."""
    return config.profile == "hybrid" and config.weight_relevance > 0 and (
        config.neighbour_weight > 0 or config.name_weight > 0 or config.time_weight > 0)


def min_max(values: F64) -> F64:
    """Scale to 0..1 over the stream; where every value is equal, 0.5 for all."""
    if values.size == 0:
        return values
    low, high = float(values.min()), float(values.max())
    if high - low <= 0.0:
        return np.full_like(values, 0.5)
    out: F64 = (values - low) / (high - low)
    return out


def _hours(now: float, then: npt.NDArray[np.float64]) -> F64:
    out: F64 = np.maximum(now - then, 0.0) / 3600.0
    return out


def score_parts(config: StreamConfig, *, cosine: F64, importance: F64, last_accessed: F64,
                created: F64, now: float, lexical: F64 | None = None) -> tuple[F64, F64, F64]:
    """The (recency, importance, relevance) parts of every memory, on the profile's scale; `lexical` is every
    memory's BM25 score (hybrid only; None counts as no match anywhere)."""
    if config.profile == "hybrid":
        return _hybrid(config, cosine, importance, created, now, lexical)
    return _spec(config, cosine, importance, last_accessed, created, now)


def _spec(config: StreamConfig, cosine: F64, importance: F64, last_accessed: F64, created: F64,
          now: float) -> tuple[F64, F64, F64]:
    since_access = np.power(config.decay, _hours(now, last_accessed))
    if config.recency_from == "created":
        recency = np.power(config.decay, _hours(now, created))
    elif config.recency_from == "both":
        recency = (since_access + np.power(config.decay, _hours(now, created))) / 2.0
    else:
        recency = since_access
    return min_max(recency), min_max(importance), min_max(cosine)


def _hybrid(config: StreamConfig, cosine: F64, importance: F64, created: F64, now: float,
            lexical: F64 | None) -> tuple[F64, F64, F64]:
    share = config.lexical_weight
    relevance = (1.0 - share) * min_max(cosine)
    if lexical is not None and lexical.size and float(lexical.max()) > 0.0:
        relevance = relevance + share * (lexical / float(lexical.max()))
    return min_max(np.power(config.decay, _hours(now, created))), min_max(importance), relevance
