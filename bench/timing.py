"""Timing for the benchmarks: medians of runs in blocks, and the floors they are compared with."""

from __future__ import annotations

import asyncio
import inspect
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numba
import numpy as np

__all__ = ["BLOCK", "WARM", "Floors", "ms", "plain_sum", "plain_words", "rounds", "rounds_async"]


def ms(fn: Any) -> float:
    start = time.perf_counter()
    fn()
    return (time.perf_counter() - start) * 1e3


@numba.njit(nogil=True, fastmath={"reassoc"})
def plain_sum(values: Any) -> float:  # compiled, summed in any order: as vectorized as the compiler can
    total = np.float32(0.0)
    for i in range(values.size):
        total += values[i]
    return float(total)


@numba.njit(nogil=True)
def plain_words(values: Any) -> int:  # compiled, a wrapping integer sum of 8-byte words: bytes of any type
    total = np.uint64(0)
    for i in range(values.size):
        total += values[i]
    return int(total)


class Floors:
    """The fastest plain passes over a matrix's bytes that can be written here: np.sum, and a compiled sum,
    each split over every core; a BLAS product with a vector of ones (timed on its own: OpenBLAS threads
    spin for a while after a product and would slow whatever ran next)."""

    def __init__(self, blocks: list[Any], pool: ThreadPoolExecutor | None, cores: int) -> None:
        """Over `cores` threads of `pool` (None, or one core: in the calling thread)."""
        self.blocks = blocks
        parts = [p for block in blocks for p in np.array_split(block, cores)]
        flat = [p.reshape(-1) for p in parts]

        def each(fn: Any, items: list[Any]) -> Any:
            if pool is None or cores == 1:
                return lambda: [fn(item) for item in items]
            return lambda: list(pool.map(fn, items))

        self.passes = {"floor_sum": each(np.sum, parts), "floor_loops": each(plain_sum, flat)}

    def gemv(self, reps: int) -> list[float]:
        ones = np.ones(self.blocks[0].shape[1], np.float32)

        def product() -> object:
            return [block @ ones for block in self.blocks]

        product()
        return [ms(product) for _ in range(reps)]


BLOCK, WARM = 5, 8  # timed runs of one kind in a row, after WARM untimed ones


def rounds(runs: dict[str, Any], reps: int) -> dict[str, list[float]]:
    """`reps` timed runs of each, in rounds: in each round, each kind in turn runs WARM times untimed, then
    BLOCK times timed. Each is timed in its own steady state (its data back in the caches, as when queries
    follow one another), not in the state the other left: at 100k x 384 the float32 matrix fits in this VM's
    L3 but, with the screen's copy beside it, a pass over one slowed the next few over the other (`rank` read
    5.9, 5.0, 3.9, 3.4, 2.8 ms in its first runs after the floors, then 2.4). The rounds spread what slows the
    machine for a while over all kinds alike."""
    times: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(-(-reps // BLOCK)):
        for name, fn in runs.items():
            for _ in range(WARM):
                fn()
            times[name].extend(ms(fn) for _ in range(BLOCK))
    return times


async def rounds_async(runs: dict[str, Any], reps: int, settle: float = 0.0) -> dict[str, list[float]]:
    """`rounds`, in the event loop, where a run may return an awaitable (MemoryStream.retrieve, awaited as a
    caller would). `settle` seconds pass before each kind's untimed runs: the threads of the kind before
    (OpenBLAS's, OpenMP's) spin for a while after their last call and would slow the next kind."""
    async def once(run: Any) -> float:
        start = time.perf_counter()
        result = run()
        if inspect.isawaitable(result):
            await result
        return (time.perf_counter() - start) * 1e3

    times: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(-(-reps // BLOCK)):
        for name, run in runs.items():
            if settle:
                await asyncio.sleep(settle)
            for _ in range(WARM):
                await once(run)
            for _ in range(BLOCK):
                times[name].append(await once(run))
    return times
