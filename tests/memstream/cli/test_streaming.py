"""`memstream chat` prints the reply as the model writes it, at a real terminal and into a pipe; a stream that
breaks is one line and what was shown is remembered; a server that cannot stream still answers."""

from __future__ import annotations

import asyncio
import json
import os
import re
import sqlite3
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.fakes.openai_server import ChatRequest, FakeOpenAIServer
from tests.memstream.cli.test_terminal import ROOT, Terminal, _persona

REPLY = "Come to my Valentine's Day party at Hobbs Cafe tomorrow at five!"


def _answer(request: ChatRequest) -> str:
    return "7" if "Reply with a single integer" in request.prompt else REPLY


@pytest.fixture
async def slow() -> AsyncIterator[FakeOpenAIServer]:
    """A model server that streams a word every 0.25 s."""
    async with FakeOpenAIServer() as server:
        server.on_chat(_answer)
        server.stream_delay = 0.25
        yield server


def _replies(tmp_path: Path) -> list[str]:
    conn = sqlite3.connect(tmp_path / "isabella.db")
    try:
        return [row[0] for row in conn.execute("SELECT text FROM memories WHERE text LIKE 'Isabella Rodriguez:%'")]
    finally:
        conn.close()


async def _chat(tmp_path: Path, server: FakeOpenAIServer) -> Terminal:
    terminal = Terminal("chat", "--persona", str(_persona(tmp_path, server.base_url)), "--as", "Maria")
    await terminal.read_until(rb"Maria> ")
    return terminal


async def test_the_terminal_shows_the_reply_word_by_word(tmp_path: Path, slow: FakeOpenAIServer) -> None:
    chat = await _chat(tmp_path, slow)
    try:
        chat.type(b"are you having a party?\r")
        await chat.read_until(rb"Isabella Rodriguez: Come to")
        first_seen = time.monotonic()
        assert b"five!" not in chat.screen  # the first words are out, the last not yet written
        await chat.read_until(rb"five!\r?\n.*Maria> ")
        assert time.monotonic() - first_seen > 1.0  # it grew over the stream's length, not at its end
        chat.type(b"\x04")
        assert await chat.exit_status(10) == 0
        assert chat.settings() == chat.before
    finally:
        chat.close()
    assert _replies(tmp_path) == [f"Isabella Rodriguez: {REPLY}"]
    assert all(r.body.get("stream") is True for r in slow.chat_requests if "Reply with a single" not in r.prompt)


async def test_into_a_pipe_the_words_arrive_as_they_are_written(tmp_path: Path, slow: FakeOpenAIServer) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "memstream", "chat", "--persona", str(_persona(tmp_path, slow.base_url)),
        "--as", "Maria", env=env, cwd=ROOT, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL)
    assert proc.stdin is not None and proc.stdout is not None
    try:
        proc.stdin.write(b"are you having a party?\n")
        await proc.stdin.drain()
        seen = b""
        while b"Come" not in seen:
            seen += await asyncio.wait_for(proc.stdout.read(100), 30)
        assert b"five!" not in seen
        proc.stdin.close()
        rest = await asyncio.wait_for(proc.stdout.read(), 30)
        assert (seen + rest).decode() == f"Isabella Rodriguez: {REPLY}\n"
        assert await asyncio.wait_for(proc.wait(), 30) == 0
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


async def test_a_stream_that_breaks_is_one_line_and_what_was_shown_is_remembered(
        tmp_path: Path, slow: FakeOpenAIServer) -> None:
    slow.stream_cut_after = 4  # "Come to my Valentine's", then the connection drops
    chat = await _chat(tmp_path, slow)
    try:
        chat.type(b"are you having a party?\r")
        await chat.read_until(rb"cut off.*Maria> ")
        slow.stream_cut_after = None
        chat.type(b"/why\r")
        await chat.read_until(rb"asked: .*Maria> ")
        chat.type(b"\x04")
        assert await chat.exit_status(10) == 0
    finally:
        chat.close()
    shown = re.sub(r"\x1b\[2K|\r", "\n", chat.screen.decode())
    assert "Isabella Rodriguez: Come to my Valentine's\n" in shown
    assert [line for line in shown.splitlines() if "cut off" in line] == [
        line for line in shown.splitlines() if line.startswith("memstream: the reply was cut off (")]
    assert "Traceback" not in shown
    assert _replies(tmp_path) == ["Isabella Rodriguez: Come to my Valentine's"]


async def test_ctrl_c_while_the_reply_is_written_keeps_what_was_shown(tmp_path: Path, slow: FakeOpenAIServer) -> None:
    slow.stream_delay = 1.0
    chat = await _chat(tmp_path, slow)
    try:
        chat.type(b"are you having a party?\r")
        await chat.read_until(rb"Isabella Rodriguez: Come to")
        chat.type(b"\x03")
        assert await chat.exit_status(10) == 130
        assert chat.settings() == chat.before
    finally:
        chat.close()
    shown = chat.screen.decode()
    said = re.search(r"Isabella Rodriguez: ([^\r\n^]*)", shown)
    assert said is not None
    assert "memstream: interrupted: the reply so far is remembered, cut off" in shown
    assert "Traceback" not in shown
    assert _replies(tmp_path) == [f"Isabella Rodriguez: {said.group(1).strip()}"]


@pytest.mark.parametrize("mode", ["refuse", "whole"])
async def test_a_server_that_cannot_stream_still_answers(tmp_path: Path, slow: FakeOpenAIServer, mode: str) -> None:
    slow.stream_mode = mode
    chat = await _chat(tmp_path, slow)
    try:
        for n in range(2):
            chat.type(b"are you having a party?\r")
            await chat.read_until(rb"(five!.*){%d}Maria> " % (n + 1))
        chat.type(b"\x04")
        assert await chat.exit_status(10) == 0
    finally:
        chat.close()
    assert "error" not in chat.screen.decode().lower() and "failed" not in chat.screen.decode()
    assert _replies(tmp_path) == [f"Isabella Rodriguez: {REPLY}"] * 2
    agent = [r for r in slow.chat_requests if "Reply with a single" not in r.prompt]
    # refused (or answered whole) once, then asked for whole replies without trying again
    assert [r.body.get("stream") for r in agent] == ([True, None, None] if mode == "refuse" else [True, None])


async def test_with_json_the_reply_is_printed_whole(tmp_path: Path, slow: FakeOpenAIServer) -> None:
    slow.stream_delay = 0.0
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "memstream", "chat", "--json", "--persona", str(_persona(tmp_path, slow.base_url)),
        env=env, cwd=ROOT, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.DEVNULL)
    out, _ = await asyncio.wait_for(proc.communicate(b"hello\n"), 60)
    [line] = out.decode().splitlines()
    assert json.loads(line)["reply"] == REPLY
    assert json.loads(line)["cut"] is False
