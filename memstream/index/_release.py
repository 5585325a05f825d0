"""Memory freed by dropped streams, given back to the system (glibc's malloc_trim), in the background.

A dropped stream's matrix, if it had its own mapping (_load.large_empty), goes back to the system when freed;
its smaller arrays, its lexical index and its context are in malloc's heap, whose freed pages glibc keeps for
reuse: the process's resident size then stays at its peak. malloc_trim(0) hands every whole free page back.
It walks the heap (a few ms to tens of ms for a large one), so it runs in a daemon thread, at most once every
two seconds, after streams were dropped. Elsewhere than glibc (musl, macOS), nothing is done.

Trimming reaches whole free pages only. So a process with a budget also sets two of malloc's options, once
(`bound_heap`): blocks of 128 KiB or more get mappings of their own, handed back when freed (glibc otherwise
raises that threshold to the size of each large block freed, up to 32 MiB, and then keeps a dropped stream's
columns and lexical arrays in its heap, among live blocks), and at most two arenas (each thread that allocates,
as loads do, would otherwise get its own, up to eight per core, each keeping what it freed). Measured with
`python -m bench.servers --quick` (256 MiB budget): peak RSS over the budget 1.79x without them, 1.42x with them.
An operator's own MALLOC_ARENA_MAX, MALLOC_MMAP_THRESHOLD_ or GLIBC_TUNABLES are left as they are.
"""

from __future__ import annotations

import ctypes
import os
import threading
import time
from collections.abc import Callable

__all__ = ["bound_heap", "soon"]

_EVERY = 2.0  # seconds between two trims, at least
_M_MMAP_THRESHOLD, _M_ARENA_MAX = -3, -8  # mallopt's parameter numbers (malloc.h)
_MMAP_THRESHOLD = 128 << 10  # glibc's own starting value, kept from then on
_ARENAS = 2
_OWN_SETTINGS = ("MALLOC_ARENA_MAX", "MALLOC_MMAP_THRESHOLD_", "GLIBC_TUNABLES")
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


def _options() -> Callable[[int, int], int] | None:
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return None
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    found: Callable[[int, int], int] = mallopt
    return found


_mallopt = _options()


def bound_heap() -> bool:
    """Set malloc's options for a process with a resident budget (the module's docstring), once; whether they
    are set (False: not glibc, or the operator set their own)."""
    if _mallopt is None or any(name in os.environ for name in _OWN_SETTINGS):
        return False
    with _lock:
        if not _state.get("bound"):
            _state["bound"] = bool(_mallopt(_M_MMAP_THRESHOLD, _MMAP_THRESHOLD)) and bool(
                _mallopt(_M_ARENA_MAX, _ARENAS))
    return bool(_state["bound"])


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
