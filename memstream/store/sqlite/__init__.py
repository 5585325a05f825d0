"""The SQLite backend: one file per persona (the embedded default)."""

from memstream.store.sqlite.binding import sqlite_module
from memstream.store.sqlite.store import SQLiteStore

__all__ = ["SQLiteStore", "sqlite_module"]
