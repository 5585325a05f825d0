"""Integration over HTTP: the real openai SDK against the fake OpenAI server, faults mapped to our errors."""

from __future__ import annotations

import re
import socket
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import numpy as np
import openai
import pytest

from memstream.config import ModelConfig, PersonaConfig, StreamConfig
from memstream.errors import CompletionError, ConfigError, EmbeddingError, ProviderError
from memstream.models.embed import OpenAIEmbedder
from memstream.models.llm import Completion, OpenAIChat, make_client
from memstream.records import Source
from memstream.stream import MemoryStream, Observation
from memstream.testing import FakeClock, hash_embedding
from tests.fakes.openai_server import ChatRequest, FakeOpenAIServer, pieces
from tests.memstream.helpers import AGENT, INSIGHTS, QUESTIONS, RATER, memory_text

MakeClient = Callable[..., openai.AsyncOpenAI]


@pytest.fixture
async def make(openai_server: FakeOpenAIServer) -> AsyncIterator[MakeClient]:
    clients: list[openai.AsyncOpenAI] = []

    def build(*, base_url: str | None = None, timeout: float = 10.0) -> openai.AsyncOpenAI:
        client = make_client(base_url=base_url or openai_server.base_url, api_key="test", timeout=timeout,
                             max_retries=0)
        clients.append(client)
        return client

    yield build
    for client in clients:
        await client.close()


