"""SQLite gives ids in blocks per stream (memstream.store.idblocks): a stream's rows sit together in the file, ids
stay unique and never come back, within a stream they follow its time, and a stream's load walks its blocks."""

from __future__ import annotations

import contextlib
import itertools
from pathlib import Path

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from memstream.store import NewMemory, Store, _load
from memstream.store.idblocks import BLOCK, allocate
from memstream.store.sqlite.binding import sqlite_module
from tests.memstream.helpers import migrations_before, run_sql

T0 = 1_700_000_000.0
VECTOR = np.full(4, 0.5, np.float32).tobytes()


def _new(stream: str, k: int) -> NewMemory:
    return NewMemory(stream=stream, kind="observation", text=f"{stream} says {k}", created_at=T0 + k,
                     importance=3, importance_source="given", embedding=np.full(4, 0.5, np.float32))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(st.sampled_from("abcdef"), max_size=40), max_size=8), st.integers(0, 10**6),
       st.integers(1, 9))
def test_allocation_gives_unique_ids_in_blocks_above_the_top(batches: list[list[str]], top: int, block: int) -> None:
    held: dict[str, tuple[int, int]] = {}
    given_ids: dict[str, list[int]] = {}
    start = top
    for batch in batches:
        made = allocate(batch, held, top, block)
        assert len(made.ids) == len(batch) and made.top >= top
        for stream, i in zip(batch, made.ids, strict=True):
            given_ids.setdefault(stream, []).append(i)
        assert all(made.blocks[s][0] <= made.blocks[s][1] <= made.top + 1 for s in batch)  # reserved
        held.update(made.blocks)
        top = made.top
    every = [i for ids in given_ids.values() for i in ids]
    assert len(set(every)) == len(every) and all(i > start for i in every)  # unique, above what was given
    for ids in given_ids.values():
        assert ids == sorted(ids)  # in order within a stream
        starts = [ids[0]] + [b for a, b in itertools.pairwise(ids) if b != a + 1]
        assert all((s - start - 1) % block == 0 for s in starts)  # each run from a block's first id
        assert len(starts) <= -(-len(ids) // block) * 2  # (a block's run, or its whole block: at most so many)
    assert top - start <= block * sum(-(-len(ids) // block) for ids in given_ids.values())  # no block wasted


async def test_streams_written_together_each_take_blocks_of_neighbouring_ids(tmp_path: Path) -> None:
    path = tmp_path / "blocks.db"
    streams = [f"guild:{n}" for n in range(30)]
    async with await Store.open(path) as store:
        ids: dict[str, list[int]] = {s: [] for s in streams}
        for k in range(40):  # a message of each server at a time, as a persona in many servers gets them
            for stream, i in zip(streams, await store.insert([_new(s, k) for s in streams]), strict=True):
                ids[stream].append(i)
        await store.insert([_new("guild:0", 40 + k) for k in range(BLOCK)])  # its block full: the next one
        every = [i for own in ids.values() for i in own]
        assert len(set(every)) == len(every)
        assert all(own == list(range(own[0], own[0] + 40)) for own in ids.values())  # one block each, in order
        everything = [row[0] for row in await run_sql(store, "SELECT id FROM memories WHERE stream = ? ORDER BY "
                                                              "created_at", "guild:0")]
        assert everything == sorted(everything) and len(everything) == 40 + BLOCK
    with contextlib.closing(sqlite_module().connect(str(path))) as conn:
        count, low, high = conn.execute("SELECT COUNT(*), MIN(id), MAX(id) FROM memories WHERE stream = 'guild:0'"
                                        ).fetchone()
        assert _load.seeks(count, low, high)  # a small share of its range: other servers' blocks between
        assert _load.ranges(conn, "guild:0", low, high) == [(low, low + BLOCK - 1), (high - 39, high)]


async def test_a_block_goes_on_after_a_restart_and_no_id_comes_back(tmp_path: Path) -> None:
    path = tmp_path / "again.db"
    async with await Store.open(path) as store:
        [a1] = await store.insert([_new("a", 1)])
        [b1] = await store.insert([_new("b", 1)])
        [a2] = await store.insert([_new("a", 2)])
        assert (a1, a2, b1) == (1, 2, BLOCK + 1)
        await store.delete([a2])
    async with await Store.open(path) as store:
        [a3] = await store.insert([_new("a", 3)])
        assert a3 == 3  # the block goes on; #2, forgotten, is not given again
        await store.purge_stream("b")  # the whole stream gone, its block with it
        [c1] = await store.insert([_new("c", 1)])
        [b2] = await store.insert([_new("b", 2)])
        assert c1 == 2 * BLOCK + 1 and b2 == 3 * BLOCK + 1  # above every block opened, b's old one included
        assert await run_sql(store, "SELECT seq FROM sqlite_sequence WHERE name = 'memories'") == [(4 * BLOCK,)]


async def test_ids_written_into_an_open_block_send_its_stream_to_a_new_one(tmp_path: Path) -> None:
    # A copy or a salvage writes rows with their ids; one may land in a stream's open block.
    async with await Store.open(tmp_path / "copied.db") as store:
        [a1] = await store.insert([_new("a", 1)])
        await run_sql(store, "INSERT INTO memories (id, stream, kind, text, created_at, last_accessed_at, "
                             "importance, importance_source, embedding) "
                             "VALUES (?, 'x', 'observation', 'copied', ?, ?, 3, 'given', ?)", a1 + 5, T0, T0, VECTOR)
        fresh = await store.insert([_new("a", k) for k in range(2, 5)])
        assert fresh == [BLOCK + 1, BLOCK + 2, BLOCK + 3]  # not a1 + 1 (its block was written into): a new one
        assert (await store.get(a1 + 5)).text == "copied"


async def test_an_old_file_keeps_its_ids_and_new_rows_take_blocks_above_them(tmp_path: Path) -> None:
    db = tmp_path / "old.db"
    old = migrations_before(10, tmp_path / "old-migrations")
    async with await Store.open(db, migrations=old) as store:  # as the version before blocks wrote it
        await run_sql(store, "INSERT INTO memories (stream, kind, text, created_at, last_accessed_at, importance, "
                             "importance_source, embedding) VALUES ('a', 'observation', 'old a', ?1, ?1, 3, 'given', "
                             "?2), ('b', 'observation', 'old b', ?1, ?1, 3, 'given', ?2)", T0, VECTOR)
    async with await Store.open(db) as store:  # migrated: 0010
        assert [m.text for m in (await store.get_many([1, 2])).values()] == ["old a", "old b"]
        assert await store.insert([_new("b", 2), _new("a", 2)]) == [3, BLOCK + 3]
