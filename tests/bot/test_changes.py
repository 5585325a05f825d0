"""Edits and deletions the store cannot take now (a full disk) wait and are applied once it can, in order; one
the store refuses for good (text that cannot be stored) is dropped with one log line, never retried."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pytest

from bot.changes import Changes, Edit
from memstream import MemoryStream, Observation, PersonaConfig, Source, StreamConfig
from memstream.testing import FakeClock, FakeEmbedder, ScriptedChat
from tests.bot.conftest import World, until
from tests.memstream.helpers import OtherProcess

STREAM = "guild:1"


@pytest.fixture
async def memory(tmp_path: Path) -> AsyncIterator[MemoryStream]:
    persona = PersonaConfig(name="Isabella", summary="Runs a cafe.", database=tmp_path / "m.db",
                            memory=StreamConfig(reflection_threshold=10_000))
    async with await MemoryStream.open(persona, clock=FakeClock(), environ={}, embedder=FakeEmbedder(),
                                       chat=ScriptedChat(), auto_reflect=False) as opened:
        yield opened


class FullDisk:
    """SQLite's file held at its size: every write that needs a new page is SQLITE_FULL (StoreFull)."""

    def __init__(self, memory: MemoryStream) -> None:
        self.conn = memory.store.conn  # type: ignore[attr-defined]

    async def fill(self) -> None:
        async with self.conn.execute("PRAGMA page_count") as cursor:
            pages = (await cursor.fetchone())[0]
        async with self.conn.execute(f"PRAGMA max_page_count={pages}"):
            pass

    async def free(self) -> None:
        async with self.conn.execute("PRAGMA max_page_count=1073741823"):
            pass


async def _stored(memory: MemoryStream, *keys: str) -> dict[str, int]:
    made = await memory.observe_many([Observation(f"Klaus: note {key}", STREAM, source=Source(message_id=key))
                                      for key in keys])
    return {key: m.id for key, m in zip(keys, made, strict=True)}


async def test_changes_the_store_cannot_take_now_wait_and_are_applied_in_order(
        memory: MemoryStream, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="bot.changes")
    ids = await _stored(memory, "m1", "m2", "m3")
    changes = Changes(memory, retry=0.02, cap=0.1)
    runner = asyncio.create_task(changes.run())
    disk = FullDisk(memory)
    try:
        await disk.fill()
        long = "the new text, much longer than the old one " * 200  # needs new pages: refused while full
        await changes.edit("m1", Edit(STREAM, "Klaus: " + long))
        await changes.edit("m2", Edit(STREAM, "Klaus: first " + long))
        await changes.delete(["m3"])
        await changes.edit("m2", Edit(STREAM, "Klaus: second " + long))  # the newest edit of m2 wins
        await changes.edit("m3", Edit(STREAM, "Klaus: too late " + long))  # a deletion wins over an edit
        await asyncio.sleep(0.3)  # several retries, all refused
        assert list(changes.waiting) == ["m1", "m2", "m3"] and changes.failures >= 2
        assert (await memory.get(ids["m1"])).text == "Klaus: note m1"
        await disk.free()
        await until(lambda: _true(changes.settled()), "the changes applied")
    finally:
        runner.cancel()
    assert (await memory.get(ids["m1"])).text == "Klaus: " + long
    assert (await memory.get(ids["m2"])).text == "Klaus: second " + long
    assert await memory.store.find_message(STREAM, "m3") is None
    lines = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING and r.name == "bot.changes"]
    assert len(lines) == 2, lines  # one when it failed, one when it works again: not one per retry
    assert "kept and tried again" in lines[0] and lines[1] == "storing edits and deletions works again"


async def test_an_edit_the_store_refuses_for_good_is_dropped_with_one_line(
        memory: MemoryStream, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="bot.changes")
    ids = await _stored(memory, "m1", "m2")
    changes = Changes(memory, retry=0.02, cap=0.1)
    runner = asyncio.create_task(changes.run())
    try:
        await changes.edit("m1", Edit(STREAM, "Klaus: bad \ud800 text"))  # not valid text: never storable
        await changes.edit("m2", Edit(STREAM, "   "))  # empty
        await changes.edit("never", Edit(STREAM, "Klaus: a message never stored"))  # nothing to edit: done
        await memory.forget([ids["m2"]])
        await changes.edit("m2", Edit(STREAM, "Klaus: after its memory was forgotten"))  # nothing to edit: done
        await asyncio.sleep(0.2)
    finally:
        runner.cancel()
    assert changes.settled() and changes.failures == 0
    assert (await memory.get(ids["m1"])).text == "Klaus: note m1"
    assert await memory.store.find_message(STREAM, "m2") is None
    assert await memory.store.find_message(STREAM, "never") is None
    lines = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING and r.name == "bot.changes"]
    assert len(lines) == 2, lines
    assert lines[0].startswith("the edit of message(s) m1 is dropped: the store refuses it for good")
    assert "not valid text" in lines[0] and "empty" in lines[1]
    nothing = [r.getMessage() for r in caplog.records if r.levelno == logging.DEBUG and r.name == "bot.changes"]
    assert len(nothing) == 2 and all("changes nothing: no memory was made from it" in line for line in nothing)


