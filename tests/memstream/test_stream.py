"""MemoryStream: observing (idempotent, batched, resumable), stats, forgetting, editing and responding."""

from __future__ import annotations

import asyncio
import json
import logging
import math
from datetime import timedelta
from pathlib import Path
from zoneinfo import ZoneInfo

import pytest

from memstream.clock import to_timestamp
from memstream.config import PersonaConfig, StreamConfig
from memstream.errors import CompletionError, ConfigError, EmbeddingError, MemoryNotFound
from memstream.records import Source
from memstream.stream import MemoryStream, Observation
from memstream.testing import FakeClock, FakeEmbedder, ScriptedChat
from tests.conftest import MakeMemory
from tests.memstream.helpers import AGENT, INSIGHTS, QUESTIONS, RATER, rate_by, tagged

# -- observing -------------------------------------------------------------------------------------


async def test_the_same_message_twice_is_one_memory(make_memory: MakeMemory, chat: ScriptedChat,
                                                    embedder: FakeEmbedder) -> None:
    memory = make_memory()
    chat.on(RATER, "4")
    first = await memory.observe("Klaus: hello", source=Source(author="Klaus", message_id="111"))
    again = await memory.observe("Klaus: hello", source=Source(author="Klaus", message_id="111"))
    assert again.id == first.id
    assert (await memory.stats()).counts.observations == 1
    assert len(chat.calls_with(RATER)) == 1 and len(embedder.calls) == 1
    assert await memory.importance_total() == 4
    # The same message id in another stream is another memory.
    other = await memory.observe("Klaus: hello", stream="guild:2", source=Source(message_id="111"))
    assert other.id != first.id


async def test_a_message_repeated_within_one_burst_is_one_memory(make_memory: MakeMemory,
                                                                 chat: ScriptedChat) -> None:
    memory = make_memory()
    chat.on(RATER, "4")
    await memory.observe("stored before", source=Source(message_id="1"))
    burst = [Observation("stored before", source=Source(message_id="1")),
             Observation("new", source=Source(message_id="2")),
             Observation("new", source=Source(message_id="2")),
             Observation("no id"), Observation("no id")]
    found = await memory.observe_many(burst)
    ids = [m.id for m in found]
    assert ids[1] == ids[2] and ids[0] != ids[1]
    assert ids[3] != ids[4]  # without a message id, nothing is deduplicated
    assert (await memory.stats()).counts.observations == 4
    assert len(chat.calls_with(RATER)) == 4
    assert await memory.importance_total() == 16


async def test_observe_many_batches_embeddings_and_rates_each_once(
    make_memory: MakeMemory, chat: ScriptedChat, embedder: FakeEmbedder, clock: FakeClock
) -> None:
    memory = make_memory()
    chat.on(RATER, rate_by({}, default=1))
    items = [Observation(f"Maria counted sheep number {n}", at=clock.now() + timedelta(seconds=n))
             for n in range(70)]
    found = await memory.observe_many(items)
    assert [m.text for m in found] == [item.text for item in items]
    assert all(m.status == "ready" and m.importance == 1 for m in found)
    size = memory.config.embed_batch_size
    assert size == 32
    assert len(embedder.calls) <= math.ceil(len(items) / size)
    assert all(len(batch) <= size for batch in embedder.calls)
    assert sorted(t for batch in embedder.calls for t in batch) == sorted(item.text for item in items)
    rated = sorted(chat.calls_with(RATER))
    assert len(rated) == len(items)
    assert len(set(rated)) == len(items)  # one call per observation, no retries
    assert (await memory.stats()).usage["rater"].calls == len(items)


async def test_a_model_failure_leaves_the_memory_pending_until_completed(
    make_memory: MakeMemory, chat: ScriptedChat, caplog: pytest.LogCaptureFixture
) -> None:
    memory = make_memory()
    chat.fail_with = CompletionError("the model server at http://127.0.0.1:9 failed with HTTP 500")
    with caplog.at_level(logging.WARNING, logger="memstream"), pytest.raises(CompletionError) as info:
        await memory.observe("Isabella invited Maria to her party")
    [pending] = await memory.recent()
    assert (pending.status, pending.importance) == ("pending", None)
    assert pending.text == "Isabella invited Maria to her party"
    message = str(info.value)
    assert "\n" not in message
    assert "HTTP 500" in message and f"memory #{pending.id}" in message and "completed later" in message
    assert any(f"#{pending.id}" in r.getMessage() for r in caplog.records if r.levelno == logging.WARNING)
    assert await memory.retrieve("party") == []
    stats = await memory.stats("default")
    assert (stats.pending.count, stats.usage["rater"].failures, stats.state.importance_since_reflection) == (1, 1, 0)

    chat.fail_with = None
    chat.on(RATER, "7")
    assert await memory.complete_pending() == 1
    done = await memory.get(pending.id)
    assert (done.status, done.importance, done.importance_source) == ("ready", 7, "rater")
    assert [m.memory.id for m in await memory.retrieve("party")] == [pending.id]
    assert await memory.importance_total() == 7
    assert await memory.complete_pending() == 0


