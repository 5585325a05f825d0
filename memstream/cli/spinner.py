"""A spinner on the terminal: what the persona is doing while the user waits, redrawn by its own thread.

Drawn only on a terminal (never into a pipe, a log or JSON output), and cleared before anything else is
printed. The thread keeps it turning while the event loop is busy (loading a local model blocks it).
"""

from __future__ import annotations

import sys
import threading
import time
from types import TracebackType
from typing import TextIO

__all__ = ["Spinner"]

FRAMES = "⠋⠙⠹⠸⠼⠴⠦⠧⠇⠏"
ASCII_FRAMES = "|/-\\"


class Spinner:
    """`with Spinner(enabled) as spin: spin.show("answering")`: a turning mark, the label and the seconds."""

    def __init__(self, enabled: bool, *, stream: TextIO | None = None, interval: float = 0.1) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.enabled, self.interval = enabled, interval
        self.label = ""
        self.frames = FRAMES if _can_encode(self.stream, FRAMES) else ASCII_FRAMES
        self._started = 0.0
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def show(self, label: str) -> None:
        """Say what is being done now (the spinner starts at the first label, its seconds from then)."""
        self._start(label, since=time.monotonic())

    def _start(self, label: str, *, since: float) -> None:
        self.label = label
        if not self.enabled or self._thread is not None:
            return
        self._started = since
        self._stop.clear()
        self._thread = threading.Thread(target=self._turn, name="spinner", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop and clear the line, leaving the cursor where the spinner began."""
        thread, self._thread = self._thread, None
        if thread is None:
            return
        self._stop.set()
        thread.join()
        with self._lock:
            self.stream.write("\r\x1b[2K")
            self.stream.flush()

    def note(self, line: str) -> None:
        """Print a line (on the spinner's stream), the spinner going on below it, its seconds counting on."""
        running = self._thread is not None
        self.stop()
        print(line, file=self.stream, flush=True)
        if running:
            self._start(self.label, since=self._started)

    def _turn(self) -> None:
        tick = 0
        while not self._stop.is_set():
            seconds = int(time.monotonic() - self._started)
            line = f"{self.frames[tick % len(self.frames)]} {self.label}…" + (f" {seconds} s" if seconds else "")
            with self._lock:
                self.stream.write(f"\r\x1b[2K{line}")
                self.stream.flush()
            tick += 1
            self._stop.wait(self.interval)

    def __enter__(self) -> Spinner:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        self.stop()


def _can_encode(stream: TextIO, text: str) -> bool:
    try:
        text.encode(getattr(stream, "encoding", None) or "ascii")
    except (UnicodeEncodeError, LookupError):
        return False
    return True