async def test_the_bot_applies_an_edit_and_a_deletion_made_while_the_disk_was_full(
        world: World, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    cog = world.bot.get_cog("ObserveCog")
    assert cog is not None
    cog.changes.retry, cog.changes.cap = 0.05, 0.2  # type: ignore[attr-defined]
    said = await world.say(world.town, world.general, world.klaus, "call me at 555-0199")
    gone = await world.say(world.town, world.general, world.klaus, "my address is 12 Elm Street")
    memory_id = await world.stored(world.town, said)
    disk = FullDisk(world.memory)
    await disk.fill()
    await world.fake.edit_message(world.general, int(str(said["id"])),
                                  "call me (number removed) " + "and more words " * 300)
    await world.fake.delete_message(world.general, int(str(gone["id"])))

    async def warned() -> bool:
        return any("kept and tried again" in r.getMessage() for r in caplog.records)

    await until(warned, "the warning")
    assert "555-0199" in (await world.memory.get(memory_id)).text  # not yet: the disk is full
    await disk.free()

    async def edited() -> bool:
        return "removed" in (await world.memory.get(memory_id)).text

    await until(edited, "the edit")
    stream = world.stream(world.town)
    await until(lambda: _none(world.memory.store.find_message(stream, str(gone["id"]))), "the deletion")
    texts = " ".join(m.text for m in await world.memory.store.recent(stream, 10, include_pending=True))
    assert "555-0199" not in texts and "Elm Street" not in texts


async def _true(value: bool) -> bool:
    return value


async def _none(awaitable: object) -> bool:
    return await awaitable is None  # type: ignore[misc]


async def test_an_edit_made_while_its_message_is_being_stored_follows_it(world: World) -> None:
    """The message's batch is in the store's hands (here waiting on another process's write lock) when the edit
    comes: the edit finds no memory yet, so it waits for the batch and is applied after it, never lost."""
    cog = world.bot.get_cog("ObserveCog")
    assert cog is not None
    other = await asyncio.to_thread(OtherProcess, Path(world.memory.store.path), write=True)  # type: ignore[attr-defined]
    try:
        said = await world.fake.send_message(world.general, world.klaus, "my code is ZQX-4411")
        key = str(said["id"])
        await until(lambda: _true(key in cog.in_store), "the batch being stored")  # type: ignore[attr-defined]
        await world.fake.edit_message(world.general, int(key), "my code is (removed)")
        await until(lambda: _true(key in cog.raced), "the edit held for its batch")  # type: ignore[attr-defined]
    finally:
        await asyncio.to_thread(other.release)
    stream = world.stream(world.town)

    async def edited() -> bool:  # ready, or pending again (its first completion raced the edit: retried later)
        found = await world.memory.store.find_message(stream, key)
        return found is not None and "removed" in (await world.memory.get(found)).text

    await until(edited, "the edit")
    assert "ZQX" not in " ".join(m.text for m in await world.memory.store.recent(stream, 10, include_pending=True))


class GatedEmbedder(FakeEmbedder):
    """Answers once its gate is open: a change held at work."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = asyncio.Event()
        self.gate.set()

    async def embed_batch(self, texts: Sequence[str]) -> npt.NDArray[np.float32]:
        await self.gate.wait()
        return await super().embed_batch(texts)


async def test_a_stop_waits_for_the_changes_at_work_and_a_store_closed_under_one_keeps_it(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    embedder = GatedEmbedder()
    persona = PersonaConfig(name="Isabella", summary="Runs a cafe.", database=tmp_path / "m.db",
                            memory=StreamConfig(reflection_threshold=10_000))
    memory = await MemoryStream.open(persona, clock=FakeClock(), environ={}, embedder=embedder, chat=ScriptedChat(),
                                     auto_reflect=False)
    await _stored(memory, "m1")
    changes = Changes(memory)

    async def applying() -> bool:
        return changes.applying == 1

    embedder.gate.clear()  # the edit waits for its embedding
    editing = asyncio.create_task(changes.edit("m1", Edit(STREAM, "Klaus: note m1, EDITED")))
    await until(applying, "the edit at work")
    still = asyncio.create_task(changes.still())
    await asyncio.sleep(0.05)
    assert not still.done()  # (a stop waits for it: the memory must outlive it)
    embedder.gate.set()
    await editing
    await asyncio.wait_for(still, 5)
    assert changes.settled()

    caplog.set_level(logging.WARNING, logger="bot.changes")
    embedder.gate.clear()
    editing = asyncio.create_task(changes.edit("m1", Edit(STREAM, "Klaus: note m1, again")))
    await until(applying, "the second edit at work")
    await memory.close()  # a stop that could not wait: the store closes under the change
    embedder.gate.set()
    await asyncio.wait_for(editing, 5)
    assert [r for r in caplog.records if r.levelno >= logging.ERROR] == []  # a store failure, not a bug of ours
    assert list(changes.waiting) == ["m1"]  # kept, to be tried again
