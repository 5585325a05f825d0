"""A streamed reply on Discord: it appears within a second of the first words, grows by edits no faster than
Discord allows (the fake answers 429 past 5 edits per 5 s per channel), splits past 2,000 characters as a whole
reply does, pings nobody, and is remembered (with its trace and "Why this reply?") as it was sent; a stream
that breaks ends cleanly, and a server that cannot stream still answers."""

from __future__ import annotations

import asyncio
import itertools
import time

from bot.render import split_message
from bot.streaming import CURSOR, CUT_NOTE
from memstream import ExplainedReply
from tests.bot.conftest import AGENT, World, until
from tests.fakes.discord_server import SentMessage
from tests.fakes.openai_server import pieces

LONG = ("I'm hosting a Valentine's Day party at Hobbs Cafe tonight at five, and everyone in town is invited: "
        "Klaus, Maria, the Mayor, <@&123> and @everyone too. Bring a friend, bring a dish, bring a song.")


async def _mention(world: World, text: str = "what are you doing tonight?") -> tuple[float, SentMessage]:
    """Mention the persona; when the agent model was asked (time.monotonic) and the reply's first message."""
    await world.say(world.town, world.general, world.klaus, "Isabella is hosting a Valentine's Day party tonight")
    await world.fake.send_message(world.general, world.maria, text, mentions=[world.fake.bot_user])
    await until(_asked(world), "the agent model to be asked")
    asked = time.monotonic()
    first = await world.fake.wait_for_sent(lambda m: m.channel_id == world.general, timeout=10)
    return asked, first


def _asked(world: World):  # type: ignore[no-untyped-def]
    async def check() -> bool:
        return any(AGENT in r.prompt for r in world.openai.chat_requests)
    return check


async def _finished(world: World, text: str, count: int = 1) -> list[SentMessage]:
    """Wait until the reply's messages show `text` whole (no cursor) and its trace is stored."""
    async def done() -> list[SentMessage] | None:
        mine = [m for m in world.fake.sent_messages if m.channel_id == world.general]
        if len(mine) < count or any(m.content.endswith(CURSOR) for m in mine):
            return None
        if [m.content for m in mine] != split_message(text):
            return None
        found = await world.memory.explain_reply(message_id=str(mine[0].id))
        return mine if found is not None else None
    return await until(done, "the whole reply", timeout=30)  # type: ignore[return-value]


async def _reply_memories(world: World) -> list[str]:
    memories = await world.memory.recent(world.stream(world.town), limit=50)
    return [m.text for m in memories if m.text.startswith("Isabella Rodriguez:")]


async def test_a_reply_appears_at_once_and_grows_by_paced_edits(world: World) -> None:
    world.models.reply = LONG
    world.openai.stream_delay = 0.15  # about 5 s for the whole reply
    _, first = await _mention(world)
    # out with the first words, long before the end (how soon: python -m bench.mention --word-delay)
    opened = first.payload["content"]
    assert opened.endswith(CURSOR) and LONG.startswith(opened.removesuffix(CURSOR))
    assert len(opened) < len(LONG) // 2
    [reply] = await _finished(world, LONG)
    assert reply.content == LONG
    shown = [first.payload["content"], *(e["content"] for e in reply.edits)]
    assert len(reply.edits) >= 3  # it grew
    for before, after in itertools.pairwise(shown):  # each edit only adds to what was shown
        assert after.removesuffix(CURSOR).startswith(before.removesuffix(CURSOR))
    times = [reply.sent_at, *reply.edited_at]
    assert all(b - a >= 1.0 for a, b in itertools.pairwise(times[:-1]))  # growing: >= 1 s apart (not the end)
    assert all(sum(1 for t in times[1:] if start <= t < start + 5.0) <= 5 for start in times)
    assert world.fake.rate_limited == []
    for body in [first.payload, *reply.edits]:  # every edit as neutral as the first send: no pings
        mentions = body["allowed_mentions"]
        assert mentions["parse"] == [] and mentions["replied_user"] is True
    assert not reply.pinged_everyone and not reply.pinged_roles  # only the one it answers is notified
    assert reply.pinged_users == [world.maria.id]
    assert await _reply_memories(world) == [f"Isabella Rodriguez: {LONG}"]


