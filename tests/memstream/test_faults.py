"""Every model fault through the real openai SDK and the fake server: no crash, the documented outcome, one
clear log line (WARNING, no traceback, from any logger) and a counter in stats."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from bot.scheduler import ReflectionScheduler
from memstream import MemoryStream, ModelConfig, Observation, PersonaConfig, Source, StreamConfig
from memstream.store import retry_delay
from memstream.testing import FakeClock
from tests.fakes.openai_server import ChatRequest, FakeOpenAIServer
from tests.memstream.helpers import INSIGHTS, QUESTIONS

STREAM = "guild:1"
THREE = "What is the party?\nWho is invited?\nWhat does Klaus want?"


class Script:
    """What the fake model answers; tests change the fields."""

    def __init__(self) -> None:
        self.rating = "7"
        self.questions = THREE
        self.insights = "Klaus is planning the party (because of 1)"

    def __call__(self, request: ChatRequest) -> str:
        if QUESTIONS in request.prompt:
            return self.questions
        if INSIGHTS in request.prompt:
            return self.insights
        return self.rating


@pytest.fixture
def script(openai_server: FakeOpenAIServer) -> Script:
    answers = Script()
    openai_server.on_chat(answers)
    openai_server.timeout_sleep = 2.0  # (past the memory fixture's 1 s client timeout)
    return answers


@pytest.fixture
async def memory(tmp_path: Path, openai_server: FakeOpenAIServer, clock: FakeClock,
                 script: Script) -> AsyncIterator[MemoryStream]:
    persona = PersonaConfig(name="Isabella", summary="Runs Hobbs Cafe.", database=tmp_path / "i.db",
                            models=ModelConfig(base_url=openai_server.base_url, max_retries=0, timeout=1.0),
                            memory=StreamConfig(reflection_threshold=5))
    async with await MemoryStream.open(persona, clock=clock, environ={}, auto_reflect=False) as opened:
        yield opened


def one_clear_line(caplog: pytest.LogCaptureFixture) -> str:
    """The only WARNING-or-above record of the test, from any logger: one line, no traceback."""
    loud = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(loud) == 1, [f"{r.name}: {r.getMessage()}" for r in loud]
    [record] = loud
    message = record.getMessage()
    assert record.exc_info is None and record.stack_info is None
    assert "\n" not in message and "Traceback" not in message
    return message


def quiet(caplog: pytest.LogCaptureFixture) -> None:
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []


async def observe(memory: MemoryStream, text: str = "Klaus is planning a Valentine's Day party") -> int:
    [stored] = await memory.observe_many([Observation(text, STREAM, source=Source(message_id=f"m-{text}"))])
    return stored.id


@pytest.mark.parametrize("kind", ["500", "429", "timeout", "malformed", "empty_choices", "disconnect"])
async def test_a_failed_rating_keeps_the_observation_pending_then_completes_it_after_its_backoff(
        memory: MemoryStream, openai_server: FakeOpenAIServer, clock: FakeClock, caplog: pytest.LogCaptureFixture,
        kind: str) -> None:
    caplog.set_level(logging.DEBUG)
    openai_server.fail_next(kind, path="chat")
    memory_id = await observe(memory)
    assert (await memory.get(memory_id)).status == "pending"
    assert f"#{memory_id} kept as pending" in one_clear_line(caplog)
    stats = await memory.stats(STREAM)
    assert (stats.pending.count, stats.pending.failed_attempts, stats.usage["rater"].failures) == (1, 1, 1)

    assert await memory.complete_pending(due_only=True) == 0  # its backoff has not passed
    clock.advance(seconds=retry_delay(1))
    assert await memory.complete_pending(due_only=True) == 1
    done = await memory.get(memory_id)
    assert (done.status, done.importance, done.importance_source) == ("ready", 7, "rater")
    assert (await memory.stats(STREAM)).pending.count == 0
    assert await memory.importance_total(STREAM) == 7


async def test_connection_refused_then_the_server_comes_back(
        memory: MemoryStream, openai_server: FakeOpenAIServer, clock: FakeClock,
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    await openai_server.stop()
    memory_id = await observe(memory)
    assert "cannot reach" in one_clear_line(caplog)
    caplog.clear()
    for _ in range(3):  # an outage of any length: every retry fails, with a longer wait each time
        clock.advance(seconds=retry_delay(100))
        assert await memory.complete_pending(due_only=True) == 0
    assert (await memory.stats(STREAM)).pending.failed_attempts == 4
    await openai_server.start()  # the same port again
    clock.advance(seconds=retry_delay(100))
    assert await memory.complete_pending(due_only=True) == 1
    assert (await memory.get(memory_id)).status == "ready"


async def test_a_failed_embedding_keeps_the_burst_pending_with_one_line(
        memory: MemoryStream, openai_server: FakeOpenAIServer, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    openai_server.fail_next("500", path="embeddings")
    items = [Observation(f"note {i}", STREAM, source=Source(message_id=f"n{i}")) for i in range(5)]
    stored = await memory.observe_many(items)
    assert {m.status for m in stored} == {"pending"}
    assert "1 failed model call" in one_clear_line(caplog)
    stats = await memory.stats(STREAM)
    assert (stats.pending.count, stats.usage["embedding"].failures) == (5, 1)
    assert await memory.complete_pending() == 5


@pytest.mark.parametrize("kind", ["429", "500"])
async def test_a_fault_the_client_retries_away_is_counted_not_logged(
        tmp_path: Path, openai_server: FakeOpenAIServer, script: Script, caplog: pytest.LogCaptureFixture,
        kind: str) -> None:
    caplog.set_level(logging.DEBUG)
    persona = PersonaConfig(name="Isabella", summary="Runs Hobbs Cafe.", database=tmp_path / "i.db",
                            models=ModelConfig(base_url=openai_server.base_url, max_retries=1, timeout=2))
    async with await MemoryStream.open(persona, clock=FakeClock(), environ={}) as memory:
        openai_server.fail_next(kind, path="chat")
        memory_id = await observe(memory)
        assert (await memory.get(memory_id)).status == "ready"
        quiet(caplog)  # the SDK's "Retrying request" is INFO
        stats = await memory.stats(STREAM)
        assert (stats.retries["rater"], stats.usage["rater"].failures) == (1, 0)


@pytest.mark.parametrize("replies", [["seven", "seven"], ["11", "7.5"], ["", "Ten"]])
async def test_a_rating_that_is_not_an_integer_is_retried_once_then_falls_back_to_5(
        memory: MemoryStream, openai_server: FakeOpenAIServer, caplog: pytest.LogCaptureFixture,
        replies: list[str]) -> None:
    caplog.set_level(logging.DEBUG)
    openai_server.script(*replies)
    stored = await memory.get(await observe(memory))
    assert (stored.status, stored.importance, stored.importance_source) == ("ready", 5, "fallback")
    assert "fallback" in one_clear_line(caplog)
    stats = await memory.stats(STREAM)
    assert (stats.counts.fallback, stats.faults["rating_fallback"], stats.usage["rater"].calls) == (1, 1, 2)


async def test_a_rating_right_on_the_second_try_is_kept(memory: MemoryStream, openai_server: FakeOpenAIServer,
                                                        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    openai_server.script("seven", " 7 ")
    stored = await memory.get(await observe(memory))
    assert (stored.importance, stored.importance_source) == (7, "rater")
    quiet(caplog)


@pytest.mark.parametrize("insights", ["Klaus is secretly rich", "Klaus is secretly rich (because of 42, 0)",
                                      "Klaus is secretly rich (because of nothing)"])
async def test_an_insight_without_valid_citations_is_dropped_and_the_total_still_resets(
        memory: MemoryStream, script: Script, caplog: pytest.LogCaptureFixture, insights: str) -> None:
    await observe(memory)
    script.insights = insights + "\nKlaus is planning the party (because of 1)"
    caplog.set_level(logging.DEBUG)
    result = await memory.reflect(STREAM)
    assert result is not None
    assert [text.startswith("Klaus is secretly rich") for text in result.dropped] == [True]
    assert [m.text for m in result.insights] == ["Klaus is planning the party"]
    assert "insight dropped" in one_clear_line(caplog)
    assert await memory.importance_total(STREAM) == 0
    assert (await memory.stats(STREAM)).faults["insight_dropped"] == 1


async def test_a_questions_reply_without_questions_skips_the_reflection_until_the_next_check(
        memory: MemoryStream, script: Script, caplog: pytest.LogCaptureFixture) -> None:
    await observe(memory)
    script.questions = "\n  \n"
    caplog.set_level(logging.DEBUG)
    scheduler = ReflectionScheduler(memory)
    result = await memory.reflect(STREAM)
    assert result is not None and result.skipped and not result.insights
    assert "skipped" in one_clear_line(caplog)
    stats = await memory.stats(STREAM)
    assert (stats.state.skipped_reflections, stats.state.importance_since_reflection) == (1, 7)
    script.questions = THREE
    await scheduler.reflect(STREAM)  # the next try reflects
    assert (await memory.stats(STREAM)).state.reflections == 1
    assert await memory.importance_total(STREAM) == 0


async def test_seven_questions_use_the_first_three_with_one_line(
        memory: MemoryStream, script: Script, caplog: pytest.LogCaptureFixture) -> None:
    await observe(memory)
    script.questions = "\n".join(f"Question {n}?" for n in range(1, 8))
    caplog.set_level(logging.DEBUG)
    result = await memory.reflect(STREAM)
    assert result is not None and result.questions == ["Question 1?", "Question 2?", "Question 3?"]
    assert "7 lines" in one_clear_line(caplog)
    stats = await memory.stats(STREAM)
    assert (stats.faults["questions_trimmed"], stats.state.reflections) == (1, 1)


@pytest.mark.parametrize("kind", ["500", "malformed", "empty_choices", "timeout"])
async def test_a_failed_scheduled_reflection_is_skipped_with_one_line_and_retried(
        memory: MemoryStream, openai_server: FakeOpenAIServer, caplog: pytest.LogCaptureFixture,
        kind: str) -> None:
    await observe(memory)
    scheduler = ReflectionScheduler(memory)
    caplog.set_level(logging.DEBUG)
    openai_server.fail_next(kind, path="chat")
    await scheduler.reflect(STREAM)  # no crash: the scheduler's job returns
    assert "will be tried again" in one_clear_line(caplog)
    stats = await memory.stats(STREAM)
    assert (stats.state.skipped_reflections, stats.state.reflections) == (1, 0)
    assert stats.usage["reflector"].failures == 1
    await scheduler.reflect(STREAM)
    assert scheduler.runs == [STREAM]
    assert await memory.importance_total(STREAM) == 0
