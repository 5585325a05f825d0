"""HTML that escapes by default: every value put into a template is escaped unless it is already `Safe`.

Memory text is untrusted (anyone on Discord writes it): it reaches a page only through `esc`, which also makes
control and bidi characters visible, as the terminal does (memstream.text), so a memory cannot reorder
the text around it.
"""

from __future__ import annotations

import html
from collections.abc import Iterable
from typing import Any

from memstream.text import visible

__all__ = ["Safe", "esc", "h", "join"]


class Safe(str):
    """Markup that is already escaped (built by `h`, `esc` or `join`)."""

    __slots__ = ()


def esc(value: Any) -> Safe:
    """A value as HTML text (or an attribute value in double quotes); `Safe` values pass unchanged."""
    if isinstance(value, Safe):
        return value
    return Safe(html.escape(visible(str(value)), quote=True))


def h(template: str, *args: Any, **kwargs: Any) -> Safe:
    """`template.format(...)` with every argument escaped (a trusted template, untrusted values)."""
    return Safe(template.format(*(esc(a) for a in args), **{k: esc(v) for k, v in kwargs.items()}))


def join(parts: Iterable[Any], sep: str = "") -> Safe:
    """Pieces of markup (escaped unless `Safe`) joined by a trusted separator."""
    return Safe(sep.join(esc(part) for part in parts))