async def test_an_embedding_failure_leaves_the_memory_pending_too(
    make_memory: MakeMemory, chat: ScriptedChat, embedder: FakeEmbedder
) -> None:
    memory = make_memory()
    chat.on(RATER, "3")
    embedder.fail_with = EmbeddingError("cannot reach the embedding server")
    with pytest.raises(EmbeddingError, match=r"cannot reach the embedding server.*kept"):
        await memory.observe("Maria painted a mural")
    found = await memory.observe_many([Observation("Maria sang"), Observation("Maria danced")])
    assert [m.status for m in found] == ["pending", "pending"]  # observe_many reports, never raises
    assert (await memory.stats()).pending.count == 3
    embedder.fail_with = None
    assert await memory.complete_pending() == 3
    assert (await memory.stats()).pending.count == 0
    assert await memory.importance_total() == 9


@pytest.mark.parametrize("importance", [0, 11, True, 5.0])
async def test_a_given_importance_must_be_1_to_10(make_memory: MakeMemory, importance: object) -> None:
    memory = make_memory()
    with pytest.raises(ConfigError, match="importance"):
        await memory.observe("x", importance=importance)  # type: ignore[arg-type]
    assert await memory.recent() == []


async def test_stats_count_kinds_histogram_fallbacks_and_usage(
    make_memory: MakeMemory, chat: ScriptedChat, clock: FakeClock
) -> None:
    memory = make_memory()
    chat.on(RATER, rate_by({"a": 2, "b": 2, "c": 9, "d": "no idea"}))
    chat.on(AGENT, "Sure!")
    for text in "abcd":
        clock.advance(minutes=1)
        await memory.observe(text)
    await memory.observe("given", importance=10)
    stats = await memory.stats("default")
    counts, state = stats.counts, stats.state
    assert (counts.observations, counts.reflections, stats.pending.count, counts.fallback) == (5, 0, 0, 1)
    assert {k: v for k, v in counts.histogram.items() if v} == {2: 2, 5: 1, 9: 1, 10: 1}
    assert state is not None and state.importance_since_reflection == 2 + 2 + 9 + 5 + 10
    assert stats.reflection_threshold == 150
    assert stats.usage["rater"].calls == 5  # a, b, c, and d twice
    assert stats.usage["embedding"].calls == 5
    assert "agent" not in stats.usage

    await memory.respond("Want to paint?", speaker="Klaus", observe_message=False)
    usage = (await memory.stats("default")).usage
    assert usage["agent"].calls == 1
    assert usage["agent"].prompt_tokens == len(chat.calls_with(AGENT)[0].split())
    assert usage["rater"].calls == 6  # the reply is observed (and rated) too
    assert (await memory.stats()).counts.observations == 6


async def test_stats_as_json_keep_the_keys_and_order_the_cli_prints(memory: MemoryStream, chat: ScriptedChat,
                                                                    clock: FakeClock) -> None:
    chat.on(RATER, "4")
    await memory.observe("a")
    await memory.store.save_reflection("default", [], to_timestamp(clock.now()))
    await memory.store.count_fault("default", "rating_fallback")
    chat.fail_with = CompletionError("down", retryable=True)
    with pytest.raises(CompletionError):
        await memory.observe("b")
    stats = await memory.stats()
    everything = stats.to_json()
    assert list(everything) == ["observations", "reflections", "pending", "fallback", "histogram", "failed_attempts",
                                "next_retry_at", "usage", "faults", "retries", "rater", "resident"]
    assert everything["resident"]["budget"] == memory.config.resident_mb << 20
    assert [everything[key] for key in ("observations", "reflections", "pending", "fallback")] == [2, 0, 1, 0]
    assert everything["histogram"] == {**{str(i): 0 for i in range(1, 11)}, "4": 1}
    assert stats.pending.next_retry_at is not None and everything["failed_attempts"] == 1
    assert everything["next_retry_at"] == stats.pending.next_retry_at.isoformat()
    assert list(everything["usage"]["rater"]) == ["calls", "failures", "prompt_tokens", "completion_tokens"]
    assert everything["usage"]["rater"]["failures"] == 1 and everything["faults"] == {"rating_fallback": 1}
    one = (await memory.stats("default")).to_json()
    assert list(one) == [*everything, "importance_since_reflection", "reflection_threshold", "last_reflection_at",
                         "reflections_run", "reflections_skipped"]
    assert [one[key] for key in list(one)[-5:]] == [0, 150, "2023-02-13T08:00:00+00:00", 1, 0]
    assert json.loads(json.dumps(one)) == one  # plain JSON data

