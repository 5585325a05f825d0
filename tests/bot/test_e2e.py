"""The real PersonaBot against the fake Discord and the fake OpenAI server, over real sockets."""

from __future__ import annotations

import asyncio
import logging

import pytest

from memstream import ExplainedReply
from memstream.store import retry_delay
from tests.bot.conftest import INSIGHTS, QUESTIONS, World, until


async def test_two_servers_are_two_streams_that_never_cross(world: World) -> None:
    await world.say(world.town, world.general, world.klaus, "The secret recipe uses cardamom")
    await world.say(world.other, world.lounge, world.maria, "I bought new paint brushes")
    town = [m.text for m in await world.memory.recent(world.stream(world.town), 50)]
    other = [m.text for m in await world.memory.recent(world.stream(world.other), 50)]
    assert town == ["Klaus in #general: The secret recipe uses cardamom"]
    assert other == ["Maria in #lounge: I bought new paint brushes"]

    await world.fake.send_message(world.lounge, world.maria, "what is the secret recipe?",
                                  mentions=[world.fake.bot_user])
    await world.fake.wait_for_sent(lambda m: m.channel_id == world.lounge)
    assert "cardamom" not in world.agent_prompts()[-1]
    record = await world.fake.slash(world.other.id, world.lounge, world.maria, "recall", {"query": "secret recipe"})
    [shown] = await record.wait_done()
    assert "cardamom" not in shown.content and "paint brushes" in shown.content


async def test_mention_is_answered_from_the_party_invitation(world: World) -> None:
    invitation = "Isabella is hosting a Valentine's Day party at Hobbs Cafe tonight at 5 pm, are you coming?"
    invite = await world.say(world.town, world.general, world.klaus, invitation)
    for day in range(3):
        world.clock.advance(hours=8)
        await world.say(world.town, world.general, world.maria, f"I had toast and jam for breakfast on day {day}")
    world.clock.advance(hours=2)
    asked = await world.fake.send_message(world.general, world.maria, "what are you doing tonight?",
                                          mentions=[world.fake.bot_user])
    reply = await world.fake.wait_for_sent(lambda m: m.channel_id == world.general)
    assert reply.content == world.models.reply
    assert reply.reference_message_id == int(str(asked["id"]))
    assert any(t.channel_id == world.general for t in world.fake.typing_events)
    prompt = world.agent_prompts()[-1]
    listing = prompt[prompt.index("<memories>"):prompt.index("</memories>")]
    first = listing.splitlines()[0]
    assert "Valentine's Day party" in first, listing
    assert "what are you doing tonight" not in listing  # the question itself takes no memory slot
    assert "Maria says to you" in prompt and "toast and jam" in prompt  # the channel's last messages
    invite_id = await world.stored(world.town, invite)
    # stored with the reply once it is out (streamed: after its last edit), as the trace a whole reply has
    explained = await until(lambda: world.memory.explain_reply(message_id=str(reply.id)), "the reply's trace")
    assert isinstance(explained, ExplainedReply) and explained.trace.items[0].memory_id == invite_id


async def test_crossing_the_threshold_runs_one_reflection_and_why_shows_its_evidence(world: World) -> None:
    stream = world.stream(world.town)
    await world.say(world.town, world.general, world.klaus, "Valentine's Day party at the cafe on Friday")
    await world.say(world.town, world.general, world.maria, "I will bring flowers to the party")
    assert world.bot.reflections.runs == []
    await world.say(world.town, world.general, world.klaus, "The party starts at 5 pm")  # 21 >= 20

    await until(lambda: _value(world.bot.reflections.runs), "the scheduled reflection")
    await asyncio.sleep(0.2)  # nothing else may follow
    assert world.bot.reflections.runs == [stream]
    assert sum(QUESTIONS in r.prompt for r in world.openai.chat_requests) == 1
    assert sum(INSIGHTS in r.prompt for r in world.openai.chat_requests) == 1
    assert await world.memory.importance_total(stream) == 0

    [insight] = [m for m in await world.memory.recent(stream, 20) if m.kind == "reflection"]
    record = await world.fake.slash(world.town.id, world.general, world.maria, "why", {"memory_id": insight.id})
    [shown] = await record.wait_done()
    assert shown.ephemeral
    assert "Isabella is hosting a Valentine's Day party" in shown.content
    evidence = await world.memory.store.evidence(insight.id)
    for memory_id in evidence:
        memory = await world.memory.get(memory_id)
        assert f"#{memory_id}" in shown.content
        assert f"/channels/{world.town.id}/{world.general}/{memory.source.message_id}" in shown.content


