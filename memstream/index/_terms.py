"""What the numpy path and the compiled loops share: pass 1's scalar rules, and the bundles the loops take.

The rules (`recency_terms`, `importance_terms`, `relevance_terms`) are plain Python, used as they are by the
numpy path (spec.py) and compiled into the loops (_loops.py): one definition for both. The bundles are
namedtuples, which numba reads field by field as it reads arguments: the arrays and scalars that travel
together into a loop travel as one.
"""

from __future__ import annotations

import math
from typing import NamedTuple

from memstream.store.arrays import F64, I64

__all__ = ["U64", "Candidates", "Columns", "Scales", "Scoring", "importance_terms", "recency_terms",
           "relevance_terms"]

U64 = 2.0**-53  # unit roundoff of float64


class Scoring(NamedTuple):
    """What a query is scored with besides the rows: its time, the decay per hour, the three weights, and the
    stream's smallest and largest last access and importance."""

    now: float
    decay: float
    w_rec: float
    w_imp: float
    w_rel: float
    last_low: float
    last_high: float
    imp_low: float
    imp_high: float


class Scales(NamedTuple):
    """How pass 1 scores a row (the loops' `pass_terms`): min(y, y_cap) * rec_scale + importance * imp_scale +
    cosine * cos_scale, a term whose scale is 0 being left out; the rows within `gap` of the k-th best are kept,
    and those whose cosine is at or beyond cut_low or cut_high may hold the stream's smallest or largest."""

    rec_scale: float
    y_cap: float
    imp_scale: float
    cos_scale: float
    gap: float
    cut_low: float
    cut_high: float


class Columns(NamedTuple):
    """A stream's per-row columns that pass 2 reads (StreamVectors')."""

    last_accessed: F64
    importance: F64
    created: F64
    ids: I64


class Candidates(NamedTuple):
    """Pass 1's answer: the rows whose exact score could be among the k best, and the rows that can hold the
    stream's smallest or largest cosine."""

    rows: I64
    extremes: I64


def recency_terms(weight: float, decay: float, low: float, high: float, now: float,
                  t0: float) -> tuple[float, float, float, float]:
    """Pass 1's recency term: (scale, cap on y, error bound, magnitude); scale 0 leaves it out.

    y = decay ** ((last_accessed - t0) / 3600) per row (StreamVectors.recency_proxy); low and high are the
    stream's smallest and largest last access.
    """
    if weight == 0 or decay == 1.0 or low == high or low >= now:
        return 0.0, math.inf, 0.0, 0.0  # recency is exactly equal for all: 0.5 everywhere
    lam = -math.log(decay) / 3600.0
    top = min(high, now)
    y_hi, y_lo = math.exp(lam * (top - t0)), math.exp(lam * (low - t0))
    # Relative error of y and of the reference's pow(): a few ulps plus the rounding of the exponent.
    exponent = lam * max(abs(low - t0), abs(top - t0), now - low) + 1.0
    rho = (16.0 + 4.0 * exponent) * U64
    ratio = y_lo / y_hi if y_hi > 0.0 else 1.0
    error = weight * 8.0 * rho / (1.0 - ratio) if ratio < 1.0 else math.inf
    if not (error <= weight / 4 and math.isfinite(y_hi)):
        return 0.0, math.inf, weight / 2, 0.0  # too narrow to trust: leave recency to the exact pass
    scale = weight / (y_hi - y_lo)
    return scale, (y_hi if high > now else math.inf), error, scale * y_hi


def importance_terms(weight: float, low: float, high: float) -> tuple[float, float]:
    """Pass 1's importance term: (scale, magnitude); scale 0 when it is equal for all."""
    if weight > 0 and high > low:
        scale = weight / (high - low)
        return scale, scale * max(abs(low), abs(high))
    return 0.0, 0.0


def relevance_terms(low: float, high: float, error: float, weight: float, slack: float, magnitude: float,
                    weights: float) -> tuple[float, float]:
    """Pass 1's relevance scale and its final slack, from the float32 cosines' range [low, high] and error
    bound (inf: not to be trusted; 0 with low == high: all exactly equal), the weight of relevance, the slack
    and magnitude of the other terms and the sum of the weights."""
    cos_scale = 0.0
    if weight > 0 and not (error == 0.0 and low == high):
        spread = high - low
        if math.isfinite(error) and spread > 8 * error:
            cos_scale = weight / spread
            slack += weight * 4 * error / spread
            magnitude += cos_scale * max(abs(low), abs(high))
        else:
            slack += weight / 2
    return cos_scale, (slack + 16 * U64 * (magnitude + weights)) * (1 + 1e-6)
