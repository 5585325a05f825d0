"""`memstream chat` at a real terminal (a pseudo-terminal), Ctrl-C and model failures: the terminal is left as it
was found, whatever ends the chat, and every interruption is one line."""

from __future__ import annotations

import asyncio
import fcntl
import json
import os
import pty
import re
import sqlite3
import subprocess
import sys
import termios
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.fakes.openai_server import ChatRequest, FakeOpenAIServer

ROOT = Path(__file__).resolve().parents[3]
AGENT = "What do you do or say next?"


def _persona(tmp_path: Path, base_url: str) -> Path:
    path = tmp_path / "isabella.toml"
    path.write_text(
        '[persona]\nname = "Isabella Rodriguez"\nsummary = "Runs Hobbs Cafe."\n'
        f'database = "{tmp_path / "isabella.db"}"\n[models]\nbase_url = "{base_url}"\nmax_retries = 0\n',
        encoding="utf-8")
    return path


def _answer(request: ChatRequest) -> str:
    return "7" if "Reply with a single integer" in request.prompt else "Come to my party!"


def _controlling_terminal() -> None:  # in the child: a session of its own, the pseudo-terminal its terminal
    os.setsid()
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)


class Terminal:
    """`memstream chat` on a pseudo-terminal: keys in, what the screen shows out, the line settings after."""

    def __init__(self, *argv: str) -> None:
        self.master, self.slave = pty.openpty()
        self.before = termios.tcgetattr(self.slave)
        env = {**os.environ, "PYTHONPATH": str(ROOT), "TERM": "xterm"}
        self.proc = subprocess.Popen([sys.executable, "-m", "memstream", *argv], stdin=self.slave,
                                     stdout=self.slave, stderr=self.slave, env=env, cwd=ROOT,
                                     preexec_fn=_controlling_terminal)
        self.screen = b""

    async def read_until(self, pattern: bytes, timeout: float = 30) -> None:
        """Read what is shown until `pattern` (a regular expression) appears."""
        deadline = time.monotonic() + timeout
        while not re.search(pattern, self.screen, re.S):
            if time.monotonic() > deadline:
                raise AssertionError(f"{pattern!r} never shown; the screen: {self.screen!r}")
            await self._read(0.1)

    async def _read(self, wait: float) -> None:
        ready = await asyncio.to_thread(_readable, self.master, wait)
        if ready:
            try:
                self.screen += os.read(self.master, 65536)
            except OSError:  # the child is gone and its side closed
                await asyncio.sleep(wait)

    def type(self, keys: bytes) -> None:
        os.write(self.master, keys)

    async def exit_status(self, timeout: float) -> int:
        """The exit status, once it has ended (within `timeout` seconds); what it showed last is read."""
        deadline = time.monotonic() + timeout
        while self.proc.poll() is None:
            if time.monotonic() > deadline:
                self.proc.kill()
                self.proc.wait()
                raise AssertionError(f"still running after {timeout} s; the screen: {self.screen!r}")
            await self._read(0.05)
        await self._read(0.2)
        return self.proc.returncode

    def settings(self) -> list[object]:
        return termios.tcgetattr(self.slave)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        os.close(self.master)
        os.close(self.slave)


def _readable(fd: int, wait: float) -> bool:
    import select

    return bool(select.select([fd], [], [], wait)[0])


@pytest.fixture
async def chat(tmp_path: Path, server: FakeOpenAIServer) -> AsyncIterator[Terminal]:
    terminal = Terminal("chat", "--persona", str(_persona(tmp_path, server.base_url)), "--as", "Maria")
    try:
        await terminal.read_until(rb"Maria> ")
        yield terminal
    finally:
        terminal.close()


def _stored(tmp_path: Path) -> list[str]:
    conn = sqlite3.connect(tmp_path / "isabella.db")
    try:
        return [row[0] for row in conn.execute("SELECT text FROM memories ORDER BY id")]
    finally:
        conn.close()


@pytest.mark.parametrize("leave", [b"\x03", b"\x04", b"/quit\r"], ids=["ctrl-c", "ctrl-d", "quit"])
async def test_however_chat_ends_the_terminal_is_left_as_it_was(chat: Terminal, leave: bytes) -> None:
    chat.type(b"hello there\r")
    await chat.read_until(rb"Come to my party!.*Maria> ")
    chat.type(leave)
    status = await chat.exit_status(10)
    assert chat.settings() == chat.before  # echo, canonical mode, CR to NL: all as they were
    assert status == (130 if leave == b"\x03" else 0)
    assert b"Traceback" not in chat.screen


async def test_ctrl_c_at_the_prompt_is_one_line(chat: Terminal) -> None:
    chat.type(b"\x03")
    assert await chat.exit_status(10) == 130
    after = chat.screen.split(b"Maria> ", 1)[1].decode()
    assert [line for line in after.splitlines() if line.strip(" ^C")] == ["memstream: interrupted"]


async def test_ctrl_c_while_answering_stops_at_once_and_says_what_was_kept(
        chat: Terminal, server: FakeOpenAIServer, tmp_path: Path) -> None:
    server.hold = lambda path, body: AGENT in json.dumps(body)  # the agent model never answers

    chat.type(b"are you there?\r")
    for _ in range(600):
        if server.held:
            break
        await asyncio.sleep(0.05)
    assert server.held, "the agent model was never asked"
    await asyncio.sleep(0.5)
    started = time.monotonic()
    chat.type(b"\x03")
    assert await chat.exit_status(10) == 130
    assert time.monotonic() - started < 3
    shown = chat.screen.split(b"are you there?", 1)[1].decode()
    lines = [line for line in re.sub(r"\x1b\[2K|\r", "\n", shown).splitlines() if line.strip(" ^C")]
    assert lines[-1] == "memstream: interrupted: your line is remembered; there was no reply"
    assert "Traceback" not in shown
    assert chat.settings() == chat.before
    assert any("are you there?" in text for text in _stored(tmp_path))


async def test_a_failed_turn_is_one_line_and_the_chat_goes_on(
        chat: Terminal, server: FakeOpenAIServer, tmp_path: Path) -> None:
    server.fail_next("500", times=10, path="chat")  # the model server is down for this turn
    chat.type(b"first question\r")
    await chat.read_until(rb"first question.*Maria> ")
    server.reset()  # and back
    server.on_chat(_answer)
    chat.type(b"second question\r")
    await chat.read_until(rb"Come to my party!.*Maria> ")
    chat.type(b"\x04")
    assert await chat.exit_status(10) == 0
    shown = chat.screen.decode()
    assert "Traceback" not in shown
    failed = [line for line in shown.splitlines() if "this turn failed" in line]
    assert len(failed) == 1
    assert "HTTP 500" in failed[0]
    assert "second question" in " ".join(_stored(tmp_path))
