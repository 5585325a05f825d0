"""One rooted error hierarchy; foreign exceptions are mapped onto it where they enter.

    MemstreamError
    ├── ConfigError            a persona file, option or environment value is invalid
    ├── StoreError             the SQLite store cannot be opened, read or written
    │   ├── MigrationError     a migration failed (the file is left as it was)
    │   └── MemoryNotFound     no memory with that id in that stream
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
    "StoreError",
]


class MemstreamError(Exception):
    """Root of every error memstream raises on purpose."""


class ConfigError(MemstreamError):
    """A persona file, option or environment value is invalid."""


class StoreError(MemstreamError):
    """The SQLite store cannot be opened, read or written."""


class MigrationError(StoreError):
    """A schema migration failed."""


class MemoryNotFound(StoreError):
    """No memory with that id (in that stream)."""


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
