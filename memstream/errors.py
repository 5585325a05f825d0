"""One rooted error hierarchy; foreign exceptions are mapped onto it where they enter.

    MemstreamError
    ├── ConfigError            a persona file, option or environment value is invalid
    │   └── MissingKey         the model server's API key is not in the environment
    ├── StoreError             the SQLite store cannot be opened, read or written
    │   ├── MigrationError     a migration failed (the file is left as it was)
    │   │   └── SchemaTooNew   the file was made by a newer memstream (never downgraded)
    │   ├── MemoryNotFound     no memory with that id in that stream
    │   ├── StoreLocked        another process held the database past the lock wait
    │   ├── StoreFull          the disk (or the file's size limit) is full
    │   ├── StoreReadOnly      the file or its folder cannot be written
    │   └── StoreDamaged       the file is not a database or is corrupt
    ├── ProviderError          a model server failed or answered nonsense
    │   ├── CompletionError    chat completions (rater, reflector, agent)
    │   ├── EmbeddingError     embeddings
    │   └── BudgetSpent        no call made: the role's daily budget is spent until it renews
    └── PromptError            a prompt cannot be loaded or rendered
        └── MissingVariables   a {{variable}} has no value
"""

from __future__ import annotations

from datetime import datetime

__all__ = [
    "BudgetSpent",
    "CompletionError",
    "ConfigError",
    "EmbeddingError",
    "MemoryNotFound",
    "MemstreamError",
    "MigrationError",
    "MissingKey",
    "MissingVariables",
    "PromptError",
    "ProviderError",
    "SchemaTooNew",
    "StoreDamaged",
    "StoreError",
    "StoreFull",
    "StoreLocked",
    "StoreReadOnly",
]


class MemstreamError(Exception):
    """Root of every error memstream raises on purpose."""


class ConfigError(MemstreamError):
    """A persona file, option or environment value is invalid."""


class MissingKey(ConfigError):
    """The model server's API key is not in the environment (and no local server is configured)."""


class StoreError(MemstreamError):
    """The SQLite store cannot be opened, read or written."""


class MigrationError(StoreError):
    """A schema migration failed."""


class SchemaTooNew(MigrationError):
    """The database file has migrations this version of memstream does not know: it was made by a newer one."""


class MemoryNotFound(StoreError):
    """No memory with that id (in that stream)."""

    def __init__(self, message: str, *, memory_id: int | None = None) -> None:
        super().__init__(message)
        self.memory_id = memory_id


class StoreLocked(StoreError):
    """Another process held the database's lock for longer than the store waits (LOCK_WAIT_SECONDS)."""


class StoreFull(StoreError):
    """The disk holding the database, or the file's size limit, is full."""


class StoreReadOnly(StoreError):
    """The database file (or its folder, for the WAL) cannot be written."""


class StoreDamaged(StoreError):
    """The file is not a database, or a page of it is corrupt."""


class ProviderError(MemstreamError):
    """A model server failed or answered something unusable."""

    def __init__(self, message: str, *, retryable: bool = False) -> None:
        super().__init__(message)
        self.retryable = retryable


class CompletionError(ProviderError):
    """A chat completion failed."""


class EmbeddingError(ProviderError):
    """An embeddings call failed."""


class BudgetSpent(ProviderError):
    """No model call was made: the role's daily budget (the persona file's [budget]) is spent until `until`."""

    def __init__(self, message: str, *, retryable: bool = True, role: str = "", until: datetime | None = None) -> None:
        super().__init__(message, retryable=retryable)
        self.role, self.until = role, until


class PromptError(MemstreamError):
    """A prompt cannot be loaded or rendered."""


class MissingVariables(PromptError):
    """A prompt was rendered without a value for one of its variables."""

    def __init__(self, prompt: str, names: list[str]) -> None:
        super().__init__(f"prompt {prompt!r} needs {', '.join(names)}")
        self.names = names

