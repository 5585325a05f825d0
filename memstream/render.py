"""How memory is shown, the same in the terminal, the dashboard and Discord: compact ranges, trees, tables."""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ["compact_ranges"]



def compact_ranges(numbers: Iterable[int]) -> list[str]:
    """Sorted runs of consecutive numbers, each as "a-b" or "a" (nothing for no numbers)."""
    ordered = sorted(set(numbers))
    if not ordered:
        return []
    parts: list[str] = []
    start = prev = ordered[0]
    for n in [*ordered[1:], None]:
        if n is not None and n == prev + 1:
            prev = n
            continue
        parts.append(str(start) if start == prev else f"{start}-{prev}")
        if n is not None:
            start = prev = n
    return parts
