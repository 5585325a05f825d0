"""Long lists of ids (or keys) cut into one statement's worth each."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import TypeVar

__all__ = ["CHUNK", "chunks"]

T = TypeVar("T")
# Ids a SQLite statement lists at most: a statement may list a chunk twice, and SQLite's limit of bound
# parameters was 999 before 3.32.
CHUNK = 500


def chunks(items: Iterable[T], size: int = CHUNK) -> Iterator[list[T]]:
    """`items` in order, in lists of at most `size` (none for no items)."""
    batch: list[T] = []
    for item in items:
        batch.append(item)
        if len(batch) == size:
            yield batch
            batch = []
    if batch:
        yield batch