async def test_the_streamed_reply_has_the_trace_and_why_of_a_whole_reply(world: World) -> None:
    world.models.reply = LONG
    world.openai.stream_delay = 0.15
    _, first = await _mention(world)
    # "Why this reply?" while it is still written: it waits, and answers once the reply is stored
    record = await world.fake.context_menu(world.town.id, world.general, world.klaus, "Why did you say that?",
                                           target_message_id=first.id)
    [shown] = await record.wait_done(timeout=30)
    assert first.content == LONG  # answered once the reply was whole
    assert shown.ephemeral and "what are you doing tonight?" in shown.content
    assert "Valentine's Day party tonight" in shown.content
    explained = await world.memory.explain_reply(message_id=str(first.id))
    assert isinstance(explained, ExplainedReply)
    assert [item.memory_id for item, _ in explained.items] != []
    own = explained.trace.reply_memory_id
    assert own is not None and (await world.memory.get(own)).text == f"Isabella Rodriguez: {LONG}"
    assert explained.trace.query_message_id is not None  # forgetting the question forgets the trace


async def test_a_long_reply_is_split_as_a_whole_one_is(world: World) -> None:
    long = " ".join(f"word{n}" for n in range(700))  # about 5,500 characters: three messages
    world.models.reply = long
    world.openai.stream_delay = 0.004
    await _mention(world)
    messages = await _finished(world, long, count=3)
    assert [m.content for m in messages] == split_message(long)
    assert world.fake.rate_limited == []
    assert messages[0].reference_message_id is not None and messages[1].reference_message_id is None
    explained = await world.memory.explain_reply(message_id=str(messages[2].id))
    assert explained is not None
    assert await _reply_memories(world) == [f"Isabella Rodriguez: {long}"]


async def test_a_stream_that_breaks_ends_cleanly_and_what_was_sent_is_remembered(world: World) -> None:
    world.models.reply = LONG
    world.openai.stream_delay = 0.1
    world.openai.stream_cut_after = 12
    said = "".join(pieces(LONG)[:12])
    await _mention(world)
    [reply] = await _finished(world, said + CUT_NOTE)
    assert reply.content == said + CUT_NOTE
    assert await _reply_memories(world) == [f"Isabella Rodriguez: {said}"]
    explained = await world.memory.explain_reply(message_id=str(reply.id))
    assert explained is not None and explained.trace.reply_memory_id is not None


async def test_a_stream_that_breaks_before_any_word_is_the_usual_apology(world: World) -> None:
    world.openai.stream_cut_after = 0
    await _mention(world)
    [sent] = [m for m in world.fake.sent_messages if m.channel_id == world.general]
    assert "can't think straight" in sent.content
    assert await _reply_memories(world) == []


async def test_a_server_that_cannot_stream_still_answers_whole(world: World) -> None:
    world.openai.stream_mode = "refuse"
    world.openai.stream_delay = 0.5  # ignored: nothing is streamed
    _, first = await _mention(world)
    [reply] = await _finished(world, world.models.reply)
    assert reply is first and reply.edits == []
    assert await _reply_memories(world) == [f"Isabella Rodriguez: {world.models.reply}"]


async def test_edits_keep_under_discords_limit_however_often_the_words_come(world: World) -> None:
    cog = world.bot.get_cog("ChatCog")
    assert cog is not None
    cog.edit_every = 0.05  # type: ignore[attr-defined]  # edit at every word, were it not for the pace
    world.models.reply = LONG
    world.openai.stream_delay = 0.1
    await _mention(world)
    [reply] = await _finished(world, LONG)
    times = [reply.sent_at, *reply.edited_at]
    assert len(reply.edits) >= 5
    assert all(sum(1 for t in times[1:] if start <= t < start + 5.0) <= 5 for start in times)
    assert world.fake.rate_limited == []


async def test_a_question_deleted_while_its_reply_is_written_takes_the_reply_with_it(world: World) -> None:
    world.models.reply = "Got it, your door code is ZQX-7731-PIN, I will keep it safe for you."
    world.openai.stream_delay = 0.3
    await world.say(world.town, world.general, world.klaus, "Isabella is hosting a Valentine's Day party tonight")
    asked = await world.fake.send_message(world.general, world.maria, "remember my door code ZQX-7731-PIN",
                                          mentions=[world.fake.bot_user])
    first = await world.fake.wait_for_sent(lambda m: m.channel_id == world.general, timeout=10)
    await world.fake.delete_message(world.general, int(str(asked["id"])))  # while the reply grows
    await until(_edited_whole(first, world.models.reply), "the reply's end", timeout=30)
    await world.drained()
    assert await world.memory.explain_reply(message_id=str(first.id)) is None
    assert not any("ZQX" in m.text for m in await world.memory.recent(world.stream(world.town), 50))


def _edited_whole(sent: SentMessage, text: str):  # type: ignore[no-untyped-def]
    async def check() -> bool:
        await asyncio.sleep(0.2)  # past the end, the reply would be stored now
        return sent.content == text
    return check
