"""PostgreSQL stopped under a command (issue 30: 7): one line on stderr, within seconds, exit 1 (a failure, as
SQLite's database that cannot be opened); what was committed is kept, and the import says what was not stored.
Each test has a server of its own, which it stops (fast shutdown, or the postmaster killed)."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import psycopg
import pytest

from memstream.exits import EXIT_FAILED
from memstream.store import Store
from tests import postgres
from tests.fakes.openai_server import FakeOpenAIServer
from tests.memstream.cli.test_cli import _answer

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}
PROMPT_SECONDS = 15  # the command fails in a few seconds; a shared, loaded machine gets some slack


@pytest.fixture
def own_server() -> Iterator[postgres.Stoppable]:
    with postgres.stoppable_server() as server:
        postgres.make_template(server.admin)
        yield server


@pytest.fixture
async def models() -> AsyncIterator[FakeOpenAIServer]:
    async with FakeOpenAIServer(latency=0.05) as server:
        server.on_chat(_answer)
        yield server


def _persona(tmp_path: Path, url: str, base_url: str) -> Path:
    path = tmp_path / "p.toml"
    path.write_text(f'[persona]\nname = "Isabella"\nsummary = "Runs Hobbs Cafe."\ndatabase = "{url}"\n'
                    f'[models]\nbase_url = "{base_url}"\nmax_retries = 0\n', encoding="utf-8")
    return path


async def _memstream(*argv: str) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(sys.executable, "-m", "memstream", *argv, env=ENV, cwd=ROOT,
                                                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)


def _count(url: str) -> tuple[int, int]:
    with psycopg.connect(url) as conn:
        row = conn.execute("SELECT count(*), count(DISTINCT message_id) FROM memories").fetchone()
    assert row is not None
    return int(row[0]), int(row[1])


@pytest.mark.parametrize("how", ["fast", "kill"])
async def test_the_server_stopped_mid_import_is_one_prompt_line_and_keeps_what_was_stored(
        tmp_path: Path, own_server: postgres.Stoppable, models: FakeOpenAIServer, how: str) -> None:
    url = postgres.create(own_server.admin)
    persona = _persona(tmp_path, url, models.base_url)
    history = tmp_path / "history.jsonl"
    history.write_text("".join(json.dumps({"text": f"line {i} about the party", "at": "2024-03-01T10:00:00Z",
                                           "id": f"m{i}"}) + "\n" for i in range(1000)), encoding="utf-8")
    proc = await _memstream("import", str(history), "--persona", str(persona))
    try:
        for _ in range(600):
            if len(models.embedding_requests) >= 3 or proc.returncode is not None:
                break
            await asyncio.sleep(0.05)
        assert len(models.embedding_requests) >= 3, "the import never reached the model"
        await asyncio.to_thread(own_server.stop, how)
        stopped = time.monotonic()
        _, err = await asyncio.wait_for(proc.communicate(), 120)
        took = time.monotonic() - stopped
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
    lines = [line for line in err.decode().splitlines() if line.strip()]
    assert proc.returncode == EXIT_FAILED
    assert took < PROMPT_SECONDS, f"{took:.0f} s to give up"
    assert len(lines) == 1, lines
    line = lines[0]
    assert line.startswith("memstream: error: ") and "cannot reach the database server" in line
    assert "Traceback" not in line and "psycopg.pool" not in line and "***" in line
    stored = int(line.split("the import stopped: ")[1].split(" of 1000")[0])
    assert 0 < stored < 1000
    assert f"{1000 - stored} were not stored; run the same import again once the database is back" in line
    await asyncio.to_thread(own_server.start)  # what it said is kept, is kept, each line once
    assert await asyncio.to_thread(_count, url) == (stored, stored)
    models.latency = 0.0
    again = await _memstream("import", str(history), "--persona", str(persona))
    await asyncio.wait_for(again.communicate(), 300)
    assert again.returncode == 0
    assert await asyncio.to_thread(_count, url) == (1000, 1000)


async def test_commands_against_a_stopped_server_are_one_prompt_line(
        tmp_path: Path, own_server: postgres.Stoppable, models: FakeOpenAIServer) -> None:
    url = postgres.create(own_server.admin)
    persona = str(_persona(tmp_path, url, models.base_url))
    first = await _memstream("observe", "Isabella plans a party", "--persona", persona)
    await first.communicate()
    assert first.returncode == 0
    await asyncio.to_thread(own_server.stop, "fast")
    for argv in (["stats"], ["stats", "--json"], ["recall", "the party"], ["observe", "another"]):
        started = time.monotonic()
        proc = await _memstream(*argv, "--persona", persona)
        _, err = await asyncio.wait_for(proc.communicate(), 120)
        lines = [line for line in err.decode().splitlines() if line.strip()]
        assert proc.returncode == EXIT_FAILED, argv
        assert time.monotonic() - started < PROMPT_SECONDS, argv
        assert len(lines) == 1 and "cannot reach the database server" in lines[0], (argv, lines)


async def test_the_warnings_psycopg_logs_while_giving_up_a_lost_connection_are_debug(
        postgres_url: str, caplog: pytest.LogCaptureFixture) -> None:
    """What psycopg and its pool say as they give up a connection the server dropped (a failed reconnection, a
    discarded connection, an error ignored in a rollback or a broken pipeline) would be lines around the one
    StoreError; they are DEBUG. psycopg's other warnings are kept."""
    caplog.set_level(logging.INFO)
    async with await Store.open(postgres_url):
        logging.getLogger("psycopg.pool").warning("error connecting in 'pool-1': connection is bad")
        logging.getLogger("psycopg").warning("error ignored terminating %r: %s", "<AsyncPipeline [BAD]>", "lost")
        logging.getLogger("psycopg.transaction").warning("error ignored in rollback of %s: %s", "<T>", "lost")
        logging.getLogger("psycopg").warning("something else")
    assert [(r.name, r.getMessage()) for r in caplog.records if r.levelno >= logging.INFO] == [
        ("psycopg", "something else")]
