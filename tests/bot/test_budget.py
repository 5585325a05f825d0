"""A spent daily budget on Discord: the persona declines politely once per channel (not on every mention), keeps
listening, and /memory-stats shows the day's spend against the budget."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from bot.bot import PersonaBot
from memstream import DiscordConfig, MemoryStream, ModelConfig, PersonaConfig, StreamConfig
from memstream.config import BudgetConfig, RoleLimit
from memstream.testing import FakeClock
from tests.bot.conftest import Models, running_bot, until
from tests.fakes.discord_server import FakeDiscord, FakeGuild, FakeUser
from tests.fakes.openai_server import FakeOpenAIServer

DECLINE = "Sorry, I've used up my thinking for today"


@dataclass
class Town:
    fake: FakeDiscord
    openai: FakeOpenAIServer
    bot: PersonaBot
    memory: MemoryStream
    guild: FakeGuild
    general: int
    kitchen: int
    klaus: FakeUser
    maria: FakeUser


@pytest.fixture
async def town(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Town]:
    models = Models()
    async with FakeDiscord(bot_name="Isabella") as fake, FakeOpenAIServer(embed_dim=64) as openai:
        openai.on_chat(models.answer)
        guild = fake.add_guild("Smallville")
        general, kitchen = guild.add_channel("general"), guild.add_channel("kitchen")
        klaus, maria = fake.add_user("Klaus"), fake.add_user("Maria")
        guild.add_member(klaus)
        guild.add_member(maria)
        fake.install(monkeypatch)
        persona = PersonaConfig(
            name="Isabella Rodriguez", summary="Isabella runs Hobbs Cafe.", database=tmp_path / "isabella.db",
            models=ModelConfig(base_url=openai.base_url, max_retries=0, timeout=5),
            memory=StreamConfig(reflection_threshold=1000), discord=DiscordConfig(guilds=(guild.id,), history=0),
            budget=BudgetConfig({"agent": RoleLimit(calls_per_day=1)}))
        async with running_bot(persona, FakeClock()) as (bot, memory):
            yield Town(fake, openai, bot, memory, guild, general, kitchen, klaus, maria)


async def _ask(town: Town, channel: int, user: FakeUser, text: str) -> None:
    """Mention the persona, and wait until its answer (or its silence) is settled and the mention remembered."""
    message = await town.fake.send_message(channel, user, text, mentions=[town.fake.bot_user])
    stream = f"guild:{town.guild.id}"
    await until(lambda: town.memory.store.find_message(stream, str(message["id"])), "the mention to be stored")
    chat = town.bot.get_cog("ChatCog")
    assert chat is not None

    async def settled() -> bool:
        return not chat.tasks  # type: ignore[attr-defined]

    await until(settled, "the answer to be settled")


def _sent(town: Town, channel: int) -> list[str]:
    return [m.content for m in town.fake.sent_messages if m.channel_id == channel]


async def test_a_spent_agent_budget_declines_once_per_channel(town: Town) -> None:
    await _ask(town, town.general, town.maria, "what are you doing tonight?")
    assert _sent(town, town.general) == [Models().reply]
    await _ask(town, town.general, town.klaus, "and you, Isabella?")
    await _ask(town, town.general, town.maria, "hello again?")
    [_, declined] = _sent(town, town.general)  # one decline in the channel, not one per mention
    assert declined.startswith(DECLINE) and "can't answer until <t:" in declined
    assert "I'm still listening, and I'll remember what's said here." in declined
    await _ask(town, town.kitchen, town.klaus, "coffee?")
    assert [m.startswith(DECLINE) for m in _sent(town, town.kitchen)] == [True]  # once in this channel too
    agent = [r for r in town.openai.chat_requests if "What do you do or say next?" in r.prompt]
    assert len(agent) == 1  # no agent call past the budget
    texts = [m.text for m in await town.memory.recent(f"guild:{town.guild.id}", 20)]
    assert any("hello again?" in t for t in texts)  # still listening

    record = await town.fake.slash(town.guild.id, town.general, town.maria, "memory-stats")
    [stats] = await record.wait_done()
    assert "budget today (" in stats.content and "  agent: 1/1 calls, " in stats.content
    assert ": spent, no call until " in stats.content
