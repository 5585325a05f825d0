"""Where a persona's memory lives (memstream.location, outside this package so that reading a persona file
loads no database code)."""

from memstream.location import is_database_url, redact

__all__ = ["is_database_url", "redact"]
