"""Numbers from outside (a model server's usage, a clock run backwards) never poison what the store keeps."""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from memstream import (
    EmbeddingError,
    MemoryNotFound,
    MemoryStream,
    ModelConfig,
    Observation,
    PersonaConfig,
    Source,
    StreamConfig,
)
from memstream.clock import to_timestamp
from memstream.models.llm import CALL_COUNT_MAX
from memstream.store import Store
from memstream.store.policy import COUNT_CEILING
from memstream.testing import FakeClock
from tests.conftest import MakeMemory
from tests.fakes.openai_server import FakeOpenAIServer

STREAM = "guild:1"
ROLES = ("rater", "embedding")


def _notes(start: int, count: int) -> list[Observation]:
    return [Observation(f"note {i} about the party", STREAM, source=Source(message_id=f"n{i}"))
            for i in range(start, start + count)]


@pytest.mark.parametrize("lie", [2**64 - 1, 2**63, -5, 1e300, "lots", None, [1]])
async def test_one_absurd_usage_reply_never_stops_later_writes(
        database: Path | str, openai_server: FakeOpenAIServer, caplog: pytest.LogCaptureFixture, lie: Any) -> None:
    caplog.set_level(logging.DEBUG)
    persona = PersonaConfig(name="Isabella", summary="Runs Hobbs Cafe.", database=database,
                            models=ModelConfig(base_url=openai_server.base_url, max_retries=0, timeout=2))
    async with await MemoryStream.open(persona, clock=FakeClock(), environ={}, auto_reflect=False) as memory:
        openai_server.usage = {"prompt_tokens": lie, "completion_tokens": lie, "total_tokens": lie}
        stored = await memory.observe_many(_notes(0, 5))
        assert {(await memory.get(m.id)).status for m in stored} == {"ready"}
        openai_server.usage = {}
        stored = await memory.observe_many(_notes(5, 5))  # the next burst is rated, stored and counted
        assert {(await memory.get(m.id)).status for m in stored} == {"ready"}
        stats = await memory.stats(STREAM)
        assert stats.pending.count == 0
        assert (stats.usage["rater"].calls, stats.usage["embedding"].calls) == (10, 2)
        for role in ROLES:
            assert 0 < stats.usage[role].prompt_tokens <= 5 * CALL_COUNT_MAX + 1000
            assert 0 <= stats.usage[role].completion_tokens <= 5 * CALL_COUNT_MAX + 1000
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


async def test_usage_totals_stay_at_the_ceiling_and_never_fail_the_write(store: Store) -> None:
    huge = (2**64 - 1, 2**63, -1, 1e300)
    rows = [(STREAM, "rater", 1, 0, value, value, value) for value in huge]
    await store.record_usage_many(rows)
    await store.record_usage_many(rows)  # the sum would pass the ceiling: it stays there
    await store.record_usage(STREAM, "agent", prompt_tokens=2**64 - 1, completion_tokens=-3, retries=2**70)
    usage = await store.usage(STREAM)
    assert (usage["rater"].calls, usage["rater"].prompt_tokens, usage["rater"].completion_tokens) == (
        8, COUNT_CEILING, COUNT_CEILING)
    assert (usage["agent"].prompt_tokens, usage["agent"].completion_tokens) == (COUNT_CEILING, 0)
    assert (await store.retries(STREAM)) == {"agent": COUNT_CEILING, "rater": COUNT_CEILING}
    [(_, _, by_day)] = [day for day in await store.usage_by_day(STREAM) if day[1] == "rater"]
    assert by_day.prompt_tokens == COUNT_CEILING


@pytest.mark.parametrize("number", [2**63, 2**64 - 1, 10**23, 0, -1])
async def test_an_id_no_database_can_hold_names_no_memory(memory: MemoryStream, number: int) -> None:
    with pytest.raises(MemoryNotFound) as found:
        await memory.get(number)
    assert found.value.memory_id == number
    for call in (memory.why(number), memory.by_number(STREAM, number), memory.forget([number]),
                 memory.get(number, stream=STREAM)):
        with pytest.raises(MemoryNotFound, match=f"no memory #{number}"):
            await call


async def test_a_clock_set_back_never_puts_a_last_access_before_its_memory_was_made(
        make_memory: MakeMemory, store: Store, clock: FakeClock) -> None:
    clock.set(datetime(2024, 6, 1))
    memory = make_memory(config=StreamConfig(profile="spec"))
    made = await memory.observe_many([Observation(f"Klaus plans the party {i}", STREAM,
                                                  source=Source(message_id=f"p{i}")) for i in range(3)])
    await memory.retrieve("party", stream=STREAM)  # the index holds the stream from here on
    clock.set(datetime(2023, 1, 1))  # memstream chat --at 2023-01-01
    await memory.retrieve("party", stream=STREAM)
    await store.touch([made[0].id], to_timestamp(datetime(2022, 1, 1)))
    await store.save_reflection(STREAM, [], to_timestamp(datetime(2023, 1, 1)),
                                touches={made[1].id: to_timestamp(datetime(2021, 1, 1))})
    for m in made:
        stored = await store.get(m.id)
        assert stored.last_accessed_at == stored.created_at == datetime(2024, 6, 1, tzinfo=UTC)
    live = await memory.index.get(STREAM)  # fed by the store's events: what the store wrote
    arrays = await store.load_stream(STREAM)
    mine, theirs = np.argsort(live.ids), np.argsort(arrays.ids)
    assert live.last_accessed[mine].tolist() == arrays.last_accessed[theirs].tolist()
    assert live.last_accessed.tolist() == [to_timestamp(datetime(2024, 6, 1))] * 3


async def test_vectors_of_the_wrong_size_are_a_failed_model_call_never_a_store_error(
        database: Path | str, openai_server: FakeOpenAIServer) -> None:
    """A model server's vector sizes are untrusted too (issue 30's soak): the write path keeps the memory pending
    (one attempt counted, retried with backoff), a query or a reflection fails as a model failure does (the bot
    then says it could not answer), and nothing of the answer is written."""
    persona = PersonaConfig(name="Isabella", summary="Runs Hobbs Cafe.", database=database,
                            models=ModelConfig(base_url=openai_server.base_url, max_retries=0, timeout=2),
                            memory=StreamConfig(reflection_threshold=10_000))
    async with await MemoryStream.open(persona, clock=FakeClock(), environ={}, auto_reflect=False) as memory:
        await memory.observe_many(_notes(0, 3))  # the store's size is 64 from here on
        openai_server.fail_next("wrong_dim", path="embeddings")
        [kept] = await memory.observe_many(_notes(3, 1))
        assert kept.status == "pending" and (await memory.store.pending_state(STREAM)).count == 1
        assert memory.last_model_error is not None
        assert "vectors of" in str(memory.last_model_error) and "the store's have 64" in str(memory.last_model_error)
        openai_server.fail_next("wrong_dim", path="embeddings")
        with pytest.raises(EmbeddingError, match="the store's have 64"):
            await memory.retrieve("the party", stream=STREAM)
        assert await memory.complete([kept.id]) == 1  # the server answers truly again
        stats = await memory.stats(STREAM)
        assert stats.usage["embedding"].failures == 2
