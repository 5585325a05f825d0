"""Exit statuses of the command line and the bot, for scripts and supervisors."""

from __future__ import annotations

from memstream.errors import ConfigError, MemstreamError, SchemaTooNew, StoreDamaged

__all__ = ["EXIT_BAD_INPUT", "EXIT_DAMAGED", "EXIT_FAILED", "EXIT_PENDING", "EXIT_TOO_NEW", "exit_status"]

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
