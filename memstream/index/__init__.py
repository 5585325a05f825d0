"""Retrieval: every memory of a stream scored for a query, from in-memory indexes kept in step with the store."""

__all__: list[str] = []
