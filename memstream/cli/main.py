"""`memstream`: parse the command line, run the command, and turn a MemstreamError into one line and an exit
status.

The modules that load numpy, the openai SDK or SQLite are imported by the commands that use them, so that
`memstream --help` and a mistyped option answer at once (tests/memstream/cli/test_startup.py).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Iterable, Sequence
from importlib.metadata import EntryPoint

from memstream.cli.handlers import Plain, run
from memstream.cli.options import DEFAULT_PERSONA
from memstream.cli.parser import build_parser
from memstream.exits import EXIT_BAD_INPUT, EXIT_INTERRUPTED, quietly_closed, run_to_exit
from memstream.records import DEFAULT_STREAM

__all__ = ["main"]


def main(argv: Sequence[str] | None = None, *, plugins: Iterable[EntryPoint] | None = None) -> int:
    """Entry point of the console script; `plugins` stands in for the installed ones (tests). Ctrl-C and a
    closed standard output end it as they end a command (run_to_exit), even while it starts or prints --help."""
    try:
        try:
            try:
                return _main(argv, plugins)
            finally:  # here, not at exit (--help ends with SystemExit): a reader that left is seen now
                sys.stdout.flush()
        except BrokenPipeError:
            return quietly_closed()
    except KeyboardInterrupt:
        print("memstream: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED


def _main(argv: Sequence[str] | None, plugins: Iterable[EntryPoint] | None) -> int:
    parser = build_parser(plugins)
    args = _parse(parser, argv)
    if args.command is None:  # `memstream` alone: what it can do, not only "COMMAND is required"
        parser.print_help(sys.stderr)
        return EXIT_BAD_INPUT
    _merge_top_options(args)
    args.stream_given = getattr(args, "stream", None) is not None
    if hasattr(args, "stream") and args.stream is None:
        args.stream = DEFAULT_STREAM
    logging.basicConfig(level=logging.INFO if args.verbose else logging.ERROR,
                        format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("aiosqlite").setLevel(logging.INFO)  # its DEBUG lines carry every statement's values
    return run_to_exit(run(args))


def _parse(parser: argparse.ArgumentParser, argv: Sequence[str] | None) -> argparse.Namespace:
    """The arguments; further ones are a usage error, except for a command that takes any (a stand-in)."""
    args, extra = parser.parse_known_args(argv)
    handler = getattr(args, "handler", None)
    if extra and not (isinstance(handler, Plain) and handler.takes_any):
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    return args


def _merge_top_options(args: argparse.Namespace) -> None:
    """Common options given before the command count as if given after it (after it wins)."""
    if args.top_persona is not None and args.persona == os.environ.get("MEMSTREAM_PERSONA", DEFAULT_PERSONA):
        args.persona = args.top_persona
    if args.top_db is not None and args.db is None:
        args.db = args.top_db
    args.json = args.json or args.top_json
    args.verbose = args.verbose or args.top_verbose
