"""Memory freed by dropped streams, given back to the system (glibc's malloc_trim), in the background.

A dropped stream's matrix, if it had its own mapping (_load.large_empty), goes back to the system when freed;
its smaller arrays, its lexical index and its context are in malloc's heap, whose freed pages glibc keeps for
reuse: the process's resident size then stays at its peak. malloc_trim(0) hands every whole free page back.
It walks the heap (a few ms to tens of ms for a large one), so it runs in a daemon thread, at most once every
two seconds, after streams were dropped. Elsewhere than glibc (musl, macOS), nothing is done.
"""

from __future__ import annotations

import ctypes
import threading
import time
from collections.abc import Callable

__all__ = ["soon"]

_EVERY = 2.0  # seconds between two trims, at least
_lock = threading.Lock()
_state = {"running": False, "again": False}


def _trimmer() -> Callable[[int], int] | None:
    try:
        trim = ctypes.CDLL(None).malloc_trim  # ctypes releases the GIL during the call
    except (OSError, AttributeError):
        return None
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    found: Callable[[int], int] = trim
    return found


_trim = _trimmer()


def soon() -> None:
    """Give freed memory back to the system shortly: now, in a daemon thread; if one is at work, once more two
    seconds after it ends."""
    if _trim is None:
        return
    with _lock:
        if _state["running"]:
            _state["again"] = True
            return
        _state["running"], _state["again"] = True, False
    threading.Thread(target=_run, name="memstream-release", daemon=True).start()


def _run() -> None:
    while True:
        if _trim is not None:
            _trim(0)
        time.sleep(_EVERY)
        with _lock:
            if not _state["again"]:
                _state["running"] = False
                return
            _state["again"] = False
