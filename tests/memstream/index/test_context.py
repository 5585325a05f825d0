"""The `hybrid` profile's context over a real store (both backends): neighbours in a channel, the people a query
names, time words. What the running index ranks is the plain-Python reference's answer over what the store holds,
after messages arrive, are edited and are forgotten; the sources come from the store."""

from __future__ import annotations

import asyncio

from memstream import MemoryStream, Observation, Source, StreamConfig
from memstream.clock import to_timestamp
from memstream.index.cues import asks_when, holds_time, named
from memstream.index.hybrid import rank_hybrid_reference
from memstream.testing import FakeClock
from tests.conftest import MakeMemory

STREAM = "guild:1"
CONFIG = StreamConfig.for_profile("hybrid", neighbour_weight=0.4, name_weight=0.2, time_weight=0.2)
QUERIES = ["what did Bob say about the boat?", "when did <@7> sail?", "<@99> boat", "the of and", "Will it rain?",
           "what did Will plan yesterday?"]


def _said(text: str, who: str, author_id: str, channel: str, message: str,
          reply_to: str | None = None) -> Observation:
    return Observation(f"{who} in #{channel}: {text}", STREAM,
                       source=Source(author=who, author_id=author_id, channel=channel, channel_id=channel,
                                     message_id=message, reply_to=reply_to))


async def assert_reference(memory: MemoryStream, clock: FakeClock) -> None:
    """For each query, the stream's top 5 is the reference's over the stored memories and sources."""
    stored = await memory.recent(STREAM, limit=1000)
    rows = [(m.id, to_timestamp(m.created_at), to_timestamp(m.last_accessed_at), float(m.importance or 0),
             (await memory.store.load_vector(m.id)).tolist(), m.text) for m in stored]
    for query in QUERIES:
        vector = (await memory.retriever.models.embed([query], stream=STREAM))[0]
        expected = rank_hybrid_reference(rows, vector.tolist(), query, to_timestamp(clock.now()), CONFIG, 5,
                                         [m.source for m in stored])
        got = [item.memory.id for item in await memory.explain(query, stream=STREAM, k=5)]
        assert got == expected, query


async def test_neighbours_names_and_times_follow_arrivals_edits_and_deletions(make_memory: MakeMemory,
                                                                              clock: FakeClock) -> None:
    memory = make_memory(config=CONFIG)
    talk = [("the boat is ready", "Bob", "7", "general"), ("where is it moored?", "Will", "8", "general"),
            ("at the old pier, since yesterday", "Bob", "7", "general"), ("lunch?", "Ann", "9", "random"),
            ("I sail on Monday", "Bob", "7", "general")]
    for i, (text, who, author_id, channel) in enumerate(talk):
        await memory.observe_many([_said(text, who, author_id, channel, f"m{i}")])
        await memory.explain("boat", stream=STREAM)  # the stream loaded: what follows reaches it as events
        clock.advance(minutes=2)
    await assert_reference(memory, clock)  # rows whose sources reached the index after its load
    clock.advance(hours=5)  # a reply hours later: beside its parent all the same
    await memory.observe_many([_said("yes, that one", "Ann", "9", "general", "m9", reply_to="m0")])
    stored = await memory.store.sources(STREAM)
    assert Source(author="Ann", author_id="9", channel="general", channel_id="general", message_id="m9",
                  reply_to="m0") in stored.values()
    await assert_reference(memory, clock)
    await memory.forget_messages(["m1", "m0"])  # the pier is now beside nothing said before; the reply, alone
    clock.advance(minutes=1)
    await assert_reference(memory, clock)
    await memory.edit_message(STREAM, "m2", "Bob in #general: at the new pier")  # no time word left
    await memory.complete_pending()
    await assert_reference(memory, clock)
    memory.index.drop(STREAM)  # loaded again from the store, sources and all: the same answers
    await assert_reference(memory, clock)
    vectors = await memory.index.get(STREAM)
    assert vectors.context is not None
    for _ in range(500):  # what the load left for writes, completed after its first query, off the event loop
        if not vectors.context.incomplete():
            break
        await asyncio.sleep(0.01)
    assert not vectors.context.incomplete()
    memory.index.drop(STREAM)
    loaded = await memory.index.get(STREAM)  # loaded, not yet asked: the maps for writes still to build
    assert loaded.context is not None and loaded.context.incomplete()
    await memory.forget_messages(["m9"])  # a removal builds them first
    await memory.observe_many([_said("the boat left", "Will", "8", "general", "m10", reply_to="m3")])
    await assert_reference(memory, clock)


def test_the_cues() -> None:
    people = [("7", "Bob"), ("8", "Will"), ("9", "Ann Lee"), ("name:May", "May"), ("4", "")]
    assert named("what did bob say?", people) == {"7"}
    assert named("what will you do?", people) == set()  # a name that is a common word: only as written
    assert named("what did Will do?", people) == {"8"}
    assert named("and Ann?", people) == {"9"} and named("ann lee", people) == {"9"}
    assert named("<@4> and <@!7>, and <@99>", people) == {"4", "7"}  # 99 never wrote here
    assert named("the of and", people) == set()
    assert asks_when("When did Bob sail?") and asks_when("what year was it") and asks_when("how long ago?")
    assert not asks_when("where is the boat?")
    assert holds_time("see you on Monday") and holds_time("back in 2019") and holds_time("at 10:30")
    assert holds_time("since 3 May") and not holds_time("you may go") and not holds_time("the boat")
