"""Streamed replies in the core, over HTTP against the fake OpenAI server: the text arrives in pieces before
its end, the stored reply and its trace are those of the whole reply, a stream that breaks keeps what came,
and a server that cannot stream (or a persona that says not to) gets whole replies."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import pytest

from memstream.errors import CompletionError
from memstream.records import Source
from memstream.stream import MemoryStream, Observation
from memstream.testing import FakeClock, ScriptedChat
from tests.fakes.openai_server import ChatRequest, FakeOpenAIServer, pieces
from tests.memstream.helpers import AGENT
from tests.memstream.models.test_llm import PARTY, models_answer, persona

REPLY = "I'm going to Isabella's Valentine's Day party tonight at Hobbs Cafe. Want to come along?"


def _answer(request: ChatRequest) -> str:
    return REPLY if AGENT in request.prompt else models_answer(request)


async def _memory(tmp_path: Path, server: FakeOpenAIServer, name: str, **models: object) -> MemoryStream:
    folder = tmp_path / name
    folder.mkdir()
    memory = await MemoryStream.open(persona(folder, server, **models), clock=FakeClock(), environ={})
    await memory.observe_many([Observation("Maria had toast for breakfast", source=Source(message_id="1")),
                               Observation(PARTY, source=Source(message_id="2"))])
    return memory


@pytest.fixture
def server(openai_server: FakeOpenAIServer) -> FakeOpenAIServer:
    openai_server.on_chat(_answer)
    return openai_server


async def test_pieces_arrive_before_the_end_and_the_reply_is_stored_as_a_whole_one_is(
        tmp_path: Path, server: FakeOpenAIServer) -> None:
    whole = await _memory(tmp_path, server, "whole")
    streamed = await _memory(tmp_path, server, "streamed")
    try:
        expected = await whole.respond("What are you doing tonight?", speaker="Klaus")
        server.stream_delay = 0.1
        draft = await streamed.start_reply("What are you doing tonight?", speaker="Klaus")
        arrivals = []
        async for piece in draft.deltas():
            arrivals.append((time.monotonic(), piece))
        reply = await draft.finish()
        await streamed.reply_sent(reply, [])
    finally:
        await whole.close()
        await streamed.close()
    assert [p for _, p in arrivals] == pieces(REPLY)
    assert arrivals[-1][0] - arrivals[0][0] > 1.0  # the first piece long before the last
    assert (reply.text, reply.prompt, reply.memories, reply.cut) == (expected.text, expected.prompt,
                                                                     expected.memories, False)
    async with await MemoryStream.open(persona(tmp_path / "whole", server), environ={}) as a, \
            await MemoryStream.open(persona(tmp_path / "streamed", server), environ={}) as b:
        traces = [await m.explain_reply(trace_id=r.trace_id) for m, r in ((a, expected), (b, reply))]
        assert traces[0] is not None and traces[1] is not None
        assert traces[0] == traces[1]  # the same trace, item for item, with the same memories
        own = [await m.get(r.memory.id) for m, r in ((a, expected), (b, reply)) if r.memory is not None]
        assert [dataclasses.replace(m, id=0) for m in own] == [dataclasses.replace(own[0], id=0)] * 2
        assert own[1].text == f"Maria: {REPLY}" and own[1].status == "ready"
        usage = (await b.stats()).usage["agent"]
        assert (usage.calls, usage.failures, usage.completion_tokens) == (1, 0, len(REPLY.split()))
    agent = [r for r in server.chat_requests if AGENT in r.prompt]
    assert [r.body.get("stream") for r in agent] == [None, True]  # respond asks whole, start_reply streams


async def test_a_stream_that_breaks_keeps_what_came_as_a_cut_reply(tmp_path: Path, server: FakeOpenAIServer) -> None:
    memory = await _memory(tmp_path, server, "cut")
    server.stream_cut_after = 5
    try:
        draft = await memory.start_reply("What are you doing tonight?", speaker="Klaus")
        got = [piece async for piece in draft.deltas()]
        assert "".join(got) == draft.text == "".join(pieces(REPLY)[:5])
        assert isinstance(draft.cut, CompletionError) and "broke off" in str(draft.cut)
        reply = await draft.finish()
        assert reply.cut and reply.text == draft.text
        assert reply.memory is not None and reply.memory.text == f"Maria: {draft.text}"
        assert await memory.explain_reply(trace_id=reply.trace_id) is not None
        usage = (await memory.stats()).usage["agent"]
        assert (usage.calls, usage.failures) == (1, 1)
    finally:
        await memory.close()


async def test_a_stream_that_breaks_before_any_word_fails_the_turn_and_stores_nothing(
        tmp_path: Path, server: FakeOpenAIServer) -> None:
    memory = await _memory(tmp_path, server, "nothing")
    server.stream_cut_after = 0
    try:
        draft = await memory.start_reply("What are you doing tonight?", speaker="Klaus", observe_message=False)
        with pytest.raises(CompletionError, match="broke off"):
            async for _ in draft.deltas():
                pass
        assert [m.text for m in await memory.recent(limit=10) if m.text.startswith("Maria:")] == []
    finally:
        await memory.close()


async def test_what_was_shown_is_what_is_remembered(tmp_path: Path, server: FakeOpenAIServer) -> None:
    memory = await _memory(tmp_path, server, "shown")
    try:
        draft = await memory.start_reply("What are you doing tonight?", speaker="Klaus")
        async for _ in draft.deltas():
            if len(draft.text) > 20:
                break  # the reader stopped here (a send failed, Ctrl-C)
        shown = draft.text
        reply = await draft.finish(shown)
        assert reply.cut and reply.text == shown.strip() and len(shown) < len(REPLY)
        assert reply.memory is not None and reply.memory.text == f"Maria: {shown.strip()}"
        assert await draft.finish() is reply  # stored once
    finally:
        await memory.close()


@pytest.mark.parametrize("mode", ["refuse", "whole"])
async def test_a_server_that_cannot_stream_gives_one_piece(tmp_path: Path, server: FakeOpenAIServer,
                                                           mode: str) -> None:
    server.stream_mode = mode
    memory = await _memory(tmp_path, server, mode)
    try:
        for _ in range(2):
            draft = await memory.start_reply("What are you doing tonight?", speaker="Klaus")
            assert [piece async for piece in draft.deltas()] == [REPLY]
            assert (await draft.finish()).text == REPLY
    finally:
        await memory.close()
    agent = [r.body.get("stream") for r in server.chat_requests if AGENT in r.prompt]
    assert agent == ([True, None, None] if mode == "refuse" else [True, None])  # tried once only


async def test_a_persona_can_turn_streaming_off(tmp_path: Path, server: FakeOpenAIServer) -> None:
    memory = await _memory(tmp_path, server, "off", stream_replies=False)
    try:
        draft = await memory.start_reply("What are you doing tonight?", speaker="Klaus")
        assert [piece async for piece in draft.deltas()] == [REPLY]
    finally:
        await memory.close()
    assert all(r.body.get("stream") is None for r in server.chat_requests)


async def test_the_scripted_fake_streams_too(memory: MemoryStream, chat: ScriptedChat) -> None:
    chat.on(AGENT, "Come to the party at five")
    draft = await memory.start_reply("any plans?", speaker="Klaus")
    assert [piece async for piece in draft.deltas()] == ["Come", " to", " the", " party", " at", " five"]
    assert (await draft.finish()).text == "Come to the party at five"
    chat.cut_after = 2
    draft = await memory.start_reply("any plans?", speaker="Klaus")
    assert [piece async for piece in draft.deltas()] == ["Come", " to"]
    reply = await draft.finish()
    assert reply.cut and reply.text == "Come to" and isinstance(draft.cut, CompletionError)
    whole = await memory.respond("any plans?", speaker="Klaus")  # respond asks for the whole reply
    assert whole.text == "Come to the party at five" and not whole.cut
