"""What only the PostgreSQL backend has to show: exact retrieval against the spec's formula in SQL, several
processes sharing one database (idempotent message ids, claimed pending work, one reflection at a time, other
processes' writes seen before a query), deletion down to the table files, ids never reused, clear errors."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any

import numpy as np
import psycopg
import pytest

from memstream.config import StreamConfig
from memstream.errors import StoreError
from memstream.index.ranking import rank
from memstream.index.vectors import StreamVectors
from memstream.records import Source
from memstream.store import NewMemory, NewTrace, Store
from memstream.store.postgres.migrate import postgres_migrations
from tests.memstream.helpers import run_sql, trace_item

T0 = 1_700_000_000.0
# The spec's score in SQL, over every ready memory of a stream (min-max per part; equal values give 0.5).
ORACLE = """
WITH s AS MATERIALIZED (
    SELECT id, created_at,
           power(%(decay)s, GREATEST(%(now)s - last_accessed_at, 0) / 3600.0) AS rec,
           importance::float8 AS imp,
           1 - (embedding <=> %(query)s::vector) AS rel
    FROM memories WHERE stream = %(stream)s AND status = 'ready'),
r AS (SELECT min(rec) AS rec0, max(rec) AS rec1, min(imp) AS imp0, max(imp) AS imp1, min(rel) AS rel0,
             max(rel) AS rel1 FROM s)
SELECT id FROM s, r ORDER BY
    %(wr)s * CASE WHEN rec1 > rec0 THEN (rec - rec0) / (rec1 - rec0) ELSE 0.5 END
  + %(wi)s * CASE WHEN imp1 > imp0 THEN (imp - imp0) / (imp1 - imp0) ELSE 0.5 END
  + %(wl)s * CASE WHEN rel1 > rel0 THEN (rel - rel0) / (rel1 - rel0) ELSE 0.5 END DESC,
    created_at DESC, id DESC
