"""Exit statuses of the command line and the bot, for scripts and supervisors."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import sys
import threading
from collections.abc import Coroutine, Iterator
from typing import Any

from memstream.errors import ConfigError, MemstreamError, SchemaTooNew, StoreDamaged
from memstream.text import visible

__all__ = ["EXIT_BAD_INPUT", "EXIT_DAMAGED", "EXIT_FAILED", "EXIT_INTERRUPTED", "EXIT_PENDING", "EXIT_PIPE_CLOSED",
           "EXIT_TOO_NEW", "Interrupted", "exit_status", "quietly_closed", "run_to_exit"]

# 0 done; 1 failed (a model server,
# a lock, the disk); 2 bad input (a persona file, an option, a history file); 3 done but memories left pending;
# 4 damaged data (restore a backup or `memstream salvage`); 5 the database was made by a newer memstream.
EXIT_FAILED, EXIT_BAD_INPUT, EXIT_PENDING, EXIT_DAMAGED, EXIT_TOO_NEW = 1, 2, 3, 4, 5
# The shell's statuses for a program ended by a signal (128 + its number): Ctrl-C (SIGINT), and standard output
# closed by its reader (SIGPIPE: `memstream export ... | head -1`), as `cat` ends under `set -o pipefail`.
EXIT_INTERRUPTED, EXIT_PIPE_CLOSED = 130, 141


class Interrupted(Exception):
    """Ctrl-C ended a command; the message says what it had done (run_to_exit prints it, exit 130)."""


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
    its status (exit_status); Ctrl-C is one line and 130; standard output closed by its reader ends the command
    quietly with 141 (what the shell reports for a program SIGPIPE ended)."""
    try:
        try:
            status = _run(command)
            sys.stdout.flush()  # here, not at exit: a reader that left is seen now
            return status
        except BrokenPipeError:
            return quietly_closed()
    except MemstreamError as exc:
        print(visible(f"memstream: error: {exc}"), file=sys.stderr)
        return exit_status(exc)
    except Interrupted as exc:
        _ending_threads_quietly()
        print(visible(f"memstream: interrupted: {exc}"), file=sys.stderr)
        return EXIT_INTERRUPTED
    except KeyboardInterrupt:
        _ending_threads_quietly()
        print("memstream: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED


def _run(command: Coroutine[Any, Any, int]) -> int:
    """asyncio.run, but Ctrl-C pressed again while the command says what the first one interrupted (and closes
    the database) is ignored, instead of raising KeyboardInterrupt wherever the program is (a traceback)."""
    ctrl_c = _CtrlC()
    with ctrl_c.installed(), asyncio.Runner() as runner:
        ctrl_c.loop = runner.get_loop()
        ctrl_c.loop.set_exception_handler(_unless_interrupted)
        try:
            return runner.run(ctrl_c.main(command))
        except asyncio.CancelledError:
            if ctrl_c.presses:
                raise KeyboardInterrupt from None
            raise


class _CtrlC:
    """SIGINT: the first cancels the command, which cleans up and says what it had done; a second meanwhile
    is ignored; a third ends the program at once (a cleanup that hangs)."""

    def __init__(self) -> None:
        self.presses = 0
        self.loop: asyncio.AbstractEventLoop | None = None
        self.task: asyncio.Task[int] | None = None

    async def main(self, command: Coroutine[Any, Any, int]) -> int:
        self.task = asyncio.current_task()
        return await command

    def __call__(self, signum: int, frame: object) -> None:
        self.presses += 1
        if self.presses == 1:
            if self.task is None or self.loop is None or self.task.done():
                raise KeyboardInterrupt
            self.task.cancel()
            self.loop.call_soon_threadsafe(lambda: None)  # wake the loop up
        elif self.presses >= 3:
            print("memstream: interrupted", file=sys.stderr, flush=True)
            os._exit(EXIT_INTERRUPTED)

    @contextlib.contextmanager
    def installed(self) -> Iterator[None]:
        """The handler, where Python's own is (the main thread, SIGINT not ignored)."""
        if threading.current_thread() is not threading.main_thread() or \
                signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
            yield
            return
        signal.signal(signal.SIGINT, self)
        try:
            yield
        finally:
            signal.signal(signal.SIGINT, signal.default_int_handler)


def _unless_interrupted(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
    """The loop's report of an error no one awaited, unless it is the interruption itself (a second Ctrl-C
    while the command was saying what the first one interrupted): that is the one line already."""
    if not isinstance(context.get("exception"), Interrupted | KeyboardInterrupt):
        loop.default_exception_handler(context)


def _ending_threads_quietly() -> None:
    """After Ctrl-C, a worker thread (a database connection's) may finish a call the interrupted command no
    longer waits for, and fail to hand the result to the event loop, which is closed: nothing is lost, and it
    is no traceback for the user."""
    previous = threading.excepthook

    def hook(args: threading.ExceptHookArgs) -> None:
        if isinstance(args.exc_value, RuntimeError) and str(args.exc_value) == "Event loop is closed":
            return
        previous(args)

    threading.excepthook = hook


def quietly_closed() -> int:
    """Standard output's reader left (`| head`): nothing more is written to it, not even at exit (Python's
    final flush would print a BrokenPipeError); the status the shell gives a program SIGPIPE ended."""
    with open(os.devnull, "wb") as devnull, contextlib.suppress(OSError, ValueError):  # not a file (tests)
        os.dup2(devnull.fileno(), sys.stdout.fileno())
    return EXIT_PIPE_CLOSED
