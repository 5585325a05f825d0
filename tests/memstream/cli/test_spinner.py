"""The spinner: drawn and cleared on a terminal, nothing anywhere else; in `memstream chat` over a real pty."""

from __future__ import annotations

import asyncio
import io
import os
import pty
import select
import subprocess
import sys
import time
from pathlib import Path

from memstream.cli.spinner import Spinner
from tests.fakes.openai_server import FakeOpenAIServer
from tests.memstream.cli.test_cli import _answer, _persona


class _Terminal(io.StringIO):
    encoding = "utf-8"


def test_it_turns_says_what_is_done_and_clears_its_line() -> None:
    out = _Terminal()
    with Spinner(True, stream=out, interval=0.01) as spin:
        spin.show("rating your message")
        time.sleep(0.05)
        spin.show("answering")
        time.sleep(0.05)
    text = out.getvalue()
    assert "⠋ rating your message…" in text and "answering…" in text
    assert text.endswith("\r\x1b[2K")  # the line is left empty for the reply


def test_a_note_goes_above_it_and_it_goes_on() -> None:
    out = _Terminal()
    with Spinner(True, stream=out, interval=0.01) as spin:
        spin.show("fetching")
        spin.note("memstream: fetching the model")
        time.sleep(0.03)
    text = out.getvalue()
    assert "\x1b[2Kmemstream: fetching the model\n" in text.replace("\r", "")
    assert text.rindex("fetching…") > text.index("the model\n")


def test_its_seconds_count_on_across_a_note() -> None:
    """A note (the model download's) does not restart the count: the user has waited since the start."""
    out = _Terminal()
    with Spinner(True, stream=out, interval=0.01) as spin:
        spin.show("starting the local models")
        time.sleep(1.1)
        spin.note("memstream: fetching the local chat model once")
        time.sleep(0.05)
    after = out.getvalue().split("fetching the local chat model once\n", 1)[1]
    assert "starting the local models…" in after
    assert "starting the local models… 1 s" in after  # not "…" alone: the count did not start again


def test_disabled_it_writes_nothing() -> None:
    out = _Terminal()
    with Spinner(False, stream=out, interval=0.01) as spin:
        spin.show("answering")
        time.sleep(0.03)
    assert out.getvalue() == ""


def test_ascii_where_the_terminal_cannot_show_braille() -> None:
    out = io.TextIOWrapper(io.BytesIO(), encoding="ascii")
    assert Spinner(True, stream=out).frames == "|/-\\"


def _read_until(fd: int, needle: bytes, timeout: float) -> bytes:
    seen = b""
    deadline = time.monotonic() + timeout
    while needle not in seen and time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], 0.1)
        if ready:
            try:
                seen += os.read(fd, 4096)
            except OSError:  # the other end closed
                break
    return seen


async def test_chat_on_a_terminal_shows_each_step_then_the_reply(tmp_path: Path) -> None:
    async with FakeOpenAIServer(latency=0.4) as server:  # slow enough for the spinner to draw
        server.on_chat(_answer)
        persona = str(_persona(tmp_path, server.base_url))
        main, child = pty.openpty()
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "memstream", "chat", "--persona", persona, "--as", "Maria",
            stdin=child, stdout=child, stderr=child)
        os.close(child)
        try:
            await asyncio.to_thread(_read_until, main, b"Maria> ", 30)
            os.write(main, b"are you throwing a party?\n")
            shown = await asyncio.to_thread(_read_until, main, b"Come to my party!", 30)
            os.write(main, b"/quit\n")
            await asyncio.wait_for(proc.wait(), 30)
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
            os.close(main)
    text = shown.decode()
    for label in ("rating your message…", "retrieving memories…", "answering…"):
        assert label in text
    assert text.index("answering…") < text.index("\x1b[2KIsabella Rodriguez: Come to my party!")


async def test_chat_into_a_pipe_shows_no_spinner(tmp_path: Path) -> None:
    async with FakeOpenAIServer(latency=0.3) as server:
        server.on_chat(_answer)
        persona = str(_persona(tmp_path, server.base_url))
        done = await asyncio.to_thread(
            subprocess.run, [sys.executable, "-m", "memstream", "chat", "--persona", persona],
            input="hello\n", capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "…" not in done.stderr and "\x1b" not in done.stderr + done.stdout