LIMIT %(k)s
"""


def memories(n: int, *, stream: str = "guild:1", dim: int = 16, seed: int = 0,
             message: str | None = None) -> list[NewMemory]:
    rng = np.random.default_rng(seed)
    return [NewMemory(stream=stream, kind="observation", text=f"{stream} memory {i}", created_at=T0 + 60 * i,
                      importance=int(rng.integers(1, 11)), importance_source="given",
                      embedding=rng.standard_normal(dim).astype(np.float32),
                      source=Source(message_id=None if message is None else f"{message}{i}"))
            for i in range(n)]


@pytest.fixture
async def pg(postgres_url: str) -> Any:
    store = await Store.open(postgres_url)
    yield store
    await store.close()


async def test_retrieval_in_process_is_the_spec_formula_run_in_sql(pg: Store, postgres_url: str) -> None:
    ids = await pg.insert(memories(400))
    rng = np.random.default_rng(7)
    await pg.touch(ids[::3], T0 + 20_000)
    vectors = StreamVectors(await pg.load_stream("guild:1"))
    config = StreamConfig()
    async with await psycopg.AsyncConnection.connect(postgres_url) as conn:
        for _ in range(5):
            query = rng.standard_normal(16).astype(np.float32)
            now = T0 + 30_000 + float(rng.integers(0, 100_000))
            ranked = rank(vectors, query, now, config, 10)
            mine = vectors.ids[ranked.rows].tolist()
            cur = await conn.execute(ORACLE, {"decay": config.decay, "now": now, "query": str(query.tolist()),
                                              "stream": "guild:1", "wr": config.weight_recency,
                                              "wi": config.weight_importance, "wl": config.weight_relevance, "k": 10})
            assert mine == [row[0] for row in await cur.fetchall()]


async def test_a_stream_read_by_several_connections_is_the_same_as_by_one(postgres_url: str) -> None:
    one, several = await Store.open(postgres_url, load_processes=1), await Store.open(postgres_url, load_processes=3)
    try:
        await one.insert(memories(20_000, dim=8) + memories(50, stream="other", dim=8))
        a, b = await one.load_stream("guild:1"), await several.load_stream("guild:1")
        assert isinstance(b.embeddings, list) and len(b.embeddings) == 3
        assert a.ids.tolist() == b.ids.tolist() and len(a.ids) == 20_000
        assert np.array_equal(a.matrix(), b.matrix()) and np.array_equal(a.inverse_norms, b.inverse_norms)
        assert np.array_equal(a.last_accessed, b.last_accessed) and np.array_equal(a.importance, b.importance)
    finally:
        await one.close()
        await several.close()


async def test_a_bad_row_fails_the_load_with_its_place(pg: Store) -> None:
    ids = await pg.insert(memories(50, dim=4))
    await run_sql(pg, "UPDATE memories SET embedding = '[1,2,3]' WHERE id = ?", ids[30])
    with pytest.raises(StoreError, match="other than 4 dimensions"):
        await pg.load_stream("guild:1")


async def test_two_processes_storing_one_message_store_it_once(postgres_url: str) -> None:
    stores = [await Store.open(postgres_url) for _ in range(2)]
    try:
        batch = memories(200, message="m")
        results = await asyncio.gather(*(s.insert_unique(batch) for s in stores),
                                       *(s.insert_unique(list(reversed(batch))) for s in stores))
    finally:
        for store in stores:
            await store.close()
    ids = [r[0] for r in results[0]]
    assert [r[0] for r in results[1]] == ids and [r[0] for r in results[2]] == ids[::-1]
    assert sum(new for result in results for _, new in result) == 200  # each stored by exactly one of them
    async with await Store.open(postgres_url) as store:
        assert await run_sql(store, "SELECT COUNT(*), COUNT(DISTINCT message_id) FROM memories") == [(200, 200)]


async def test_pending_work_is_claimed_by_one_process_and_completed_once(postgres_url: str) -> None:
    a, b = await Store.open(postgres_url), await Store.open(postgres_url)
    try:
        pending = [NewMemory(stream="s", kind="observation", text=f"p{i}", created_at=T0) for i in range(10)]
        ids = await a.insert(pending)
        assert await b.pending_memories(claim=True) == []  # the inserting process holds them while it completes
        await run_sql(a, "UPDATE memories SET claimed_until = NULL")  # as if it died: its claims run out
        mine, theirs = await asyncio.gather(a.pending_memories(6, claim=True), b.pending_memories(6, claim=True))
        assert sorted(m.id for m in [*mine, *theirs]) == ids  # every one, to exactly one of them
        assert not {m.id for m in mine} & {m.id for m in theirs}
        vector = np.ones(4, np.float32)
        done = await asyncio.gather(*(s.complete_many("s", [(i, 5, "rater", vector) for i in ids]) for s in (a, b)))
        assert sorted(done[0] + done[1]) == ids and not set(done[0]) & set(done[1])
        assert (await a.state("s")).importance_since_reflection == 5 * 10  # each counted once
        await a.count_attempt(ids[0])  # a failure lets go of nothing that is not pending
        assert await b.pending_memories(claim=True) == []
    finally:
        await a.close()
        await b.close()


async def test_a_failed_attempt_lets_another_process_try(postgres_url: str) -> None:
    a, b = await Store.open(postgres_url), await Store.open(postgres_url)
    try:
        [memory_id] = await a.insert([NewMemory(stream="s", kind="observation", text="p", created_at=T0)])
        assert await b.pending_memories(claim=True) == []
        await a.count_attempt(memory_id, at=T0)  # the model failed: the claim goes, the backoff stays
        assert await b.pending_memories(claim=True, due_at=T0 + 1) == []  # not due yet
        assert [m.id for m in await b.pending_memories(claim=True, due_at=T0 + 3600)] == [memory_id]
    finally:
        await a.close()
        await b.close()


# A process that claims pending work (by inserting it) and is then killed: no close, no goodbye.
_HOLDER = """
import asyncio, sys
from memstream.store import NewMemory, Store
async def main():
    store = await Store.open(sys.argv[1])
    ids = await store.insert([NewMemory(stream="s", kind="observation", text=f"p{i}", created_at=0.0)
                              for i in range(3)])
    print(*ids, flush=True)
    await asyncio.sleep(3600)
