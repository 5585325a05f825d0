"""Compiled loops for retrieval (numba, _loops.py), with the numpy path (spec.py, hybrid.py) as the fallback.

Why compiled: the matrix product streams the whole matrix through the CPU caches, and every numpy call after
it starts cold. At 10k memories the few dozen small calls around the product cost a third as much as the
product itself. Here a query is `prepare` (the query), pass 1 (_scan.py: the product and every row's
approximate score, the candidates, split over the cores) and `finish` (the exact scores, the top k).

The loops do the same floating-point operations, in the same order, as the numpy path and the reference (no
fast-math: no reassociation, no fused multiply-add), so the error bounds argued in _terms.py hold for both
paths, and the exact pass reproduces the reference's sums and pow() bit for bit. The one exception is
the float32 product, whose error bound holds for any order of its sums, with or without fused
multiply-adds. tests/memstream/index/test_fastpath.py checks both paths against the reference. The scalar rules
of pass 1 and the bundles the loops take are in _terms.py: one definition for both paths.

The loops are compiled once and cached on disk (numba's cache: beside this file if it is writable, else the
user's cache directory); loading them still takes a few seconds, so no query waits for it: `warm()` starts it
(VectorIndex does, in the background, when it loads a large stream; so does the bot at start) and until they
are ready queries take the numpy path. MEMSTREAM_JIT=0 keeps to the numpy path, which is also used when
numba is missing or cannot compile here.
"""

from __future__ import annotations

import logging
import os
import threading
from typing import Any

import numpy as np

from memstream.index._terms import Candidates, Columns, Scoring
from memstream.store.arrays import F32, F64, I64

__all__ = ["available", "finish", "loops", "prepare", "ready", "warm"]

log = logging.getLogger(__name__)

_lock = threading.Lock()
_kernels: dict[str, Any] | None = None
_failed = False
_warming = False


def _compile() -> dict[str, Any]:
    from memstream.index import _loops, _word_loops  # optional: numba imported, the loops compiled or loaded

    return {"prepare": _loops.prepare, "cosines": _loops.cosines, "pass_terms": _loops.pass_terms,
            "candidates": _loops.candidates, "cut": _loops.cut, "finish": _loops.finish, "quantize": _loops.quantize,
            "bm25": _loops.bm25, "context": _loops.context, "cut_words": _word_loops.cut_words,
            "count_terms": _word_loops.count_terms, "slot_terms": _word_loops.slot_terms,
            "term_order": _word_loops.term_order}


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
    for chars in (np.frombuffer(b"a b\n", np.uint8), np.frombuffer("a b\n".encode("utf-32-le"), np.uint32)):
        kernels["cut_words"](chars, np.array([4], np.int64), np.ones(128, np.uint8))
    kernels["count_terms"](rows, rows, rows[:1], 4)
    kernels["slot_terms"](rows, rows, 4)
    kernels["term_order"](rows, 4)
    kernels["cosines"](np.ones((4, 4), np.float32), ones32, ones32, ones32.copy(), 0)
    codes = np.ones((4, 4), np.int16)
    kernels["cosines"](codes, ones32, ones32, ones32.copy(), 0)
    kernels["quantize"](np.ones((4, 4), np.float32), codes, ones32.copy(), 0)
    kernels["bm25"](ones.copy(), rows, rows, rows, rows, 1.0, 1.0, 1.2, 0.75)
    scoring = Scoring(1.0, 0.5, 1.0, 1.0, 1.0, 0.0, 1.0, 1.0, 2.0)
    scales = kernels["pass_terms"](0.0, 1.0, False, 0.0, scoring, 1e-6)
    kernels["candidates"](ones32, 0, 4, ones, ones, scales, np.full(2, -np.inf), rows.copy(), rows.copy())
    kernels["cut"](ones32, rows.copy(), ones, ones, scales, 0.0)
    kernels["finish"](np.ones((4, 4), np.float32), 0, rows[:2], rows[2:], ones, 2.0, Columns(ones, ones, ones, rows),
                      scoring, 2)


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
    """The compiled loops by name (_scan.py runs pass 1's over the cores)."""
    kernels = _get()
    if kernels is None:
        raise RuntimeError("the compiled retrieval loops are not available")
    return kernels


def prepare(query: F32) -> tuple[F64, float, F32]:
    """(the query in float64, its reference norm, the float32 unit query)."""
    q64, norm, unit = loops()["prepare"](query)
    return q64, norm, unit


def finish(matrix: F32, offset: int, found: Candidates, query: F64, q_norm: float, columns: Columns,
           scoring: Scoring, k: int) -> tuple[I64, F64]:
    """Pass 2 of pass 1's candidates (matrix: the stream's rows from row `offset`, or if offset < 0 the found rows
    gathered, candidates first): the top rows and, row by row, their (score, recency, importance, relevance,
    cosine)."""
    top, parts = loops()["finish"](matrix, offset, found.rows, found.extremes, query, q_norm, columns, scoring, k)
    return top, parts
