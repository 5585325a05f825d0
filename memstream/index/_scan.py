"""Pass 1 of the compiled path, split over the cores: the product, then the candidates.

The threads (one a core, the calling thread among them) take pieces of the rows as they come free, so a
slower core takes fewer: each computes its pieces' float32 cosines with the unit query (_loops' `cosines`).
Once every row's is in (the relevance term is normalized over the whole stream), each scores the pieces it
computed, latest first (their cosines still in its caches), and keeps the rows near its own k best
(`candidates`); the k best of all make the final cut.

Why not np.matmul for the product: BLAS threads spin for a while after a product, taking the cores from the
work that follows it (the rest of the query, the event loop, the store's thread), and the scoring after it
would run in one thread. One pass at a time uses the cores (a second waits for the first): a pass's threads
wait for each other, so two passes' threads must not queue in the pool behind one another.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, NamedTuple, TypeVar

import numpy as np
import numpy.typing as npt

from memstream.index import _kernels as kernels
from memstream.index._terms import Candidates, Scales, Scoring
from memstream.store.arrays import F32, F64, I64, cores

__all__ = ["ROOM", "Rows", "Source", "cosines", "each", "first_pass"]

Rows = npt.NDArray[Any]  # float32 rows, or a screen's int16 codes (screen.py)
T = TypeVar("T")


class Source(NamedTuple):
    """What pass 1 reads: the rows in (first row, rows) blocks, float32 or a screen's int16 codes; each row's
    factor (its inverse norm, or the screen's factor); and how far the float32 cosines computed from them may
    be from the reference's (inf: they cannot be trusted)."""

    blocks: Sequence[tuple[int, Rows]]
    factors: F32
    error: float

# Room for candidates and extreme rows in a compiled pass; beyond it the numpy path takes the query.
ROOM = 4096
# Below this many rows a thread, handing work to another thread costs more than it saves.
_SHARE_ROWS = 16_384
# Rows are handed out to the threads in pieces of this many (each the product of about 12 MB at 384 dims).
_PIECE_ROWS = 8192
_buffer: F32 | None = None
_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()
_turn = threading.Lock()  # one pass's threads in the pool at a time


def cosines(blocks: Sequence[tuple[int, Rows]], unit: F32, inverse_norms: F32,
            out: F32) -> tuple[float, float, bool]:
    """The float32 cosine of every row with the unit query, into `out`; (the smallest, the largest, whether any
    is NaN). Over a screen's codes, `inverse_norms` are its factors."""
    pieces = _pieces(blocks)
    with _turn:
        claims = _Claims(len(pieces))
        found = _on_cores(_threads(len(out)), lambda i, _: _product(pieces, claims, unit, inverse_norms, out))
    return _range(found)


def first_pass(source: Source, unit: F32, y: F64, t0: float, importance: F64, scoring: Scoring, k: int,
               room: int = ROOM) -> Candidates | None:
    """Pass 1 over `source`, each row scored from y (the recency proxy from t0), its importance and its cosine
    with the unit query: the candidates, or None if more than `room` of either kind (scores equal within the
    error bound: the numpy path copes)."""
    loops = kernels.loops()
    inverse_norms = source.factors
    n = len(inverse_norms)
    pieces = _pieces(source.blocks)
    room = min(room, n)
    ranges: list[tuple[float, float, bool]] = []
    lock = threading.Lock()

    def terms() -> Scales:
        found: Scales = loops["pass_terms"](*_range(ranges), t0, scoring, source.error)
        return found

    def share(cos: F32, products: _Claims, wait: Callable[[], None]) -> tuple[F64, I64, I64] | None:
        mine: list[int] = []
        found = _product(pieces, products, unit, inverse_norms, cos, mine)
        with lock:
            ranges.append(found)
        wait()  # every row's cosine is in, and every share's range
        scales = terms()
        best, rows, extremes = np.full(k, -np.inf), np.empty(room, np.int64), np.empty(room, np.int64)
        count = ext = 0
        for j in reversed(mine):  # its own pieces, whose cosines are still in its caches, the latest first
            start, part = pieces[j]
            c, e = loops["candidates"](cos, start, start + len(part), y, importance, scales, best,
                                       rows[min(count, room):], extremes[min(ext, room):])
            count, ext = count + c, ext + e
        return None if count > room or ext > room else (best, rows[:count], extremes[:ext])

    with _turn:
        cos = _scratch(n)
        products = _Claims(len(pieces))
        found = _on_cores(_threads(n), lambda i, wait: share(cos, products, wait))
        if any(f is None for f in found):
            return None
        parts = [f for f in found if f is not None]
        best = np.concatenate([f[0] for f in parts])
        rows = np.concatenate([f[1] for f in parts])
        extremes = np.concatenate([f[2] for f in parts])
        scales = terms()
        floor = float(np.partition(best, best.size - k)[best.size - k]) - scales.gap  # the k-th best, less the gap
        kept = loops["cut"](cos, rows, y, importance, scales, floor)
    if kept > room or len(extremes) > room:
        return None
    return Candidates(rows[:kept], extremes)


def each(count: int, work: Callable[[int], None]) -> None:
    """work(i) for i in range(count), split over the cores (each i taken by whichever thread comes free)."""
    def share(i: int, wait: Callable[[], None]) -> None:
        for j in claims:
            work(j)

    with _turn:
        claims = _Claims(count)
        _on_cores(max(1, min(cores(), count)), share)


class _Claims:
    """Indices 0..count-1, each handed out once, to whichever thread asks first: faster threads take more."""

    def __init__(self, count: int) -> None:
        self._next, self._count, self._lock = 0, count, threading.Lock()

    def __iter__(self) -> _Claims:
        return self

    def __next__(self) -> int:
        with self._lock:
            if self._next >= self._count:
                raise StopIteration
            self._next += 1
            return self._next - 1


def _product(pieces: Sequence[tuple[int, Rows]], claims: _Claims, unit: F32, inverse_norms: F32, out: F32,
             taken: list[int] | None = None) -> tuple[float, float, bool]:
    """The cosines of the pieces this thread claims (noted in `taken`); their range."""
    run = kernels.loops()["cosines"]
    found = []
    for j in claims:
        found.append(run(pieces[j][1], unit, inverse_norms, out, pieces[j][0]))
        if taken is not None:
            taken.append(j)
    return _range(found) if found else (math.inf, -math.inf, False)


def _range(found: Sequence[tuple[float, float, bool]]) -> tuple[float, float, bool]:
    return min(f[0] for f in found), max(f[1] for f in found), any(f[2] for f in found)


def _pieces(blocks: Sequence[tuple[int, Rows]]) -> list[tuple[int, Rows]]:
    """The rows as (first row, rows) pieces of at most _PIECE_ROWS, within blocks."""
    pieces = []
    for start, block in blocks:
        for lo in range(0, len(block), _PIECE_ROWS):
            pieces.append((start + lo, block[lo:lo + _PIECE_ROWS]))
    return pieces


def _threads(n: int) -> int:
    """How many threads share a pass over n rows: every core, for a large stream."""
    return max(1, min(cores(), n // _SHARE_ROWS))


def _scratch(n: int) -> F32:
    """A float32 buffer of n (one pass at a time uses it: _turn): reused, its pages mapped once."""
    global _buffer
    if _buffer is None or len(_buffer) < n:
        _buffer = np.empty(max(n, 2 * len(_buffer) if _buffer is not None else n), np.float32)
    return _buffer[:n]


def _on_cores(count: int, work: Callable[[int, Callable[[], None]], T]) -> list[T]:
    """work(i, wait) for i in range(count), each in its own thread (the calling thread takes 0), all at once;
    `wait` returns once every one has called it. An error in one is raised here, after all have ended. The
    caller holds _turn: the pool holds one pass's threads at a time, so none waits behind another pass."""
    if count == 1:
        return [work(0, lambda: None)]
    gate = _Gate(count)

    def run(i: int) -> T:
        try:
            return work(i, gate.wait)
        except BaseException:
            gate.broken = True  # the others stop waiting
            raise

    futures = [_workers().submit(run, i) for i in range(1, count)]
    outcomes: list[tuple[Any, BaseException | None]] = []
    try:
        outcomes.append((run(0), None))
    except BaseException as exc:
        outcomes.append((None, exc))
    _spin(lambda: all(future.done() for future in futures))
    for future in futures:  # each is waited for, whatever the others did
        error = future.exception()
        outcomes.append((None, error) if error is not None else (future.result(), None))
    errors = [e for _, e in outcomes if e is not None]
    if errors:  # the first cause, not the waits it broke
        raise next((e for e in errors if not isinstance(e, threading.BrokenBarrierError)), errors[0])
    return [result for result, _ in outcomes]


class _Gate:
    """A barrier whose waiters spin (yielding the processor) instead of sleeping: the threads of a pass arrive
    within microseconds of each other, and waking a sleeping thread took 50-150 us on this VM."""

    def __init__(self, parties: int) -> None:
        self.parties, self.arrived, self.broken = parties, 0, False
        self._lock = threading.Lock()

    def wait(self) -> None:
        with self._lock:
            self.arrived += 1
        _spin(lambda: self.arrived >= self.parties or self.broken)
        if self.arrived < self.parties:
            raise threading.BrokenBarrierError


def _spin(done: Callable[[], bool]) -> None:
    """Wait until done(): yielding the processor (and the GIL) between looks, sleeping after the first
    millisecond."""
    deadline = time.perf_counter() + 1e-3
    while not done():
        time.sleep(0 if time.perf_counter() < deadline else 1e-4)


def _workers() -> ThreadPoolExecutor:
    global _pool
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(max(1, cores() - 1), thread_name_prefix="memstream-scan")
        return _pool
