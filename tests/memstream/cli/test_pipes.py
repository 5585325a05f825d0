"""Every command that writes to standard output, when its reader leaves (`| head -1`): it ends quietly with the
status the shell gives a program SIGPIPE ended (141), never a traceback."""

from __future__ import annotations

import asyncio
import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fakes.openai_server import FakeOpenAIServer
from tests.memstream.cli.test_cli import _cli, _persona

ROOT = Path(__file__).resolve().parents[3]
PIPE_CLOSED = 141
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}


@pytest.fixture
async def persona(tmp_path: Path, server: FakeOpenAIServer) -> str:
    """A persona whose default stream is well over a pipe's 64 KB."""
    path = str(_persona(tmp_path, server.base_url))
    lines = tmp_path / "history.jsonl"
    lines.write_text("".join(json.dumps({"text": f"line {i}: " + "the party at Hobbs Cafe " * 12,
                                         "at": f"2024-03-01T10:{i % 60:02d}:00Z"}) + "\n" for i in range(400)),
                     encoding="utf-8")
    assert await _cli("import", str(lines), "--importance", "5", "--persona", path) == 0
    return path


COMMANDS = [
    ["export", "--stream", "default"],
    ["export", "--author", "123"],
    ["memories", "-n", "400", "--json"],
    ["memories", "-n", "400"],
    ["recall", "party", "-k", "50"],
    ["recall", "party", "--json"],
    ["stats", "--json"],
    ["stats"],
    ["why", "1"],
    ["--help"],
    ["export", "--help"],
]


@pytest.mark.parametrize("argv", COMMANDS, ids=" ".join)
async def test_a_reader_that_left_ends_the_command_quietly(persona: str, argv: list[str]) -> None:
    persona_args = ["--persona", persona] if "--help" not in argv else []

    def run() -> tuple[int, str]:
        with subprocess.Popen([sys.executable, "-m", "memstream", *argv, *persona_args], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, env=ENV, cwd=ROOT) as proc:
            assert proc.stdout is not None and proc.stderr is not None
            proc.stdout.close()  # the reader is gone before the first byte is written
            err = proc.stderr.read().decode()
            return proc.wait(60), err

    status, err = await asyncio.to_thread(run)
    assert err == ""
    assert status == (0 if "--help" in argv else PIPE_CLOSED)  # argparse drops what --help could not write


@pytest.mark.parametrize("reader", ["head -1", "head -c 5"])
async def test_export_into_head(persona: str, reader: str) -> None:
    command = (f"set -o pipefail; {shlex.quote(sys.executable)} -m memstream export --stream default "
               f"--persona {shlex.quote(persona)} | {reader}")
    done = await asyncio.to_thread(subprocess.run, ["bash", "-c", command], capture_output=True, text=True,
                                   env=ENV, cwd=ROOT, timeout=60)
    assert done.stderr == ""
    assert done.returncode == PIPE_CLOSED  # as `cat big-file | head -1` under pipefail
    assert done.stdout.startswith('{"text"'[: 5 if "-c" in reader else None])