async def test_context_menu_explains_a_reply(world: World) -> None:
    await world.say(world.town, world.general, world.klaus, "Valentine's Day party tonight at the cafe")
    await world.fake.send_message(world.general, world.maria, "any plans?", mentions=[world.fake.bot_user])
    reply = await world.fake.wait_for_sent(lambda m: m.channel_id == world.general)
    await until(lambda: world.memory.explain_reply(message_id=str(reply.id)), "the reply's trace")
    record = await world.fake.context_menu(world.town.id, world.general, world.klaus, "Why did you say that?",
                                           target_message_id=reply.id)
    [shown] = await record.wait_done()
    assert shown.ephemeral and "any plans?" in shown.content
    assert "Valentine's Day party tonight" in shown.content and "rec " in shown.content and "rel " in shown.content

    not_a_reply = await world.fake.send_message(world.general, world.klaus, "just chatting")
    record = await world.fake.context_menu(world.town.id, world.general, world.klaus, "Why did you say that?",
                                           target_message_id=int(str(not_a_reply["id"])))
    [shown] = await record.wait_done()
    assert "not one of my replies" in shown.content


async def test_recall_touches_no_last_access_time(world: World) -> None:
    for text in ("the oven is broken", "the party needs balloons", "Klaus reads about gentrification"):
        await world.say(world.town, world.general, world.klaus, text)
    stream = world.stream(world.town)
    before = {m.id: m.last_accessed_at for m in await world.memory.recent(stream, 50)}
    world.clock.advance(hours=5)
    record = await world.fake.slash(world.town.id, world.general, world.maria, "recall", {"query": "party balloons"})
    [shown] = await record.wait_done()
    assert "balloons" in shown.content and shown.ephemeral
    after = {m.id: m.last_accessed_at for m in await world.memory.recent(stream, 50)}
    assert after == before


async def test_deleted_and_edited_messages_are_followed(world: World) -> None:
    stream = world.stream(world.town)
    gone = await world.say(world.town, world.general, world.klaus, "my phone number is 555-0199")
    bulk = [await world.say(world.town, world.general, world.klaus, f"secret {i}") for i in range(2)]
    kept = await world.say(world.town, world.general, world.maria, "I like tea")
    await world.fake.delete_message(world.general, int(str(gone["id"])))
    await until(lambda: _none(world.memory.store.find_message(stream, str(gone["id"]))), "the deletion")
    await world.fake.bulk_delete(world.general, [int(str(m["id"])) for m in bulk])
    await until(lambda: _none(world.memory.store.find_message(stream, str(bulk[1]["id"]))), "the bulk deletion")
    await world.fake.edit_message(world.general, int(str(kept["id"])), "I like coffee now")

    async def edited() -> bool:
        return any("coffee" in m.text for m in await world.memory.recent(stream, 10))

    await until(edited, "the edit")
    texts = [m.text for m in await world.memory.recent(stream, 50)]
    assert texts == ["Maria in #general: I like coffee now"]


