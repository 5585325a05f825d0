"""Start-up errors, DMs, threads, bursts, rate limits and restarts of the real bot."""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path

import pytest

from bot.__main__ import run
from memstream import ConfigError, MemoryStream, Source, StreamConfig
from memstream.testing import FakeClock
from tests.bot.conftest import QUESTIONS, WAIT, World, one_server, running_bot, until
from tests.fakes.discord_server import FakeDiscord
from tests.fakes.openai_server import FakeOpenAIServer


def _persona_file(tmp_path: Path, base_url: str) -> Path:
    path = tmp_path / "isabella.toml"
    path.write_text(f'[persona]\nname = "Isabella"\nsummary = "Runs a cafe."\ndatabase = "{tmp_path / "i.db"}"\n'
                    f'[models]\nbase_url = "{base_url}"\n', encoding="utf-8")
    return path


async def test_no_token_is_a_one_line_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DISCORD_TOKEN", raising=False)
    args = argparse.Namespace(persona=str(_persona_file(tmp_path, "http://127.0.0.1:9/v1")), db=None)
    with pytest.raises(ConfigError, match="DISCORD_TOKEN is not set") as caught:
        await run(args)
    assert "\n" not in str(caught.value)


async def test_message_content_intent_not_enabled_is_a_one_line_error(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    async with FakeDiscord() as fake, FakeOpenAIServer() as openai:
        fake.add_guild("g").add_channel("c")
        fake.reject_intents = True
        fake.install(monkeypatch)
        monkeypatch.setenv("DISCORD_TOKEN", "token")
        args = argparse.Namespace(persona=str(_persona_file(tmp_path, openai.base_url)), db=None)
        with pytest.raises(ConfigError, match="MESSAGE CONTENT intent") as caught:
            await asyncio.wait_for(run(args), WAIT)
        assert "\n" not in str(caught.value)
        assert fake.identify_payloads and fake.gateway_close_codes[-1] == 4014


async def test_direct_messages_are_their_own_stream_and_answered(world: World) -> None:
    dm = world.fake.dm_channel(world.maria)
    message = await world.fake.send_message(dm, world.maria, "my cat is called Pixel")
    stream = f"dm:{world.maria.id}"

    async def stored() -> int | None:
        return await world.memory.store.find_message(stream, str(message["id"]))

    await until(stored, "the DM to be stored")
    reply = await world.fake.wait_for_sent(lambda m: m.channel_id == dm)
    assert reply.content == world.models.reply
    assert [m.text for m in await world.memory.recent(world.stream(world.town), 5)] == []


async def test_threads_follow_their_parent_channel(world: World) -> None:
    thread = world.town.add_thread(world.general, "party planning")
    message = await world.fake.send_message(thread, world.klaus, "we need more chairs")
    await world.stored(world.town, message)
    [memory] = await world.memory.recent(world.stream(world.town), 5)
    assert memory.text == "Klaus in #party planning: we need more chairs"
    assert memory.source.channel_id == str(thread)


async def test_a_burst_is_batched(world: World) -> None:
    before = len(world.openai.embedding_requests)
    sent = await asyncio.gather(*(world.fake.send_message(world.general, world.klaus, f"burst message {i}")
                                  for i in range(64)))
    for message in sent:
        await world.stored(world.town, message)
    calls = [c for c in world.openai.embedding_requests[before:] if any("burst message" in t for t in c)]
    assert sum(len(c) for c in calls) == 64
    assert len(calls) <= 8  # one call per observation would be 64
    ratings = [r for r in world.openai.chat_requests if "burst message" in r.prompt and "<memory>" in r.prompt]
    assert len(ratings) == 64


async def test_a_rate_limited_reply_still_arrives(world: World) -> None:
    world.fake.rate_limit_next("POST /channels", retry_after=0.1)
    await world.fake.send_message(world.general, world.maria, "hello?", mentions=[world.fake.bot_user])
    reply = await world.fake.wait_for_sent(lambda m: m.channel_id == world.general)
    assert reply.content == world.models.reply
    assert world.fake.rate_limited


async def test_other_bots_are_not_observed_or_answered(world: World) -> None:
    robot = world.fake.add_user("Robot", bot=True)
    world.town.add_member(robot)
    await world.fake.send_message(world.general, robot, "beep @Isabella", mentions=[world.fake.bot_user])
    human = await world.say(world.town, world.general, world.klaus, "a human message")
    await world.drained()
    texts = [m.text for m in await world.memory.recent(world.stream(world.town), 5)]
    assert texts == ["Klaus in #general: a human message"]
    assert not [m for m in world.fake.sent_messages if m.channel_id == world.general]
    assert human


async def test_a_due_reflection_survives_a_restart(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    async with one_server(tmp_path, monkeypatch, StreamConfig(reflection_threshold=10)) as (openai, persona, stream):
        # The process that observed these died before it could reflect: only the database knows.
        async with await MemoryStream.open(persona, clock=FakeClock(), environ={}, auto_reflect=False) as before:
            for n in range(2):
                await before.observe(f"Valentine's Day party note {n}", stream=stream, source=Source(author_id="1"))
            assert await before.reflection_due(stream)
        async with running_bot(persona, FakeClock()) as (bot, memory):

            async def reflected() -> bool:
                return bot.reflections.runs == [stream]

            await until(reflected, "the reflection after the restart")
            assert sum(QUESTIONS in r.prompt for r in openai.chat_requests) == 1
            assert await memory.importance_total(stream) == 0
