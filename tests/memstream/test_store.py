"""The store: migrations, sqlite-vec, dimensions, transitive forgetting, state, usage and traces."""

from __future__ import annotations

import asyncio
import json
import shutil
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pytest

from memstream.clock import from_timestamp, to_timestamp
from memstream.errors import MemoryNotFound, MigrationError, StoreError
from memstream.records import ReplyTrace, RoleUsage, Source, TraceItem
from memstream.store import NewMemory, NewTrace, Store, all_migrations, deferred_touches, sqlite_module
from memstream.store.chunks import CHUNK, chunks
from tests.memstream.helpers import run_sql, trace_item

MIGRATIONS = Path(__file__).resolve().parents[2] / "migrations"
SHIPPED = [(m.version, m.name) for m in all_migrations(MIGRATIONS)]
TABLES = {"memories", "evidence", "stream_state", "reply_traces", "model_usage", "meta", "schema_migrations"}
T0 = to_timestamp(datetime(2023, 2, 13, 8, 0, tzinfo=UTC))


def vec(*values: float) -> np.ndarray:
    return np.asarray(values, dtype=np.float32)


def observation(text: str, *, stream: str = "default", importance: int | None = 3, dim: int = 4,
                at: float = T0, message_id: str | None = None) -> NewMemory:
    embedding = None if importance is None else np.full(dim, 0.5, np.float32)
    return NewMemory(stream=stream, kind="observation", text=text, created_at=at, importance=importance,
                     importance_source=None if importance is None else "given", embedding=embedding,
                     source=Source(message_id=message_id))


