"""What a command writes: its result (lines for a person, one JSON document with --json) on standard output,
progress and notes on standard error."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any

from memstream.text import visible, visible_json

__all__ = ["emit", "progress", "say"]


def emit(args: argparse.Namespace, data: Any, lines: Sequence[str]) -> None:
    """The result: `data` as JSON with --json, else the lines (control characters made visible)."""
    if args.json:
        print(visible_json(json.dumps(data, indent=2, ensure_ascii=False, default=str)))
    else:
        print(visible("\n".join(lines)))


def say(line: str) -> None:
    """A note on standard error, prefixed with the program's name."""
    print(visible(f"memstream: {line}"), file=sys.stderr, flush=True)


def progress(done: int, total: int, step: int, verb: str = "imported") -> None:
    """A progress bar on a terminal; a line every 10% elsewhere (logs stay readable)."""
    if not total:
        return
    if sys.stderr.isatty():
        width = 30
        filled = width * done // total
        print(f"\r[{'#' * filled}{'.' * (width - filled)}] {done}/{total}", end="" if done < total else "\n",
              file=sys.stderr, flush=True)
    elif total >= 1000 and (done == total or done * 10 // total != (done - step) * 10 // total):
        print(f"{verb} {done}/{total} ({100 * done // total}%)", file=sys.stderr, flush=True)
