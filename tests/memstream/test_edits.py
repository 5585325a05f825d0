"""An edited message is as durable as a deletion: the edit is stored at once (the old text gone from the files
and from retrieval), and the new text is embedded when the models answer, retried until it is (issue 30, 3)."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from pathlib import Path

import numpy as np
import pytest

from memstream import ConfigError, MemoryStream, ModelConfig, Observation, PersonaConfig, Source, StreamConfig
from memstream.store import NewMemory, Store, retry_delay
from memstream.testing import FakeClock
from tests.fakes.openai_server import ChatRequest, FakeOpenAIServer
from tests.memstream.helpers import run_sql
from tests.memstream.test_privacy import leftovers

STREAM = "guild:1"
PHONE = "ZQPH-0176-5550199"


@pytest.fixture
async def memory(database: Path | str, openai_server: FakeOpenAIServer,
                 clock: FakeClock) -> AsyncIterator[MemoryStream]:
    def rate(request: ChatRequest) -> str:
        return "7"

    openai_server.on_chat(rate)
    persona = PersonaConfig(name="Isabella", summary="Runs Hobbs Cafe.", database=database,
                            models=ModelConfig(base_url=openai_server.base_url, max_retries=0, timeout=0.5),
                            memory=StreamConfig(reflection_threshold=10_000))
    async with await MemoryStream.open(persona, clock=clock, environ={}, auto_reflect=False) as opened:
        yield opened


async def texts_stored(memory: MemoryStream) -> list[str]:
    return [row[0] for row in await run_sql(memory.store, "SELECT text FROM memories")]


async def test_an_edit_while_the_embedding_server_fails_is_kept_and_completed_later(
        memory: MemoryStream, openai_server: FakeOpenAIServer, clock: FakeClock, database: Path | str,
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    await memory.observe_many([Observation("Maria: the party is on Friday at the cafe", STREAM,
                                           source=Source(message_id="m0"))])
    [stored] = await memory.observe_many([Observation(f"Klaus: call me about the party at {PHONE}", STREAM,
                                                      source=Source(message_id="m1"))])
    assert stored.status == "ready" and await memory.importance_total(STREAM) == 14
    assert stored.id in {s.memory.id for s in await memory.retrieve("call Klaus about the party", stream=STREAM)}

    openai_server.fail_next("500", path="embeddings")
    edited = await memory.edit_message(STREAM, "m1", "Klaus: call me about the party (number removed)")
    assert edited is not None and (edited.id, edited.status) == (stored.id, "pending")
    assert edited.text == "Klaus: call me about the party (number removed)"
    # At once: the old text is nowhere, neither in a row, nor in the file, nor ranked by retrieval.
    assert not any(PHONE in text for text in await texts_stored(memory))
    if isinstance(database, Path):
        assert leftovers(database, PHONE) == []
    found = await memory.retrieve("call Klaus about the party", stream=STREAM)
    assert stored.id not in {s.memory.id for s in found} and found
    assert (await memory.stats(STREAM)).pending.count == 1

    # The server is back: the retries of pending memories embed the new text; the importance counted once.
    clock.advance(seconds=retry_delay(1))
    assert await memory.complete_pending(due_only=True) == 1
    done = await memory.get(stored.id)
    assert (done.status, done.text, done.importance) == ("ready", "Klaus: call me about the party (number removed)", 7)
    assert await memory.importance_total(STREAM) == 14
    found = await memory.retrieve("call Klaus about the party number removed", stream=STREAM)
    assert [s.memory.text for s in found if s.memory.id == stored.id] == [done.text]
    assert not any(PHONE in text for text in await texts_stored(memory))


async def test_an_edit_with_the_models_up_is_ready_at_once(memory: MemoryStream, database: Path | str) -> None:
    await memory.observe_many([Observation(f"Klaus: my number is {PHONE}", STREAM, source=Source(message_id="m1"))])
    edited = await memory.edit_message(STREAM, "m1", "Klaus: (removed)")
    assert edited is not None and (edited.status, edited.text) == ("ready", "Klaus: (removed)")
    assert [s.memory.text for s in await memory.retrieve("removed", stream=STREAM)] == ["Klaus: (removed)"]
    assert await memory.importance_total(STREAM) == 7
    if isinstance(database, Path):
        assert leftovers(database, PHONE) == []
    assert await memory.edit_message(STREAM, "m9", "never stored") is None


@pytest.mark.parametrize("text", ["Klaus: bad \ud800 text", "", "  \n "], ids=["surrogate", "empty", "blank"])
async def test_an_edit_whose_text_cannot_be_stored_is_refused_before_anything_is_written(
        memory: MemoryStream, text: str) -> None:
    """A refusal for good (ConfigError, which callers do not retry), not a foreign error from the database."""
    [stored] = await memory.observe_many([Observation("Klaus: the party", STREAM, source=Source(message_id="m1"))])
    with pytest.raises(ConfigError):
        await memory.edit_message(STREAM, "m1", text)
    after = await memory.get(stored.id)
    assert (after.text, after.status) == ("Klaus: the party", "ready")


async def test_a_completion_of_the_text_before_an_edit_leaves_the_memory_pending(store: Store) -> None:
    """The write path embedded the old text while the message was edited: that embedding is not taken."""
    [memory_id] = await store.insert([NewMemory(stream=STREAM, kind="observation", text=f"Klaus: {PHONE}",
                                                created_at=1.0, source=Source(message_id="m1"))])
    await store.update_text(memory_id, "Klaus: (removed)")
    vector = np.ones(64, np.float32)
    assert await store.complete_many(STREAM, [(memory_id, 5, "rater", vector)], texts=[f"Klaus: {PHONE}"]) == []
    assert (await store.get(memory_id)).status == "pending"
    assert await store.complete_many(STREAM, [(memory_id, 5, "rater", vector)], texts=["Klaus: (removed)"]) == [
        memory_id]
    done = await store.get(memory_id)
    assert (done.status, done.text, done.importance) == ("ready", "Klaus: (removed)", 5)
