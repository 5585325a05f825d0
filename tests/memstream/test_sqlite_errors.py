"""SQLite errors after opening are ours: one line, the right class, a locked database waited out within a
bound, and the user's text either stored or plainly not."""

from __future__ import annotations

import asyncio
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from memstream import (
    MemoryStream,
    Observation,
    RoleModel,
    Store,
    StoreError,
    StoreFull,
    StoreLocked,
    StreamConfig,
    cli,
)
from memstream.store import sqlite_module
from memstream.store.sqlite import connection as _sqlite
from memstream.store.sqlite import store as store_module
from memstream.testing import FakeClock, FakeEmbedder, ScriptedChat
from tests.memstream.helpers import OtherProcess


def _memory(store: Store) -> MemoryStream:
    chat = ScriptedChat()
    chat.on("<memory>", "5")
    return MemoryStream(store, FakeEmbedder(), rater=RoleModel(chat, "r"), reflector=RoleModel(chat, "r"),
                        agent=RoleModel(chat, "a"), name="I", summary="S", clock=FakeClock(),
                        config=StreamConfig(reflection_threshold=10**6))


async def test_a_lock_held_briefly_is_waited_out_and_the_text_stored(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    db = tmp_path / "p.db"
    async with await Store.open(db) as store:
        await store.conn.execute("PRAGMA busy_timeout=200")  # one attempt waits 0.2 s: the retry loop shows
        writer = OtherProcess(db, write=True)
        loop = asyncio.get_running_loop()
        loop.call_later(1.0, writer.release)  # past several busy timeouts, within the lock wait
        stored = await _memory(store).observe("kept despite the lock")
        assert (await store.get(stored.id)).text == "kept despite the lock"


async def test_a_lock_held_past_the_wait_is_one_clear_error_and_nothing_half_stored(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_sqlite, "LOCK_WAIT_SECONDS", 0.5)
    db = tmp_path / "p.db"
    async with await Store.open(db) as store:
        await store.conn.execute("PRAGMA busy_timeout=100")
        writer = OtherProcess(db, write=True)
        try:
            with pytest.raises(StoreLocked) as info:
                await _memory(store).observe("this one is not stored")
        finally:
            writer.release()
        message = str(info.value)
        assert "\n" not in message and "another process kept the database locked" in message
        assert "nothing was written" in message and str(db) in message
        assert await store.recent("default", 5, include_pending=True) == []
        later = await _memory(store).observe("works once the lock is gone")  # the store is still usable
        assert later.status == "ready"


def test_the_command_line_says_locked_in_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(_sqlite, "LOCK_WAIT_SECONDS", 0.5)
    monkeypatch.setattr(_sqlite, "BUSY_TIMEOUT_MS", 100)
    monkeypatch.setattr(store_module, "BUSY_TIMEOUT_MS", 100)
    db = tmp_path / "p.db"
    persona = tmp_path / "p.toml"
    persona.write_text(f'[persona]\nname = "I"\nsummary = "S"\ndatabase = "{db}"\n'
                       '[models]\nbase_url = "http://127.0.0.1:9/v1"\n', encoding="utf-8")
    assert cli.main(["stats", "--persona", str(persona)]) == 0
    capsys.readouterr()
    writer = OtherProcess(db, write=True)
    try:
        code = cli.main(["observe", "hello", "--importance", "3", "--persona", str(persona)])
    finally:
        writer.release()
    err = capsys.readouterr().err
    assert code != 0 and err.count("\n") == 1 and "locked" in err and "Traceback" not in err


async def test_a_full_disk_is_one_clear_error_and_what_was_stored_survives(tmp_path: Path) -> None:
    db = tmp_path / "p.db"
    async with await Store.open(db) as store:
        memory = _memory(store)
        first = await memory.observe("stored before the disk filled up")
        async with store.conn.execute("PRAGMA page_count") as cur:
            pages = (await cur.fetchone())[0]
        async with store.conn.execute(f"PRAGMA max_page_count={pages + 1}"):
            pass  # the file may not grow: what a full disk does to SQLite (SQLITE_FULL)
        with pytest.raises(StoreFull) as info:
            await memory.observe_many([__import__("memstream").Observation("x" * 3000 + str(i)) for i in range(50)])
        assert "\n" not in str(info.value) and "disk is full" in str(info.value)
    async with await Store.open(db) as store:
        assert (await store.get(first.id)).text == "stored before the disk filled up"
        assert isinstance(info.value, StoreError)


def _fill(path: Path, *, leave: int) -> None:
    """Write `path` until the disk is full, then give `leave` bytes back."""
    with open(path, "wb", buffering=0) as f:
        try:
            while True:
                f.write(b"\0" * 65536)
        except OSError:
            pass
        f.truncate(max(0, f.tell() - leave))


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 2 MB file system of its own (tmpfs; needs root, as in CI here)."""
    mount = tmp_path / "small"
    mount.mkdir()
    if os.geteuid() != 0:
        pytest.skip("mounting a small tmpfs needs root")
    made = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mount)], capture_output=True)
    if made.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {made.stderr.decode().strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


async def test_a_real_full_disk_mid_burst_keeps_what_was_stored_and_resumes_when_space_returns(
        small_disk: Path) -> None:
    ballast = small_disk / "ballast"
    db = small_disk / "p.db"
    async with await Store.open(db) as store:
        memory = _memory(store)
        first = await memory.observe("stored while there was room")
        _fill(ballast, leave=200 * 1024)  # the disk is full but for ~200 KB
        burst = [Observation(f"burst line {i} " + "y" * 3000) for i in range(200)]
        with pytest.raises(StoreFull) as info:
            for start in range(0, 200, 20):
                await memory.observe_many(burst[start:start + 20])
        assert "\n" not in str(info.value) and "disk is full" in str(info.value)
        kept = await store.recent("default", 500, include_pending=True)
        texts = {b.text for b in burst} | {first.text}
        assert all(m.text in texts for m in kept)  # none half-written: each stored whole (ready, or pending)
        ballast.unlink()  # space returns
        after = await memory.observe("stored once there was room again")
        assert after.status == "ready"
        await memory.complete_pending()  # what was left pending by the full disk completes
        assert all(m.status == "ready" for m in await store.recent("default", 500, include_pending=True))
    async with await Store.open(db) as store:
        assert (await store.get(first.id)).text == "stored while there was room"
        async with store.conn.execute("PRAGMA integrity_check") as cursor:
            assert (await cursor.fetchone())[0] == "ok"


async def test_a_batch_write_leaves_no_statement_behind_for_a_dropped_cursor_to_reset(tmp_path: Path) -> None:
    # aiosqlite hands back each executemany's cursor, which still held the statement; dropped in the event loop's
    # thread, pysqlite3 reset the statement from there, possibly while another write of the same SQL was running
    # it in the connection's thread: that statement was left half-run, and the next batch write of that SQL
    # failed ("Error binding parameter 0"; a sharded bot's usage counts). Here the drop is made to happen at
    # that moment, from an adapter called while the second write binds its parameters.
    module = sqlite_module()
    sql = "INSERT INTO meta (key, value) VALUES (?, ?) ON CONFLICT (key) DO UPDATE SET value = excluded.value"

    class Dropping:
        pass

    async with await Store.open(tmp_path / "m.db") as store:
        held = [await store.conn.executemany(sql, [("a", "1")])]
        await store.get_meta("a")  # aiosqlite's thread lets go of the first call's result: `held` is the last

        def adapt(_: Dropping) -> str:
            held.clear()
            return "2"

        module.register_adapter(Dropping, adapt)
        try:
            await store.conn.executemany(sql, [("b", Dropping())])
            await store.conn.executemany(sql, [("c", "3")])
        finally:
            module.adapters.pop((Dropping, module.PrepareProtocol), None)
        assert [await store.get_meta(key) for key in "abc"] == ["1", "2", "3"]
