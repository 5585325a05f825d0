"""Isolation, as a property: over random messages in several servers and DMs, no retrieval, reflection, agent
prompt or inspection output of one stream ever shows a memory of another."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Iterable

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memstream import MemoryNotFound, MemoryStream, Observation, RoleModel, Source, Store, StreamConfig
from memstream.testing import FakeClock, FakeEmbedder, ScriptedChat
from tests.memstream.helpers import AGENT, INSIGHTS, QUESTIONS

STREAMS = ("guild:1", "guild:2", "dm:7", "dm:8")
WORDS = ("party", "cake", "Klaus", "secret", "recipe", "tonight", "paint", "cafe", "Maria", "friday")
TOKEN = re.compile(r"tok\d+x(\d)")
_STATEMENT = re.compile(r"^1\. (.*)$", re.MULTILINE)

Message = tuple[int, str]


def messages() -> st.SearchStrategy[list[Message]]:
    """Each message: its stream's index and text from words every stream shares, plus a unique token."""
    one = st.tuples(st.integers(0, len(STREAMS) - 1), st.lists(st.sampled_from(WORDS), min_size=1, max_size=5))
    return st.lists(one, min_size=1, max_size=24).map(
        lambda items: [(s, " ".join(words) + f" tok{n}x{s}") for n, (s, words) in enumerate(items)])


def foreign(own: int, texts: Iterable[str]) -> list[str]:
    """Tokens of other streams found in these texts."""
    return [m.group(0) for text in texts for m in TOKEN.finditer(text) if int(m.group(1)) != own]


def _chat() -> ScriptedChat:
    def insight(prompt: str, model: str) -> str:
        found = _STATEMENT.search(prompt)  # an insight that repeats its first statement, tokens and all
        return f"It seems that {found.group(1) if found else 'nothing'} (because of 1)"

    chat = ScriptedChat()
    chat.on("<memory>", "6")
    chat.on(QUESTIONS, "What about the party?\nWhat is secret?\nWho paints?")
    chat.on(INSIGHTS, insight)
    chat.on(AGENT, "Sounds good.")
    return chat


async def _check(items: list[Message]) -> None:
    chat = _chat()
    store = await Store.open(":memory:")
    memory = MemoryStream(store, FakeEmbedder(), rater=RoleModel(chat, "r"), reflector=RoleModel(chat, "r"),
                          agent=RoleModel(chat, "a"), name="Isabella", summary="Runs a cafe.", clock=FakeClock(),
                          config=StreamConfig(reflection_threshold=10**6, k=3), auto_reflect=False)
    try:
        await memory.observe_many([Observation(text, STREAMS[s], source=Source(author_id=str(s), message_id=f"m{n}"))
                                   for n, (s, text) in enumerate(items)])
        ids = {s: [m.id for m in await memory.recent(key, 100)] for s, key in enumerate(STREAMS)}
        for s, key in enumerate(STREAMS):  # reflect everywhere first: insights are memories too
            seen = len(chat.calls)
            result = await memory.reflect(key)
            assert result is not None
            shown = [p for _, p in chat.calls[seen:]] + [m.text for m in result.statements + result.insights]
            assert foreign(s, shown) == [], key
            for insight in result.insights:
                tree = await memory.why(insight.id, stream=key)
                assert foreign(s, [child.memory.text for child in tree.evidence]) == []
        for s, key in enumerate(STREAMS):
            seen = len(chat.calls)
            query = "party secret recipe tonight cake"
            shown = [m.memory.text for m in await memory.explain(query, stream=key, k=50)]
            shown += [m.memory.text for m in await memory.retrieve(query, stream=key)]
            reply = await memory.respond(query, stream=key, speaker="Maria")
            shown += [reply.prompt, *(m.memory.text for m in reply.memories)]
            shown += [p for _, p in chat.calls[seen:]]
            shown += [m.text for m in await memory.recent(key, 100)] + [str(await memory.stats(key))]
            assert foreign(s, shown) == [], key
            trace = await memory.explain_reply(trace_id=reply.trace_id, stream=STREAMS[(s + 1) % len(STREAMS)])
            assert trace is None
            for other, other_ids in ids.items():
                for memory_id in other_ids if other != s else []:
                    with pytest.raises(MemoryNotFound):
                        await memory.why(memory_id, stream=key)
                    with pytest.raises(MemoryNotFound):
                        await memory.forget([memory_id], stream=key)
    finally:
        await memory.close()


@settings(max_examples=25, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(messages())
def test_no_output_of_one_stream_ever_shows_a_memory_of_another(items: list[Message]) -> None:
    asyncio.run(_check(items))