async def test_concurrent_reflections_on_one_stream_run_once(make_memory: MakeMemory, chat: ScriptedChat) -> None:
    memory = make_memory(config=StreamConfig(reflection_threshold=10), auto_reflect=False)
    await memory.observe("A happened", importance=9)
    await memory.observe("B happened", importance=9)
    assert await memory.reflection_due()
    chat.on(QUESTIONS, "Why?\nWho?\nWhat?")
    chat.on(INSIGHTS, "A and B (because of 1, 2)")
    results = await asyncio.gather(memory.reflect(only_if_due=True), memory.reflect(only_if_due=True))
    assert sorted(r is None for r in results) == [False, True]
    assert len(chat.calls_with(QUESTIONS)) == 1 and len(chat.calls_with(INSIGHTS)) == 1


async def test_auto_reflect_off_leaves_reflection_to_the_caller(make_memory: MakeMemory, chat: ScriptedChat) -> None:
    memory = make_memory(config=StreamConfig(reflection_threshold=5), auto_reflect=False)
    await memory.observe("A happened", importance=9)
    assert chat.calls == []
    assert await memory.due_streams() == ["default"]


# -- forgetting and editing ------------------------------------------------------------------------


async def test_forgetting_removes_the_memory_and_reflections_built_on_it(
    make_memory: MakeMemory, chat: ScriptedChat, clock: FakeClock
) -> None:
    memory = make_memory()
    a = await memory.observe("Klaus said something hurtful", importance=8)
    b = await memory.observe("Maria painted the sunset", importance=4)
    chat.on(QUESTIONS, "How does Maria feel about Klaus?\nWhat does Maria do?\nWhy?")
    chat.on(INSIGHTS, lambda prompt, model: "\n".join([
        f"Maria is upset with Klaus (because of {_number(prompt, a.text)})",
        f"Maria loves painting (because of {_number(prompt, b.text)})",
    ]))
    first = await memory.reflect()
    assert first is not None
    by_text = {m.text: m for m in first.insights}
    upset, painting = by_text["Maria is upset with Klaus"], by_text["Maria loves painting"]
    chat.rules.clear()
    chat.on(QUESTIONS, "What next?")
    chat.on(INSIGHTS, lambda prompt, model: f"Maria avoids Klaus (because of {_number(prompt, upset.text)})")
    clock.advance(hours=1)
    second = await memory.reflect()
    assert second is not None
    [avoids] = second.insights
    assert avoids.depth == 2
    # Load the stream's matrix so that forgetting must update it too.
    assert len(await memory.explain("Klaus", k=10)) == 5

    deleted = await memory.forget([a.id])

    assert sorted(deleted) == sorted([a.id, upset.id, avoids.id])
    left = {item.memory.id for item in await memory.retrieve("Klaus", k=10)}
    assert left == {b.id, painting.id}
    with pytest.raises(MemoryNotFound):
        await memory.why(upset.id)
    assert [child.memory.id for child in (await memory.why(painting.id)).evidence] == [b.id]


def _number(prompt: str, text: str) -> int:
    for line in tagged(prompt, "statements").strip().splitlines():
        number, _, rest = line.partition(". ")
        if rest == text:
            return int(number)
    raise AssertionError(f"{text!r} is not a statement")


async def test_forgetting_in_the_wrong_stream_deletes_nothing(make_memory: MakeMemory) -> None:
    memory = make_memory()
    mine = await memory.observe("a secret", stream="dm:1", importance=5)
    with pytest.raises(MemoryNotFound):
        await memory.forget([mine.id], stream="dm:2")
    assert (await memory.get(mine.id)).text == "a secret"
    assert await memory.forget([mine.id], stream="dm:1") == [mine.id]


