"""Untrusted text at the edges: checked where it comes in (files, commands, the bot), made harmless where it
goes out to a terminal. Memory text is untrusted, and a control character in it (ESC [2J clears the screen, a
bidi override reorders a line) must not act on the operator's terminal: every one is made visible."""

from __future__ import annotations

import re

__all__ = ["check_text", "visible", "visible_json"]

def check_text(value: str, what: str) -> str:
    """`value` if it can be stored (UTF-8 encodable: no lone surrogate such as "\\ud800"); ValueError if not."""
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError(f"{what} holds a character that is not valid text ({value[exc.start]!r} at position "
                         f"{exc.start}: a lone UTF-16 surrogate)") from None
    return value


# C0 controls but newline and tab, DEL, C1 controls, and the Unicode bidi embeddings/overrides/isolates.
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069]")
_JSON_UNSAFE = re.compile("[\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def _show(match: re.Match[str]) -> str:
    char = match.group()
    code = ord(char)
    if code < 0x20:
        return chr(0x2400 + code)  # the Unicode control picture: ESC shows as ␛
    if code == 0x7F:
        return "\u2421"  # ␡
    return f"\\u{code:04x}" if code > 0xFF else f"\\x{code:02x}"


def visible(text: str) -> str:
    """`text` with every control character (but newline and tab) replaced by a visible stand-in."""
    return _CONTROL.sub(_show, text)


def visible_json(text: str) -> str:
    """A JSON document safe on a terminal: json escapes C0 controls itself; DEL, C1 and bidi controls get
    \\u escapes (the same string to a JSON reader)."""
    return _JSON_UNSAFE.sub(lambda m: f"\\u{ord(m.group()):04x}", text)