async def test_an_edit_while_the_embedding_server_fails_is_kept_and_completed_later(
        world: World, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    stream = world.stream(world.town)
    said = await world.say(world.town, world.general, world.klaus, "call me at 555-0199")
    memory_id = await world.stored(world.town, said)
    world.openai.fail_next("500", path="embeddings")
    await world.fake.edit_message(world.general, int(str(said["id"])), "call me (number removed)")

    async def edited() -> bool:
        return "removed" in (await world.memory.get(memory_id)).text

    await until(edited, "the edit")
    assert "555-0199" not in " ".join(m.text for m in await world.memory.store.recent(stream, 10,
                                                                                       include_pending=True))
    await until(lambda: _value([r.getMessage() for r in caplog.records if
                                "is stored, its old text gone" in r.getMessage()]), "the log of the edit")
    assert not [r for r in caplog.records if "could not" in r.getMessage()]
    assert (await world.memory.get(memory_id)).status == "pending"
    world.clock.advance(seconds=retry_delay(1))
    await world.memory.complete_pending(due_only=True)  # as the bot's scheduler does (or did just now)
    done = await world.memory.get(memory_id)
    assert (done.status, done.text) == ("ready", "Klaus in #general: call me (number removed)")


async def test_leaving_a_server_purges_its_stream(world: World) -> None:
    await world.say(world.other, world.lounge, world.maria, "remember me")
    await world.say(world.town, world.general, world.maria, "and me here")
    await world.fake.remove_bot_from_guild(world.other.id)

    async def purged() -> bool:
        return not await world.memory.recent(world.stream(world.other), 5)

    await until(purged, "the purge")
    assert len(await world.memory.recent(world.stream(world.town), 5)) == 1


async def test_reflect_is_refused_to_non_managers_even_if_the_server_allows_the_command(world: World) -> None:
    world.fake.enforce_command_permissions = False  # the server's admins opened /reflect to everyone
    await world.say(world.town, world.general, world.klaus, "Valentine's Day party plans")
    record = await world.fake.slash(world.town.id, world.general, world.maria, "reflect")
    [shown] = await record.wait_done()
    assert "Only server managers" in shown.content and shown.ephemeral
    assert not any(QUESTIONS in r.prompt for r in world.openai.chat_requests)

    record = await world.fake.slash(world.town.id, world.general, world.manager, "reflect")
    [shown] = await record.wait_done()
    assert "Isabella is hosting" in shown.content
    assert sum(QUESTIONS in r.prompt for r in world.openai.chat_requests) == 1


async def test_reflect_cites_the_server_s_own_numbers_never_global_ids(world: World) -> None:
    for n in range(3):  # another server's memories take the first global ids
        await world.say(world.other, world.lounge, world.maria, f"elsewhere {n}")
    await world.say(world.town, world.general, world.klaus, "Valentine's Day party plans")
    [mine] = await world.memory.recent(world.stream(world.town), 5)
    assert mine.number == 1 and mine.id > 1
    record = await world.fake.slash(world.town.id, world.general, world.manager, "reflect")
    [shown] = await record.wait_done()
    assert "(because of #1)" in shown.content and f"#{mine.id}" not in shown.content


async def test_a_long_reply_is_split_and_everyone_is_never_pinged(world: World) -> None:
    world.models.reply = "@everyone come to the party! " + ("Bring snacks. " * 220)
    assert len(world.models.reply) > 3000
    since = len(world.fake.sent_messages)
    await world.fake.send_message(world.general, world.maria, "tell me everything", mentions=[world.fake.bot_user])
    await world.fake.wait_for_sent(lambda m: m.channel_id == world.general, since=since)
    second = await world.fake.wait_for_sent(lambda m: m.channel_id == world.general and "@everyone" not in m.content,
                                            since=since)
    parts = [m for m in world.fake.sent_messages[since:] if m.channel_id == world.general]
    assert len(parts) == 2 and all(len(p.content) <= 2000 for p in parts) and second in parts
    assert "".join(p.content for p in parts).replace(" ", "") == world.models.reply.strip().replace(" ", "")
    assert not any(p.pinged_everyone or p.pinged_roles for p in parts)


async def test_forget_removes_a_users_memories_and_the_insights_built_on_them(world: World) -> None:
    stream = world.stream(world.town)
    await world.say(world.town, world.general, world.klaus, "Valentine's Day party on Friday")
    await world.say(world.town, world.general, world.maria, "I'll bring a party cake")
    result = await world.memory.reflect(stream)
    assert result is not None and result.insights
    record = await world.fake.slash(world.town.id, world.general, world.maria, "forget")
    [shown] = await record.wait_done()
    assert "Forgotten: 1 memory(ies)" in shown.content and "and 1 insight(s)" in shown.content
    texts = [m.text for m in await world.memory.recent(stream, 50)]
    assert texts == ["Klaus in #general: Valentine's Day party on Friday"]  # the insight cited Maria's message


async def test_memory_stats_and_memories_pages(world: World) -> None:
    for i in range(12):
        await world.say(world.town, world.general, world.klaus, f"note number {i}")
    record = await world.fake.slash(world.town.id, world.general, world.maria, "memories")
    [page] = await record.wait_done()
    assert "note number 11" in page.content and "note number 1 " not in page.content and "page:2" in page.content
    record = await world.fake.slash(world.town.id, world.general, world.maria, "memories", {"page": 2})
    [page2] = await record.wait_done()
    assert "note number 0" in page2.content and "note number 11" not in page2.content
    record = await world.fake.slash(world.town.id, world.general, world.maria, "memory-stats")
    [stats] = await record.wait_done()
    assert "Observations 12" in stats.content and "rater: 12 call(s)" in stats.content


async def _value(items: list[str]) -> bool:
    return bool(items)


async def _none(result: object) -> bool:
    return await result is None  # type: ignore[misc]


async def test_a_reply_is_stored_with_the_message_it_answers(world: World) -> None:
    """Discord's message.reference becomes the observation's reply_to: retrieval reads the reply with it."""
    asked = await world.say(world.town, world.general, world.klaus, "Who brings the cake on Friday?")
    answer = await world.say(world.town, world.general, world.maria, "I do!",
                             reference_message_id=int(str(asked["id"])))
    plain = await world.say(world.town, world.general, world.maria, "see you there")
    replies = {m.text: m.source.reply_to for m in await world.memory.recent(world.stream(world.town), 10)}
    assert replies["Maria in #general: I do!"] == str(asked["id"]) != str(answer["id"])
    assert replies["Maria in #general: see you there"] is None and plain["id"]
