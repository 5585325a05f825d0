"""Durable ingestion: persisted before any model call, retried with backoff, never stored twice; a reflection is
one transaction, the last-access times its retrievals set included."""

from __future__ import annotations

import asyncio
import itertools

import pytest

from memstream import CompletionError, EmbeddingError, MemoryStream, Observation, Source
from memstream.store import RETRY_BASE_SECONDS, RETRY_CAP_SECONDS, NewMemory, Store, retry_delay
from memstream.testing import FakeClock, FakeEmbedder, ScriptedChat
from tests.conftest import MakeMemory
from tests.memstream.helpers import INSIGHTS, QUESTIONS, RATER, run_sql

STREAM = "guild:1"


def burst(count: int, start: int = 0) -> list[Observation]:
    return [Observation(f"message {i} about the party", STREAM, source=Source(author_id="7", message_id=f"m{i}"))
            for i in range(start, start + count)]


async def ids_by_message(memory: MemoryStream) -> dict[str, int]:
    return {row[0]: row[1] for row in await run_sql(memory.store, "SELECT message_id, COUNT(*) FROM memories "
                                                                  "GROUP BY message_id")}


def test_the_backoff_doubles_up_to_its_cap() -> None:
    assert [retry_delay(n) for n in range(1, 6)] == [RETRY_BASE_SECONDS * 2**k for k in range(5)]
    assert retry_delay(60) == retry_delay(10_000) == RETRY_CAP_SECONDS


async def test_a_burst_is_persisted_before_any_model_call(make_memory: MakeMemory, chat: ScriptedChat,
                                                          embedder: FakeEmbedder) -> None:
    memory = make_memory()
    stored = await memory.observe_many(burst(5), defer=True)
    assert {m.status for m in stored} == {"pending"} and chat.calls == [] and embedder.calls == []
    assert await memory.complete([m.id for m in stored]) == 5
    assert {m.status for m in await memory.recent(STREAM, 10)} == {"ready"}


async def test_an_outage_of_any_length_loses_nothing(make_memory: MakeMemory, chat: ScriptedChat,
                                                     clock: FakeClock) -> None:
    memory = make_memory()
    chat.fail_with = CompletionError("the model server is down", retryable=True)
    await memory.observe_many(burst(40))
    for hour in range(24):  # a day of retries, every one failing, further apart each time
        clock.advance(hours=1)
        await memory.observe_many(burst(5, start=100 + 5 * hour))
        assert await memory.complete_pending(due_only=True) == 0
    stats = await memory.stats(STREAM)
    assert stats.pending.count == 160 and stats.pending.next_retry_at is not None
    chat.fail_with = None  # the model is back
    clock.advance(seconds=RETRY_CAP_SECONDS)
    assert await memory.complete_pending(due_only=True) == 160
    assert set((await ids_by_message(memory)).values()) == {1}
    assert (await memory.stats(STREAM)).pending.count == 0


async def test_each_failure_pushes_the_next_try_further(make_memory: MakeMemory, chat: ScriptedChat,
                                                        clock: FakeClock) -> None:
    memory = make_memory()
    chat.fail_with = CompletionError("down", retryable=True)
    [pending] = await memory.observe_many(burst(1))
    waits = []
    for _ in range(4):
        due = (await memory.stats(STREAM)).pending.next_retry_at
        assert due is not None
        waits.append(due)
        clock.set(due)
        assert await memory.complete_pending(due_only=True) == 0
    gaps = [(b - a).total_seconds() for a, b in itertools.pairwise(waits)]
    assert gaps == [retry_delay(2), retry_delay(3), retry_delay(4)]
    assert (await memory.stats(STREAM)).pending.failed_attempts == 5
    assert (await memory.get(pending.id)).status == "pending"


async def test_a_replayed_event_is_never_stored_twice(make_memory: MakeMemory) -> None:
    memory = make_memory()
    first = await memory.observe_many(burst(10))
    again = await memory.observe_many(burst(10) + burst(3))  # replayed, and repeated within one batch
    assert [m.id for m in again] == [m.id for m in first] + [m.id for m in first[:3]]
    await asyncio.gather(*(memory.observe_many(burst(12)) for _ in range(4)))  # the same events, concurrently
    assert await ids_by_message(memory) == {f"m{i}": 1 for i in range(12)}
    assert await memory.importance_total(STREAM) == sum(m.importance or 0 for m in await memory.recent(STREAM, 50))


async def test_nothing_is_completed_twice_at_once(make_memory: MakeMemory, chat: ScriptedChat) -> None:
    memory = make_memory()
    chat.on(RATER, "3")
    stored = await memory.observe_many(burst(20), defer=True)
    await asyncio.gather(memory.complete([m.id for m in stored]), memory.complete_pending(),
                         memory.complete_pending())
    assert len(chat.calls_with(RATER)) == 20
    assert await memory.importance_total(STREAM) == 60


async def test_a_failed_embedding_counts_one_attempt_per_memory(make_memory: MakeMemory,
                                                                embedder: FakeEmbedder) -> None:
    memory = make_memory()
    embedder.fail_with = EmbeddingError("no embeddings today")
    await memory.observe_many(burst(3))
    assert (await memory.stats(STREAM)).pending.failed_attempts == 3