def tables(path: Path) -> set[str]:
    """Table names, read with a separate plain connection."""
    conn = sqlite_module().connect(str(path))
    try:
        return {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    finally:
        conn.close()


def versions(path: Path) -> list[tuple[int, str]]:
    conn = sqlite_module().connect(str(path))
    try:
        return list(conn.execute("SELECT version, name FROM schema_migrations ORDER BY version"))
    finally:
        conn.close()


def test_the_sqlite_binding_can_load_extensions() -> None:
    assert hasattr(sqlite_module().Connection, "enable_load_extension")


# -- migrations ------------------------------------------------------------------------------------


async def test_a_fresh_file_is_migrated_with_sqlite_vec_loaded(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "fresh.db"
    async with await Store.open(path) as store:
        assert await store.applied() == [m.version for m in all_migrations()] == [v for v, _ in SHIPPED]
        assert SHIPPED[0] == (1, "initial")
        assert await store.pending() == []
        async with store.conn.execute("SELECT vec_version()") as cur:
            row = await cur.fetchone()
        assert row is not None and str(row[0]).startswith("v")
        async with store.conn.execute("SELECT applied_at FROM schema_migrations") as cur:
            applied_at = [row[0] for row in await cur.fetchall()]
        assert len(applied_at) == len(SHIPPED)
        assert all(datetime.fromisoformat(at).tzinfo is not None for at in applied_at)
    assert tables(path) >= TABLES
    assert versions(path) == SHIPPED


async def test_reopening_a_migrated_file_applies_nothing_and_keeps_the_data(tmp_path: Path) -> None:
    path = tmp_path / "memory.db"
    async with await Store.open(path) as store:
        [memory_id] = await store.insert([observation("kept")])
        async with store.conn.execute("SELECT applied_at FROM schema_migrations") as cur:
            first = await cur.fetchall()
    async with await Store.open(path) as store:
        assert await store.migrate() == []
        async with store.conn.execute("SELECT applied_at FROM schema_migrations") as cur:
            assert await cur.fetchall() == first
        assert (await store.get(memory_id)).text == "kept"


def _migrations_with(tmp_path: Path, name: str, sql: str) -> Path:
    directory = tmp_path / "migrations"
    shutil.copytree(MIGRATIONS, directory)
    (directory / name).write_text(sql, encoding="utf-8")
    return directory


BROKEN = "CREATE TABLE partial (x INTEGER);\nINSERT INTO partial VALUES (1);\nCREATE TABLE broken (;\n"


async def test_a_broken_migration_raises_and_leaves_no_partial_table(tmp_path: Path) -> None:
    directory = _migrations_with(tmp_path, "9998_broken.sql", BROKEN)
    path = tmp_path / "memory.db"
    with pytest.raises(MigrationError, match="9998_broken") as info:
        await Store.open(path, migrations=directory)
    assert str(path) in str(info.value)
    assert "partial" not in tables(path)
    assert versions(path) == SHIPPED  # the good migrations before it stay applied


async def test_a_broken_migration_on_a_used_file_keeps_its_data(tmp_path: Path) -> None:
    path = tmp_path / "memory.db"
    async with await Store.open(path) as store:
        [memory_id] = await store.insert([observation("precious")])
    directory = _migrations_with(tmp_path, "9998_broken.sql", BROKEN)
    with pytest.raises(MigrationError):
        await Store.open(path, migrations=directory)
    async with await Store.open(path) as store:
        assert (await store.get(memory_id)).text == "precious"
        assert await store.applied() == [v for v, _ in SHIPPED]
    assert "partial" not in tables(path)


async def test_an_incomplete_statement_is_a_migration_error(tmp_path: Path) -> None:
    directory = _migrations_with(tmp_path, "9998_cut.sql", "CREATE TABLE partial (x INTEGER);\nCREATE TABLE cut (")
    with pytest.raises(MigrationError, match="incomplete"):
        await Store.open(tmp_path / "memory.db", migrations=directory)
    assert "partial" not in tables(tmp_path / "memory.db")


async def test_a_good_second_migration_is_applied_in_order(tmp_path: Path) -> None:
    directory = _migrations_with(tmp_path, "9998_extra.sql", "-- an extra table\nCREATE TABLE extra (x INTEGER);\n")
    path = tmp_path / "memory.db"
    async with await Store.open(path) as store:
        assert await store.applied() == [v for v, _ in SHIPPED]
        assert [m.version for m in await store.pending(all_migrations(directory))] == [9998]
        assert await store.migrate(all_migrations(directory)) == [9998]
    assert versions(path) == [*SHIPPED, (9998, "extra")]
    assert "extra" in tables(path)


@pytest.mark.parametrize(("files", "message"), [
    ({"2_bad-name.sql": "SELECT 1;"}, "not named"),
    ({"0001_again.sql": "SELECT 1;"}, "share a number"),
])
def test_migration_files_are_checked(tmp_path: Path, files: dict[str, str], message: str) -> None:
    directory = tmp_path / "migrations"
    directory.mkdir()
    shutil.copy(MIGRATIONS / "0001_initial.sql", directory)
    for name, sql in files.items():
        (directory / name).write_text(sql, encoding="utf-8")
    with pytest.raises(MigrationError, match=message):
        all_migrations(directory)


# -- writing and reading ---------------------------------------------------------------------------


async def test_embeddings_of_another_dimension_are_refused(store: Store) -> None:
    await store.insert([observation("four", dim=4)])
    with pytest.raises(StoreError, match=r"\[8\] dimensions do not match the store's 4"):
        await store.insert([observation("eight", dim=8)])
    with pytest.raises(StoreError, match="dimensions"):
        await store.insert([observation("four", dim=4), observation("two", dim=2)])
    [pending] = await store.insert([observation("pending", importance=None)])
    with pytest.raises(StoreError, match="dimensions"):
        await store.complete(pending, 3, "rater", np.ones(3, np.float32))
    assert [m.text for m in await store.recent("default", 10, include_pending=True)] == ["pending", "four"]


async def test_pending_memories_are_completed_once(store: Store) -> None:
    [memory_id] = await store.insert([observation("later", importance=None)])
    assert (await store.get(memory_id)).status == "pending"
    assert [m.id for m in await store.pending_memories()] == [memory_id]
    assert len((await store.load_stream("default")).ids) == 0
    assert await store.complete(memory_id, 6, "rater", vec(1, 0, 0, 0))
    assert not await store.complete(memory_id, 2, "rater", vec(1, 0, 0, 0))
    done = await store.get(memory_id)
    assert (done.status, done.importance, done.importance_source) == ("ready", 6, "rater")
    assert (await store.load_stream("default")).ids.tolist() == [memory_id]
    assert np.array_equal(await store.load_vector(memory_id), vec(1, 0, 0, 0))


async def test_pending_memories_of_some_streams_only(store: Store) -> None:
    # A process of a sharded bot completes its own streams' pending work, however many streams it has.
    ids = await store.insert([observation(f"later {n}", stream=f"guild:{n % 1200}", importance=None, at=T0 + n)
                              for n in range(2400)])
    mine = [f"guild:{n}" for n in range(1200) if n % 2 == 0]  # 600 streams: more than one query's worth
    found = await store.pending_memories(10_000, streams=mine)
    assert [m.id for m in found] == [i for n, i in enumerate(ids) if n % 2 == 0]  # as they came (not id order: SQLite)
    first = await store.pending_memories(5, streams=mine[::-1])  # oldest first, whatever the order given
    assert [m.id for m in first] == [ids[0], ids[2], ids[4], ids[6], ids[8]]
    assert await store.pending_memories(streams=[]) == []
    assert len(await store.pending_memories(10_000)) == 2400


async def test_pending_memories_a_closed_store_left_are_the_next_ones_at_once(database: Path | str) -> None:
    # A restart: the bot's start-up pass retries every pending memory the last process left (deferred, or cut off
    # by the shutdown) at once, not only when a claim of the process that is gone would have run out.
    async with await Store.open(database) as before:
        ids = await before.insert([observation(f"deferred {n}", importance=None) for n in range(3)])
    async with await Store.open(database) as after:
        assert [m.id for m in await after.pending_memories(claim=True)] == ids


async def test_a_failed_transaction_writes_nothing(store: Store) -> None:
    with pytest.raises(RuntimeError):
        async with store.transaction():
            await store.insert([observation("lost")])
            raise RuntimeError("boom")
    assert await store.recent("default", 10, include_pending=True) == []


async def test_concurrent_transactions_take_turns(store: Store) -> None:
    async def write(text: str, *, fail: bool = False) -> None:
        async with store.transaction():
            await store.insert([observation(text)])
            await asyncio.sleep(0)  # let the other task run while this transaction is open
            await store.insert([observation(text + "+")])
            if fail:
                raise RuntimeError(text)

    await asyncio.gather(write("a"), write("b"))
    results = await asyncio.gather(write("c"), write("lost", fail=True), write("d"), return_exceptions=True)
    assert [type(r) for r in results] == [type(None), RuntimeError, type(None)]
    texts = sorted(m.text for m in await store.recent("default", 20))
    assert texts == ["a", "a+", "b", "b+", "c", "c+", "d", "d+"]


async def test_one_message_is_one_memory_per_stream(store: Store) -> None:
    [first] = await store.insert([observation("hello", message_id="m1")])
    assert await store.find_message("default", "m1") == first
    assert await store.find_message("guild:2", "m1") is None
    [other] = await store.insert([observation("hello", stream="guild:2", message_id="m1")])
    assert sorted(await store.by_message(["m1", "m9"])) == [first, other]
    with pytest.raises(StoreError, match=r"(?i)unique constraint"):
        await store.insert([observation("hello again", message_id="m1")])
    assert sorted(await store.by_message(["m1"])) == [first, other]


async def test_get_checks_the_stream(store: Store) -> None:
    [memory_id] = await store.insert([observation("mine", stream="dm:1")])
    assert (await store.get(memory_id, stream="dm:1")).stream == "dm:1"
    with pytest.raises(MemoryNotFound, match="dm:2"):
        await store.get(memory_id, stream="dm:2")
    with pytest.raises(MemoryNotFound):
        await store.get(memory_id + 100)


async def test_deleting_a_memory_deletes_the_reflections_built_on_it_transitively(store: Store) -> None:
    a, b, c = await store.insert([observation(t) for t in "abc"])

    def reflection(text: str, depth: int) -> NewMemory:
        return NewMemory(stream="default", kind="reflection", text=text, created_at=T0 + 60, importance=4,
                         importance_source="derived", depth=depth, embedding=np.full(4, 0.5, np.float32))

    [r1, r3] = await store.save_reflection("default", [(reflection("r1", 1), [a, b]), (reflection("r3", 1), [c])],
                                           T0 + 60)
    [r2] = await store.save_reflection("default", [(reflection("r2", 2), [r1, c])], T0 + 120)
    assert await store.evidence(r2) == [r1, c]

    assert await store.delete([a]) == sorted([a, r1, r2])

    left = await store.get_many([a, b, c, r1, r2, r3])
    assert sorted(left) == sorted([b, c, r3])
    assert await store.evidence(r3) == [c]
    assert await run_sql(store, "SELECT COUNT(*) FROM evidence") == [(1,)]
    assert sorted((await store.load_stream("default")).ids.tolist()) == sorted([b, c, r3])


async def test_importance_total_state_and_due_streams(store: Store) -> None:
    assert (await store.state("s")).importance_since_reflection == 0
    assert await store.add_importance("s", 7) == 7
    assert await store.add_importance("s", 5) == 12
    assert await store.add_importance("t", 20) == 20
    assert await store.due_streams(10) == ["s", "t"]
    assert await store.due_streams(15) == ["t"]
    await store.save_reflection("t", [], T0)
    state = await store.state("t")
    assert (state.importance_since_reflection, state.reflections) == (0, 1)
    assert state.last_reflection_at == datetime(2023, 2, 13, 8, 0, tzinfo=UTC)
    assert await store.due_streams(10) == ["s"]


async def test_counts_usage_traces_and_purge(store: Store) -> None:
    await store.insert([observation("a", importance=2), observation("b", importance=2),
                        observation("c", importance=None), observation("d", stream="other", importance=9)])
    counts = await store.counts("default")
    assert (counts.observations, counts.reflections, counts.pending, counts.fallback) == (3, 0, 1, 0)
    assert counts.histogram == {**dict.fromkeys(range(1, 11), 0), 2: 2}
    assert (await store.counts()).histogram[9] == 1

    await store.record_usage("default", "rater", prompt_tokens=10, completion_tokens=1)
    await store.record_usage("default", "rater", failures=1)
    await store.record_usage("other", "rater", prompt_tokens=5)
    assert (await store.usage("default"))["rater"] == RoleUsage(calls=2, failures=1, prompt_tokens=10,
                                                                completion_tokens=1)
    assert (await store.usage())["rater"].calls == 3

    item = TraceItem(memory_id=1, score=2.5, recency=0.25, importance=1.0, relevance=0.5, cosine=0.75)
    trace_id = await store.save_trace(NewTrace("default", T0, "what now?", (item,), None, query_memory_id=2,
                                               query_message_id="discord-41", query_author_id="u1"))
    await store.link_reply(trace_id, ["discord-42", "discord-43"], None)
    assert await store.trace(message_id="discord-43") == await store.trace(trace_id=trace_id)
    assert await store.trace(message_id="discord-44") is None
    assert await store.trace() is None
    assert await store.trace(message_id="discord-42") == ReplyTrace(
        id=trace_id, stream="default", at=from_timestamp(T0), query="what now?", items=(item,), reply_memory_id=None,
        message_id="discord-42", query_memory_id=2, query_message_id="discord-41", query_author_id="u1")
    # The row keeps the items as the JSON every version wrote (a copy between versions reads it the same).
    [(stored,)] = await run_sql(store, "SELECT items FROM reply_traces WHERE id = ?", trace_id)
    assert json.loads(stored) == [{"id": 1, "score": 2.5, "recency": 0.25, "importance": 1.0, "relevance": 0.5,
                                   "cosine": 0.75}]

    assert await store.streams() == ["default", "other"]
    assert await store.purge_stream("default") == 3
    assert await store.streams() == ["other"]
    assert await store.usage("default") == {}
    assert await store.trace(trace_id=trace_id) is None


async def test_linking_a_reply_whose_trace_was_forgotten_meanwhile_links_nothing(store: Store) -> None:
    # The bot sends a reply, then links the sent message to the reply's trace; the deletion of a message the reply
    # used (handled by another task, or another process) can take the trace in between: nothing is left to link.
    used, reply = await store.insert([observation("Klaus: my dog is Rex"), observation("Rex!", importance=None)])
    trace_id = await store.save_trace(NewTrace("default", T0, "the dog?", (trace_item(used),), reply))
    assert sorted(await store.delete([used])) == [used, reply]
    await store.link_reply(trace_id, ["discord-7"], reply)
    assert await store.trace(message_id="discord-7") is None
    assert await run_sql(store, "SELECT COUNT(*) FROM trace_messages") == [(0,)]


async def test_new_files_are_private_and_existing_ones_keep_their_mode(tmp_path: Path) -> None:
    import os
    import stat

    db = tmp_path / "data" / "personas" / "p.db"
    async with await Store.open(db) as store:
        await store.set_meta("x", "y")  # a write: the WAL and shared memory files exist now
        for suffix in ("", "-wal", "-shm"):
            assert stat.S_IMODE(os.stat(f"{db}{suffix}").st_mode) == 0o600, suffix
    for folder in (db.parent, db.parent.parent):
        assert stat.S_IMODE(os.stat(folder).st_mode) == 0o700
    shared = tmp_path / "shared.db"
    shared.touch()
    shared.chmod(0o640)  # the operator's choice
    async with await Store.open(shared):
        pass
    assert stat.S_IMODE(os.stat(shared).st_mode) == 0o640


async def test_what_a_retrieval_returns_is_read_touched_and_counted_in_one_write(store: Store) -> None:
    a, b, c = await store.insert([observation(t) for t in ("a", "b", "c")])
    embedding = [("default", "embedding", 1, 0, 7, 0, 0)]
    found = await store.retrieved([b, a, c + 100], T0 + 3600, usage=embedding)
    assert sorted(found) == [a, b]  # the missing id left out
    assert {to_timestamp(m.last_accessed_at) for m in found.values()} == {T0}  # as read before the touch
    touched = await store.get_many([a, b, c])
    assert [to_timestamp(touched[i].last_accessed_at) for i in (a, b, c)] == [T0 + 3600, T0 + 3600, T0]
    assert (await store.usage("default"))["embedding"].prompt_tokens == 7
    with pytest.raises(RuntimeError):  # joined to an enclosing transaction: undone with it
        async with store.transaction():
            await store.retrieved([c], T0 + 7200, usage=embedding)
            raise RuntimeError("boom")
    assert to_timestamp((await store.get(c)).last_accessed_at) == T0
    assert (await store.usage("default"))["embedding"].calls == 1
    with deferred_touches() as collected:  # a reflection's retrievals: collected, written with its insights
        assert sorted(await store.retrieved([c, a], T0 + 9000)) == [a, c]
    assert collected == {c: T0 + 9000, a: T0 + 9000}
    assert to_timestamp((await store.get(c)).last_accessed_at) == T0
    assert await store.retrieved([], T0) == {}


async def test_a_retrieval_of_more_ids_than_one_statement_holds(store: Store) -> None:
    ids = await store.insert([observation(f"m{n}") for n in range(1200)])
    found = await store.retrieved(ids[::-1], T0 + 60, usage=[("default", "embedding", 1, 0, 0, 0, 0)])
    assert sorted(found) == ids
    assert {to_timestamp(m.last_accessed_at) for m in (await store.get_many(ids)).values()} == {T0 + 60}
    assert (await store.usage("default"))["embedding"].calls == 1


def test_long_lists_of_ids_go_in_chunks_of_one_statement_each() -> None:
    assert list(chunks(range(7), 3)) == [[0, 1, 2], [3, 4, 5], [6]]
    assert list(chunks(iter("ab"), 2)) == [["a", "b"]]  # any iterable, in order
    assert list(chunks([])) == []
    assert [len(chunk) for chunk in chunks(range(1001))] == [CHUNK, CHUNK, 1]


async def test_a_call_after_close_is_a_store_error(database: Path | str) -> None:
    """A task still at work as its owner closes the store (a bot stopping) meets a StoreError, as for any store
    failure: never the driver's own exception."""
    store = await Store.open(database)
    await store.close()
    with pytest.raises(StoreError):
        await store.state("guild:1")
    with pytest.raises(StoreError):
        await store.get_many([1])