async def test_forget_by_author_and_by_message_and_purge(make_memory: MakeMemory) -> None:
    memory = make_memory()
    klaus = Source(author="Klaus", author_id="7", message_id="m1")
    await memory.observe("Klaus: hi", stream="guild:1", importance=2, source=klaus)
    await memory.observe("Klaus: bye", stream="guild:1", importance=2, source=Source(author_id="7", message_id="m2"))
    other = await memory.observe("Ada: hi", stream="guild:1", importance=2, source=Source(author_id="8"))
    assert len(await memory.forget_author("guild:1", "7")) == 2
    assert [m.id for m in await memory.recent("guild:1")] == [other.id]
    await memory.observe("Ada: again", stream="guild:1", importance=2, source=Source(message_id="m3"))
    assert len(await memory.forget_messages(["m3", "unknown"])) == 1
    assert await memory.purge("guild:1") == 1
    assert await memory.recent("guild:1") == []
    assert await memory.retrieve("hi", stream="guild:1") == []


async def test_an_edited_message_changes_text_and_embedding(make_memory: MakeMemory, embedder: FakeEmbedder) -> None:
    memory = make_memory()
    original = await memory.observe("Maria likes apples", importance=3, source=Source(message_id="m1"))
    await memory.observe("Klaus fixed his bike", importance=3)

    async def cosine_to_pears() -> float:
        return next(i.cosine for i in await memory.explain("pears", k=2) if i.memory.id == original.id)

    before = await cosine_to_pears()
    edited = await memory.edit_message("default", "m1", "pears")
    assert edited is not None and (edited.id, edited.text) == (original.id, "pears")
    assert before < 0.99 and await cosine_to_pears() == pytest.approx(1.0)
    assert len(embedder.calls[-2]) == 1  # the new text was embedded once
    assert await memory.edit_message("default", "missing", "x") is None


# -- responding ------------------------------------------------------------------------------------


async def test_respond_observes_both_sides_and_keeps_the_message_out_of_its_memories(
    make_memory: MakeMemory, chat: ScriptedChat, clock: FakeClock
) -> None:
    memory = make_memory()
    chat.on(RATER, "3")
    chat.on(AGENT, "  I'm painting tonight.  ")
    for n in range(6):
        await memory.observe(f"Maria painted canvas {n}", at=clock.now() - timedelta(hours=n))
    reply = await memory.respond("What are you painting?", speaker="Klaus",
                                 source=Source(author="Klaus", message_id="d1"))
    assert reply.text == "I'm painting tonight."
    assert len(reply.memories) == memory.config.k
    texts = [item.memory.text for item in reply.memories]
    assert "Klaus: What are you painting?" not in texts
    assert reply.memory is not None and reply.memory.text == "Maria: I'm painting tonight."
    assert reply.memory.source.author == "Maria"
    assert 'Klaus says to you: "What are you painting?"' in reply.prompt
    assert tagged(reply.prompt, "memories").count("\n- ") == len(reply.memories) - 1
    [(model, _)] = [call for call in chat.calls if AGENT in call[1]]
    assert model == "agent-model"
    trace = await memory.store.trace(trace_id=reply.trace_id)
    assert trace is not None and trace.reply_memory_id == reply.memory.id


async def test_time_is_shown_in_the_persona_time_zone(make_memory: MakeMemory, chat: ScriptedChat) -> None:
    memory = make_memory(tz=ZoneInfo("America/New_York"))
    await memory.respond("hi", observe_message=False)  # the clock says 08:00 UTC on Feb 13, 2023
    [prompt] = chat.calls_with(AGENT)
    assert "It is Monday, February 13, 2023, 3:00 AM." in prompt


async def test_open_with_fakes_and_close(tmp_path: Path, chat: ScriptedChat, embedder: FakeEmbedder,
                                         clock: FakeClock) -> None:
    persona = PersonaConfig(name="Maria", summary="A painter.", database=tmp_path / "data" / "maria.db",
                            memory=StreamConfig(k=2))
    memory = await MemoryStream.open(persona, chat=chat, embedder=embedder, clock=clock, environ={})
    async with memory:
        await memory.observe("Maria woke up", importance=2)
        assert memory.config.k == 2 and memory.name == "Maria"
    assert (tmp_path / "data" / "maria.db").is_file()
    reopened = await MemoryStream.open(persona, chat=chat, embedder=embedder, clock=clock, environ={})
    async with reopened:
        assert [m.text for m in await reopened.recent()] == ["Maria woke up"]
