"""Huge pages for a loaded matrix (pages.py): the bytes unchanged, the memory moved where the kernel can."""

from __future__ import annotations

import numpy as np
import pytest

from memstream import pages
from memstream._load import large_empty


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


def test_small_matrices_are_left_alone_and_the_background_thread_ends() -> None:
    assert not pages.collapse(np.ones((100, 384), np.float32))
    assert pages.collapse_in_background([np.ones((100, 384), np.float32)]) is None
    matrix = large_empty((20_000, 384))
    matrix[:] = 1.0
    thread = pages.collapse_in_background([matrix])
    assert thread is not None
    thread.join(30)
    assert not thread.is_alive()
    assert float(matrix.sum()) == matrix.size