def free_port() -> int:
    """A port nothing listens on (bound and released at once)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


# -- chat ------------------------------------------------------------------------------------------


async def test_complete_returns_the_text_and_token_counts(openai_server: FakeOpenAIServer, make: MakeClient) -> None:
    openai_server.script("I'm going to Isabella's party")
    prompt = "You are Maria.\nWhat do you do next?"
    completion = await OpenAIChat(make()).complete(prompt, model="gpt-fake")
    assert completion.text == "I'm going to Isabella's party"
    assert completion.prompt_tokens == len(prompt.split())
    assert completion.completion_tokens == len(completion.text.split())
    [request] = openai_server.chat_requests
    assert request.model == "gpt-fake"
    assert request.messages == [{"role": "user", "content": prompt}]
    assert "temperature" not in request.body


async def test_temperature_is_sent_when_set(openai_server: FakeOpenAIServer, make: MakeClient) -> None:
    await OpenAIChat(make(), temperature=0.2).complete("hi", model="gpt-fake")
    assert openai_server.chat_requests[0].body["temperature"] == 0.2


# -- embeddings ------------------------------------------------------------------------------------


async def test_embeddings_are_batched_and_match_hash_embedding(openai_server: FakeOpenAIServer,
                                                              make: MakeClient) -> None:
    texts = [f"Maria saw bird number {n}" for n in range(10)] + [""]
    embedder = OpenAIEmbedder(make(), model="text-embedding-fake")
    vectors = await embedder.embed_batch(texts)
    assert openai_server.embedding_requests == [[*texts[:-1], " "]]  # one request; empty text sent as a space
    assert vectors.dtype == np.float32 and vectors.shape == (11, 64)
    for text, row in zip(texts, vectors, strict=True):
        assert np.allclose(row, hash_embedding(text or " ", 64), atol=1e-6)
    assert embedder.take_tokens() == sum(len(t.split()) for t in texts[:-1])
    assert embedder.take_tokens() == 0
    assert openai_server.requests[0].body["model"] == "text-embedding-fake"


async def test_embedding_batches_and_dimensions(openai_server: FakeOpenAIServer, make: MakeClient) -> None:
    embedder = OpenAIEmbedder(make(), model="e", dimensions=16, batch_size=4)
    vectors = await embedder.embed_batch([f"text {n}" for n in range(10)])
    assert [len(batch) for batch in openai_server.embedding_requests] == [4, 4, 2]
    assert vectors.shape == (10, 16)
    assert all(r.body["dimensions"] == 16 for r in openai_server.requests)


# -- faults ----------------------------------------------------------------------------------------

CHAT_FAULTS = {
    "500": ("failed with HTTP 500", True),
    "timeout": ("did not answer in time", True),
    "malformed": ("sent a malformed answer", True),
    "empty_choices": ("returned no choices", True),
    "401": ("rejected the API key (HTTP 401)", False),
    "429": ("rate limiting us (HTTP 429)", True),
}
EMBEDDING_FAULTS = {
    "500": "failed with HTTP 500",
    "timeout": "did not answer in time",
    "malformed": "sent a malformed answer",
    "empty_choices": "sent a malformed answer",
    "401": "rejected the API key (HTTP 401)",
}


def assert_one_clear_line(error: ProviderError, base_url: str, model: str, expected: str, *,
                          from_sdk: bool = True) -> None:
    message = str(error)
    assert "\n" not in message
    assert expected in message
    assert base_url.rstrip("/") in message and f"(model {model})" in message
    if from_sdk:
        assert isinstance(error.__cause__, openai.OpenAIError | ValueError)  # raised from the SDK's exception


@pytest.mark.parametrize("kind", sorted(CHAT_FAULTS))
async def test_chat_faults_become_completion_errors(openai_server: FakeOpenAIServer, make: MakeClient,
                                                    kind: str) -> None:
    openai_server.timeout_sleep = 2.0
    openai_server.fail_next(kind)
    chat = OpenAIChat(make(timeout=0.3))
    with pytest.raises(CompletionError) as info:
        await chat.complete("hello", model="gpt-fake")
    expected, retryable = CHAT_FAULTS[kind]
    assert_one_clear_line(info.value, openai_server.base_url, "gpt-fake", expected, from_sdk=kind != "empty_choices")
    assert info.value.retryable is retryable
    assert len(openai_server.requests) == 1
    assert (await chat.complete("hello again", model="gpt-fake")).text == "OK"  # the next call is fine


@pytest.mark.parametrize("kind", sorted(EMBEDDING_FAULTS))
async def test_embedding_faults_become_embedding_errors(openai_server: FakeOpenAIServer, make: MakeClient,
                                                        kind: str) -> None:
    openai_server.timeout_sleep = 2.0
    openai_server.fail_next(kind)
    embedder = OpenAIEmbedder(make(timeout=0.3), model="text-embedding-fake")
    with pytest.raises(EmbeddingError) as info:
        await embedder.embed_batch(["hello", "world"])
    assert "\n" not in str(info.value) and EMBEDDING_FAULTS[kind] in str(info.value)
    assert (await embedder.embed_batch(["hello"])).shape == (1, 64)


async def test_connection_refused(make: MakeClient) -> None:
    base_url = f"http://127.0.0.1:{free_port()}/v1"
    client = make(base_url=base_url)
    with pytest.raises(CompletionError) as info:
        await OpenAIChat(client).complete("hello", model="gpt-fake")
    assert_one_clear_line(info.value, base_url, "gpt-fake", "cannot reach")
    assert info.value.retryable
    with pytest.raises(EmbeddingError, match=f"cannot reach the model server at {re.escape(base_url)}"):
        await OpenAIEmbedder(client, model="e").embed_batch(["hello"])


# -- streamed chat ---------------------------------------------------------------------------------


async def _streamed(chat: OpenAIChat, prompt: str = "hi") -> list[str | Completion]:
    return [item async for item in chat.stream(prompt, model="gpt-fake")]


async def test_stream_yields_the_pieces_then_the_completion(openai_server: FakeOpenAIServer, make: MakeClient) -> None:
    openai_server.script("I'm going to Isabella's party tonight")
    *texts, done = await _streamed(OpenAIChat(make()), "You are Maria.\nWhat do you do next?")
    assert texts == pieces("I'm going to Isabella's party tonight")
    assert done == Completion("I'm going to Isabella's party tonight", prompt_tokens=8, completion_tokens=6)
    [request] = openai_server.chat_requests
    assert request.body["stream"] is True and request.body["stream_options"] == {"include_usage": True}


async def test_a_stream_cut_off_raises_after_what_came(openai_server: FakeOpenAIServer, make: MakeClient) -> None:
    openai_server.script("one two three four five")
    openai_server.stream_cut_after = 2
    got: list[str | Completion] = []
    with pytest.raises(CompletionError, match="broke off its reply") as caught:
        async for item in OpenAIChat(make()).stream("hi", model="gpt-fake"):
            got.append(item)
    assert got == ["one", " two"] and caught.value.retryable


@pytest.mark.parametrize("mode", ["refuse", "whole"])
async def test_a_server_that_does_not_stream_is_asked_for_whole_replies(
        openai_server: FakeOpenAIServer, make: MakeClient, mode: str) -> None:
    openai_server.stream_mode = mode
    openai_server.script("first reply", "second reply")
    chat = OpenAIChat(make())
    assert await _streamed(chat) == ["first reply", Completion("first reply", 1, 2)]
    assert await _streamed(chat) == ["second reply", Completion("second reply", 1, 2)]
    assert [r.body.get("stream") for r in openai_server.chat_requests] == (
        [True, None, None] if mode == "refuse" else [True, None])


async def test_other_failures_of_a_streamed_request_are_errors_not_fallbacks(
        openai_server: FakeOpenAIServer, make: MakeClient) -> None:
    openai_server.fail_next("500", path="chat")
    chat = OpenAIChat(make())
    with pytest.raises(CompletionError, match="HTTP 500"):
        await _streamed(chat)
    assert chat.streaming  # a server error says nothing of streaming


async def test_a_bad_request_that_is_not_about_streaming_does_not_turn_it_off(
        openai_server: FakeOpenAIServer, make: MakeClient) -> None:
    openai_server.fail_next("400", times=2, path="chat")  # streamed and unstreamed: the request itself is wrong
    chat = OpenAIChat(make())
    with pytest.raises(CompletionError, match="HTTP 400"):
        await _streamed(chat)
    assert chat.streaming
    openai_server.script("fine")
    assert await _streamed(chat) == ["fine", Completion("fine", 1, 1)]
    assert [r.body.get("stream") for r in openai_server.chat_requests[-1:]] == [True]


async def test_streaming_off_asks_for_whole_replies(openai_server: FakeOpenAIServer, make: MakeClient) -> None:
    openai_server.script("whole")
    assert await _streamed(OpenAIChat(make(), streaming=False)) == ["whole", Completion("whole", 1, 1)]
    assert "stream" not in openai_server.chat_requests[0].body


# -- a whole memory stream over HTTP ---------------------------------------------------------------

PARTY = "Isabella invited Maria to her Valentine's Day party tonight"


def models_answer(request: ChatRequest) -> str:
    prompt = request.prompt
    if RATER in prompt:
        return "8" if "party" in memory_text(prompt) else "2"
    if QUESTIONS in prompt:
        return "What is Isabella planning?\nWho will be at the party?\nWhat does Maria do?"
    if INSIGHTS in prompt:
        return "Maria is invited to a Valentine's Day party (because of 1)"
    assert AGENT in prompt
    return "I'm going to Isabella's party. Want to come?"


def persona(tmp_path: Path, server: FakeOpenAIServer, **models: object) -> PersonaConfig:
    return PersonaConfig(
        name="Maria", summary="A student.", database=tmp_path / "maria.db",
        models=ModelConfig(base_url=server.base_url, rater="rater-fake", reflector="reflector-fake",
                           agent="agent-fake", embedding="embedding-fake", **models),  # type: ignore[arg-type]
        memory=StreamConfig(reflection_threshold=20),
    )


async def test_a_memory_stream_observes_retrieves_reflects_and_responds_over_http(
    openai_server: FakeOpenAIServer, tmp_path: Path
) -> None:
    openai_server.on_chat(models_answer)
    clock = FakeClock()
    memory = await MemoryStream.open(persona(tmp_path, openai_server), clock=clock, environ={})
    async with memory:
        found = await memory.observe_many([
            Observation("Maria had toast for breakfast", source=Source(message_id="1")),
            Observation(PARTY, source=Source(message_id="2")),
            Observation("Maria walked to class", source=Source(message_id="3")),
        ])
        assert [m.importance for m in found] == [2, 8, 2]
        assert len(openai_server.embedding_requests) == 1  # the burst is embedded in one request
        assert await memory.importance_total() == 12

        [best, *_] = await memory.retrieve("Valentine's Day party tonight")
        assert best.memory.text == PARTY

        clock.advance(hours=1)
        await memory.observe("Maria bought a red dress for the party")  # 8 more: 20 reaches the threshold
        reflections = [m for m in await memory.recent(limit=10) if m.kind == "reflection"]
        assert [m.text for m in reflections] == ["Maria is invited to a Valentine's Day party"]
        assert await memory.importance_total() == 0

        reply = await memory.respond("What are you doing tonight?", speaker="Klaus")
        assert reply.text == "I'm going to Isabella's party. Want to come?"

        models = {}
        for request in openai_server.chat_requests:
            kind = next(k for k, needle in (("rater", RATER), ("questions", QUESTIONS), ("insights", INSIGHTS),
                                            ("agent", AGENT)) if needle in request.prompt)
            models.setdefault(kind, set()).add(request.model)
        assert models == {"rater": {"rater-fake"}, "questions": {"reflector-fake"},
                          "insights": {"reflector-fake"}, "agent": {"agent-fake"}}
        assert {r.body["model"] for r in openai_server.requests if r.path == "/v1/embeddings"} == {"embedding-fake"}
        usage = (await memory.stats()).usage
        assert usage["agent"].prompt_tokens == len(openai_server.chat_requests[-2].prompt.split())
        assert usage["embedding"].prompt_tokens > 0


async def test_a_server_outage_leaves_pending_memories_completed_later(
    openai_server: FakeOpenAIServer, tmp_path: Path
) -> None:
    openai_server.on_chat(models_answer)
    memory = await MemoryStream.open(persona(tmp_path, openai_server, max_retries=0), environ={})
    async with memory:
        openai_server.fail_next("500", path="chat")
        with pytest.raises(CompletionError, match=r"HTTP 500.*kept and will be completed later"):
            await memory.observe(PARTY)
        assert (await memory.stats()).pending.count == 1
        assert await memory.complete_pending() == 1
        [done] = await memory.recent()
        assert (done.status, done.importance) == ("ready", 8)


async def test_without_a_key_or_a_base_url_opening_fails_naming_the_variable(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="OPENAI_API_KEY"):
        ModelConfig().api_key({})
    config = PersonaConfig(name="Maria", summary="A student.", database=tmp_path / "maria.db")
    with pytest.raises(ConfigError, match="OPENAI_API_KEY is not set"):
        await MemoryStream.open(config, environ={})
    assert not (tmp_path / "maria.db").exists()
