"""Start-up errors, DMs, threads, bursts, rate limits and restarts of the real bot."""

from __future__ import annotations

import argparse
import asyncio
import logging
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


async def test_the_bot_says_in_one_line_who_is_online_where_and_how_to_invite_it(
        world: World, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="bot")
    world.bot._announced = False  # the line was logged at start-up, before this test could capture it
    await world.bot.on_ready()
    [line] = [r.getMessage() for r in caplog.records if "is online as" in r.getMessage()]
    assert world.bot.persona.name in line and str(world.fake.bot_user.id) in line
    assert "Smallville" in line and "Elsewhere" in line and "2 server(s)" in line
    assert f"client_id={world.fake.bot_user.id}" in line and "scope=bot+applications.commands" in line


def test_each_reconnect_attempt_is_one_warning_line(caplog: pytest.LogCaptureFixture) -> None:
    from bot.__main__ import configure_logging

    names = ["", "aiosqlite", "httpx", "httpx2", "openai"]
    before = {name: logging.getLogger(name).level for name in names}
    try:
        configure_logging(verbose=False)
        caplog.set_level(logging.INFO, logger="discord.client")
        try:
            raise OSError(111, "Connect call failed ('162.159.135.232', 443)")
        except OSError:
            logging.getLogger("discord.client").exception("Attempting a reconnect in %.2fs", 2.5)
    finally:  # leave logging as the other tests expect it
        for name, level in before.items():
            logging.getLogger(name).setLevel(level)
    [record] = [r for r in caplog.records if r.name == "discord.client"]
    assert record.levelname == "WARNING" and record.exc_info is None
    text = caplog.text
    assert "Traceback" not in text and "reconnect in 2.50s" in text
    assert "Discord unreachable (ConnectionRefusedError" in text


def test_the_default_log_has_no_voice_warnings_and_no_scheduler_chatter(caplog: pytest.LogCaptureFixture) -> None:
    from bot.__main__ import configure_logging

    names = ["", "aiosqlite", "httpx", "httpx2", "openai", "apscheduler"]
    before = {name: logging.getLogger(name).level for name in names}
    try:
        configure_logging(verbose=False)
        caplog.set_level(logging.INFO, logger="discord.client")
        logging.getLogger("discord.client").warning("PyNaCl is not installed, voice will NOT be supported")
        logging.getLogger("discord.client").warning("davey is not installed, voice will NOT be supported")
        logging.getLogger("discord.client").warning("a warning worth reading")
        logging.getLogger("apscheduler.scheduler").info("Scheduler started")
        scheduler_level = logging.getLogger("apscheduler").getEffectiveLevel()
    finally:  # leave logging as the other tests expect it
        for name, level in before.items():
            logging.getLogger(name).setLevel(level)
    shown = [r.getMessage() for r in caplog.records if r.name.startswith(("discord", "apscheduler"))]
    assert shown == ["a warning worth reading"] and scheduler_level == logging.WARNING


async def test_an_unreachable_discord_at_start_is_one_line_per_try(monkeypatch: pytest.MonkeyPatch,
                                                                   caplog: pytest.LogCaptureFixture) -> None:
    import bot.__main__ as runner

    monkeypatch.setattr(runner, "LOGIN_RETRY", 0.01)
    tries: list[str] = []

    class Unreachable:
        async def login(self, token: str) -> None:
            tries.append(token)
            if len(tries) < 3:
                raise OSError(-2, "Name or service not known")

    caplog.set_level(logging.WARNING, logger="bot")
    await runner.login(Unreachable(), "token")  # type: ignore[arg-type]
    assert len(tries) == 3
    lines = [r.getMessage() for r in caplog.records if r.name == "bot"]
    assert len(lines) == 2 and all("Discord unreachable" in line and "trying again in" in line for line in lines)
    assert not any(r.exc_info for r in caplog.records)


async def test_closing_stores_what_is_queued_and_reports_the_gateway(
        world: World, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from bot.health import STATUS_ENV

    status = tmp_path / "status"
    monkeypatch.setenv(STATUS_ENV, str(status))
    await world.bot.on_ready()
    assert status.read_text().startswith("connected")
    from bot.cogs import observe

    monkeypatch.setattr(observe, "BURST_WINDOW", 1.0)  # the messages wait in the queue when the stop comes
    cog = world.bot.get_cog("ObserveCog")
    assert cog is not None
    sent = [await world.fake.send_message(world.general, world.klaus, f"said just before the stop {i}")
            for i in range(5)]

    async def queued() -> bool:
        return len(cog.queue) == 5  # type: ignore[attr-defined]

    await until(queued, "the messages to be queued")
    await world.bot.close()  # what SIGTERM does
    for message in sent:
        assert await world.memory.store.find_message(world.stream(world.town), str(message["id"])) is not None
    assert not status.read_text().startswith("connected")  # stopped or disconnected: no longer healthy


async def test_a_stop_that_cannot_wait_says_what_is_kept_and_what_is_lost(
        world: World, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    from bot import bot as bot_module

    monkeypatch.setattr(bot_module, "CLOSE_DRAIN_SECONDS", 0.5)
    world.openai.hold = lambda path, body: True  # the model server stopped answering: nothing gets rated
    sent = [await world.fake.send_message(world.general, world.klaus, f"said before the stop {i}") for i in range(40)]

    async def all_stored() -> bool:
        found = [await world.memory.store.find_message(world.stream(world.town), str(m["id"])) for m in sent]
        return all(i is not None for i in found)

    await until(all_stored, "the messages to be stored (pending)")
    await until(lambda: asyncio.sleep(0, bool(world.openai.held)), "a model call to be in flight")
    caplog.set_level(logging.WARNING)
    await world.bot.close()  # what SIGTERM does
    [line] = [r.getMessage() for r in caplog.records if r.getMessage().startswith("closing")]
    assert "not stored" not in line
    assert "40 stored observation(s) are not rated and embedded yet: they are kept as pending" in line
