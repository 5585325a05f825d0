"""Exit statuses of the command line and the bot, for scripts and supervisors."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Coroutine
from typing import Any

from memstream.errors import ConfigError, MemstreamError, SchemaTooNew, StoreDamaged
from memstream.text import visible

__all__ = ["EXIT_BAD_INPUT", "EXIT_DAMAGED", "EXIT_FAILED", "EXIT_PENDING", "EXIT_TOO_NEW", "exit_status",
           "run_to_exit"]

# 0 done; 1 failed (a model server,
# a lock, the disk); 2 bad input (a persona file, an option, a history file); 3 done but memories left pending;
# 4 damaged data (restore a backup or `memstream salvage`); 5 the database was made by a newer memstream.
EXIT_FAILED, EXIT_BAD_INPUT, EXIT_PENDING, EXIT_DAMAGED, EXIT_TOO_NEW = 1, 2, 3, 4, 5


def exit_status(exc: MemstreamError) -> int:
    """The exit status for an error that ends a command (see EXIT_*)."""
    if isinstance(exc, ConfigError):
        return EXIT_BAD_INPUT
    if isinstance(exc, StoreDamaged):
        return EXIT_DAMAGED
    if isinstance(exc, SchemaTooNew):
        return EXIT_TOO_NEW
    return EXIT_FAILED


def run_to_exit(command: Coroutine[Any, Any, int]) -> int:
    """Run a command to its exit status: an error that ends it is one line on stderr (never a traceback) and
    its status (exit_status); Ctrl-C is 130."""
    try:
        return asyncio.run(command)
    except MemstreamError as exc:
        print(visible(f"memstream: error: {exc}"), file=sys.stderr)
        return exit_status(exc)
    except KeyboardInterrupt:
        return 130
