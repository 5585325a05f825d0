"""A world for end-to-end bot tests: the fake Discord, the fake OpenAI server, and the real PersonaBot."""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from bot.bot import PersonaBot
from memstream import DiscordConfig, MemoryStream, ModelConfig, PersonaConfig, StreamConfig
from memstream.testing import FakeClock
from tests.fakes.discord_server import FakeDiscord, FakeGuild, FakeUser
from tests.fakes.openai_server import ChatRequest, FakeOpenAIServer

WAIT = 8.0
QUESTIONS = "most salient high-level"
INSIGHTS = "high-level insights can you infer"
AGENT = "What do you do or say next?"
_MEMORY = re.compile(r"<memory>(.*)</memory>", re.DOTALL)


async def until(check: Callable[[], Awaitable[object]], what: str, timeout: float = WAIT) -> object:
    """Poll an async check until it returns something truthy."""
    deadline = time.monotonic() + timeout
    while True:
        result = await check()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


@dataclass
class Models:
    """What the fake model server answers, per prompt; tests change these fields."""

    ratings: dict[str, int] = field(default_factory=lambda: {"party": 7, "Valentine": 7})
    questions: str = "What is Isabella planning?\nWho is coming to the party?\nHow does Klaus feel?"
    insights: str = "Isabella is hosting a Valentine's Day party (because of 1, 2)"
    reply: str = "I'm going to my Valentine's Day party at 5 pm. Want to come?"

    def answer(self, request: ChatRequest) -> str:
        prompt = request.prompt
        match = _MEMORY.search(prompt)
        if match:
            text = match.group(1)
            return str(max([v for k, v in self.ratings.items() if k in text], default=1))
        if QUESTIONS in prompt:
            return self.questions
        if INSIGHTS in prompt:
            return self.insights
        return self.reply


@dataclass
class World:
    """Everything an end-to-end test touches."""

    fake: FakeDiscord
    openai: FakeOpenAIServer
    models: Models
    clock: FakeClock
    bot: PersonaBot
    memory: MemoryStream
    town: FakeGuild
    general: int
    other: FakeGuild
    lounge: int
    klaus: FakeUser
    maria: FakeUser
    manager: FakeUser

    def stream(self, guild: FakeGuild) -> str:
        return f"guild:{guild.id}"

    async def stored(self, guild: FakeGuild, message: dict[str, object]) -> int:
        """Wait until a Discord message is a ready memory; its id."""
        stream, key = self.stream(guild), str(message["id"])

        async def ready() -> int | None:
            found = await self.memory.store.find_message(stream, key)
            if found is None:
                return None
            return found if (await self.memory.get(found)).status == "ready" else None

        return int(await until(ready, f"message {key} to be stored"))  # type: ignore[call-overload]

    async def say(self, guild: FakeGuild, channel: int, user: FakeUser, text: str, **kw: object) -> dict[str, object]:
        """Post a message and wait until the persona has it in memory."""
        message = await self.fake.send_message(channel, user, text, **kw)  # type: ignore[arg-type]
        await self.stored(guild, message)
        return message

    async def drained(self) -> None:
        # discord.py loads extensions as fresh module objects: no isinstance against our import.
        cog = self.bot.get_cog("ObserveCog")
        assert cog is not None
        await asyncio.wait_for(cog.drained(), WAIT)  # type: ignore[attr-defined]

    def agent_prompts(self) -> list[str]:
        return [r.prompt for r in self.openai.chat_requests if AGENT in r.prompt]


@pytest.fixture
async def world(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[World]:
    models = Models()
    async with FakeDiscord(bot_name="Isabella") as fake, FakeOpenAIServer(embed_dim=64) as openai:
        openai.on_chat(models.answer)
        town = fake.add_guild("Smallville")
        general = town.add_channel("general")
        other = fake.add_guild("Elsewhere")
        lounge = other.add_channel("lounge")
        klaus, maria, manager = fake.add_user("Klaus"), fake.add_user("Maria"), fake.add_user("Mayor")
        for guild in (town, other):
            guild.add_member(klaus)
            guild.add_member(maria)
        town.add_member(manager, roles=[town.add_manager_role()])
        fake.install(monkeypatch)
        persona = PersonaConfig(
            name="Isabella Rodriguez", summary="Isabella runs Hobbs Cafe and is planning a Valentine's Day party.",
            database=tmp_path / "isabella.db",
            models=ModelConfig(base_url=openai.base_url, max_retries=0, timeout=5),
            memory=StreamConfig(reflection_threshold=20),
            discord=DiscordConfig(guilds=(town.id, other.id), history=4),
        )
        clock = FakeClock()
        async with running_bot(persona, clock) as (bot, memory):
            yield World(fake, openai, models, clock, bot, memory, town, general, other, lounge, klaus, maria, manager)


@contextlib.asynccontextmanager
async def running_bot(persona: PersonaConfig, clock: FakeClock) -> AsyncIterator[tuple[PersonaBot, MemoryStream]]:
    """Open the persona's memory and run the real bot on it until the block ends."""
    memory = await MemoryStream.open(persona, clock=clock, environ={})
    bot = PersonaBot(memory, persona, guild_ready_timeout=0.05)
    task = asyncio.create_task(bot.start("token"))
    try:
        await asyncio.wait_for(bot.wait_until_ready(), WAIT)
        yield bot, memory
    finally:
        await bot.close()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait_for(task, WAIT)
        await memory.close()


@contextlib.asynccontextmanager
async def one_server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, memory: StreamConfig | None = None
                     ) -> AsyncIterator[tuple[FakeOpenAIServer, PersonaConfig, str]]:
    """A fake Discord with one server and a fake model server; the persona and the server's stream key."""
    models = Models()
    async with FakeDiscord() as fake, FakeOpenAIServer() as openai:
        openai.on_chat(models.answer)
        town = fake.add_guild("Smallville")
        town.add_channel("general")
        fake.install(monkeypatch)
        persona = PersonaConfig(name="Isabella", summary="Runs a cafe.", database=tmp_path / "i.db",
                                models=ModelConfig(base_url=openai.base_url, max_retries=0),
                                memory=memory or StreamConfig(), discord=DiscordConfig(guilds=(town.id,)))
        yield openai, persona, f"guild:{town.id}"
