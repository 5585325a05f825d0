"""Huge pages for a loaded matrix, in the background: the same bytes scan faster.

A stream's matrix is loaded into ordinary 4 KB pages (`_load.large_empty`: mapping fresh huge pages took up to
4 s for 1.5 GB on this kind of VM). Scanning it then takes a TLB miss every 4 KB: at 100k x 384, where the
matrix fits in the CPU's last-level cache, a plain pass over it read 6.3-6.9 ms in 4 KB pages and 4.5-4.7 ms
in 2 MB ones. So once a stream is loaded, a daemon thread asks the kernel to move it into huge pages
(MADV_COLLAPSE, Linux 6.1+; about 0.4 s for 146 MB, 32 MB at a time, queries going on meanwhile: the move is
invisible to readers and writers). Where the kernel cannot (older kernels, shared memory, huge pages turned
off), nothing changes.
"""

from __future__ import annotations

import ctypes
import logging
import threading
from collections.abc import Sequence
from typing import Any

import numpy.typing as npt

__all__ = ["collapse", "collapse_in_background", "wait"]

log = logging.getLogger(__name__)

_MADV_HUGEPAGE = 14
_MADV_COLLAPSE = 25  # Linux 6.1+; not exported by Python 3.11's mmap module
_HUGE = 2 << 20
_STEP = 32 << 20
_MIN_BYTES = 16 << 20  # smaller matrices are left as they are
_running: list[threading.Thread] = []


def collapse(matrix: npt.NDArray[Any]) -> bool:
    """Move the whole 2 MB pages of this array's memory into huge pages, now; whether the kernel did."""
    if matrix.nbytes < _MIN_BYTES:
        return False
    try:
        madvise = ctypes.CDLL(None, use_errno=True).madvise  # ctypes releases the GIL during the call
        madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    except (OSError, AttributeError):
        return False
    base = matrix.ctypes.data
    low, high = (base + _HUGE - 1) & ~(_HUGE - 1), (base + matrix.nbytes) & ~(_HUGE - 1)
    if high <= low or madvise(low, high - low, _MADV_HUGEPAGE) != 0:
        return False
    for start in range(low, high, _STEP):
        if madvise(start, min(_STEP, high - start), _MADV_COLLAPSE) != 0:
            log.debug("huge pages unavailable for a matrix (errno %d)", ctypes.get_errno())
            return False
    return True


def collapse_in_background(blocks: Sequence[npt.NDArray[Any]]) -> threading.Thread | None:
    """collapse() each large block in a daemon thread (which keeps them alive until it is done)."""
    large = [block for block in blocks if block.nbytes >= _MIN_BYTES]
    if not large:
        return None
    thread = threading.Thread(target=lambda: [collapse(block) for block in large], name="memstream-pages",
                              daemon=True)
    thread.start()
    _running[:] = [t for t in _running if t.is_alive()] + [thread]
    return thread


def wait(timeout: float | None = None) -> None:
    """Until every move started so far has ended (a benchmark's steady state)."""
    for thread in list(_running):
        thread.join(timeout)
