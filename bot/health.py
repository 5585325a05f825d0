"""The container's health check: `python -m bot.health` exits 0 while the bot's gateway is connected.

The bot writes its state to $MEMSTREAM_STATUS_FILE (when set): "connected <unix time>" on ready and on every
resume, "disconnected <unix time>" when the gateway drops. A missing file means the bot has not connected yet.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

__all__ = ["STATUS_ENV", "main", "write_status"]

STATUS_ENV = "MEMSTREAM_STATUS_FILE"


def write_status(state: str) -> None:
    """Record the gateway's state for the health check (nothing when no status file is configured)."""
    path = os.environ.get(STATUS_ENV)
    if path:
        partial = Path(path + ".partial")
        partial.write_text(f"{state} {time.time():.0f}\n", encoding="utf-8")
        partial.replace(path)


def main() -> int:
    """0 if the gateway is connected, 1 (with the reason on stderr) if not."""
    path = os.environ.get(STATUS_ENV)
    if not path:
        print(f"{STATUS_ENV} is not set", file=sys.stderr)
        return 1
    try:
        state = Path(path).read_text(encoding="utf-8").split()
    except OSError:
        print("the bot has not connected to Discord yet", file=sys.stderr)
        return 1
    if not state or state[0] != "connected":
        print(f"the bot's gateway is {state[0] if state else 'unknown'}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
