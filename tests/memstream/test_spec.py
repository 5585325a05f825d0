"""The spec's own test (its Requirements) and the seed's story, end to end with the public fakes."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from memstream.records import TraceItem
from memstream.stream import MemoryStream
from memstream.testing import FakeClock, FakeEmbedder, ScriptedChat
from tests.conftest import MakeMemory
from tests.memstream.helpers import (
    AGENT,
    INSIGHTS,
    QUESTIONS,
    RATER,
    CountingRetriever,
    cosine_vector,
    e0,
    rate_by,
    tagged,
)

PARTY = "Isabella is planning a Valentine's Day party at Hobbs Cafe"
TEETH = "Maria brushed her teeth"
BED = "Maria made her bed"
QUERY = "Who is throwing a party?"
THREE_QUESTIONS = ["What is Isabella planning?", "How does Maria feel about Klaus?", "What does Maria do each day?"]


async def test_old_important_relevant_memory_beats_recent_trivial_one_and_reflection_stops(
    make_memory: MakeMemory, chat: ScriptedChat, clock: FakeClock
) -> None:
    # Fake embedder: cosines to the query are fixed exactly (0.9 for the party, 0.2 / 0.1 for the trivia).
    embedder = FakeEmbedder(dim=3, fixed={QUERY: e0(), PARTY: cosine_vector(0.9),
                                          TEETH: cosine_vector(0.2), BED: cosine_vector(0.1, axis=2)})
    counting = CountingRetriever()
    memory = make_memory(embedder=embedder, retriever=counting)
    counting.inner = memory.retriever
    # Stub importance scores, through the rater.
    fillers = [f"Maria watered plant number {n}" for n in range(16)]
    scores = {PARTY: 8, TEETH: 1, BED: 1, **dict.fromkeys(fillers, 9)}
    chat.on(RATER, rate_by(scores))
    chat.on(QUESTIONS, "\n".join(THREE_QUESTIONS))
    chat.on(INSIGHTS, "Isabella is hosting a party that Maria may attend (because of 1, 2)")

    start = clock.now()
    await memory.observe(PARTY, at=start - timedelta(days=2))
    await memory.observe(TEETH, at=start - timedelta(minutes=10))
    await memory.observe(BED, at=start - timedelta(minutes=5))

    ranked = await memory.retrieve(QUERY, k=3)
    assert ranked[0].memory.text == PARTY
    assert {item.memory.text for item in ranked} == {PARTY, TEETH, BED}
    party, teeth = ranked[0], next(item for item in ranked if item.memory.text == TEETH)
    assert party.memory.created_at < teeth.memory.created_at
    assert party.recency < teeth.recency
    assert party.importance == 1.0 and party.relevance == 1.0

    # 10 so far; 15 fillers of 9 bring the total to 145, below the default threshold of 150.
    assert memory.config.reflection_threshold == 150
    for text in fillers[:15]:
        clock.advance(minutes=1)
        await memory.observe(text)
    assert await memory.importance_total() == 145
    assert chat.calls_with(QUESTIONS) == [] and counting.calls == []

    clock.advance(minutes=1)
    await memory.observe(fillers[15])  # 154: crosses the threshold

    assert len(chat.calls_with(QUESTIONS)) == 1
    assert counting.calls == [(question, "default") for question in THREE_QUESTIONS]
    assert len(chat.calls_with(INSIGHTS)) == 1
    assert await memory.importance_total() == 0
    [insight] = [m for m in await memory.recent(limit=50) if m.kind == "reflection"]
    assert insight.text == "Isabella is hosting a party that Maria may attend"


INVITATION = "Isabella invited Maria to her Valentine's Day party at Hobbs Cafe on February 14 at 5 pm"
BREAKFAST = "Maria had toast for breakfast"
EVENING_CHAT = "Maria chatted with Tom about their evening plans"
WALK = "Maria took a walk in the park"
QUESTION = "What are you doing tonight?"
ANSWER = "I'm going to Isabella's party at 5. Want to come?"


async def test_seed_story_invitation_reaches_the_agent_prompt_first(
    make_memory: MakeMemory, chat: ScriptedChat
) -> None:
    # Cosine alone would rank the evening chat, then breakfast, above the invitation (the seed's point).
    embedder = FakeEmbedder(dim=3, fixed={
        QUESTION: e0(), f"Klaus: {QUESTION}": cosine_vector(0.95, axis=2), EVENING_CHAT: cosine_vector(0.9),
        BREAKFAST: cosine_vector(0.6), INVITATION: cosine_vector(0.5, axis=2), WALK: cosine_vector(0.1),
    })
    memory: MemoryStream = make_memory(embedder=embedder)
    chat.on(RATER, rate_by({INVITATION: 7, BREAKFAST: 1, EVENING_CHAT: 2, WALK: 2}, default=1))
    chat.on(AGENT, ANSWER)
    day = datetime(2023, 2, 14, tzinfo=UTC)
    await memory.observe(EVENING_CHAT, at=day - timedelta(days=7, hours=5))
    invitation = await memory.observe(INVITATION, at=day - timedelta(hours=10))
    breakfast = await memory.observe(BREAKFAST, at=day + timedelta(hours=8))
    await memory.observe(WALK, at=day + timedelta(hours=12))
    assert (invitation.importance, breakfast.importance) == (7, 1)
    assert invitation.created_at < breakfast.created_at

    reply = await memory.respond(QUESTION, speaker="Klaus", at=day + timedelta(hours=16))

    assert reply.text == ANSWER
    assert reply.memories[0].memory.id == invitation.id
    by_text = {item.memory.text: item for item in reply.memories}
    assert by_text[BREAKFAST].cosine > by_text[INVITATION].cosine
    assert by_text[EVENING_CHAT].cosine > by_text[INVITATION].cosine
    [prompt] = chat.calls_with(AGENT)
    assert prompt == reply.prompt
    lines = tagged(prompt, "memories").strip().splitlines()
    assert INVITATION in lines[0]
    assert len(lines) == len(reply.memories)
    assert f"Klaus: {QUESTION}" not in tagged(prompt, "memories")  # the message itself is not a memory of it
    assert QUESTION in prompt  # but it is the situation
    # The persona's own reply is observed too, and the trace records what the reply was built from.
    assert reply.memory is not None and reply.memory.text == f"Maria: {ANSWER}"
    trace = await memory.store.trace(trace_id=reply.trace_id)
    assert trace is not None
    assert trace.items == tuple(TraceItem.of(item) for item in reply.memories)  # with their score parts
