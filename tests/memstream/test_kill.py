"""SIGKILL in the middle of a burst, an import and a reflection: after a restart nothing is lost, nothing is
doubled, the file is sound, and a killed reflection has changed nothing."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from memstream import MemoryStream, Observation, Source, Store, StreamConfig
from memstream.cli import main
from memstream.testing import FakeEmbedder, ScriptedChat
from tests.fakes.openai_server import ChatRequest, FakeOpenAIServer
from tests.memstream.helpers import INSIGHTS, QUESTIONS
from tests.memstream.index.test_hybrid import assert_in_step
from tests.memstream.kill_worker import STREAMS, T0, messages, persona

ROOT = Path(__file__).resolve().parents[2]
WAIT = 20.0


async def _spawn(*args: str) -> asyncio.subprocess.Process:
    env = {k: v for k, v in os.environ.items() if k not in ("OPENAI_API_KEY", "OPENAI_BASE_URL")}
    return await asyncio.create_subprocess_exec(sys.executable, *args, cwd=ROOT, env=env,
                                                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)


async def _kill_when(process: asyncio.subprocess.Process, ready: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT
    while not ready():
        if process.returncode is not None or time.monotonic() > deadline:
            out, err = await process.communicate()
            raise AssertionError(f"never reached {what}: exit {process.returncode}\n{out.decode()}{err.decode()}")
        await asyncio.sleep(0.002)
    process.send_signal(signal.SIGKILL)
    assert await process.wait() == -signal.SIGKILL


async def rows(store: Store, sql: str, *args: object) -> list[tuple[Any, ...]]:
    async with store.conn.execute(sql, args) as cursor:
        return [tuple(row) for row in await cursor.fetchall()]


async def assert_consistent(store: Store) -> None:
    """integrity_check, foreign keys, and every evidence pointer naming a memory of the same stream."""
    assert await rows(store, "PRAGMA integrity_check") == [("ok",)]
    assert await rows(store, "PRAGMA foreign_key_check") == []
    dangling = await rows(store, "SELECT e.reflection_id, e.memory_id FROM evidence e "
                                 "LEFT JOIN memories r ON r.id = e.reflection_id "
                                 "LEFT JOIN memories m ON m.id = e.memory_id "
                                 "WHERE r.id IS NULL OR m.id IS NULL OR r.stream != m.stream OR r.kind != 'reflection'")
    assert dangling == []
    bare = await rows(store, "SELECT id FROM memories WHERE kind = 'reflection' AND id NOT IN "
                             "(SELECT reflection_id FROM evidence)")
    assert bare == []


async def snapshot(store: Store) -> dict[str, list[tuple[Any, ...]]]:
    """Everything a reflection may change, row by row (model_usage only counts the calls that were made)."""
    return {table: await rows(store, f"SELECT * FROM {table} ORDER BY 1, 2")
            for table in ("memories", "evidence", "stream_state", "faults", "reply_traces")}


async def test_sigkill_in_the_middle_of_a_burst_of_500_loses_and_doubles_nothing(
        tmp_path: Path, openai_server: FakeOpenAIServer) -> None:
    db = tmp_path / "isabella.db"
    openai_server.latency = 0.003
    worker = await _spawn("-m", "tests.memstream.kill_worker", "ingest", str(db), openai_server.base_url, "500", "25")
    await _kill_when(worker, lambda: len(openai_server.requests) >= 200, "the middle of the burst")

    # Restarted with in-process fakes (the server's 64-dim hashed embeddings, rating 5): only faster; with the
    # hybrid profile, whose lexical index must follow what the restart completes and replays.
    restarted = dataclasses.replace(persona(db, openai_server.base_url),
                                    memory=StreamConfig.for_profile("hybrid", reflection_threshold=10**9))
    async with await MemoryStream.open(restarted, environ={}, embedder=FakeEmbedder(64),
                                       chat=ScriptedChat(default="5")) as memory:
        await assert_consistent(memory.store)
        for stream in STREAMS:  # the streams and their indexes loaded from what the kill left
            await memory.explain("message about the party", stream=stream)
        counts = await rows(memory.store, "SELECT message_id, COUNT(*) FROM memories GROUP BY message_id")
        assert counts and all(n == 1 for _, n in counts)
        assert 25 <= len(counts) < 500  # killed mid-way: some batches stored, the rest never seen
        left = (await memory.stats()).pending.count
        assert left > 0
        await memory.complete_pending()
        await memory.observe_many(messages(500))  # the source replays every event after the restart

        stored = await rows(memory.store, "SELECT message_id, COUNT(*), MIN(status) FROM memories GROUP BY message_id")
        assert sorted(m for m, _, _ in stored) == sorted(str(10_000 + i) for i in range(500))
        assert {(n, status) for _, n, status in stored} == {(1, "ready")}
        await assert_consistent(memory.store)
        for stream in STREAMS:  # the importance total counts every completed memory exactly once
            [(total,)] = await rows(memory.store, "SELECT SUM(importance) FROM memories WHERE stream = ?", stream)
            assert await memory.importance_total(stream) == total
            await assert_in_step(memory, stream, ["message number 17 party", "author 3 general", "number 499"])


async def test_an_import_killed_mid_way_and_run_again_stores_each_line_once(
        tmp_path: Path, openai_server: FakeOpenAIServer) -> None:
    db, source = tmp_path / "isabella.db", tmp_path / "history.jsonl"
    toml = tmp_path / "isabella.toml"
    toml.write_text(f'[persona]\nname = "Isabella"\nsummary = "Runs a cafe."\ndatabase = "{db}"\n'
                    f'[models]\nbase_url = "{openai_server.base_url}"\nmax_retries = 0\n', encoding="utf-8")
    lines = [{"text": f"line {i}: Klaus mentioned the party", "at": f"2024-02-13T{9 + i // 60:02d}:{i % 60:02d}:00Z",
              "stream": STREAMS[i % 2]} for i in range(300)]
    lines[7] = {**lines[7], "text": lines[3]["text"]}  # the same text twice is still two lines
    source.write_text("\n".join(json.dumps(line) for line in lines) + "\n", encoding="utf-8")
    openai_server.latency = 0.003
    command = ("-m", "memstream", "import", str(source), "--persona", str(toml))
    first = await _spawn(*command)
    await _kill_when(first, lambda: len(openai_server.requests) >= 30, "the middle of the import")
    async with await Store.open(db) as store:
        await assert_consistent(store)
        [(stored,)] = await rows(store, "SELECT COUNT(*) FROM memories")
        assert 0 < stored < 300

    openai_server.latency = 0.0
    # Run again to the end (in a thread: the model server answers from this test's event loop).
    assert await asyncio.to_thread(main, list(command[2:])) == 0
    async with await Store.open(db) as store:
        await assert_consistent(store)
        found = await rows(store, "SELECT text, created_at, COUNT(*), MIN(status) FROM memories "
                                  "GROUP BY message_id ORDER BY created_at")
        assert [text for text, *_ in found] == [line["text"] for line in lines]
        assert {(n, status) for *_, n, status in found} == {(1, "ready")}


async def _prepared(db: Path, server: FakeOpenAIServer) -> None:
    """A stream with observations and one earlier reflection, then due for the next one."""
    async with await MemoryStream.open(persona(db, server.base_url, threshold=40), environ={},
                                       auto_reflect=False) as memory:
        await memory.observe_many([Observation(f"Klaus said party thing {i}", "guild:1", T0, 4,
                                               Source(message_id=f"p{i}")) for i in range(12)])
        first = await memory.reflect("guild:1", at=T0)
        assert first is not None and first.insights
        await memory.observe_many([Observation(f"Maria said cake thing {i}", "guild:1", T0, 5,
                                               Source(message_id=f"c{i}")) for i in range(10)])
        assert await memory.reflection_due("guild:1")


def _answer(request: ChatRequest) -> str:
    if QUESTIONS in request.prompt:
        return "What is the party?\nWho brings cake?\nHow does Klaus feel?"
    if INSIGHTS in request.prompt:
        return "Klaus and Maria prepare a party together (because of 1, 2, 3)"
    return "5"


@pytest.mark.parametrize("killed_at", ["insights", "insight embedding"])
async def test_a_reflection_killed_mid_way_leaves_the_stream_exactly_as_before(
        tmp_path: Path, openai_server: FakeOpenAIServer, killed_at: str) -> None:
    db = tmp_path / "isabella.db"
    openai_server.on_chat(_answer)
    await _prepared(db, openai_server)
    async with await Store.open(db) as store:
        before = await snapshot(store)

    def hold(path: str, body: Any) -> bool:
        if killed_at == "insights":
            return path.endswith("/chat/completions") and INSIGHTS in json.dumps(body)
        return path.endswith("/embeddings") and "prepare a party together" in json.dumps(body)

    openai_server.hold = hold
    worker = await _spawn("-m", "tests.memstream.kill_worker", "reflect", str(db), openai_server.base_url, "guild:1")
    await _kill_when(worker, lambda: bool(openai_server.held), f"the {killed_at} call")
    # By then the questions were asked and each was retrieved for: three retrievals touched memories.
    assert sum(QUESTIONS in json.dumps(r.body) for r in openai_server.requests) == 2

    async with await Store.open(db) as store:
        await assert_consistent(store)
        assert await snapshot(store) == before

    openai_server.hold = None  # and the next attempt, after the restart, reflects normally
    async with await MemoryStream.open(persona(db, openai_server.base_url, threshold=40), environ={}) as memory:
        result = await memory.reflect("guild:1", only_if_due=True)
        assert result is not None and [m.text for m in result.insights] == ["Klaus and Maria prepare a party together"]
        assert await memory.importance_total("guild:1") == 0
        await assert_consistent(memory.store)
