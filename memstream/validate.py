"""Checks of untrusted values at the door, shared by every way text comes in (files, commands, the bot)."""

from __future__ import annotations

__all__ = ["check_text"]


def check_text(value: str, what: str) -> str:
    """`value` if it can be stored (UTF-8 encodable: no lone surrogate such as "\\ud800"); ValueError if not."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError(f"{what} holds a character that is not valid text ({value[exc.start]!r} at position "
                         f"{exc.start}: a lone UTF-16 surrogate)") from None
    return value
