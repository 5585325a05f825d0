"""Huge pages for a loaded matrix (pages.py): the bytes unchanged, the memory moved where the kernel can."""

from __future__ import annotations

import weakref
from collections.abc import Iterator

import numpy as np
import pytest

from memstream.index import _pages as pages
from memstream.store._load import large_empty


def _huge_kb() -> int:
    with open("/proc/self/smaps_rollup") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("AnonHugePages:"))


def test_a_large_matrix_moves_into_huge_pages_with_its_bytes_unchanged() -> None:
    matrix = large_empty((20_000, 384))  # 29 MB in ordinary pages
    matrix[:] = np.random.default_rng(0).standard_normal(matrix.shape, dtype=np.float32)
    copy = matrix.copy()
    before = _huge_kb()
    if not pages.collapse(matrix):
        pytest.skip("this kernel cannot move memory into huge pages (MADV_COLLAPSE, Linux 6.1+)")
    assert _huge_kb() - before >= (matrix.nbytes >> 10) - 4096  # all but the unaligned ends
    assert np.array_equal(matrix, copy)


class _Owner:
    """A matrix in blocks, as StreamVectors holds one."""

    def __init__(self, *blocks: np.ndarray) -> None:
        self._blocks = list(blocks)

    def blocks(self) -> Iterator[tuple[int, np.ndarray]]:
        start = 0
        for block in self._blocks:
            yield start, block
            start += len(block)


def test_small_matrices_are_left_alone_and_the_background_thread_ends() -> None:
    assert not pages.collapse(np.ones((100, 384), np.float32))
    assert pages.collapse_in_background(_Owner(np.ones((100, 384), np.float32))) is None
    matrix = large_empty((20_000, 384))
    matrix[:] = 1.0
    owner = _Owner(np.ones((100, 384), np.float32), matrix)
    thread = pages.collapse_in_background(owner)
    assert thread is not None
    thread.join(30)
    assert not thread.is_alive()
    assert float(matrix.sum()) == matrix.size


def test_a_move_no_longer_wanted_stops_and_holds_nothing() -> None:
    matrix = large_empty((20_000, 384))
    matrix[:] = 1.0
    before = _huge_kb()
    assert not pages.collapse(matrix, still_wanted=lambda: False)
    assert _huge_kb() - before < 2048  # not one 32 MB step moved
    owner = _Owner(*(large_empty((20_000, 384)) for _ in range(4)))
    ref = weakref.ref(owner)
    thread = pages.collapse_in_background(owner)
    assert thread is not None
    del owner
    thread.join(30)
    assert not thread.is_alive()
    assert ref() is None