# -- reflection: one transaction ------------------------------------------------------------------


async def _due(memory: MemoryStream, clock: FakeClock) -> None:
    await memory.observe_many([Observation(f"Klaus said thing {i}", STREAM, clock.now(), 5) for i in range(8)])


async def _snapshot(memory: MemoryStream) -> list[tuple[object, ...]]:
    return (await run_sql(memory.store, "SELECT * FROM memories ORDER BY id")
            + await run_sql(memory.store, "SELECT * FROM stream_state ORDER BY stream"))


@pytest.mark.parametrize("fails", ["insights", "embedding"])
async def test_a_failed_reflection_changes_nothing_not_even_last_access(
        make_memory: MakeMemory, chat: ScriptedChat, embedder: FakeEmbedder, clock: FakeClock, fails: str) -> None:
    memory = make_memory(auto_reflect=False)
    await _due(memory, clock)
    ranking = [(m.memory.id, m.score) for m in await memory.explain("Klaus said thing", stream=STREAM)]
    before = await _snapshot(memory)
    clock.advance(hours=5)
    chat.on(QUESTIONS, "What did Klaus say?\nWho is Klaus?\nWhy?")
    if fails == "insights":
        chat.on(INSIGHTS, lambda prompt, model: (_ for _ in ()).throw(CompletionError("insights failed")))
    else:
        chat.on(INSIGHTS, "Klaus talks a lot (because of 1)")
        real = embedder.embed_batch

        async def flaky(texts: list[str]) -> object:
            if texts == ["Klaus talks a lot"]:
                raise EmbeddingError("embedding failed")
            return await real(texts)

        embedder.embed_batch = flaky  # type: ignore[method-assign]
    with pytest.raises((CompletionError, EmbeddingError)):
        await memory.reflect(STREAM)
    after = await _snapshot(memory)
    assert after[:-1] == before[:-1]  # every memory, last access included
    assert after[-1][:4] == before[-1][:4]  # the total; only the skip counter moved
    clock.advance(hours=-5)
    # and the in-memory ranking agrees with the store again
    assert [(m.memory.id, m.score) for m in await memory.explain("Klaus said thing", stream=STREAM)] == ranking


async def test_a_reflection_commits_what_its_retrievals_touched(make_memory: MakeMemory, chat: ScriptedChat,
                                                                clock: FakeClock) -> None:
    memory = make_memory(auto_reflect=False)
    await _due(memory, clock)
    clock.advance(hours=5)
    chat.on(QUESTIONS, "What did Klaus say?\nWho is Klaus?\nWhy?")
    chat.on(INSIGHTS, "Klaus talks a lot (because of 1)")
    result = await memory.reflect(STREAM)
    assert result is not None and result.statements
    for statement in result.statements:
        assert (await memory.get(statement.id)).last_accessed_at == clock.now()
    untouched = {m.id for m in await memory.recent(STREAM, 50)} - {m.id for m in result.statements}
    for memory_id in untouched - {m.id for m in result.insights}:
        assert (await memory.get(memory_id)).last_accessed_at < clock.now()


async def test_the_store_s_sql_follows_the_one_retry_formula(store: Store) -> None:
    # The SQL that counts a failure is written from retry_delay (store/policy.py): equal at every count,
    # the doubling, its cap and beyond.
    [memory_id] = await store.insert([NewMemory(stream=STREAM, kind="observation", text="x", created_at=0.0)])
    for failures in range(1, 41):
        await store.count_attempt(memory_id, at=1000.0)
        due = (await store.pending_state(STREAM)).next_retry_at
        assert due is not None and due.timestamp() == 1000.0 + retry_delay(failures), failures


async def test_an_observation_retried_after_a_model_failure_is_the_same_memory(
        make_memory: MakeMemory, chat: ScriptedChat, clock: FakeClock) -> None:
    memory = make_memory()
    chat.fail_with = CompletionError("HTTP 500", retryable=True)
    with pytest.raises(CompletionError, match="observing the same text again completes it"):
        await memory.observe("Klaus plans the party", stream=STREAM)
    [pending] = await memory.store.recent(STREAM, 10, include_pending=True)
    chat.fail_with = None  # the rater is back: the operator runs the same command again
    clock.advance(minutes=5)
    again = await memory.observe("Klaus plans the party", stream=STREAM)
    assert (again.id, again.status, again.created_at) == (pending.id, "ready", pending.created_at)
    assert await memory.complete_pending() == 0  # nothing left to complete (an import's last step)
    assert [m.id for m in await memory.store.recent(STREAM, 10, include_pending=True)] == [pending.id]
    # Once ready, the same text is a new memory; a Discord message is still keyed by its id alone.
    assert (await memory.observe("Klaus plans the party", stream=STREAM)).id != pending.id
    chat.fail_with = CompletionError("HTTP 500", retryable=True)
    [first] = await memory.observe_many([Observation("hi", STREAM, source=Source(message_id="d1"))])
    [second] = await memory.observe_many([Observation("hi", STREAM, source=Source(message_id="d2"))])
    assert first.id != second.id and {first.status, second.status} == {"pending"}
    assert await memory.observe_many([Observation("hi", "guild:2")]) != []  # another stream: its own memory
    assert len(await memory.store.recent(STREAM, 10, include_pending=True)) == 4
