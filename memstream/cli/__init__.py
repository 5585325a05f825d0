"""`memstream ...`: the command line, a module per command family (chat, memories, files, evaluate, web, doctor,
init), their parser and how commands run (parser, handlers), and the plugins' commands (plugins)."""

from memstream.cli.main import main

__all__ = ["main"]
