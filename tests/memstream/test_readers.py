"""Loading a stream's rows in reader processes (memstream.store.readers): the same rows as in this process, the
readers kept between loads and ended with the store, failures reported or read around."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path

import numpy as np
import pytest

from memstream.config import StreamConfig
from memstream.errors import StoreError
from memstream.index.gathering import Gathering
from memstream.index.ranking import rank
from memstream.index.vector_index import VectorIndex
from memstream.index.vectors import StreamVectors
from memstream.records import Source
from memstream.store import NewMemory, SQLiteStore, Store, StreamArrays
from memstream.store._load import WorkerFailed, cores
from memstream.store.readers import Readers, processes_available, split

T0 = 1_676_275_200.0  # 2023-02-13 08:00 UTC
needs_processes = pytest.mark.skipif(not processes_available(), reason="reader processes need Linux (memfd)")


@pytest.mark.parametrize("processes", [1, 2, 3])
async def test_loading_a_file_matches_the_rows_of_the_store(tmp_path: Path, processes: int) -> None:
    # Streams interleaved, pending rows among ready ones, ids with gaps: in this process or in several.
    if processes > 1 and not processes_available():
        pytest.skip("loading in worker processes needs Linux (memfd)")
    rng = np.random.default_rng(5)
    store = await Store.open(tmp_path / "load.db", load_processes=processes)
    try:
        rows = [NewMemory(stream="s" if i % 4 else "t", kind="observation", text=f"m{i}", created_at=T0 + i * 0.125,
                          importance=int(rng.integers(1, 11)) if i % 7 else None,
                          embedding=rng.standard_normal(6).astype(np.float32) if i % 7 else None)
                 for i in range(3000)]
        ids = await store.insert(rows)
        await store.delete(ids[100:400])
        loaded = await store.load_stream("s")
        gone = set(ids[100:400])
        expect = sorted((i, r) for i, r in zip(ids, rows, strict=True)
                        if r.stream == "s" and r.embedding is not None and i not in gone)
        assert len(loaded.blocks()) == (processes if processes > 1 else 1)
        order = np.argsort(loaded.ids)
        assert loaded.ids[order].tolist() == [i for i, _ in expect]
        assert np.array_equal(loaded.matrix()[order], np.stack([r.embedding for _, r in expect]))  # type: ignore[misc]
        assert loaded.created[order].tolist() == [r.created_at for _, r in expect]
        assert loaded.last_accessed[order].tolist() == [r.created_at for _, r in expect]
        assert loaded.importance[order].tolist() == [r.importance for _, r in expect]
        assert loaded.inverse_norms is not None
        assert np.allclose(loaded.inverse_norms[order],
                           1 / np.linalg.norm(np.stack([r.embedding for _, r in expect]), axis=1), rtol=1e-6)  # type: ignore[misc]
        vectors = await VectorIndex(store).get("s")
        assert sorted(vectors.ids.tolist()) == [i for i, _ in expect]
        reference = StreamVectors(StreamArrays(vectors.ids.copy(), vectors.embeddings.copy(),
                                               vectors.importance.astype(np.float32), vectors.last_accessed.copy(),
                                               vectors.created.copy()))
        for seed in range(3):
            query = np.random.default_rng(seed).standard_normal(6).astype(np.float32).tolist()
            expected = rank(reference, query, T0 + 3600, StreamConfig(), 5)
            found = rank(vectors, query, T0 + 3600, StreamConfig(), 5)
            assert vectors.ids[found.rows].tolist() == reference.ids[expected.rows].tolist()
            assert np.array_equal(found.score, expected.score)
            vectors.append([10**6 + seed], [query], [5.0], T0 + 10, T0 + 10)  # a new block after the loaded ones
            reference.append([10**6 + seed], [query], [5.0], T0 + 10, T0 + 10)
    finally:
        await store.close()


@pytest.mark.parametrize("processes", [1, 3])
async def test_a_bad_row_fails_the_load_with_its_id_whoever_reads_it(tmp_path: Path, processes: int) -> None:
    store = await Store.open(tmp_path / "bad.db", load_processes=processes)
    try:
        rows = [NewMemory(stream="s", kind="observation", text=f"m{i}", created_at=T0 + i, importance=3,
                          embedding=np.full(4, i + 1, np.float32)) for i in range(90)]
        ids = await store.insert(rows)
        async with store.transaction():
            await store.conn.execute("UPDATE memories SET embedding = zeroblob(12) WHERE id = ?", (ids[70],))
        with pytest.raises(StoreError, match=f"memory #{ids[70]} has an embedding of 12 bytes, expected 16"):
            await store.load_stream("s")
    finally:
        await store.close()


async def test_a_reader_that_cannot_run_is_reported_as_such(tmp_path: Path) -> None:
    store = await Store.open(tmp_path / "w.db")
    await store.close()
    readers = Readers("no_such_sqlite", str(tmp_path / "w.db"), 2)
    try:
        with pytest.raises(WorkerFailed, match=r"failed: ModuleNotFoundError: No module named 'no_such_sqlite'"):
            readers.read("s", 1, 100, 100, 4, 2)
    finally:
        readers.close()


async def test_when_workers_cannot_start_the_stream_loads_in_this_process(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    store = await Store.open(tmp_path / "fallback.db", load_processes=2)
    try:
        rows = [NewMemory(stream="s", kind="observation", text=f"m{i}", created_at=T0 + i, importance=3,
                          embedding=np.full(4, i + 1, np.float32)) for i in range(50)]
        ids = await store.insert(rows)
        monkeypatch.setattr("sys.executable", str(tmp_path / "no-such-python"))
        loaded = await store.load_stream("s")
        assert sorted(loaded.ids.tolist()) == ids and len(loaded.blocks()) == 1
        assert "cannot start a loader process" in caplog.text and "loading it here" in caplog.text
    finally:
        await store.close()


@pytest.mark.parametrize("bad", [0, -2, 1.5, True, "2"])
async def test_a_bad_number_of_load_processes_is_refused_before_the_file_is_touched(tmp_path: Path,
                                                                                  bad: object) -> None:
    with pytest.raises(ValueError, match="load_processes must be a whole number of 1 or more"):
        await Store.open(tmp_path / "never.db", load_processes=bad)  # type: ignore[arg-type]
    assert not (tmp_path / "never.db").exists()


def test_the_worker_split_covers_every_id_once() -> None:
    for low, high, parts in [(1, 1, 3), (1, 2, 3), (5, 1_000_004, 2), (7, 100, 7), (-3, 3, 4)]:
        ranges = split(low, high, parts)
        covered = [i for first, last in ranges for i in range(first, last + 1)]
        assert covered == list(range(low, high + 1))
        assert len(ranges) == min(parts, high - low + 1)
        widths = [last - first + 1 for first, last in ranges]
        assert max(widths) - min(widths) <= 1


def _rows(n: int, stream: str = "s", dim: int = 6, seed: int = 3) -> list[NewMemory]:
    rng = np.random.default_rng(seed)
    people = ["Klaus", "Maria", "Ayesha"]
    return [NewMemory(stream=stream, kind="observation", created_at=T0 + i * 60.0,
                      text=f"{people[i % 3]} said m{i} at {i % 24}:00 about topic{i % 11}",
                      importance=int(rng.integers(1, 11)), embedding=rng.standard_normal(dim).astype(np.float32),
                      source=Source(author=people[i % 3], author_id=str(i % 3 + 1), channel=f"c{i % 4}",
                                    channel_id=str(100 + i % 4), message_id=str(10_000 + i),
                                    reply_to=str(10_000 + i - 3) if i % 5 == 0 and i >= 3 else None))
            for i in range(n)]


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def _dead(pid: int) -> None:
    """Until the process has ended (a zombie, not yet reaped by its parent, counts)."""
    for _ in range(500):
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            return
        if state in ("Z", "X"):
            return
        time.sleep(0.01)
    raise AssertionError(f"process {pid} did not end")


@needs_processes
async def test_the_readers_are_kept_between_loads_and_end_with_the_store(tmp_path: Path) -> None:
    async with await SQLiteStore.open(tmp_path / "kept.db", load_processes=2) as store:
        await store.insert(_rows(600))
        first = await store.load_stream("s", texts=True)
        assert store.readers is not None
        pids = store.readers.pids()
        second = await store.load_stream("s", texts=True)
        assert len(pids) == 2 and store.readers.pids() == pids
        assert first.ids.tolist() == second.ids.tolist() and first.texts == second.texts
    assert all(map(_gone, pids))  # (closing the store ends them, and waits for them)


@needs_processes
async def test_a_reader_that_died_between_loads_is_replaced(tmp_path: Path) -> None:
    async with await SQLiteStore.open(tmp_path / "died.db", load_processes=2) as store:
        ids = await store.insert(_rows(500))
        await store.load_stream("s")
        assert store.readers is not None
        victim = store.readers.pids()[0]
        os.kill(victim, signal.SIGKILL)
        await asyncio.to_thread(_dead, victim)
        loaded = await store.load_stream("s")
        assert sorted(loaded.ids.tolist()) == ids and len(loaded.blocks()) == 2  # (by readers, not here)
        assert victim not in store.readers.pids() and len(store.readers.pids()) == 2


@needs_processes
async def test_after_a_bad_row_the_readers_read_the_repaired_stream(tmp_path: Path) -> None:
    async with await SQLiteStore.open(tmp_path / "repair.db", load_processes=2) as store:
        ids = await store.insert(_rows(300, dim=4))
        async with store.transaction():
            await store.conn.execute("UPDATE memories SET embedding = zeroblob(12) WHERE id = ?", (ids[250],))
        with pytest.raises(StoreError, match=f"memory #{ids[250]} has an embedding of 12 bytes, expected 16"):
            await store.load_stream("s")
        await store.delete([ids[250]])
        loaded = await store.load_stream("s", texts=True, sources=True)
        assert sorted(loaded.ids.tolist()) == ids[:250] + ids[251:]


@needs_processes
async def test_each_gets_every_text_in_row_order_as_the_readers_send_them(tmp_path: Path) -> None:
    async with await SQLiteStore.open(tmp_path / "each.db", load_processes=3) as store:
        await store.insert(_rows(5000))
        chunks: list[list[str]] = []
        loaded = await store.load_stream("s", texts=True, each=chunks.append)
        assert len(chunks) > 3 and [t for chunk in chunks for t in chunk] == loaded.texts
    none: list[list[str]] = []
    async with await SQLiteStore.open(tmp_path / "each.db", load_processes=1) as here:
        assert (await here.load_stream("s", texts=True, each=none.append)).texts == loaded.texts and none == []


@needs_processes
async def test_an_index_gathered_while_readers_read_is_the_one_read_here(tmp_path: Path) -> None:
    path = tmp_path / "same.db"
    store = await SQLiteStore.open(path, load_processes=2)
    here = await SQLiteStore.open(path, load_processes=1)
    try:
        await store.insert(_rows(3000, dim=8))
        config = StreamConfig.for_profile("hybrid")
        gathered = await VectorIndex.for_config(store, config).get("s")
        read = await VectorIndex.for_config(here, config).get("s")
        assert gathered.ids.tolist() == read.ids.tolist()
        for query in ["Klaus topic3", "what did Maria say at 9:00", "m2999 topic10"]:
            assert gathered.terms is not None and read.terms is not None
            assert np.array_equal(gathered.terms.score(query, gathered.n), read.terms.score(query, read.n))
            vector = np.random.default_rng(len(query)).standard_normal(8).astype(np.float32).tolist()
            found, expected = (rank(v, vector, T0 + 9e5, config, 5, text=query) for v in (gathered, read))
            assert gathered.ids[found.rows].tolist() == read.ids[expected.rows].tolist()
            assert np.array_equal(found.score, expected.score)
        assert gathered.context is not None and read.context is not None
        for column in ("author", "prev", "next", "parent", "timed"):
            assert np.array_equal(getattr(gathered.context, column)[:gathered.n],
                                  getattr(read.context, column)[:read.n]), column
    finally:
        await store.close()
        await here.close()


def test_what_was_gathered_from_other_texts_is_not_used() -> None:
    rng = np.random.default_rng(1)
    n = 50
    arrays = StreamArrays(np.arange(1, n + 1, dtype=np.int64), rng.standard_normal((n, 4)).astype(np.float32),
                          np.full(n, 5.0, np.float32), np.full(n, T0), T0 + np.arange(n, dtype=np.float64))
    texts = [f"apple{i} pear" for i in range(n)]
    stale = Gathering("english", True)
    stale.feed([f"quince{i} at 9:00" for i in range(20)])  # (a load that started over: other strings)
    fresh = Gathering("english", True)
    fresh.feed(texts[:20])
    built = []
    for gathered in (stale, fresh, None):
        vectors = StreamVectors(arrays)
        vectors.index(arrays.ids.tolist(), texts, language="english", context=True, gathered=gathered)
        assert vectors.terms is not None and vectors.context is not None
        built.append((vectors.terms.score("quince3 apple7 pear", n), vectors.context.timed[:n].copy()))
    for scores, timed in built[:2]:
        assert np.array_equal(scores, built[2][0]) and np.array_equal(timed, built[2][1])
    assert built[2][0][7] > 0 and not built[2][1].any()


@needs_processes
@pytest.mark.parametrize(("count", "setting", "expected"), [
    (3_999, None, 0), (4_000, None, min(cores(), 2)), (5_999, None, min(cores(), 2)), (6_000, None, min(cores(), 3)),
    (10**7, None, min(cores(), 8)), (50, 3, 3), (10**6, 1, 0)])
async def test_how_many_readers_a_load_takes(tmp_path: Path, count: int, setting: int | None, expected: int) -> None:
    store = await SQLiteStore.open(tmp_path / "n.db", load_processes=setting)
    try:
        assert store._load_workers(count) == expected  # (0: read in this process)
    finally:
        await store.close()
