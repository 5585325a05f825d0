"""The store of record: the storage interface (`Store`, a Protocol) and its backends.

`await Store.open(location)` opens a SQLite file (a path) or a PostgreSQL database (a `postgresql://` URL).
Nothing above this package knows which one it runs on.
"""

from memstream.config import is_database_url, redact
from memstream.store.base import Store
from memstream.store.migrations import Migration, all_migrations
from memstream.store.policy import RETRY_BASE_SECONDS, RETRY_CAP_SECONDS, deferred_touches, retry_delay
from memstream.store.records import NewMemory, NewTrace, StreamArrays, UsageRow
from memstream.store.sqlite import SQLiteStore, sqlite_module
from memstream.store.sqlite.rows import to_blob
from memstream.store.sqlite.scrub import residue_needles

__all__ = ["RETRY_BASE_SECONDS", "RETRY_CAP_SECONDS", "Migration", "NewMemory", "NewTrace", "SQLiteStore", "Store",
           "StreamArrays", "UsageRow", "all_migrations", "deferred_touches", "is_database_url", "redact",
           "residue_needles", "retry_delay", "sqlite_module", "to_blob"]
