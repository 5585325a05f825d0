"""The resident budget (`[memory] resident_mb`, memstream.index.resident): how many memories one process holds
at once, against this machine's memory."""

from __future__ import annotations

import os

from memstream.config import StreamConfig
from memstream.doctor.checks import Check
from memstream.index.profiles import uses_lexical
from memstream.index.resident import bytes_per_memory

__all__ = ["check_resident", "physical_memory"]

_FIX = "set [memory] resident_mb (README: Memory per process)"
_DEFAULT_DIM = 384  # before the first embedding tells the database's


def physical_memory() -> int | None:
    """This machine's memory in bytes (None where the system does not say)."""
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def check_resident(config: StreamConfig, dimensions: int | None, physical: int | None) -> Check:
    """The budget in memories of the database's dimension; a warning when there is none, or when it is more
    than three quarters of this machine's memory."""
    machine = f"; this machine has {physical >> 20:,} MiB" if physical else ""
    budget = config.resident_mb << 20
    if not budget:
        return Check.warn("memory", f"resident_mb = 0: every stream queried stays in memory for the life of the "
                                    f"process{machine}", _FIX)
    dim = dimensions or _DEFAULT_DIM
    held = budget // bytes_per_memory(dim, lexical=uses_lexical(config))
    detail = (f"resident_mb {config.resident_mb:,}: about {held:,} memories of {dim} dimensions held at once per "
              f"process (least recently used streams beyond it are dropped, reloaded on their next query){machine}")
    if physical and budget > physical * 3 // 4:
        return Check.warn("memory", detail + ": more than three quarters of it", _FIX)
    return Check.ok("memory", detail)
