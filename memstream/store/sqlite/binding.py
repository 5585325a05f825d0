"""The one SQLite binding this process uses (one that can load sqlite-vec)."""

from __future__ import annotations

import contextlib
import types
from functools import cache

from memstream.errors import StoreError

__all__ = ["sqlite_module"]


@cache
def sqlite_module() -> types.ModuleType:
    """The one SQLite binding this process uses: one that can load extensions."""
    candidates = []
    with contextlib.suppress(ImportError):
        import pysqlite3.dbapi2 as pysqlite3

        candidates.append(pysqlite3)
    import sqlite3

    candidates.append(sqlite3)
    for module in candidates:
        if hasattr(module.Connection, "enable_load_extension"):
            chosen: types.ModuleType = module
            return chosen
    raise StoreError(
        "this Python's sqlite3 cannot load extensions (needed for sqlite-vec): "
        "pip install pysqlite3 (Linux), or use a Python built with loadable SQLite extensions"
    )

