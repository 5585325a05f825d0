"""Huge pages for a loaded matrix, in the background: the same bytes scan faster.

A stream's matrix is loaded into ordinary 4 KB pages (`_load.large_empty`: mapping fresh huge pages took up to
4 s for 1.5 GB on this kind of VM). Scanning it then takes a TLB miss every 4 KB: at 100k x 384, where the
matrix fits in the CPU's last-level cache, a plain pass over it read 6.3-6.9 ms in 4 KB pages and 4.5-4.7 ms
in 2 MB ones. So once a stream is loaded, a daemon thread asks the kernel to move it into huge pages
(MADV_COLLAPSE, Linux 6.1+; about 0.4 s for 146 MB, 32 MB at a time, queries going on meanwhile: the move is
invisible to readers and writers). Where the kernel cannot (older kernels, shared memory, huge pages turned
off), nothing changes.

Memory built here rather than loaded, a stream's screen (screen.py), asks for huge pages before its first write
(`huge_empty`): at 1M x 384 its 733 MiB were built in 0.7-2.2 s that way (the kernel zeroing fresh huge pages)
against 0.9 s in ordinary pages, but then moving them took seconds of queries at 1.5-3x their speed; built in
huge pages, retrieve read 22-31 ms from 1.9 s after the stream was loaded, 30-45 ms only from 4 s otherwise.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import mmap
import threading
import weakref
from collections.abc import Callable, Iterator
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

__all__ = ["collapse", "collapse_in_background", "huge_empty", "wait"]

log = logging.getLogger(__name__)

_MADV_HUGEPAGE = 14
_MADV_COLLAPSE = 25  # Linux 6.1+; not exported by Python 3.11's mmap module
_HUGE = 2 << 20
_STEP = 32 << 20
_MIN_BYTES = 16 << 20  # smaller matrices are left as they are
_running: list[threading.Thread] = []


class HasBlocks(Protocol):
    """A matrix held in blocks of rows (StreamVectors)."""

    def blocks(self) -> Iterator[tuple[int, npt.NDArray[Any]]]: ...


def huge_empty(shape: tuple[int, int], dtype: Any) -> npt.NDArray[Any]:
    """An uninitialized array for memory built here (a screen), in huge pages from its first write where the
    kernel has them free: no move afterwards. A small one (under 16 MB) is numpy's."""
    size = shape[0] * shape[1] * np.dtype(dtype).itemsize
    if size < _MIN_BYTES or not hasattr(mmap, "MADV_HUGEPAGE"):
        return np.empty(shape, dtype)
    region = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    with contextlib.suppress(OSError):
        region.madvise(mmap.MADV_HUGEPAGE)
    return np.frombuffer(region, dtype=dtype).reshape(shape)  # the array keeps the mapping alive


def collapse(matrix: npt.NDArray[Any], *, still_wanted: Callable[[], bool] = lambda: True) -> bool:
    """Move the whole 2 MB pages of this array's memory into huge pages, now, 32 MB at a time while
    still_wanted(); whether the kernel moved all of them."""
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
        if not still_wanted():
            return False
        if madvise(start, min(_STEP, high - start), _MADV_COLLAPSE) != 0:
            log.debug("huge pages unavailable for a matrix (errno %d)", ctypes.get_errno())
            return False
    return True


def collapse_in_background(owner: HasBlocks) -> threading.Thread | None:
    """collapse() each large block of `owner` (a loaded stream's matrix) in a daemon thread. The thread holds
    the owner only weakly: a matrix dropped meanwhile (the stream reloaded, the store closed) is freed, not
    kept alive by the move, which stops there."""
    if not any(block.nbytes >= _MIN_BYTES for _, block in owner.blocks()):
        return None
    ref = weakref.ref(owner)

    def run() -> None:
        index = 0
        while True:
            found = ref()
            blocks = [] if found is None else [block for _, block in found.blocks()]
            del found
            if index >= len(blocks):
                return
            block = blocks[index]
            del blocks  # only the block being moved is held, and only while it is
            collapse(block, still_wanted=lambda: ref() is not None)
            del block
            index += 1

    thread = threading.Thread(target=run, name="memstream-pages", daemon=True)
    thread.start()
    _running[:] = [t for t in _running if t.is_alive()] + [thread]
    return thread


def wait(timeout: float | None = None) -> None:
    """Until every move started so far has ended (a benchmark's steady state)."""
    for thread in list(_running):
        thread.join(timeout)
