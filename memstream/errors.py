"""One rooted error hierarchy; foreign exceptions are mapped onto it where they enter.

    MemstreamError
    ├── ConfigError            a persona file, option or environment value is invalid
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
    │   └── EmbeddingError     embeddings
    └── PromptError            a prompt cannot be loaded or rendered
        └── MissingVariables   a {{variable}} has no value
"""

from __future__ import annotations

__all__ = [
    "CompletionError",
    "ConfigError",
    "EmbeddingError",
    "MemoryNotFound",
    "MemstreamError",
    "MigrationError",
    "MissingVariables",
    "PromptError",
    "ProviderError",
    "SchemaTooNew",
    "StoreDamaged",
    "StoreError",
    "StoreFull",
    "StoreLocked",
    "StoreReadOnly",
    "exit_status",
]


class MemstreamError(Exception):
    """Root of every error memstream raises on purpose."""


class ConfigError(MemstreamError):
    """A persona file, option or environment value is invalid."""


class StoreError(MemstreamError):
    """The SQLite store cannot be opened, read or written."""


class MigrationError(StoreError):
    """A schema migration failed."""


class SchemaTooNew(MigrationError):
    """The database file has migrations this version of memstream does not know: it was made by a newer one."""


class MemoryNotFound(StoreError):
    """No memory with that id (in that stream)."""


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


class PromptError(MemstreamError):
    """A prompt cannot be loaded or rendered."""


class MissingVariables(PromptError):
    """A prompt was rendered without a value for one of its variables."""

    def __init__(self, prompt: str, names: list[str]) -> None:
        super().__init__(f"prompt {prompt!r} needs {', '.join(names)}")
        self.names = names


# Exit statuses of the command line and the bot, for scripts and supervisors: 0 done; 1 failed (a model server,
# a lock, the disk); 2 bad input (a persona file, an option, a history file); 3 done but memories left pending;
# 4 damaged data (restore a backup or `memstream salvage`); 5 the database was made by a newer memstream.
EXIT_FAILED, EXIT_BAD_INPUT, EXIT_PENDING, EXIT_DAMAGED, EXIT_TOO_NEW = 1, 2, 3, 4, 5


def exit_status(exc: MemstreamError) -> int:
    """The exit status for an error that ends a command (see EXIT_*)."""
    if isinstance(exc, ConfigError):
        return EXIT_BAD_INPUT
    if isinstance(exc, StoreDamaged):
        return EXIT_DAMAGED
    if isinstance(exc, SchemaTooNew):
        return EXIT_TOO_NEW
    return EXIT_FAILED
