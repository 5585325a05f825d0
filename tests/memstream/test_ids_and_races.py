"""Ids are never reused, a deletion beside a reader says what it did, racing writers each finish cleanly."""

from __future__ import annotations

import asyncio
import json
import os
import sqlite3
import sys
from pathlib import Path

import numpy as np
import pytest

from memstream import MemoryNotFound, MemoryStream, Observation, RoleModel, Source, Store, StreamConfig
from memstream.cli import main
from memstream.testing import FakeClock, FakeEmbedder, ScriptedChat
from tests.fakes.openai_server import FakeOpenAIServer
from tests.memstream.helpers import AGENT, OtherProcess, migrations_before, run_sql
from tests.memstream.test_privacy import leftovers


async def _old_row(store: Store, stream: str, text: str) -> int:
    """A ready memory inserted with the columns every schema version has (as an older version would)."""
    cursor = await store.conn.execute(
        "INSERT INTO memories (stream, kind, text, created_at, last_accessed_at, importance, importance_source, "
        "embedding) VALUES (?, 'observation', ?, 1.0e9, 1.0e9, 5, 'given', ?)",
        (stream, text, np.ones(64, np.float32).tobytes()))
    assert cursor.lastrowid is not None
    return cursor.lastrowid


def _memory(store: Store) -> MemoryStream:
    chat = ScriptedChat()
    chat.on("<memory>", "5")
    chat.on(AGENT, "noted")
    return MemoryStream(store, FakeEmbedder(), rater=RoleModel(chat, "r"), reflector=RoleModel(chat, "r"),
                        agent=RoleModel(chat, "a"), name="Isabella", summary="Runs a cafe.", clock=FakeClock(),
                        config=StreamConfig(reflection_threshold=10_000))


async def test_a_forgotten_id_is_never_given_again_in_any_stream(database: Path | str) -> None:
    db = database
    async with await Store.open(db) as store:
        memory = _memory(store)
        first = await memory.observe("a server memory", stream="guild:1")
        second = await memory.observe("the newest server memory", stream="guild:1")
        await memory.forget([second.id])
        await memory.forget([first.id])
        dm = await memory.observe("a direct message", stream="dm:2")
        assert dm.id > second.id  # not #1 or #2 again, though both are gone
    async with await Store.open(db) as store:  # the sequence survives a restart
        again = await _memory(store).observe("after a restart", stream="dm:2")
        assert again.id == dm.id + 1
        assert await store.get_many([first.id, second.id]) == {}


async def test_forgetting_a_memory_a_reply_used_forgets_the_reply_and_its_trace(database: Path | str) -> None:
    async with await Store.open(database) as store:
        memory = _memory(store)
        top = await memory.observe("the cake is lemon", stream="guild:1")
        other = await memory.observe("the tea is green", stream="guild:1")
        reply = await memory.respond("what cake?", stream="guild:1", speaker="Ann", observe_message=False)
        assert reply.memory is not None and top.id in [m.memory.id for m in reply.memories]
        trace = await store.trace(trace_id=reply.trace_id)
        assert trace is not None and top.id in [item.memory_id for item in trace.items]
        gone = await memory.forget([top.id])
        assert sorted(gone) == sorted([top.id, reply.memory.id])  # the reply was built from it
        assert await store.trace(trace_id=reply.trace_id) is None
        assert await store.get_many([top.id, reply.memory.id, other.id]) == {other.id: other}
        fresh = await memory.observe("a new memory in another stream", stream="dm:9")
        assert fresh.id > reply.memory.id  # no number comes back


