"""Untrusted text at the edges: checked where it comes in (files, commands, the bot), made harmless where it
goes out to a terminal. Memory text is untrusted, and a control character in it (ESC [2J clears the screen, a
bidi override reorders a line) must not act on the operator's terminal: every one is made visible."""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path

from memstream.errors import ConfigError

__all__ = ["check_text", "read_bounded", "visible", "visible_json"]


def read_bounded(path: Path, what: str, *, max_bytes: int, max_line: int | None = None,
                 encoding: str = "utf-8") -> str:
    """The text of a file given on the command line (a persona, an import, an eval file), read only if it is
    a regular file of at most `max_bytes` bytes whose lines are at most `max_line` characters: else one
    ConfigError line saying which limit (never a MemoryError from /dev/zero, nor a wait on a pipe)."""
    try:
        found = os.stat(path)  # before opening: opening a FIFO would wait for a writer
        if not stat.S_ISREG(found.st_mode):
            raise ConfigError(f"{path}: not a regular file: {what} must be one (not a device, pipe or folder)")
        if found.st_size > max_bytes:
            raise ConfigError(f"{path}: {found.st_size} bytes: {what} may have at most {max_bytes} bytes")
        with open(path, "rb") as file:
            if not stat.S_ISREG(os.fstat(file.fileno()).st_mode):
                raise ConfigError(f"{path}: not a regular file: {what} must be one")
            data = file.read(max_bytes + 1)
        if len(data) > max_bytes:  # it grew while read
            raise ConfigError(f"{path}: more than {max_bytes} bytes: {what} may have at most {max_bytes} bytes")
        text = data.decode(encoding)
    except FileNotFoundError:
        raise
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read: {exc}") from exc
    if max_line is not None:
        for number, line in enumerate(text.splitlines(), 1):
            if len(line) > max_line:
                raise ConfigError(f"{path}: line {number} has {len(line)} characters: a line of {what} may have "
                                  f"at most {max_line}")
    return text

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
