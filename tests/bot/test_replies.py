"""The persona's word: a reply is sent before its own memory is rated, and kept (pending) when that fails."""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest

from tests.bot.conftest import World, until
from tests.fakes.discord_server import SEND_MESSAGES


def _rates_the_reply(reply: str) -> Any:
    def rating_of_reply(path: str, body: Any) -> bool:
        return "chat" in path and reply[:30] in json.dumps(body) and "<memory>" in json.dumps(body)
    return rating_of_reply


async def test_the_answer_is_sent_while_its_own_rating_hangs_then_fails(world: World) -> None:
    await world.say(world.town, world.general, world.klaus, "Isabella is hosting a Valentine's Day party tonight")
    world.openai.hold = _rates_the_reply(world.models.reply)  # the rating of the reply never answers
    asked = await world.fake.send_message(world.general, world.maria, "what are you doing tonight?",
                                          mentions=[world.fake.bot_user])
    reply = await world.fake.wait_for_sent(lambda m: m.channel_id == world.general)
    assert reply.content == world.models.reply and reply.reference_message_id == int(str(asked["id"]))
    stream = world.stream(world.town)

    async def own_memory() -> Any:
        found = await world.memory.store.find_message(stream, str(reply.id))
        return None if found is None else await world.memory.get(found)

    # Before any rating of it came back, the reply is in memory (pending), with the Discord id it went out as,
    # and its trace explains the sent message.
    own = await until(own_memory, "the reply's memory to carry its message id")
    assert own.status == "pending" and own.text.endswith(world.models.reply)
    assert world.openai.held, "the reply's rating was asked for after the reply was sent"
    explained = await world.memory.explain_reply(message_id=str(reply.id))
    assert explained is not None and explained.trace.query == "what are you doing tonight?"

    # The held rating times out (the client's 5 s): the memory stays pending; the retry completes it.
    world.openai.hold = None

    async def completed() -> bool:
        await world.memory.complete_pending()
        return (await world.memory.get(own.id)).status == "ready"

    assert await until(completed, "the pending reply to be completed", timeout=20.0)


async def test_an_undeliverable_answer_is_not_remembered_as_said(world: World) -> None:
    await world.say(world.town, world.general, world.klaus, "Isabella is hosting a Valentine's Day party tonight")
    for role in (world.town.bot_role, world.town.everyone_role):  # Discord refuses the reply: 403
        role.permissions &= ~SEND_MESSAGES
    before = len(await world.memory.recent(world.stream(world.town), 50))
    asked = await world.fake.send_message(world.general, world.maria, "what are you doing tonight?",
                                          mentions=[world.fake.bot_user])
    await until(lambda: _agent_called(world), "the agent call")
    await world.stored(world.town, asked)
    chat = world.bot.get_cog("ChatCog")
    assert chat is not None

    async def answered() -> bool:
        return not chat.tasks  # type: ignore[attr-defined]

    await until(answered, "the answer task to end")
    texts = [m.text for m in await world.memory.recent(world.stream(world.town), 50)]
    assert len(texts) == before + 1  # the question, not the reply nobody saw
    assert not any(t.startswith("Isabella Rodriguez:") for t in texts)
    assert await world.memory.store.conn.execute_fetchall("SELECT id FROM reply_traces") == []


async def _agent_called(world: World) -> bool:
    return bool(world.agent_prompts())


async def test_deleting_a_message_deletes_the_replies_that_quoted_it(world: World) -> None:
    """bob deletes "my favourite colour is ultraviolet-7": the persona's reply quoting it (to maria) goes from
    memory, /recall finds nothing of it, and a new insight cannot cite it."""
    stream = world.stream(world.town)
    said = await world.say(world.town, world.general, world.klaus, "my favourite colour is ultraviolet-7")
    world.models.reply = "Klaus told me his favourite colour is ultraviolet-7!"
    await world.fake.send_message(world.general, world.maria, "what is Klaus's favourite colour?",
                                  mentions=[world.fake.bot_user])
    reply = await world.fake.wait_for_sent(lambda m: m.channel_id == world.general)

    async def reply_remembered() -> bool:
        found = await world.memory.store.find_message(stream, str(reply.id))
        return found is not None and (await world.memory.get(found)).status == "ready"

    await until(reply_remembered, "the reply to be remembered")
    await world.fake.delete_message(world.general, int(str(said["id"])))

    async def forgotten() -> bool:
        return all("ultraviolet" not in m.text for m in await world.memory.recent(stream, 50))

    await until(forgotten, "the message and the reply quoting it to be forgotten")
    record = await world.fake.slash(world.town.id, world.general, world.maria, "recall", {"query": "ultraviolet"})
    [shown] = await record.wait_done()
    assert "ultraviolet" not in shown.content
    result = await world.memory.reflect(stream)
    assert result is None or all("ultraviolet" not in i.text for i in result.insights)
    assert await world.memory.explain_reply(message_id=str(reply.id)) is None


async def test_a_mention_answered_on_a_full_disk_is_answered_and_the_failure_to_remember_it_is_said(
        world: World, caplog: pytest.LogCaptureFixture) -> None:
    """A full disk when the reply is written: the reply is streamed out before it is stored (what was sent is
    what is remembered), so the mention is answered; that its memory could not be written is one warning, and
    nothing of it is half-stored (no reply memory without its trace)."""
    await world.say(world.town, world.general, world.klaus, "the party is on Friday")
    await world.drained()
    conn = world.memory.store.conn  # type: ignore[attr-defined]
    async with conn.execute("PRAGMA page_count") as cursor:
        pages = (await cursor.fetchone())[0]
    world.models.reply = "Friday! " + "and so much more to say " * 300  # its memory needs new pages: refused
    caplog.set_level(logging.WARNING, logger="bot")
    async with conn.execute(f"PRAGMA max_page_count={pages}"):
        pass
    try:
        await world.fake.send_message(world.general, world.maria, "when is the party?", mentions=[world.fake.bot_user])
        told = await world.fake.wait_for_sent(lambda m: m.channel_id == world.general)

        async def said() -> bool:
            return any("could not record the reply" in r.getMessage() for r in caplog.records)

        await until(said, "the warning that the reply could not be recorded")
    finally:
        async with conn.execute("PRAGMA max_page_count=1073741823"):
            pass
    assert told.content.startswith("Friday!")
    async with conn.execute("SELECT COUNT(*) FROM memories WHERE text LIKE '%so much more to say%'") as cursor:
        assert (await cursor.fetchone())[0] == 0
