"""Ctrl-C (SIGINT) anywhere in a command: one line saying what was done, exit 130, never a traceback; an
import says what it stored and what is left pending."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sqlite3
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.fakes.openai_server import FakeOpenAIServer
from tests.memstream.cli.test_cli import _cli, _persona

ROOT = Path(__file__).resolve().parents[3]
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}


async def _interrupted(server: FakeOpenAIServer, argv: list[str], hold: Callable[[str, Any], bool]
                       ) -> tuple[int, list[str]]:
    """Run `memstream ARGV`, Ctrl-C it once a request `hold` picks is in flight; its status and stderr lines."""
    server.hold = hold
    proc = await asyncio.create_subprocess_exec(sys.executable, "-m", "memstream", *argv, env=ENV, cwd=ROOT,
                                                stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE)
    try:
        for _ in range(600):
            if server.held or proc.returncode is not None:
                break
            await asyncio.sleep(0.05)
        assert server.held, "the command never called the model"
        await asyncio.sleep(0.3)  # more calls in flight
        proc.send_signal(signal.SIGINT)
        _, err = await asyncio.wait_for(proc.communicate(), 10)  # promptly, not when the model answers
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    assert proc.returncode is not None
    return proc.returncode, [line for line in err.decode().splitlines() if line.strip()]


def _embeddings(path: str, body: Any) -> bool:
    return path.endswith("/embeddings")


async def test_ctrl_c_during_an_import_says_what_was_stored_and_what_is_pending(
        tmp_path: Path, server: FakeOpenAIServer) -> None:
    persona = str(_persona(tmp_path, server.base_url))
    history = tmp_path / "history.jsonl"
    history.write_text("".join(json.dumps({"text": f"line {i} about the party", "at": "2024-03-01T10:00:00Z"})
                               + "\n" for i in range(600)), encoding="utf-8")
    status, lines = await _interrupted(server, ["import", str(history), "--persona", persona], _embeddings)
    assert status == 130
    conn = sqlite3.connect(tmp_path / "isabella.db")
    try:
        pending = conn.execute("SELECT count(*) FROM memories WHERE status = 'pending'").fetchone()[0]
    finally:
        conn.close()
    assert pending > 0
    assert lines == [f"memstream: interrupted: 0 of 600 line(s) imported (0 ready); {pending} stored memory(ies) "
                     "pending (not yet rated and embedded): the same import run again skips what is stored and "
                     "completes what is pending"]


@pytest.mark.parametrize(("argv", "hold"), [
    (["recall", "the party"], _embeddings),
    (["observe", "a party on Friday"], lambda path, body: path.endswith("/chat/completions")),
    (["reflect"], lambda path, body: path.endswith("/chat/completions")),
], ids=["recall", "observe", "reflect"])
async def test_ctrl_c_in_any_command_is_one_line_and_130(tmp_path: Path, server: FakeOpenAIServer,
                                                         argv: list[str], hold: Callable[[str, Any], bool]) -> None:
    persona = str(_persona(tmp_path, server.base_url))
    assert await _cli("observe", "Isabella is planning a party", "--importance", "7", "--persona", persona) == 0
    status, lines = await _interrupted(server, [*argv, "--persona", persona], hold)
    assert status == 130
    assert lines == ["memstream: interrupted"]


@pytest.mark.parametrize("after", [0.2, 0.4, 0.8])
async def test_ctrl_c_while_a_command_starts_is_one_line(tmp_path: Path, after: float) -> None:
    proc = await asyncio.create_subprocess_exec(sys.executable, "-m", "memstream", "stats", "--db",
                                                str(tmp_path / "x.db"), env=ENV, cwd=ROOT,
                                                stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE)
    await asyncio.sleep(after)
    if proc.returncode is None:
        proc.send_signal(signal.SIGINT)
    _, err = await asyncio.wait_for(proc.communicate(), 20)
    lines = [line for line in err.decode().splitlines() if line.strip()]
    if proc.returncode == 0:  # it was done before the signal
        return
    if proc.returncode == 1 and err.startswith(b"Fatal Python error: init_import_site"):
        return  # the interpreter's own start (its `site` module), before any of memstream is read: any program's
    assert proc.returncode in (130, -signal.SIGINT)  # before Python's own handler is in place: the signal's
    assert lines in ([], ["memstream: interrupted"])


async def test_a_second_ctrl_c_while_the_first_is_handled_is_still_one_line(
        tmp_path: Path, server: FakeOpenAIServer) -> None:
    persona = str(_persona(tmp_path, server.base_url))
    history = tmp_path / "history.jsonl"
    history.write_text("".join(json.dumps({"text": f"line {i}", "at": "2024-03-01T10:00:00Z"}) + "\n"
                               for i in range(600)), encoding="utf-8")
    server.hold = _embeddings
    proc = await asyncio.create_subprocess_exec(sys.executable, "-m", "memstream", "import", str(history),
                                                "--persona", persona, env=ENV, cwd=ROOT,
                                                stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE)
    try:
        for _ in range(600):
            if server.held:
                break
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.3)
        proc.send_signal(signal.SIGINT)
        await asyncio.sleep(0.001)  # the user presses it again, impatient
        proc.send_signal(signal.SIGINT)
        _, err = await asyncio.wait_for(proc.communicate(), 10)
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    lines = [line for line in err.decode().splitlines() if line.strip()]
    assert proc.returncode in (130, -signal.SIGINT)  # the second one may end Python itself: the shell shows 130
    assert len(lines) == 1 and lines[0].startswith("memstream: interrupted"), lines