async def test_an_old_file_keeps_its_ids_and_references_through_the_rebuild(tmp_path: Path) -> None:
    db = tmp_path / "old.db"
    old = migrations_before(4, tmp_path / "old-migrations")
    async with await Store.open(db, migrations=old) as store:  # written as that version wrote it
        kept_id = await _old_row(store, "guild:1", "kept")
        cited_id = await _old_row(store, "guild:1", "cited")
        await store.conn.execute("INSERT INTO memories (stream, kind, text, created_at, last_accessed_at, "
                                 "importance, importance_source, embedding) SELECT stream, 'reflection', "
                                 "'an insight', created_at, created_at, 5, 'derived', embedding FROM memories "
                                 f"WHERE id = {cited_id}")
        await store.conn.execute(f"INSERT INTO evidence VALUES ((SELECT MAX(id) FROM memories), {cited_id}, 0)")
    async with await Store.open(db) as store:  # 0004 rebuilds the table
        assert (await store.get(kept_id)).text == "kept"
        insight = max((await store.get_many(list(range(1, 10)))).values(), key=lambda m: m.id)
        assert await store.evidence(insight.id) == [cited_id]
        async with store.conn.execute("PRAGMA foreign_keys") as cur:
            assert (await cur.fetchone())[0] == 1
        await _memory(store).forget([cited_id])  # the cascade still works on the rebuilt table
        assert insight.id not in await store.get_many([insight.id])
        fresh = await _memory(store).observe("fresh", stream="guild:1")
        assert fresh.id > insight.id


