"""`memstream ...`: the command line."""

from memstream.cli.commands import main

__all__ = ["main"]