asyncio.run(main())
"""


async def test_the_claims_of_a_killed_process_are_free_as_soon_as_it_is_gone(postgres_url: str) -> None:
    # PostgreSQL ends a killed process's sessions, and with them its presence lock: the next process (a restart)
    # retries its pending work at once, not after CLAIM_SECONDS.
    holder = await asyncio.create_subprocess_exec(sys.executable, "-c", _HOLDER, postgres_url,
                                                  stdout=asyncio.subprocess.PIPE)
    try:
        assert holder.stdout is not None
        ids = [int(x) for x in (await asyncio.wait_for(holder.stdout.readline(), 60)).split()]
        assert len(ids) == 3
        async with await Store.open(postgres_url) as other:
            assert await other.pending_memories(claim=True) == []  # the holder is there: its claims stand
            holder.kill()
            await holder.wait()
            claimed = []
            for _ in range(200):  # the server sees the connection close within milliseconds
                if claimed := await other.pending_memories(claim=True):
                    break
                await asyncio.sleep(0.05)
            assert [m.id for m in claimed] == ids
    finally:
        if holder.returncode is None:
            holder.kill()
            await holder.wait()


async def test_one_process_reflects_on_a_stream_at_a_time(postgres_url: str) -> None:
    a, b = await Store.open(postgres_url), await Store.open(postgres_url)
    try:
        async with a.reflection_claim("guild:1") as first, b.reflection_claim("guild:1") as second, \
                b.reflection_claim("guild:2") as other:
            assert (first, second, other) == (True, False, True)
        async with b.reflection_claim("guild:1") as later:
            assert later
    finally:
        await a.close()
        await b.close()


async def test_a_process_sees_other_processes_writes_to_its_streams_not_its_own(postgres_url: str) -> None:
    here, there = await Store.open(postgres_url), await Store.open(postgres_url)
    try:
        ids = await here.insert(memories(5) + memories(5, stream="guild:2"))
        await here.load_stream("guild:1")
        assert await here.changed_elsewhere(["guild:1"]) == set()
        await here.insert(memories(2, seed=1))  # our own write: our matrix has it
        await here.touch(ids[:2], T0 + 5)
        assert await here.changed_elsewhere(["guild:1"]) == set()
        await there.insert(memories(1, stream="guild:2"))  # a stream we do not hold
        assert await here.changed_elsewhere(["guild:1"]) == set()
        for write in (there.touch([ids[0]], T0 + 9), there.delete([ids[1]]), there.insert(memories(1, seed=2))):
            await write
            assert await here.changed_elsewhere(["guild:1"]) == {"guild:1"}
            await here.load_stream("guild:1")
        await there.insert(memories(1, seed=3))
        await here.insert(memories(1, seed=4))  # our write after theirs: theirs is still missed, and seen
        assert await here.changed_elsewhere(["guild:1"]) == {"guild:1"}
    finally:
        await here.close()
        await there.close()


async def test_writers_of_one_stream_in_two_processes_never_deadlock(postgres_url: str) -> None:
    # A reflection (touches, insights, the importance reset) beside new messages and their completion: each
    # takes the stream's lock first, so they queue instead of locking rows in opposite orders.
    a, b = await Store.open(postgres_url), await Store.open(postgres_url)
    try:
        ids = await a.insert(memories(20, dim=4))
        vector = np.ones(4, np.float32)

        async def reflect(i: int) -> None:
            insight = NewMemory(stream="guild:1", kind="reflection", text=f"insight {i}", created_at=T0, importance=5,
                                importance_source="derived", depth=1, embedding=vector)
            await a.save_reflection("guild:1", [(insight, ids[:2])], T0, {m: T0 + i for m in ids[i % 5::5]})

        async def observe(i: int) -> None:
            [(new, _)] = await b.insert_unique([NewMemory(stream="guild:1", kind="observation", text=f"m{i}",
                                                          created_at=T0, source=Source(message_id=f"x{i}"))])
            await b.complete_many("guild:1", [(new, 3, "rater", vector)], [("guild:1", "rater", 1, 0, 1, 1, 0)])

        await asyncio.gather(*(work(i) for i in range(40) for work in (reflect, observe)))
        assert (await a.state("guild:1")).reflections == 40
        assert (await a.counts("guild:1")).observations == 60
    finally:
        await a.close()
        await b.close()


async def test_batches_of_two_streams_writing_each_others_usage_never_deadlock(postgres_url: str) -> None:
    # A burst's batch carries the usage counted so far, of every stream, in the order the calls were counted:
    # batches of two streams (each under its own stream's lock) may list the same usage rows in opposite orders.
    a, b = await Store.open(postgres_url), await Store.open(postgres_url)
    try:
        vector = np.ones(4, np.float32)
        streams = ("guild:1", "guild:2")

        async def complete(store: Store, i: int) -> None:
            stream = streams[i % 2]
            [(new, _)] = await store.insert_unique([NewMemory(stream=stream, kind="observation", text=f"m{i}",
                                                              created_at=T0, source=Source(message_id=f"u{i}"))])
            usage = [(s, role, 1, 0, 1, 1, 0) for s in streams for role in ("rater", "embedder")]
            await store.complete_many(stream, [(new, 3, "rater", vector)], usage[::-1] if i % 2 else usage)

        await asyncio.gather(*(complete(store, i) for i in range(60) for store in (a, b)))
        usage = await a.usage("guild:1")
        assert usage["rater"].calls == 120 and usage["embedder"].calls == 120
    finally:
        await a.close()
        await b.close()


async def test_a_memory_stream_reloads_a_stream_another_process_wrote_to(make_memory: Any, embedder: Any,
                                                                        database: Any) -> None:
    memory = make_memory()
    first = await memory.observe("Maria painted the river", stream="s", importance=5)
    assert [m.memory.id for m in await memory.explain("river", stream="s")] == [first.id]
    async with await Store.open(database) as other:
        [theirs] = await other.insert([NewMemory(stream="s", kind="observation", text="Klaus fixed the bike",
                                                 created_at=T0, importance=5, importance_source="given",
                                                 embedding=(await embedder.embed_batch(["Klaus fixed the bike"]))[0])])
        assert theirs in {m.memory.id for m in await memory.explain("bike", stream="s")}
        await other.delete([theirs])
    assert theirs not in {m.memory.id for m in await memory.explain("bike", stream="s")}


async def test_ids_are_never_reused_and_deletion_cascades_to_trace_items(pg: Store) -> None:
    ids = await pg.insert(memories(3))
    trace = await pg.save_trace(NewTrace("guild:1", T0, "what?", (trace_item(ids[0]), trace_item(ids[1])), ids[2]))
    await pg.delete([ids[0]])
    assert await pg.trace(trace_id=trace) is None  # a reply built from a forgotten memory goes too
    assert await run_sql(pg, "SELECT COUNT(*) FROM trace_items") == [(0,)]
    assert set(await pg.get_many(ids)) == {ids[1]}  # the reply itself (ids[2]) was forgotten with it
    [later] = await pg.insert(memories(1, seed=5))
    assert later > max(ids)
    later_trace = await pg.save_trace(NewTrace("guild:1", T0, "again?", ()))
    assert later_trace > trace


async def _heap_tuples_holding(url: str, needle: str) -> int:
    """Tuples (live or dead, not yet vacuumed) holding `needle` in the memories heap and its TOAST, read with
    pageinspect from the pages themselves: what no query can see."""
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        await conn.execute("CREATE EXTENSION IF NOT EXISTS pageinspect")
        found = 0
        for table in ("memories", "reply_traces"):
            cur = await conn.execute("SELECT pg_relation_size(%s::regclass) / current_setting('block_size')::int",
                                     (table,))
            blocks = (await cur.fetchone())[0]
            for block in range(blocks):
                cur = await conn.execute("SELECT t_data FROM heap_page_items(get_raw_page(%s, %s))", (table, block))
                found += sum(1 for (data,) in await cur.fetchall() if data is not None and needle.encode() in data)
        return found


async def test_a_deletion_vacuums_the_text_out_of_the_table(pg: Store, postgres_url: str) -> None:
    secret = "ZQXV-my-phone-is-555-0199-ZQXV"
    rows = memories(30)
    rows[12] = NewMemory(stream="guild:1", kind="observation", text=f"Klaus: {secret}", created_at=T0,
                         importance=3, importance_source="given", embedding=np.ones(16, np.float32))
    ids = await pg.insert(rows)
    await pg.save_trace(NewTrace("guild:1", T0, f"about {secret}", (trace_item(ids[12]),), query_memory_id=ids[12]))
    await pg.delete([ids[12]])
    assert await run_sql(pg, "SELECT COUNT(*) FROM memories WHERE text LIKE ?", f"%{secret}%") == [(0,)]
    assert await _heap_tuples_holding(postgres_url, secret) > 0  # dead tuples: the test can see them
    assert await pg.scrub() is True
    assert await _heap_tuples_holding(postgres_url, secret) == 0


async def test_an_older_snapshot_holds_the_scrub_until_it_ends(pg: Store, postgres_url: str) -> None:
    ids = await pg.insert(memories(5))
    reader = await psycopg.AsyncConnection.connect(postgres_url)
    await reader.set_isolation_level(psycopg.IsolationLevel.REPEATABLE_READ)
    await reader.execute("SELECT COUNT(*) FROM memories")  # a snapshot from before the deletion
    try:
        await pg.delete([ids[0]])
        assert await pg.scrub(wait=0.1) is False
        assert await pg.get_meta("scrub_pending_since") is not None
    finally:
        await reader.rollback()
        await reader.close()
    assert await pg.finish_scrub() is True  # (also done by the next open or close)
    assert await _heap_tuples_holding(postgres_url, "guild:1 memory 0") == 0


async def test_an_unreachable_server_is_one_clear_line_with_no_password() -> None:
    with pytest.raises(StoreError) as info:
        await Store.open("postgresql://memstream:s3cret@127.0.0.1:9/none?connect_timeout=2")
    message = str(info.value)
    assert "cannot reach the database server" in message and "s3cret" not in message and "\n" not in message


async def test_processes_starting_at_once_migrate_once(postgres_server: str) -> None:
    from tests import postgres

    url = postgres.create(postgres_server)
    try:
        async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
            await conn.execute("DROP SCHEMA public CASCADE; CREATE SCHEMA public")  # an empty database
        stores = await asyncio.gather(*(Store.open(url) for _ in range(3)))
        for store in stores:
            await store.close()
        async with await Store.open(url) as store:
            assert await run_sql(store, "SELECT version FROM schema_migrations ORDER BY version") == [
                (m.version,) for m in postgres_migrations()]
    finally:
        postgres.drop(postgres_server, url)


def test_two_real_processes_racing_for_pending_work_complete_each_once(postgres_url: str, tmp_path: Path) -> None:
    async def setup() -> list[int]:
        async with await Store.open(postgres_url) as store:
            ids = await store.insert([NewMemory(stream=f"s{i % 3}", kind="observation", text=f"p{i}", created_at=T0)
                                      for i in range(300)])
            await run_sql(store, "UPDATE memories SET claimed_until = NULL")
            return ids

    ids = asyncio.run(setup())
    worker = Path(__file__).with_name("pg_claim_worker.py")
    import subprocess

    procs = [subprocess.Popen([sys.executable, str(worker), postgres_url, str(tmp_path / f"done{i}")])
             for i in range(2)]
    assert [p.wait(timeout=120) for p in procs] == [0, 0]
    done = [[int(x) for x in (tmp_path / f"done{i}").read_text().split()] for i in range(2)]
    assert sorted(done[0] + done[1]) == ids  # every pending memory completed, by exactly one process
    assert done[0] and done[1]  # both took part

    async def check() -> list[tuple[Any, ...]]:
        async with await Store.open(postgres_url) as store:
            return await run_sql(store, "SELECT stream, importance_since_reflection FROM stream_state ORDER BY stream")

    assert asyncio.run(check()) == [("s0", 500), ("s1", 500), ("s2", 500)]
