"""Tests of the fake OpenAI server, driven through the real `openai.AsyncOpenAI` client."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
import openai
import pytest
from openai.types.chat import ChatCompletionContentPartTextParam, ChatCompletionMessageParam

from memstream.testing import hash_embedding
from tests.fakes.openai_server import ChatRequest, FakeOpenAIServer

Client = openai.AsyncOpenAI
MakeClient = Callable[..., Client]
USER: list[ChatCompletionMessageParam] = [{"role": "user", "content": "hi there"}]


@pytest.fixture
async def server() -> AsyncIterator[FakeOpenAIServer]:
    async with FakeOpenAIServer(embed_dim=64) as srv:
        yield srv


@pytest.fixture
async def make_client(server: FakeOpenAIServer) -> AsyncIterator[MakeClient]:
    clients: list[openai.AsyncOpenAI] = []

    def make(**kwargs: Any) -> openai.AsyncOpenAI:
        options: dict[str, Any] = {"api_key": "test", "base_url": server.base_url, "max_retries": 0}
        options.update(kwargs)
        client = openai.AsyncOpenAI(**options)
        clients.append(client)
        return client

    yield make
    for client in clients:
        await client.close()


@pytest.fixture
def client(make_client: MakeClient) -> openai.AsyncOpenAI:
    return make_client()


async def chat(client: Client, content: str = "hi there", model: str = "gpt-test") -> str | None:
    completion = await client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": content}]
    )
    return completion.choices[0].message.content


def assert_close(got: list[float], want: list[float]) -> None:
    assert len(got) == len(want)
    assert max(abs(a - b) for a, b in zip(got, want, strict=True)) < 1e-6


# -- chat ------------------------------------------------------------------------------------------------


async def test_chat_completion_shape(server: FakeOpenAIServer, client: Client) -> None:
    completion = await client.chat.completions.create(
        model="gpt-test", messages=[{"role": "system", "content": "be brief"}, *USER]
    )
    assert completion.object == "chat.completion"
    assert completion.model == "gpt-test"
    assert completion.id.startswith("chatcmpl-")
    choice = completion.choices[0]
    assert (choice.message.role, choice.message.content, choice.finish_reason) == ("assistant", "OK", "stop")
    assert completion.usage is not None
    assert (completion.usage.prompt_tokens, completion.usage.completion_tokens) == (4, 1)
    assert completion.usage.total_tokens == 5
    [req] = server.chat_requests
    assert req.model == "gpt-test"
    assert req.prompt == "be brief\nhi there"
    assert req.messages[0] == {"role": "system", "content": "be brief"}
    assert req.body["model"] == "gpt-test"


async def test_script_is_fifo_then_falls_back(server: FakeOpenAIServer, client: Client) -> None:
    server.script("first", "second")
    server.on_chat(lambda req: f"echo:{req.prompt}")
    assert await chat(client) == "first"
    assert await chat(client) == "second"
    assert await chat(client, "third") == "echo:third"


async def test_on_chat_chooses_by_prompt(server: FakeOpenAIServer, client: Client) -> None:
    seen: list[ChatRequest] = []

    def responder(req: ChatRequest) -> str:
        seen.append(req)
        return "7" if "poignancy" in req.prompt else "hello"

    server.on_chat(responder)
    assert await chat(client, "Rate the poignancy of this memory") == "7"
    assert await chat(client, "Say something") == "hello"
    assert [r.prompt for r in seen] == ["Rate the poignancy of this memory", "Say something"]


async def test_default_replies(client: Client) -> None:
    assert await chat(client, "Rate it. Reply with a single integer from 1 to 10.") == "5"
    assert await chat(client, "anything else") == "OK"


async def test_content_parts_are_joined_into_prompt(server: FakeOpenAIServer, client: Client) -> None:
    parts: list[ChatCompletionContentPartTextParam] = [
        {"type": "text", "text": "part one"},
        {"type": "text", "text": "part two"},
    ]
    await client.chat.completions.create(model="m", messages=[{"role": "user", "content": parts}])
    assert server.chat_requests[0].prompt == "part one\npart two"


# -- embeddings ------------------------------------------------------------------------------------------


async def test_embeddings_default_base64(server: FakeOpenAIServer, client: Client) -> None:
    texts = ["the cat sat", "a dog barked", "the cat sat"]
    response = await client.embeddings.create(model="text-embedding-test", input=texts)
    assert server.requests[-1].body["encoding_format"] == "base64"
    assert response.model == "text-embedding-test"
    assert [d.index for d in response.data] == [0, 1, 2]
    for text, item in zip(texts, response.data, strict=True):
        assert_close(item.embedding, hash_embedding(text, 64))
    assert response.usage.prompt_tokens == response.usage.total_tokens == 9


async def test_embeddings_float(server: FakeOpenAIServer, client: Client) -> None:
    response = await client.embeddings.create(model="e", input="hello world", encoding_format="float")
    assert server.requests[-1].body["encoding_format"] == "float"
    [item] = response.data
    assert item.embedding == hash_embedding("hello world", 64)


async def test_embeddings_dimensions_override(client: Client) -> None:
    response = await client.embeddings.create(model="e", input=["x y"], dimensions=16)
    assert_close(response.data[0].embedding, hash_embedding("x y", 16))


async def test_embed_dim_from_constructor(make_client: MakeClient) -> None:
    async with FakeOpenAIServer(embed_dim=8) as small:
        client = make_client(base_url=small.base_url)
        response = await client.embeddings.create(model="e", input="abc")
    assert_close(response.data[0].embedding, hash_embedding("abc", 8))


async def test_batch_is_one_request(server: FakeOpenAIServer, client: Client) -> None:
    await client.embeddings.create(model="e", input=["a", "b", "c", "d"])
    await client.embeddings.create(model="e", input="single")
    assert server.embedding_requests == [["a", "b", "c", "d"], ["single"]]
    assert [r.path for r in server.requests] == ["/v1/embeddings", "/v1/embeddings"]


async def test_token_arrays_are_rejected(server: FakeOpenAIServer, client: Client) -> None:
    with pytest.raises(openai.BadRequestError):
        await client.embeddings.create(model="e", input=[[1, 2, 3]])
    assert server.embedding_requests == []
    assert len(server.requests) == 1


# -- models, recording, lifecycle ------------------------------------------------------------------------


async def test_models_list(client: Client) -> None:
    page = await client.models.list()
    assert [m.id for m in page.data] == ["gpt-fake", "text-embedding-fake"]


async def test_models_list_checks_the_key_and_can_be_missing(server: FakeOpenAIServer,
                                                              make_client: MakeClient) -> None:
    server.require_api_key = "right"
    with pytest.raises(openai.AuthenticationError):
        await make_client(api_key="wrong").models.list()
    assert [m.id for m in (await make_client(api_key="right").models.list()).data] == ["gpt-fake",
                                                                                     "text-embedding-fake"]
    server.models = None  # a server that lists no models
    with pytest.raises(openai.NotFoundError):
        await make_client(api_key="right").models.list()


async def test_reset_clears_records_script_and_faults(server: FakeOpenAIServer, client: Client) -> None:
    server.script("scripted")
    server.fail_next("500")
    with pytest.raises(openai.InternalServerError):
        await chat(client)
    await client.embeddings.create(model="e", input="x")
    assert len(server.requests) == 2
    server.reset()
    assert (server.requests, server.chat_requests, server.embedding_requests) == ([], [], [])
    assert server.pending_faults == 0
    assert await chat(client) == "OK"


async def test_explicit_start_stop() -> None:
    srv = FakeOpenAIServer(embed_dim=4)
    with pytest.raises(RuntimeError):
        _ = srv.base_url
    await srv.start()
    try:
        assert srv.base_url == f"http://127.0.0.1:{srv.port}/v1"
        assert srv.port > 0
        client = openai.AsyncOpenAI(api_key="k", base_url=srv.base_url, max_retries=0)
        try:
            assert await chat(client) == "OK"
        finally:
            await client.close()
    finally:
        await srv.stop()
    await srv.stop()  # idempotent


async def test_latency(server: FakeOpenAIServer, client: Client) -> None:
    server.latency = 0.3
    start = time.monotonic()
    await chat(client)
    assert time.monotonic() - start >= 0.3


# -- faults ----------------------------------------------------------------------------------------------

STATUS_FAULTS = [
    ("500", openai.InternalServerError, 500),
    ("429", openai.RateLimitError, 429),
    ("401", openai.AuthenticationError, 401),
]


@pytest.mark.parametrize(("kind", "exc", "status"), STATUS_FAULTS)
@pytest.mark.parametrize("call", ["chat", "embeddings"])
async def test_status_faults(
    server: FakeOpenAIServer,
    client: Client,
    kind: str,
    exc: type[openai.APIStatusError],
    status: int,
    call: str,
) -> None:
    server.fail_next(kind)
    request: Callable[[], Awaitable[object]] = (
        (lambda: chat(client)) if call == "chat" else (lambda: client.embeddings.create(model="e", input="x"))
    )
    with pytest.raises(exc) as info:
        await request()
    assert info.value.status_code == status
    assert isinstance(info.value.body, dict)
    assert set(info.value.body) >= {"message", "type", "code"}
    await request()  # the fault is consumed; the next call succeeds
    assert len(server.requests) == 2


async def test_429_carries_retry_after_headers(server: FakeOpenAIServer, client: Client) -> None:
    server.fail_next("429")
    with pytest.raises(openai.RateLimitError) as info:
        await chat(client)
    assert info.value.response.headers["retry-after"] == "0"
    assert "retry-after-ms" in info.value.response.headers


async def test_429_is_retried_by_sdk(server: FakeOpenAIServer, make_client: MakeClient) -> None:
    server.fail_next("429")
    client = make_client(max_retries=1)
    start = time.monotonic()
    assert await chat(client) == "OK"
    assert time.monotonic() - start < 0.3  # retry-after-ms made the SDK retry at once
    assert len(server.requests) == 2
    assert len(server.chat_requests) == 1


async def test_500_retries_exhausted(server: FakeOpenAIServer, make_client: MakeClient) -> None:
    server.fail_next("500", times=3)
    client = make_client(max_retries=1)
    with pytest.raises(openai.InternalServerError):
        await chat(client)
    assert len(server.requests) == 2
    assert server.pending_faults == 1


async def test_timeout(server: FakeOpenAIServer, make_client: MakeClient) -> None:
    server.timeout_sleep = 2.0
    server.fail_next("timeout")
    client = make_client(timeout=0.5)
    start = time.monotonic()
    with pytest.raises(openai.APITimeoutError):
        await chat(client)
    assert time.monotonic() - start < 1.5
    assert len(server.requests) == 1
    assert await chat(client) == "OK"


async def test_timeout_answers_if_client_waits(server: FakeOpenAIServer, make_client: MakeClient) -> None:
    server.timeout_sleep = 0.2
    server.fail_next("timeout")
    assert await chat(make_client(timeout=5.0)) == "OK"


async def test_server_stops_promptly_with_sleeping_handler(make_client: MakeClient) -> None:
    srv = FakeOpenAIServer()
    await srv.start()
    srv.timeout_sleep = 30.0
    srv.fail_next("timeout")
    client = make_client(base_url=srv.base_url, timeout=0.3)
    with pytest.raises(openai.APITimeoutError):
        await chat(client)
    start = time.monotonic()
    await srv.stop()
    assert time.monotonic() - start < 2.0


async def test_disconnect(server: FakeOpenAIServer, client: Client) -> None:
    server.fail_next("disconnect")
    with pytest.raises(openai.APIConnectionError) as info:
        await chat(client)
    assert not isinstance(info.value, openai.APITimeoutError)
    assert len(server.requests) == 1
    assert await chat(client) == "OK"


async def test_malformed_json_raises_decode_error(server: FakeOpenAIServer, client: Client) -> None:
    # The SDK does not wrap a broken JSON body: json.JSONDecodeError escapes as-is.
    server.fail_next("malformed")
    with pytest.raises(json.JSONDecodeError):
        await chat(client)
    server.fail_next("malformed")
    with pytest.raises(json.JSONDecodeError):
        await client.embeddings.create(model="e", input="x")


async def test_empty_choices(server: FakeOpenAIServer, client: Client) -> None:
    # Chat: the SDK accepts the completion, with no choices to read.
    server.fail_next("empty_choices")
    completion = await client.chat.completions.create(model="gpt-test", messages=USER)
    assert completion.choices == []
    assert completion.model == "gpt-test"
    # Embeddings (default base64 decoding): the SDK raises ValueError on empty data.
    server.fail_next("empty_choices")
    with pytest.raises(ValueError, match="No embedding data"):
        await client.embeddings.create(model="e", input="x")


async def test_faults_consumed_in_order_and_by_path(server: FakeOpenAIServer, client: Client) -> None:
    server.fail_next("500", path="embeddings")
    server.fail_next("401", times=2)
    with pytest.raises(openai.AuthenticationError):  # chat skips the embeddings-only fault
        await chat(client)
    with pytest.raises(openai.InternalServerError):  # first matching fault for embeddings
        await client.embeddings.create(model="e", input="x")
    with pytest.raises(openai.AuthenticationError):
        await client.embeddings.create(model="e", input="x")
    assert server.pending_faults == 0
    await client.embeddings.create(model="e", input="x")
    assert len(server.requests) == 4
    assert server.embedding_requests == [["x"]]


async def test_fault_path_forms(server: FakeOpenAIServer, client: Client) -> None:
    server.fail_next("500", path="/v1/chat/completions")
    server.fail_next("500", path="chat/completions")
    for _ in range(2):
        with pytest.raises(openai.InternalServerError):
            await chat(client)
    assert await chat(client) == "OK"


async def test_lies_absurd_usage_and_wrong_sized_vectors(server: FakeOpenAIServer, client: Client) -> None:
    server.fail_next("absurd_usage", times=2)
    completion = await client.chat.completions.create(model="gpt-test", messages=USER)
    assert completion.choices[0].message.content == "OK"
    assert completion.usage is not None and completion.usage.prompt_tokens == 2**64 - 1
    response = await client.embeddings.create(model="e", input="x", encoding_format="float")
    assert response.usage.prompt_tokens == 2**64 - 1 and len(response.data[0].embedding) == 64
    server.fail_next("wrong_dim", times=2)
    response = await client.embeddings.create(model="e", input=["x", "y"], encoding_format="float")
    assert {len(d.embedding) for d in response.data} - {64}
    with pytest.raises(json.JSONDecodeError):  # a chat reply has no vectors: garbage instead
        await chat(client)


async def test_random_faults_at_a_seeded_rate_cover_the_five_kinds(server: FakeOpenAIServer, make_client: MakeClient,
                                                                   ) -> None:
    client = make_client()

    async def outcomes(seed: int, rate: float = 0.2) -> list[str]:
        server.fail_at_random(rate, seed=seed)
        seen = []
        for _ in range(200):
            try:
                response = await client.embeddings.create(model="e", input="x", encoding_format="float")
            except openai.APIStatusError as exc:
                seen.append(str(exc.status_code))
                continue
            except json.JSONDecodeError:
                seen.append("garbage")
                continue
            usage, dim = response.usage.prompt_tokens, len(response.data[0].embedding)
            seen.append("usage" if usage > 10**6 else "dim" if dim != 64 else "ok")
        return seen

    first = await outcomes(7)
    assert await outcomes(7) == first  # seeded
    faults = [o for o in first if o != "ok"]
    assert 20 <= len(faults) <= 60  # about 20% of 200
    assert set(faults) == {"500", "429", "garbage", "usage", "dim"}
    assert await outcomes(7, 0.0) == ["ok"] * 200
    with pytest.raises(ValueError, match="between 0 and 1"):
        server.fail_at_random(1.5)


def test_unknown_fault_kind() -> None:
    with pytest.raises(ValueError, match="unknown fault"):
        FakeOpenAIServer().fail_next("418")


async def test_require_api_key(server: FakeOpenAIServer, make_client: MakeClient) -> None:
    server.require_api_key = "sk-right"
    with pytest.raises(openai.AuthenticationError) as info:
        await chat(make_client(api_key="sk-wrong"))
    assert info.value.code == "invalid_api_key"
    with pytest.raises(openai.AuthenticationError):
        await make_client(api_key="sk-wrong").embeddings.create(model="e", input="x")
    assert await chat(make_client(api_key="sk-right")) == "OK"
    assert len(server.requests) == 3
    assert len(server.chat_requests) == 1
    assert server.requests[-1].headers["Authorization"] == "Bearer sk-right"


# -- streaming -------------------------------------------------------------------------------------


async def _events(server: FakeOpenAIServer, body: dict[str, Any]) -> tuple[int, str, list[str]]:
    """POST a chat request as raw HTTP: the status, the content type and the SSE `data:` payloads."""
    async with aiohttp.ClientSession() as session, session.post(f"{server.base_url}/chat/completions",
                                                                json=body) as response:
        text = await response.text()
    events = [block.removeprefix("data: ") for block in text.split("\n\n") if block]
    return response.status, response.content_type, events


async def test_a_streamed_reply_is_server_sent_events_as_openai_sends_them(server: FakeOpenAIServer) -> None:
    server.script("Come to my party!")
    body = {"model": "m", "messages": USER, "stream": True, "stream_options": {"include_usage": True}}
    status, kind, events = await _events(server, body)
    assert (status, kind, events[-1]) == (200, "text/event-stream", "[DONE]")
    chunks = [json.loads(e) for e in events[:-1]]
    assert {c["object"] for c in chunks} == {"chat.completion.chunk"} and len({c["id"] for c in chunks}) == 1
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    texts = [c["choices"][0]["delta"].get("content") for c in chunks[1:-2]]
    assert texts == ["Come", " to", " my", " party!"]
    assert chunks[-2]["choices"][0]["finish_reason"] == "stop"
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 4


async def test_the_real_client_reads_the_stream(server: FakeOpenAIServer, client: Client) -> None:
    server.script("one two three")
    stream = await client.chat.completions.create(model="m", messages=USER, stream=True)
    texts = [chunk.choices[0].delta.content async for chunk in stream if chunk.choices]
    assert "".join(t or "" for t in texts) == "one two three"


async def test_stream_modes_refuse_and_whole_and_a_stream_cut_off(server: FakeOpenAIServer) -> None:
    body = {"model": "m", "messages": USER, "stream": True}
    server.stream_mode = "refuse"
    status, _, _ = await _events(server, body)
    assert status == 400
    server.stream_mode = "whole"
    server.script("all at once")
    status, kind, [whole] = await _events(server, body)
    assert (status, kind) == (200, "application/json")
    assert json.loads(whole)["choices"][0]["message"]["content"] == "all at once"
    server.stream_mode = "sse"
    server.stream_cut_after = 1
    server.script("one two three")
    with pytest.raises(aiohttp.ClientPayloadError):
        await _events(server, body)
