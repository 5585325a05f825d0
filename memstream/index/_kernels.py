"""Compiled loops for retrieval (numba), with the numpy path in retrieve.py as the fallback.

Why compiled: the matrix product streams the whole matrix through the CPU caches, and every numpy call after
it starts cold. At 10k memories the few dozen small calls around the product cost a third as much as the
product itself. Here a query is `prepare` (the query), pass 1 (scan.py: the product and every row's
approximate score, the candidates, split over the cores) and `finish` (the exact scores, the top k).

The loops do the same floating-point operations, in the same order, as the numpy path and the reference (no
fast-math: no reassociation, no fused multiply-add), so the error bounds argued in retrieve.py hold for both
paths, and the exact pass reproduces the reference's sums and pow() bit for bit. The one exception is
the float32 product, whose error bound holds for any order of its sums, with or without fused
multiply-adds. tests/memstream/index/test_fastpath.py checks both paths against the reference. The scalar rules
(`recency_terms`, `importance_terms`, `relevance_terms`) are plain Python, used as they are by the numpy
path and compiled into the loops: one definition for both.

The loops are compiled once and cached on disk (numba's cache: beside this file if it is writable, else the
user's cache directory); loading them still takes a few seconds, so no query waits for it: `warm()` starts it
(VectorIndex does, in the background, when it loads a large stream; so does the bot at start) and until they
are ready queries take the numpy path. MEMSTREAM_JIT=0 keeps to the numpy path, which is also used when
numba is missing or cannot compile here.
"""

from __future__ import annotations

import logging
import math
import os
import threading
from typing import Any

import numpy as np

from memstream.store.arrays import F32, F64, I64

__all__ = ["available", "finish", "importance_terms", "loops", "prepare", "ready", "recency_terms",
           "relevance_terms", "warm"]

log = logging.getLogger(__name__)

_U64 = 2.0**-53  # unit roundoff of float64
_lock = threading.Lock()
_kernels: dict[str, Any] | None = None
_failed = False
_warming = False


# -- the scalar rules of pass 1, shared by both paths ------------------------------------------------


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
    rho = (16.0 + 4.0 * exponent) * _U64
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
    return cos_scale, (slack + 16 * _U64 * (magnitude + weights)) * (1 + 1e-6)


# -- the loops -------------------------------------------------------------------------------------


def _compile() -> dict[str, Any]:
    from memstream.index import _loops  # optional: numba imported, the loops compiled or loaded, on first use

    return {"prepare": _loops.prepare, "cosines": _loops.cosines, "pass_terms": _loops.pass_terms,
            "candidates": _loops.candidates, "cut": _loops.cut, "finish": _loops.finish, "quantize": _loops.quantize,
            "bm25": _loops.bm25}


def _get() -> dict[str, Any] | None:
    global _kernels, _failed
    if _kernels is not None or _failed:
        return _kernels
    with _lock:
        if _kernels is None and not _failed:
            if os.environ.get("MEMSTREAM_JIT", "1").strip().lower() in ("0", "false", "no", "off"):
                _failed = True
                return None
            try:
                kernels = _compile()
                _warm(kernels)
                _kernels = kernels
            except Exception as exc:  # no numba, or it cannot compile here: the numpy path does the same
                log.info("compiled retrieval loops unavailable (%s: %s); using numpy", exc.__class__.__name__, exc)
                _failed = True
    return _kernels


def _warm(kernels: dict[str, Any]) -> None:
    # The argument types of real calls, so that each loop is compiled (or loaded) once, here.
    ones32, ones, rows = np.ones(4, np.float32), np.ones(4), np.arange(4, dtype=np.int64)
    kernels["prepare"](ones32)
    kernels["cosines"](np.ones((4, 4), np.float32), ones32, ones32, ones32.copy(), 0)
    codes = np.ones((4, 4), np.int16)
    kernels["cosines"](codes, ones32, ones32, ones32.copy(), 0)
    kernels["quantize"](np.ones((4, 4), np.float32), codes, ones32.copy(), 0)
    kernels["bm25"](ones.copy(), rows, rows, rows, rows, 1.0, 1.0, 1.2, 0.75)
    terms = kernels["pass_terms"](0.0, 1.0, False, 0.0, 1.0, 0.5, 1.0, 1.0, 1.0, 0.0, 1.0, 1.0, 2.0, 1e-6)
    kernels["candidates"](ones32, 0, 4, ones, ones, *terms, np.full(2, -np.inf), rows.copy(), rows.copy())
    kernels["cut"](ones32, rows.copy(), ones, ones, *terms[:4], 0.0)
    kernels["finish"](np.ones((4, 4), np.float32), 0, rows[:2], rows[2:], ones, 2.0, ones, ones, ones, rows,
                      2.0, 0.5, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 1.0, 2)


def available() -> bool:
    """Whether the compiled loops can be used (compiling or loading them first if need be)."""
    return _get() is not None


def ready() -> bool:
    """Whether the compiled loops are loaded: never waits (a query meanwhile takes the numpy path)."""
    return _kernels is not None


def warm(*, background: bool = False) -> None:
    """Compile or load the loops now, or start doing so in a daemon thread: loading takes seconds (tens the
    first time, when they are compiled), which no query should wait for."""
    global _warming
    if _kernels is not None or _failed:
        return
    if not background:
        _get()
        return
    with _lock:
        if _warming:
            return
        _warming = True
    threading.Thread(target=_get, name="memstream-loops", daemon=True).start()


def loops() -> dict[str, Any]:
    """The compiled loops by name (scan.py runs pass 1's over the cores)."""
    kernels = _get()
    if kernels is None:
        raise RuntimeError("the compiled retrieval loops are not available")
    return kernels


def prepare(query: F32) -> tuple[F64, float, F32]:
    """(the query in float64, its reference norm, the float32 unit query)."""
    q64, norm, unit = loops()["prepare"](query)
    return q64, norm, unit


def finish(matrix: F32, offset: int, rows: I64, extremes: I64, query: F64, q_norm: float, last: F64,
           importance: F64, created: F64, ids: I64, now: float, decay: float, weights: tuple[float, float, float],
           last_range: tuple[float, float], importance_range: tuple[float, float], k: int) -> tuple[I64, F64]:
    """Pass 2: the top rows and, row by row, their (score, recency, importance, relevance, cosine)."""
    top, parts = loops()["finish"](matrix, offset, rows, extremes, query, q_norm, last, importance, created, ids,
                                    now, decay, *weights, *last_range, *importance_range, k)
    return top, parts