async def test_forget_beside_an_open_reader_says_what_is_left_and_finishes_later(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db = tmp_path / "p.db"
    secret = "ZQXV-reader-held-secret-ZQXV"
    async with await Store.open(db) as store:
        memory = _memory(store)
        doomed = await memory.observe(f"Klaus: {secret}", stream="guild:1")
        await memory.observe("Maria: tea", stream="guild:1")
    reader = OtherProcess(db)  # another process in the middle of a read
    try:
        async with await Store.open(db) as store:
            memory = _memory(store)
            await memory.forget([doomed.id])
            assert memory.scrubbed is False  # it does not claim what did not happen
            assert leftovers(db, secret)  # and indeed the log still holds a copy
            assert await store.get_meta("scrub_pending_since") is not None
    finally:
        reader.release()
    async with await Store.open(db) as store:  # the next open finishes the scrub
        assert await store.get_meta("scrub_pending_since") is None
    assert leftovers(db, secret) == []


async def test_the_forget_command_tells_the_truth_beside_a_reader(tmp_path: Path,
                                                                  capsys: pytest.CaptureFixture[str]) -> None:
    db = tmp_path / "isabella.db"
    secret = "ZQXV-cli-reader-secret-ZQXV"
    async with FakeOpenAIServer() as server:
        server.on_chat(lambda request: "5")
        persona = tmp_path / "isabella.toml"
        persona.write_text(f'[persona]\nname = "Isabella"\nsummary = "Runs a cafe."\ndatabase = "{db}"\n'
                           f'[models]\nbase_url = "{server.base_url}"\nmax_retries = 0\n', encoding="utf-8")

        async def run(*argv: str) -> int:
            return await asyncio.to_thread(main, [*argv, "--persona", str(persona)])

        assert await run("observe", f"Klaus: {secret}", "--json") == 0
        memory_id = json.loads(capsys.readouterr().out)["id"]
        reader = OtherProcess(db)
        try:
            assert await run("forget", str(memory_id)) == 0
            out = capsys.readouterr().out
            assert "no copy of their text is left" not in out
            assert "another process is reading" in out and "write-ahead log" in out
        finally:
            reader.release()
        assert await run("stats") == 0  # any later command on the persona finishes the scrub
        capsys.readouterr()
    assert leftovers(db, secret) == []


@pytest.mark.parametrize("round_", range(5))
async def test_two_writers_of_the_same_messages_each_finish_and_store_each_once(database: Path | str,
                                                                                  round_: int) -> None:
    db = database
    async with await Store.open(db):
        pass
    lines = [Observation(f"line {i}", "guild:1", source=Source(message_id=f"import:{i}")) for i in range(300)]
    stores = [await Store.open(db) for _ in range(2)]
    try:
        results = await asyncio.gather(*(_memory(s).observe_many(lines) for s in stores))
    finally:
        for store in stores:
            await store.close()
    assert [m.id for m in results[0]] == [m.id for m in results[1]]
    async with await Store.open(db) as store:
        assert await run_sql(store, "SELECT COUNT(*), COUNT(DISTINCT message_id) FROM memories") == [(300, 300)]
        assert (await store.state("guild:1")).importance_since_reflection == 300 * 5  # each counted once


async def test_two_import_processes_of_one_file_both_succeed(tmp_path: Path) -> None:
    async with FakeOpenAIServer() as server:
        server.on_chat(lambda request: "4")
        db = tmp_path / "p.db"
        persona = tmp_path / "p.toml"
        persona.write_text(f'[persona]\nname = "Isabella"\nsummary = "Runs a cafe."\ndatabase = "{db}"\n'
                           f'[models]\nbase_url = "{server.base_url}"\nmax_retries = 0\n', encoding="utf-8")
        history = tmp_path / "h.jsonl"
        history.write_text("".join(json.dumps({"text": f"message {i}", "at": "2024-01-01T10:00:00Z",
                                               "id": str(i)}) + "\n" for i in range(400)), encoding="utf-8")
        procs = [await asyncio.create_subprocess_exec(
            "python", "-m", "memstream", "import", str(history), "--persona", str(persona),
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, env=_env()) for _ in range(2)]
        try:
            outs = await asyncio.wait_for(asyncio.gather(*(p.communicate() for p in procs)), 120)
        finally:
            for proc in procs:
                if proc.returncode is None:
                    proc.kill()
        for proc, (_out, err) in zip(procs, outs, strict=True):
            assert proc.returncode == 0, err.decode()
            assert b"Traceback" not in err
        conn = sqlite3.connect(db)
        assert conn.execute("SELECT COUNT(*), COUNT(DISTINCT message_id), SUM(status = 'ready') "
                            "FROM memories").fetchone() == (400, 400, 400)
        conn.close()


def _env() -> dict[str, str]:
    env = dict(os.environ, OPENAI_API_KEY="test")
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
    return env


async def test_a_running_process_sees_what_another_process_wrote_forgot_and_edited(database: Path | str) -> None:
    db = database
    async with await Store.open(db) as here_store, await Store.open(db) as there_store:
        here, there = _memory(here_store), _memory(there_store)
        await here.observe_many([Observation(f"small talk {i}", "guild:1", importance=1) for i in range(20)])
        assert (await here.retrieve("anything", stream="guild:1"))  # the matrix is loaded here
        favourite = await there.observe("Isabella's favourite colour is teal", stream="guild:1", importance=10)
        found = await here.explain("Isabella's favourite colour is teal", stream="guild:1")
        assert found[0].memory.id == favourite.id  # written elsewhere, seen here
        await there.forget([favourite.id])
        assert favourite.id not in [m.memory.id for m in await here.explain("favourite colour", stream="guild:1",
                                                                             k=30)]
        edited = await there.observe("a note about soup", stream="guild:1", importance=9,
                                     source=Source(message_id="m-edit"))
        await here.explain("soup", stream="guild:1")
        await there.edit_message("guild:1", "m-edit", "a note about the harbour lighthouse")
        top = await here.explain("a note about the harbour lighthouse", stream="guild:1")
        assert top[0].memory.id == edited.id and top[0].memory.text.endswith("lighthouse")
        assert top[0].cosine > 0.99  # the new embedding, not the soup one


async def test_numbers_count_per_stream_from_an_old_file_on_and_are_never_reused(tmp_path: Path) -> None:
    db = tmp_path / "old.db"
    old = migrations_before(6, tmp_path / "before-numbers")
    async with await Store.open(db, migrations=old) as store:
        for i in range(5):  # interleaved: global ids 1..5
            await _old_row(store, "guild:1" if i % 2 == 0 else "guild:2", f"note {i}")
    async with await Store.open(db) as store:  # migrated: numbered per stream, in id order
        memory = _memory(store)
        numbers = {(m.stream, m.text): m.number for s in ("guild:1", "guild:2") for m in await memory.recent(s, 10)}
        assert numbers == {("guild:1", "note 0"): 1, ("guild:1", "note 2"): 2, ("guild:1", "note 4"): 3,
                           ("guild:2", "note 1"): 1, ("guild:2", "note 3"): 2}
        last = await memory.observe("note 5", stream="guild:2")
        assert last.number == 3 and last.id == 6
        await memory.forget([last.id])
        again = await memory.observe("note 6", stream="guild:2")
        assert again.number == 4  # #3 is not given to another memory
        assert await store.by_number("guild:2", 4) == again.id
        with pytest.raises(MemoryNotFound):
            await store.by_number("guild:1", 4)
        await memory.purge("guild:1")
        fresh = await memory.observe("after the purge", stream="guild:1")
        assert fresh.number == 1  # a purged server leaves nothing behind, not even its count
