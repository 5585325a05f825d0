"""A sharded persona: two real bot processes (`memstream bot --shard-count 4 --shards ...`) on one database,
against one fake Discord that routes events by Discord's formula and one fake model server. Each stream is
served, reflected on and retried by exactly one process; DMs and the command sync by the shard-0 process."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from bot.bot import make_bot
from bot.sharding import Shards, shard_of
from memstream import MemoryStream, ModelConfig, Observation, PersonaConfig, Source, load_persona
from tests.bot.conftest import AGENT, QUESTIONS, WAIT, Models, until
from tests.bot.shard_worker import URL_ENV
from tests.fakes.discord_server import FakeDiscord, FakeGuild, FakeUser
from tests.fakes.openai_server import CHAT_PATH, FakeOpenAIServer

ROOT = Path(__file__).resolve().parents[2]
COUNT = 4
# The two processes: their shards, and the Discord token and model API key that tell their requests apart
# (one bot has one token; two here only so that the fakes can say which process made a request).
PROCESSES = {"a": "0-1", "b": "2,3"}


@pytest.fixture(params=["sqlite", "postgres"])
def database(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """The `[persona] database` both processes share: a SQLite file (WAL) on this machine, or a fresh
    PostgreSQL database of the test's own."""
    if request.param == "sqlite":
        return str(tmp_path / "isabella.db")
    url: str = request.getfixturevalue("postgres_url")
    return url


@dataclass
class Sharded:
    """The running world: the fakes, the servers (two per shard), the users, and the persona file."""

    fake: FakeDiscord
    openai: FakeOpenAIServer
    guilds: list[FakeGuild]
    channels: dict[int, int]  # guild id: its channel
    klaus: FakeUser
    maria: FakeUser
    persona: Path

    def owner(self, stream: str) -> str:
        """Which process serves a stream: a server's by its shard, the rest by the one holding shard 0."""
        if stream.startswith("guild:"):
            return "a" if shard_of(int(stream.split(":")[1]), COUNT) in (0, 1) else "b"
        return "a"

    def chats(self) -> list[tuple[str, str]]:
        """Every chat request so far: (process, prompt)."""
        found = []
        for request in self.openai.requests:
            if request.path == CHAT_PATH and isinstance(request.body, dict):
                prompt = "\n".join(str(m.get("content")) for m in request.body.get("messages", []))
                found.append((request.headers.get("Authorization", "").removeprefix("Bearer key-"), prompt))
        return found

    def posts(self, channel: int) -> list[str]:
        """The processes that posted a message in a channel, one entry per message."""
        return [(r.authorization or "").removeprefix("Bot token-") for r in self.fake.requests
                if r.method == "POST" and r.path == f"/channels/{channel}/messages" and r.status == 200]


def _persona_file(tmp_path: Path, database: str, base_url: str, guilds: list[FakeGuild]) -> Path:
    path = tmp_path / "isabella.toml"
    ids = ", ".join(str(g.id) for g in guilds)
    path.write_text(
        f'[persona]\nname = "Isabella"\nsummary = "Isabella runs Hobbs Cafe."\ndatabase = "{database}"\n'
        f'[models]\nbase_url = "{base_url}"\nmax_retries = 0\n'
        '[memory]\nreflection_threshold = 20\nk = 20\n'
        f'[discord]\nguilds = [{ids}]\nhistory = 0\n', encoding="utf-8")
    return path


@contextlib.asynccontextmanager
async def bots(world: Sharded, tmp_path: Path) -> AsyncIterator[dict[str, asyncio.subprocess.Process]]:
    """Both bot processes, started as `memstream bot` is in a container, stopped with SIGTERM."""
    procs: dict[str, asyncio.subprocess.Process] = {}
    logs: dict[str, Path] = {}
    try:
        for name, shards in PROCESSES.items():
            env = {k: v for k, v in os.environ.items() if k not in ("OPENAI_API_KEY", "OPENAI_BASE_URL")}
            env.update({URL_ENV: world.fake.http_base, "DISCORD_TOKEN": f"token-{name}",
                        "OPENAI_API_KEY": f"key-{name}"})
            logs[name] = tmp_path / f"bot-{name}.log"
            with logs[name].open("wb") as log:
                procs[name] = await asyncio.create_subprocess_exec(
                    sys.executable, "-m", "tests.bot.shard_worker", "bot", "--persona", str(world.persona),
                    "--shard-count", str(COUNT), "--shards", shards, cwd=ROOT, env=env, stdout=log, stderr=log)

        async def live() -> bool:
            for proc in procs.values():
                if proc.returncode is not None:
                    raise AssertionError("a bot exited:\n" + "\n".join(p.read_text() for p in logs.values()))
            return world.fake.live_shards() == {"token-a": [(0, COUNT), (1, COUNT)],
                                                "token-b": [(2, COUNT), (3, COUNT)]}

        await until(live, "both processes to connect their shards", timeout=30)
        yield procs
    except BaseException:
        for path in logs.values():
            print(f"--- {path.name}\n{path.read_text()}")
        raise
    finally:
        for proc in procs.values():
            if proc.returncode is None:
                proc.send_signal(signal.SIGTERM)
        for name, proc in procs.items():
            try:
                await asyncio.wait_for(proc.wait(), WAIT)
            except TimeoutError:
                proc.kill()
                await proc.wait()
                raise AssertionError(f"bot {name} did not stop on SIGTERM:\n{logs[name].read_text()}") from None


