"""Where a persona's memory lives: a SQLite file's path, or a PostgreSQL URL (told apart by the scheme)."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

__all__ = ["is_database_url", "redact"]

_URL_SCHEMES = ("postgresql://", "postgres://")


def is_database_url(location: str | Path) -> bool:
    """Whether a database setting names a PostgreSQL server (a URL), not a SQLite file (a path)."""
    return isinstance(location, str) and location.startswith(_URL_SCHEMES)


def redact(url: str) -> str:
    """The URL without its password, for messages and logs."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.hostname or ""
    user = f"{parts.username}:***@" if parts.username else ":***@"
    port = f":{parts.port}" if parts.port else ""
    return urlunsplit(parts._replace(netloc=f"{user}{host}{port}"))
