"""The bot through a model outage and a restart: every message is stored first, kept pending while the model is
down, completed once it is back (after its backoff) or at the next start, and never stored twice."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from memstream import MemoryStream, Observation, Source
from memstream.store import RETRY_CAP_SECONDS
from memstream.testing import FakeClock
from tests.bot.conftest import World, one_server, running_bot, until


async def test_messages_in_a_model_outage_are_kept_and_completed_when_it_is_back(world: World) -> None:
    stream = world.stream(world.town)
    world.openai.fail_next("500", times=10_000)  # the model server is down
    sent = [await world.fake.send_message(world.general, world.klaus, f"outage note {i}") for i in range(12)]
    await world.fake.send_message(world.general, world.maria, "are you there?", mentions=[world.fake.bot_user])
    apology = await world.fake.wait_for_sent(lambda m: m.channel_id == world.general)
    assert "can't think" in apology.content  # still answered, if only to say so
    await world.drained()
    stored = await world.memory.recent(stream, 50)
    assert len(stored) == 13 and {m.status for m in stored} == {"pending"}
    assert await world.bot.reflections.retry_pending() == 0  # their backoff has not passed

    world.openai.reset()
    world.openai.on_chat(world.models.answer)  # the model is back
    world.clock.advance(seconds=RETRY_CAP_SECONDS)
    assert await world.bot.reflections.retry_pending() == 13
    for message in sent:
        await world.stored(world.town, message)
    async with world.memory.store.conn.execute(
            "SELECT COUNT(*), COUNT(DISTINCT message_id) FROM memories WHERE stream = ?", (stream,)) as cursor:
        assert await cursor.fetchone() == (13, 13)


async def test_a_restart_completes_what_a_dead_process_left_pending(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    async with one_server(tmp_path, monkeypatch) as (_, persona, stream):
        async with await MemoryStream.open(persona, clock=FakeClock(), environ={}) as before:
            # Stored, then the process died before any model call: only the database knows.
            await before.observe_many([Observation(f"left behind {i}", stream, source=Source(message_id=str(i)))
                                       for i in range(30)], defer=True)
            await before.store.count_attempt(1, at=FakeClock().now().timestamp() + 10**6)  # even one backing off
        async with running_bot(persona, FakeClock()) as (_, memory):

            async def completed() -> bool:
                return (await memory.stats(stream)).pending.count == 0

            await until(completed, "the pending observations to be completed at start")
            assert len(await memory.recent(stream, 50)) == 30


async def test_a_full_disk_keeps_the_queued_observations_and_work_resumes_when_space_returns(
        world: World, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    import logging

    from bot.cogs import observe

    monkeypatch.setattr(observe, "STORE_RETRY", 0.05)
    monkeypatch.setattr(observe, "STORE_RETRY_CAP", 0.2)
    cog = world.bot.get_cog("ObserveCog")
    assert isinstance(cog, observe.ObserveCog)
    cog.store_retry = 0.05
    store = world.memory.store
    async with store.conn.execute("PRAGMA page_count") as cursor:
        pages = (await cursor.fetchone())[0]
    async with store.conn.execute(f"PRAGMA max_page_count={pages}"):
        pass  # the file cannot grow: SQLite answers SQLITE_FULL, as on a full disk
    caplog.set_level(logging.WARNING, logger="bot.observe")
    sent = [await world.fake.send_message(world.general, world.klaus, f"disk full note {i} " + "x" * 2000)
            for i in range(8)]

    async def warned() -> bool:
        return any("kept in memory and tried again" in r.getMessage() for r in caplog.records)

    await until(warned, "the full-disk warning")
    async with store.conn.execute("SELECT COUNT(*) FROM memories WHERE text LIKE '%disk full note%'") as cur:
        assert (await cur.fetchone())[0] == 0  # nothing half-written
    assert len(cog.queue) == 8  # all kept
    async with store.conn.execute("PRAGMA max_page_count=1073741823"):
        pass  # space returns
    for message in sent:
        await world.stored(world.town, message)  # stored by itself, no restart
    assert any("works again" in r.getMessage() for r in caplog.records)
    assert sum("kept in memory" in r.getMessage() for r in caplog.records) == 1  # one warning, not one per try


async def test_a_damaged_stream_is_reported_once_and_the_other_servers_are_still_served(
        world: World, caplog: pytest.LogCaptureFixture) -> None:
    import logging

    from memstream import Observation as Obs

    town, other = world.stream(world.town), world.stream(world.other)
    await world.memory.observe_many([Obs(f"town memory {i:03d} " + "t" * 300, town) for i in range(200)])
    await world.memory.observe_many([Obs(f"other memory {i:03d} " + "o" * 300, other) for i in range(200)])
    store = world.memory.store
    from memstream.store import sqlite_module

    await world.drained()

    async def settled() -> bool:  # the 400 observations crossed the threshold: let the reflections finish
        return not (await world.memory.reflection_due(town) or await world.memory.reflection_due(other))

    await until(settled, "the due reflections to run", timeout=30.0)

    async def checkpointed() -> bool:  # everything into the main file, where the damage goes
        side = sqlite_module().connect(store.path)
        try:
            return bool(side.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()[0] == 0)
        finally:
            side.close()

    await until(checkpointed, "the log to be checkpointed", timeout=30.0)
    _damage_page_holding(Path(store.path), b"town memory 100")  # a page of the town's memories goes bad
    world.memory.index.drop(town)  # what it had loaded is gone: the next retrieval reads the file
    world.memory.index.drop(other)
    caplog.set_level(logging.ERROR, logger="bot")
    for _ in range(2):
        await world.fake.send_message(world.general, world.maria, "what do you remember?",
                                      mentions=[world.fake.bot_user])
        sorry = await world.fake.wait_for_sent(lambda m: m.channel_id == world.general)
        assert "damaged" in sorry.content
    await world.fake.send_message(world.lounge, world.maria, "and here?", mentions=[world.fake.bot_user])
    answer = await world.fake.wait_for_sent(lambda m: m.channel_id == world.lounge)
    assert "damaged" not in answer.content  # the other server is still served
    reports = [r for r in caplog.records if "other streams are still served" in r.getMessage()]
    assert len(reports) == 1 and town in reports[0].getMessage()


def _damage_page_holding(db: Path, needle: bytes) -> None:
    """Damage the leaf page that holds the live row with `needle` in its text: of the pages where the bytes occur
    (a page reused by other rows, or as an interior page over many, can still hold a stale copy in its free
    space), the one whose damage, tried on a copy of the file, breaks the reading of that row and of no row far
    from it."""
    from memstream.store import sqlite_module

    conn = sqlite_module().connect(db)
    try:
        [(row,)] = conn.execute("SELECT id FROM memories WHERE text LIKE ?", (f"%{needle.decode()}%",)).fetchall()
        far = [i for (i,) in conn.execute("SELECT id FROM memories WHERE abs(id - ?) > 8", (row,))]
    finally:
        conn.close()
    data = db.read_bytes()
    pages = sorted({match.start() // 4096 for match in re.finditer(re.escape(needle), data)})
    trial = db.with_name("trial.db")
    for page in pages:
        trial.write_bytes(data[:page * 4096] + b"\xa5" * 4096 + data[(page + 1) * 4096:])
        conn = sqlite_module().connect(trial)
        try:  # by id: SQLite reads only the pages on the way to each row
            conn.execute("SELECT text FROM memories WHERE id = ?", (row,)).fetchall()
        except sqlite_module().DatabaseError:
            try:
                for other in far:
                    conn.execute("SELECT text FROM memories WHERE id = ?", (other,)).fetchall()
            except sqlite_module().DatabaseError:
                continue  # an interior page: more than this row's neighbours go with it
            break
        finally:
            conn.close()
    else:
        raise AssertionError(f"no page of {pages} holds the row with {needle!r}")
    trial.unlink()
    with open(db, "r+b") as f:
        f.seek(page * 4096)
        f.write(b"\xa5" * 4096)