async def _prepare(persona: Path, streams: list[str]) -> None:
    """What earlier runs left: in every stream two notes that make it due for a reflection (the processes that
    wrote them died before reflecting) and one observation still pending (a model outage)."""
    async with await MemoryStream.open(load_persona(persona), environ={"OPENAI_API_KEY": "key-setup"},
                                       auto_reflect=False) as memory:
        for n, stream in enumerate(streams):
            await memory.observe_many([Observation(f"note {n}.{i} of {stream} about the party", stream, None, 10,
                                                   Source(author_id="1")) for i in range(2)])
            await memory.observe_many([Observation(f"pending chat of {stream}", stream, None, None,
                                                   Source(author_id="1"))], defer=True)
        assert await memory.due_streams() == sorted(streams)


async def _ask(world: Sharded, channel: int, text: str) -> tuple[str, str]:
    """Maria asks the persona something in a channel; the process that answered, and its agent prompt."""
    before = len(world.chats())
    message = await world.fake.send_message(channel, world.maria, text, mentions=[world.fake.bot_user])
    await world.fake.wait_for_sent(lambda m: m.channel_id == channel and m.reference_message_id == int(message["id"]),
                                   timeout=WAIT)
    answers = [c for c in world.chats()[before:] if AGENT in c[1] and text in c[1]]
    assert len(answers) == 1, f"{text!r} was answered by {[process for process, _ in answers]}"
    return answers[0]


async def _stored(persona: Path, stream: str, message: dict[str, Any], *, present: bool = True) -> None:
    """Wait until a message is a ready memory in the shared database (or, not `present`, is gone from it)."""
    async with await MemoryStream.open(load_persona(persona), environ={"OPENAI_API_KEY": "key-setup"},
                                       auto_reflect=False) as memory:

        async def ready() -> bool:
            found = await memory.store.find_message(stream, str(message["id"]))
            if not present:
                return found is None
            return found is not None and (await memory.get(found)).status == "ready"

        await until(ready, f"message {message['id']} to be {'stored' if present else 'forgotten'}")


