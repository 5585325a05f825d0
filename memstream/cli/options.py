"""The options many commands share (--persona, --db, --json, -v, --local; --stream; --at) and the types that
check option values as they are parsed, so a bad value is a usage error before anything is opened."""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, TypeAlias

from memstream.config import is_database_url, url_problem
from memstream.data.history import parse_time
from memstream.errors import ConfigError
from memstream.records import DEFAULT_STREAM, ID_MAX

if TYPE_CHECKING:
    Subparsers: TypeAlias = argparse._SubParsersAction[argparse.ArgumentParser]  # argparse has no public name

__all__ = ["DEFAULT_PERSONA", "Parents", "database", "importance", "iso_time", "memory_id", "parents", "positive",
           "stream_key", "user_id"]

DEFAULT_PERSONA = "personas/isabella.toml"


@dataclass(frozen=True)
class Parents:
    """Parent parsers a command takes its shared options from."""

    common: argparse.ArgumentParser  # --persona, --db, --json, -v, --local
    scoped: argparse.ArgumentParser  # --stream
    timed: argparse.ArgumentParser  # --at


def parents() -> Parents:
    """The shared options, as parent parsers."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--persona", default=os.environ.get("MEMSTREAM_PERSONA", DEFAULT_PERSONA),
                        help="persona file (default: $MEMSTREAM_PERSONA or %(default)s)")
    common.add_argument("--db", type=database, help="use this database (a file, or a postgresql:// URL) instead of "
                        "the persona's")
    common.add_argument("--json", action="store_true", help="machine-readable output")
    common.add_argument("-v", "--verbose", action="store_true", help="log what happens")
    common.add_argument("--local", action="store_true",
                        help="no key at all: a tiny chat model and embeddings on this machine, and their own "
                             "database beside the persona's (pip install 'memstream[local]'; for trying the "
                             "pipeline, not for a real persona)")
    scoped = argparse.ArgumentParser(add_help=False)
    scoped.add_argument("--stream", type=stream_key,
                        help=f"stream key, e.g. guild:123 or dm:456 (default: {DEFAULT_STREAM})")
    timed = argparse.ArgumentParser(add_help=False)
    timed.add_argument("--at", type=iso_time, help="act at this ISO-8601 time (replays, imports)")
    return Parents(common, scoped, timed)


def iso_time(text: str) -> datetime:
    """An ISO-8601 time (UTC unless it says otherwise)."""
    try:
        return parse_time(text)
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


def importance(text: str) -> int:
    """An importance, 1 to 10."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if not 1 <= value <= 10:
        raise argparse.ArgumentTypeError(f"must be a whole number from 1 to 10, got {text!r}")
    return value


def positive(text: str) -> int:
    """A whole number of at least 1."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a whole number >= 1, got {text!r}")
    return value


def memory_id(text: str) -> int:
    """A memory's id or number: 1 to ID_MAX (what either database can hold)."""
    digits = text.strip()
    value = int(digits) if digits.isdigit() and len(digits) <= len(str(ID_MAX)) else 0
    if not 1 <= value <= ID_MAX:
        raise argparse.ArgumentTypeError(f"must be a memory id, a whole number from 1 to {ID_MAX}, got {text[:40]!r}")
    return value


def stream_key(text: str) -> str:
    """A stream key: anything but blank."""
    if not text.strip():
        raise argparse.ArgumentTypeError("must be a non-empty key such as guild:123, dm:456 or default")
    return text


def user_id(text: str) -> str:
    """A Discord user id: its digits (a name is not an id, and would match no one), without surrounding spaces."""
    digits = text.strip()
    if not (digits.isascii() and digits.isdigit() and len(digits) <= 20):
        raise argparse.ArgumentTypeError(f"must be a Discord user id, its digits such as 123456789012345678, got "
                                         f"{text!r} (a name is not an id: Discord shows it with Developer Mode, "
                                         "right-click > Copy User ID)")
    return digits


def database(value: str) -> Path | str:
    """A --db value: a PostgreSQL URL as given, else a file path (not libpq's key=value form)."""
    if not is_database_url(value) and (problem := url_problem(value)):
        raise argparse.ArgumentTypeError(problem)
    return value if is_database_url(value) else Path(value)
