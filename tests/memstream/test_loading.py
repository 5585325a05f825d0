"""Loading a stream for retrieval: both backends give the same arrays, bit for bit, and the same texts (edge
values, deletions, other streams in between, one reader or several, inside a transaction); a write after the
load's snapshot shows at the next check; anything malformed from PostgreSQL is a clear error, never arrays."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
from pathlib import Path
from typing import Any

import numpy as np
import psycopg
import pytest

from memstream.errors import StoreError
from memstream.records import Source
from memstream.store import NewMemory, Store, StreamArrays, _load, records
from memstream.store.postgres.grouped import PLAN, GroupReader, copy_sql
from memstream.store.sqlite.binding import sqlite_module
from memstream.store.sqlite.evidence import STREAM_EVIDENCE
from tests.memstream.helpers import run_sql

T0 = 1_700_000_000.0
DIM = 6
TEXTS = ["", "plain", "naïve café", "日本語のテキスト", "e\u0301 (combining)", "emoji 🎉🧑‍🎨", "tab\tnew\nline",
         "quotes ' \" and \\ back\\slash", "مرحبا", "x" * 10_000, "{\"json\": [1, 2]}", "\u200b zero width",
         "  padded  ", "\n"]
EDGES = [np.zeros(DIM), [-0.0, 0.0, -0.0, 1.0, -1.0, 0.5], [1.4e-45, -1.4e-45, 1e-38, 3.4e38, -3.4e38, 1.0],
         [1e-20, 2e-20, 3e-20, 1e20, 1e-3, 7.0]]


def _memories(n: int, seed: int = 0) -> list[NewMemory]:
    """n memories over three interleaved streams (guild:1's ids sparse), edge embeddings and texts among them,
    importance 1 to 10, times with fractions; every 50th pending (no embedding)."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        stream = ("guild:1", "guild:1", "guild:2", "guild:1", "dm:3")[i % 5]
        pending = i % 50 == 6  # in guild:1
        vector = (np.asarray(EDGES[i % 97], np.float32) if i % 97 < len(EDGES)
                  else rng.standard_normal(DIM) * (1 if i % 3 else rng.uniform(1e-3, 1e3)))
        out.append(NewMemory(stream=stream, kind="observation" if i % 7 else "reflection",
                             text=TEXTS[i % len(TEXTS)] + f" #{i}" * (i % 2), created_at=T0 + i * 61.37 + rng.random(),
                             importance=None if pending else int(rng.integers(1, 11)),
                             importance_source=None if pending else "given",
                             embedding=None if pending else vector.astype(np.float32)))
    return out


def _by_id(arrays: StreamArrays, position: dict[int, int] | None = None) -> dict[str, Any]:
    """The arrays in id order, floats as their bits; the texts in the same order. With `position` (each id's place
    among the rows inserted), the ids as those places: the same on every backend, whatever ids it gives."""
    order = np.argsort(arrays.ids, kind="stable")
    assert arrays.inverse_norms is not None
    ids = arrays.ids[order].tolist()
    out: dict[str, Any] = {"ids": ids if position is None else [position[i] for i in ids]}
    for name in ("importance", "last_accessed", "created", "inverse_norms"):
        out[name] = np.ascontiguousarray(getattr(arrays, name)[order]).tobytes()
    out["matrix"] = np.ascontiguousarray(arrays.matrix()[order]).tobytes()
    out["texts"] = None if arrays.texts is None else [arrays.texts[i] for i in order.tolist()]
    return out


async def _fill(store: Store, memories: list[NewMemory]) -> tuple[dict[int, int], set[int]]:
    """Insert, touch some, delete some of guild:1 (both ends, a run, a few): each id's place among the memories
    (ids are the backend's: unique, and in the order of the inserts within each stream), and the places of
    guild:1's ready memories."""
    ids = await store.insert(memories)
    assert len(set(ids)) == len(ids)
    for stream in {m.stream for m in memories}:
        own = [i for i, m in zip(ids, memories, strict=True) if m.stream == stream]
        assert own == sorted(own), stream
    await store.touch(ids[::11], T0 + 1e6 + 0.123)
    mine = [i for i, m in zip(ids, memories, strict=True) if m.stream == "guild:1"]
    doomed = {mine[0], mine[-1], *mine[100:140], *mine[500:503]}
    await store.delete(sorted(doomed))
    position = {i: k for k, i in enumerate(ids)}
    return position, {position[i] for i in mine if i not in doomed and memories[position[i]].embedding is not None}


async def test_both_backends_load_the_same_arrays_and_texts_bit_for_bit(tmp_path: Path, postgres_url: str) -> None:
    memories = _memories(3_000)
    loads: dict[tuple[str, int], dict[str, Any]] = {}
    for name, location in (("sqlite", tmp_path / "a.db"), ("postgres", postgres_url)):
        async with await Store.open(location) as store:
            position, ready = await _fill(store, memories)
        for readers in (1, 3):
            async with await Store.open(location, load_processes=readers) as store:
                loaded = await store.load_stream("guild:1", texts=True)
                assert isinstance(loaded.embeddings, list) == (readers > 1)
                loads[name, readers] = _by_id(loaded, position)
                assert _by_id(await store.load_stream("guild:1"), position)["texts"] is None
                assert _by_id(await store.load_stream("guild:1"), position) == {**loads[name, readers], "texts": None}
        async with await Store.open(location) as store, store.transaction():  # what the transaction sees
            [extra] = await store.insert([memories[0]])
            loads[name, 0] = _by_id(await store.load_stream("guild:1", texts=True), {**position, extra: -1})
            assert loads[name, 0]["ids"][-1] == -1  # the newest, last
    first = loads["sqlite", 1]
    assert first["ids"] == sorted(ready) and 1_600 < len(ready) < 1_800
    expected = [memories[k] for k in sorted(ready)]
    assert first["texts"] == [m.text for m in expected]
    assert np.frombuffer(first["matrix"], np.float32).reshape(-1, DIM)[0].tolist() == [-0.0, 0.0, -0.0, 1, -1, 0.5]
    assert {m.text.split(" #")[0] for m in expected} == set(TEXTS)
    for key, got in loads.items():
        if key[1] == 0:
            assert got == loads["sqlite", 0], key
        else:
            assert got == first, key


async def test_a_load_reads_the_sources_in_the_same_pass_on_both_backends(tmp_path: Path, postgres_url: str) -> None:
    names = [None, "Ann", "Zoë ✨", "", "\u2028"]
    memories = [dataclasses.replace(m, source=Source(
        author=names[i % 5], author_id=None if i % 4 == 0 else str(i % 9), channel=names[(i + 1) % 5],
        channel_id=None if i % 6 == 0 else f"c{i % 3}", message_id=None if i % 7 == 0 else f"m{i}",
        reply_to=f"m{i - 3}" if i % 5 == 0 else None)) for i, m in enumerate(_memories(1_500))]
    for location in (tmp_path / "s.db", postgres_url):
        async with await Store.open(location) as store:
            await _fill(store, memories)
            expected = {i: dataclasses.astuple(s) for i, s in (await store.sources("guild:1")).items()}
        assert len(expected) > 500 and any(None in fields for fields in expected.values())
        assert any("" in fields for fields in expected.values())  # an empty name is not a missing one
        for readers in (1, 3):
            async with await Store.open(location, load_processes=readers) as store:
                loaded = await store.load_stream("guild:1", texts=True, sources=True)
                assert loaded.sources is not None
                assert dict(zip(loaded.ids.tolist(), loaded.sources, strict=True)) == expected, (location, readers)
                assert (await store.load_stream("guild:1", texts=True)).sources is None
        async with await Store.open(location) as store, store.transaction():
            loaded = await store.load_stream("guild:1", texts=True, sources=True)
            assert loaded.sources is not None
            assert dict(zip(loaded.ids.tolist(), loaded.sources, strict=True)) == expected, location


def _sequential(location: Path) -> None:
    """The file's ids rewritten in the order the rows were made across all streams, as stores wrote them before
    migration 0010 (each stream's rows spread over the whole file, a row here and there)."""
    with contextlib.closing(sqlite_module().connect(str(location))) as conn:
        ids = [row[0] for row in conn.execute("SELECT id FROM memories ORDER BY created_at, id")]
        conn.executemany("UPDATE memories SET id = ? WHERE id = ?", [(-k - 1, i) for k, i in enumerate(ids)])
        conn.executemany("UPDATE memories SET id = ? WHERE id = ?", [(k + 1, -k - 1) for k in range(len(ids))])
        conn.commit()


@pytest.mark.parametrize("layout", ["blocks", "sequential"])
async def test_a_stream_interleaved_with_others_is_read_by_its_runs_or_its_index_with_the_same_rows(
        tmp_path: Path, layout: str) -> None:
    location = tmp_path / "mixed.db"
    async with await Store.open(location) as store:
        await _fill(store, _memories(5_000))
    if layout == "sequential":
        _sequential(location)
    module = sqlite_module()
    with contextlib.closing(module.connect(str(location))) as conn:
        spans = {s: conn.execute("SELECT COUNT(*), MIN(id), MAX(id) FROM memories WHERE stream = ?", (s,)).fetchone()
                 for s in ("guild:1", "dm:3")}
        runs = _load.ranges(conn, "dm:3", *spans["dm:3"][1:])
    assert not _load.seeks(*spans["guild:1"])  # three rows in five of its range: walked
    assert _load.seeks(*spans["dm:3"])  # one in five: not the whole range
    if layout == "blocks":  # its ids in a few blocks of 256: each walked
        assert runs is not None and 4 <= len(runs) <= 5 and sum(b - a + 1 for a, b in runs) < 1_300
    else:  # its rows one in five: sought through the stream index
        assert runs is None
    for stream, (count, low, high) in spans.items():
        read = []
        for seek in (False, True):
            sink = _load.Sink(count, DIM, texts=True, sources=True)
            _load.read_range(_load.read_only(module, str(location)), stream, low, high, sink, seek=seek)
            read.append(_by_id(records.sink_arrays(sink)) | {"sources": sorted(zip(sink.ids[:sink.n].tolist(),
                                                                                      sink.sources or [],
                                                                                      strict=True))})
        assert read[0] == read[1] and len(read[0]["ids"]) > 900, stream
        async with await Store.open(location) as store:  # and the store's load, whichever way it reads
            loaded = _by_id(await store.load_stream(stream, texts=True))
            assert loaded == {key: value for key, value in read[0].items() if key != "sources"}, stream


def test_runs_hold_every_id_and_join_ids_close_together() -> None:
    assert _load.runs([]) == []
    assert _load.runs([5]) == [(5, 5)]
    assert _load.runs([1, 2, 3, 70, 200, 264, 329], gap=64) == [(1, 3), (70, 70), (200, 264), (329, 329)]
    rng = np.random.default_rng(3)
    for _ in range(50):
        ids = sorted(set(rng.integers(0, 5_000, int(rng.integers(1, 300))).tolist()))
        found = _load.runs(ids, gap=16)
        assert [i for i in ids if not any(a <= i <= b for a, b in found)] == []  # every id in a run
        assert all(a2 - b1 > 16 for (_, b1), (a2, _) in itertools.pairwise(found))  # far apart: kept apart
        assert all(a in ids and b in ids for a, b in found)  # no run wider than its ids
        inside = [[i for i in ids if a <= i <= b] for a, b in found]
        assert all(j - i <= 16 for run in inside for i, j in itertools.pairwise(run))  # close: together


async def test_a_stream_s_evidence_is_found_through_its_reflections_alone(tmp_path: Path) -> None:
    location = tmp_path / "evidence.db"
    async with await Store.open(location) as store:
        ids = await store.insert(_memories(200))
        cited = [i for i, m in zip(ids, _memories(200), strict=True) if m.stream == "dm:3"][:3]
        insight = dataclasses.replace(_memories(1)[0], stream="dm:3", kind="reflection", text="an insight",
                                      importance_source="derived", depth=1)
        [reflection] = await store.save_reflection("dm:3", [(insight, cited)], T0 + 10)
        assert await store.evidence_links("dm:3") == {reflection: cited}
        assert await store.evidence_links("guild:1") == {}
    with contextlib.closing(sqlite_module().connect(str(location))) as conn:
        plan = " ".join(str(row[-1]) for row in conn.execute("EXPLAIN QUERY PLAN " + STREAM_EVIDENCE, ("dm:3",)))
    # the stream's reflections from their own index alone (migration 0009), never a look at each of its memories
    assert "USING COVERING INDEX memories_reflections" in plan and "memories_by_stream" not in plan, plan


async def test_an_empty_stream_loads_as_no_rows_on_both(tmp_path: Path, postgres_url: str) -> None:
    for location in (tmp_path / "a.db", postgres_url):
        async with await Store.open(location) as store:
            await store.insert(_memories(3)[2:3])  # guild:2 only
            empty = await store.load_stream("guild:1", texts=True)
            assert len(empty.ids) == 0 and empty.texts == [] and empty.matrix().shape[0] == 0


async def test_a_write_after_the_loads_snapshot_shows_at_the_next_check(postgres_url: str) -> None:
    here, there = await Store.open(postgres_url, load_processes=3), await Store.open(postgres_url)
    try:
        await here.insert(_memories(20_000, seed=1))
        ready = {int(i) for i in (await here.load_stream("guild:1")).ids}
        for n in range(6):
            loading = asyncio.ensure_future(here.load_stream("guild:1"))
            await asyncio.sleep(0.005 * n)
            async with there.transaction():  # one write at both ends of the stream (the first and last reader)
                gone = min(ready)
                await there.delete([gone])
                [new] = await there.insert([_memories(1)[0]])
            after = (ready - {gone}) | {new}
            loaded = {int(i) for i in (await loading).ids}
            assert loaded in (ready, after)  # one moment of the database, whichever: every reader in one snapshot
            seen = await here.changed_elsewhere(["guild:1"])
            assert loaded == after or seen == {"guild:1"}, "a write after the snapshot went unnoticed"
            ready = after
    finally:
        await here.close()
        await there.close()


async def test_a_ready_memory_with_a_missing_value_fails_the_load(postgres_url: str) -> None:
    async with await Store.open(postgres_url) as store:
        ids = await store.insert(_memories(10))
        await run_sql(store, "ALTER TABLE memories DROP CONSTRAINT memories_check")  # as a damaged table might
        await run_sql(store, "ALTER TABLE memories ALTER COLUMN created_at DROP NOT NULL")
        await run_sql(store, "UPDATE memories SET created_at = NULL WHERE id = ?", ids[3])
        with pytest.raises(StoreError, match=r"cannot load stream 'guild:1': a memory among #0\.\.#255 has a missing"):
            await store.load_stream("guild:1")
        await run_sql(store, "UPDATE memories SET created_at = 1, embedding = NULL WHERE id = ?", ids[3])
        with pytest.raises(StoreError, match=f"other than {DIM} dimensions \\(or none\\)"):
            await store.load_stream("guild:1")


# -- the grouped COPY, as PostgreSQL sent it, then damaged -----------------------------------------------------


@pytest.fixture
async def sent(postgres_url: str) -> tuple[list[tuple[int, int, int]], list[bytes]]:
    """The groups of a 1,000-memory stream and the COPY messages PostgreSQL sends for them (with texts)."""
    async with await Store.open(postgres_url) as store:
        await store.insert(_memories(1_700))
    async with await psycopg.AsyncConnection.connect(postgres_url, client_encoding="UTF8") as conn:
        groups = [(int(a), int(b), int(c)) for a, b, c in await (await conn.execute(PLAN, ("guild:1",))).fetchall()]
        messages = []
        async with conn.cursor() as cur, cur.copy(copy_sql(DIM, texts=True), (
                [g[0] for g in groups], [g[1] for g in groups], "guild:1")) as copy:
            async for data in copy:
                messages.append(bytes(data))
    return groups, messages


def _read(groups: list[tuple[int, int, int]], chunks: list[bytes], *, texts: bool = True) -> _load.Part:
    reader = GroupReader(groups, DIM, texts=texts)
    for chunk in chunks:
        reader.feed(chunk)
    return reader.finish()


def _fields(message: bytes, offset: int = 0) -> list[bytes | None]:
    """The fields of one COPY row (at `offset`: after the file header)."""
    count, pos, out = int.from_bytes(message[offset:offset + 2], "big"), offset + 2, []
    for _ in range(count):
        length = int.from_bytes(message[pos:pos + 4], "big", signed=True)
        out.append(None if length < 0 else message[pos + 4:pos + 4 + length])
        pos += 4 + max(length, 0)
    return out


def _row(fields: list[bytes | None]) -> bytes:
    out = len(fields).to_bytes(2, "big")
    for field in fields:
        out += (-1).to_bytes(4, "big", signed=True) if field is None else len(field).to_bytes(4, "big") + field
    return out


def test_the_copy_is_read_the_same_however_it_is_cut(sent: Any) -> None:
    groups, messages = sent
    assert len(groups) >= 2 and len(messages) == len(groups) + 1  # a message a group, then the trailer
    whole = _read(groups, messages)
    assert len(whole.columns["ids"]) == sum(g[2] for g in groups) and whole.texts is not None
    joined = b"".join(messages)
    rng = np.random.default_rng(3)
    for cuts in ([], [1], [5, 19, 20], sorted(rng.choice(len(joined), 40, replace=False).tolist())):
        bounds = [0, *cuts, len(joined)]
        part = _read(groups, [joined[a:b] for a, b in itertools.pairwise(bounds)])
        assert np.array_equal(part.embeddings, whole.embeddings) and part.texts == whole.texts
        assert all(np.array_equal(part.columns[k], whole.columns[k]) for k in whole.columns)


def _damaged(messages: list[bytes], group: int, field: int, value: bytes | None) -> list[bytes]:
    """The messages with one field of one group's row replaced (group 0 comes after the 19-byte header)."""
    offset = 19 if group == 0 else 0
    fields = _fields(messages[group], offset)
    fields[field] = value
    return [*messages[:group], messages[group][:offset] + _row(fields), *messages[group + 1:]]


def _number(n: int) -> bytes:
    return n.to_bytes(8, "big", signed=True)


@pytest.mark.parametrize(("group", "field", "value", "error"), [
    (0, 0, _number(0), "group 0 of"),  # the group number
    (1, 0, _number(1), r"group 1 of \d+ \(or twice\)"),
    (0, 1, _number(5), "sent 5 memories among #0..#"),  # the row count
    (0, 2, _number(1), "other than 6 dimensions"),  # the server's count of wrong vectors
    (0, 3, None, "among #0..#.* has a missing or malformed value"),  # ids
    (1, 5, b"\x00" * 12, "has a missing or malformed value"),  # last access: 3 of them
    (0, 7, None, "missing or malformed"),  # the vectors
    (0, 8, None, "missing or malformed"),  # the texts' lengths
    (0, 9, b"\xff\xfe", "texts of the memories among #0..#.* came malformed"),  # not UTF-8
    (0, 9, b"short", "texts of the memories among #0..#.* came malformed"),
])
def test_a_damaged_group_is_an_error_never_arrays(sent: Any, group: int, field: int, value: bytes | None,
                                                  error: str) -> None:
    groups, messages = sent
    with pytest.raises(_load.LoadError, match=error):
        _read(groups, _damaged(messages, group, field, value))


def test_a_vector_not_in_pgvectors_format_is_an_error(sent: Any) -> None:
    groups, messages = sent
    vectors = bytearray(_fields(messages[0], 19)[7] or b"")
    vectors[4 + 4 * DIM + 1] ^= 0xFF  # the second vector's dimension (its header: dim, unused)
    with pytest.raises(_load.LoadError, match="not in pgvector's binary format"):
        _read(groups, _damaged(messages, 0, 7, bytes(vectors)))


@pytest.mark.parametrize(("change", "error"), [
    (lambda m: m[:-1], "came incomplete"),  # no trailer
    (lambda m: [m[0][:-3], *m[1:]], "rows of .* fields|came malformed"),  # a row cut short
    (lambda m: [b"PGCOPY\n\xff\r\n\x01" + m[0][11:], *m[1:]], "not in the expected binary format"),
    (lambda m: [*m, m[-1]], "went on after its end"),
    (lambda m: [m[0], *m[2:]], "did not come from the server"),  # a group missing
    (lambda m: [m[0][:19] + (3).to_bytes(2, "big") + m[0][21:], *m[1:]], "rows of 3 fields, expected 10"),
])
def test_a_damaged_copy_is_an_error(sent: Any, change: Any, error: str) -> None:
    groups, messages = sent
    with pytest.raises(_load.LoadError, match=error):
        _read(groups, change(messages))