async def _memstream(*args: str) -> None:
    """Run a memstream command in its own process, with its own model API key."""
    env = dict(os.environ, OPENAI_API_KEY="key-cli")
    proc = await asyncio.create_subprocess_exec(sys.executable, "-m", "memstream", *args, cwd=ROOT, env=env,
                                                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    _, err = await proc.communicate()
    assert proc.returncode == 0, err.decode()


async def test_two_processes_with_two_shards_each_serve_every_stream_once(tmp_path: Path, database: str) -> None:
    models = Models(reply="Sure, come by the cafe.")
    async with FakeDiscord(bot_name="Isabella", shard_count=COUNT) as fake, FakeOpenAIServer(embed_dim=64) as openai:
        openai.on_chat(models.answer)
        guilds = [fake.add_guild(f"Town {n}", shard=(n % COUNT, COUNT)) for n in range(2 * COUNT)]
        klaus, maria = fake.add_user("Klaus"), fake.add_user("Maria")
        channels = {}
        for guild in guilds:
            channels[guild.id] = guild.add_channel("general")
            guild.add_member(klaus)
            guild.add_member(maria)
        world = Sharded(fake, openai, guilds, channels, klaus, maria,
                        _persona_file(tmp_path, database, openai.base_url, guilds))
        streams = sorted([f"guild:{g.id}" for g in guilds] + [f"dm:{maria.id}", "notes"])
        await _prepare(world.persona, streams)

        async with bots(world, tmp_path):
            # Slash commands: synced once per configured server, all by the process holding shard 0.
            assert sorted(x for x in fake.sync_log if x is not None) == sorted(g.id for g in guilds)
            assert {r.authorization for r in fake.requests_to("PUT /applications")} == {"Bot token-a"}

            # At start each process finished its own streams' pending observations and reflected on its own
            # due streams: each once, by the stream's owner ("notes", no server's, belongs to shard 0's).
            async def started() -> bool:
                chats = world.chats()
                return (sum(QUESTIONS in p for _, p in chats) >= len(streams)
                        and sum("<memory>pending chat" in p for _, p in chats) >= len(streams))

            await until(started, "the start-up reflections and retries", timeout=20)
            for stream in streams:
                reflections = [who for who, p in world.chats() if QUESTIONS in p and f"of {stream} about" in p]
                assert reflections == [world.owner(stream)], stream
                ratings = [who for who, p in world.chats() if f"<memory>pending chat of {stream}</memory>" in p]
                assert ratings == [world.owner(stream)], stream

            # Each server's mention is answered once, by the process holding the server's shard.
            for guild in guilds:
                process, _ = await _ask(world, channels[guild.id], f"hello from {guild.name}")
                assert process == world.owner(f"guild:{guild.id}")
            for guild in guilds:
                assert world.posts(channels[guild.id]) == [world.owner(f"guild:{guild.id}")], guild.name
            # DMs come on shard 0 only: answered by that process alone.
            dm = fake.dm_channel(maria)
            process, _ = await _ask(world, dm, "hello in a DM")
            assert process == "a" and world.posts(dm) == ["a"]

            # A deleted message reaches only the process serving its server, which forgets it.
            on_b = next(g for g in guilds if world.owner(f"guild:{g.id}") == "b")
            said = await fake.send_message(channels[on_b.id], klaus, "my dog is called Rex")
            await _stored(world.persona, f"guild:{on_b.id}", said)
            process, prompt = await _ask(world, channels[on_b.id], "what is the name of Klaus's dog?")
            assert process == "b" and "Rex" in prompt
            await fake.delete_message(channels[on_b.id], int(said["id"]))
            assert [e["id"] for e in fake.events_on_shard(shard_of(on_b.id, COUNT), "MESSAGE_DELETE")] == [said["id"]]
            assert all(not fake.events_on_shard(s, "MESSAGE_DELETE") for s in range(COUNT)
                       if s != shard_of(on_b.id, COUNT))
            await _stored(world.persona, f"guild:{on_b.id}", said, present=False)
            process, prompt = await _ask(world, channels[on_b.id], "and the dog's name?")
            assert process == "b" and "Rex" not in prompt

            # Another process on the database (the operator's `memstream forget` and `memstream observe`) forgets
            # a memory of a stream process a serves and adds one: a's next answer reloads the stream.
            on_a = next(g for g in guilds if world.owner(f"guild:{g.id}") == "a")
            said = await fake.send_message(channels[on_a.id], klaus, "my cat is called Pixel")
            await _stored(world.persona, f"guild:{on_a.id}", said)
            process, prompt = await _ask(world, channels[on_a.id], "what is the name of Klaus's cat?")
            assert process == "a" and "Pixel" in prompt
            await _memstream("forget", "--persona", str(world.persona), "--message", str(said["id"]))
            await _memstream("observe", "--persona", str(world.persona), "--stream", f"guild:{on_a.id}",
                             "--importance", "1", "Klaus said his cat is now called Mochi")
            process, prompt = await _ask(world, channels[on_a.id], "and the cat's name?")
            assert process == "a" and "Pixel" not in prompt and "Mochi" in prompt

            # Nothing was reflected twice meanwhile.
            assert sum(QUESTIONS in p for _, p in world.chats()) == len(streams)


async def test_with_no_servers_configured_each_server_is_synced_once_by_the_process_serving_it(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    import bot.bot

    monkeypatch.setattr(bot.bot, "IDENTIFY_SECONDS", 0.0)
    caplog.set_level(logging.INFO, logger="bot")
    async with FakeDiscord(bot_name="Isabella", shard_count=COUNT) as fake, FakeOpenAIServer(embed_dim=64) as openai:
        guilds = [fake.add_guild(f"Town {n}", shard=(n % COUNT, COUNT)) for n in range(2 * COUNT)]
        fake.install(monkeypatch)
        persona = PersonaConfig(name="Isabella", summary="Runs a cafe.", database=tmp_path / "i.db",
                                models=ModelConfig(base_url=openai.base_url, max_retries=0))
        async with contextlib.AsyncExitStack() as stack:
            for shards in ((0, 1), (2, 3)):
                memory = await stack.enter_async_context(await MemoryStream.open(persona, environ={}))
                running = make_bot(memory, persona, Shards(COUNT, shards), guild_ready_timeout=0.05)
                task = asyncio.create_task(running.start("token"))
                stack.push_async_callback(asyncio.wait_for, task, WAIT)
                stack.push_async_callback(running.close)
                await asyncio.wait_for(running.wait_until_ready(), WAIT)
            assert sorted(x for x in fake.sync_log if x is not None) == sorted(g.id for g in guilds)
    online = [r.getMessage() for r in caplog.records if "is online as" in r.getMessage()]
    assert len(online) == 2 and "on shard(s) 0-1 of 4 in 4 server(s)" in online[0] + online[1]
    assert "on shard(s) 2-3 of 4 in 4 server(s)" in online[0] + online[1]
