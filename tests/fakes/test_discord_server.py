"""Prove the fake Discord works with an unmodified discord.py ``commands.Bot`` over real sockets."""

import asyncio
import contextlib
import io
import warnings
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import aiohttp
import pytest

from tests.fakes.discord_server import (
    INTENT_MESSAGE_CONTENT,
    SEND_MESSAGES,
    FakeDiscord,
    FakeGuild,
    FakeRole,
    FakeUser,
)

with warnings.catch_warnings():
    warnings.filterwarnings("ignore", message="'audioop' is deprecated", category=DeprecationWarning)
    import discord
    from discord import app_commands
    from discord.ext import commands

WAIT = 5.0


class TinyBot(commands.Bot):
    """A minimal bot: mention/DM echo, four app commands, and queues recording the events it saw."""

    def __init__(self, guild_id: int, *, allowed_mentions: discord.AllowedMentions | None = None) -> None:
        """Configure intents, fast readiness and the commands."""
        intents = discord.Intents.default()
        intents.message_content = True
        super().__init__(
            command_prefix="!",
            intents=intents,
            guild_ready_timeout=0.05,
            allowed_mentions=allowed_mentions if allowed_mentions is not None else discord.AllowedMentions.none(),
        )
        self.guild_id = guild_id
        self.ready_event = asyncio.Event()
        self.messages: asyncio.Queue[discord.Message] = asyncio.Queue()
        self.raw_deletes: asyncio.Queue[discord.RawMessageDeleteEvent] = asyncio.Queue()
        self.raw_bulk_deletes: asyncio.Queue[discord.RawBulkMessageDeleteEvent] = asyncio.Queue()
        self.raw_edits: asyncio.Queue[discord.RawMessageUpdateEvent] = asyncio.Queue()
        self.guild_removals: asyncio.Queue[discord.Guild] = asyncio.Queue()
        self.remembered: asyncio.Queue[discord.Message] = asyncio.Queue()
        self.errors: asyncio.Queue[Exception] = asyncio.Queue()
        self.resumed = asyncio.Event()
        self._add_commands()

    def _add_commands(self) -> None:
        """Register /say, /ponder, /slow, /rude, /admin and the "Remember this" message command."""

        @self.tree.command(name="say", description="Repeat text")
        @app_commands.describe(text="What to say", private="Only you see it")
        async def say(interaction: discord.Interaction, text: str, private: bool = False) -> None:
            await interaction.response.send_message(text, ephemeral=private)

        @self.tree.command(name="ponder", description="Think first, answer later")
        async def ponder(interaction: discord.Interaction, topic: str) -> None:
            await interaction.response.defer(ephemeral=True, thinking=True)
            await asyncio.sleep(0.1)
            await interaction.followup.send(f"I pondered {topic}")
            await interaction.followup.send("one more thing")

        @self.tree.command(name="slow", description="Answer after a delay")
        async def slow(interaction: discord.Interaction, delay: float) -> None:
            await asyncio.sleep(delay)
            try:
                await interaction.response.send_message("finally")
            except discord.NotFound as exc:
                self.errors.put_nowait(exc)

        @self.tree.command(name="rude", description="Follow up without answering")
        async def rude(interaction: discord.Interaction) -> None:
            try:
                await interaction.followup.send("no ack first")
            except discord.NotFound as exc:
                self.errors.put_nowait(exc)

        @self.tree.command(name="admin", description="Managers only")
        @app_commands.default_permissions(manage_guild=True)
        async def admin(interaction: discord.Interaction) -> None:
            await interaction.response.send_message("done", ephemeral=True)

        @self.tree.context_menu(name="Remember this")
        async def remember(interaction: discord.Interaction, message: discord.Message) -> None:
            self.remembered.put_nowait(message)
            await interaction.response.send_message(f"remembered: {message.content}", ephemeral=True)

    async def setup_hook(self) -> None:
        """Sync all commands to the test guild."""
        guild = discord.Object(self.guild_id)
        self.tree.copy_global_to(guild=guild)
        await self.tree.sync(guild=guild)

    async def on_ready(self) -> None:
        """Signal readiness."""
        self.ready_event.set()

    async def on_resumed(self) -> None:
        """Signal a successful RESUME."""
        self.resumed.set()

    async def on_message(self, message: discord.Message) -> None:
        """Record human messages; echo when mentioned or in DMs."""
        if message.author.bot:
            return
        self.messages.put_nowait(message)
        assert self.user is not None
        if self.user in message.mentions or message.guild is None:
            text = message.content.replace(self.user.mention, "").strip()
            await message.reply(f"echo: {text}", mention_author=False)

    async def on_raw_message_delete(self, payload: discord.RawMessageDeleteEvent) -> None:
        """Record deletes."""
        self.raw_deletes.put_nowait(payload)

    async def on_raw_bulk_message_delete(self, payload: discord.RawBulkMessageDeleteEvent) -> None:
        """Record bulk deletes."""
        self.raw_bulk_deletes.put_nowait(payload)

    async def on_raw_message_edit(self, payload: discord.RawMessageUpdateEvent) -> None:
        """Record edits."""
        self.raw_edits.put_nowait(payload)

    async def on_guild_remove(self, guild: discord.Guild) -> None:
        """Record guild removals."""
        self.guild_removals.put_nowait(guild)


@dataclass
class World:
    """A running fake, its guild and users, and a connected TinyBot."""

    fake: FakeDiscord
    guild: FakeGuild
    channel_id: int
    alice: FakeUser
    manager: FakeUser
    manager_role: FakeRole
    bot: TinyBot


async def start_bot(bot: commands.Bot, token: str = "token") -> asyncio.Task[None]:
    """Start ``bot`` against the fake and return once on_ready fired (or fail with what start() raised)."""
    task = asyncio.create_task(bot.start(token))
    ready = asyncio.create_task(bot.wait_until_ready())
    done, _ = await asyncio.wait({task, ready}, timeout=WAIT, return_when=asyncio.FIRST_COMPLETED)
    if ready in done:
        return task
    ready.cancel()
    await bot.close()
    if task.done():
        raise AssertionError("bot.start failed before the bot was ready") from task.exception()
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    raise AssertionError("bot did not become ready in time")


async def stop_bot(bot: commands.Bot, task: asyncio.Task[None]) -> None:
    """Close the bot and wait for its start() task to finish."""
    await bot.close()
    await asyncio.wait_for(task, WAIT)


@pytest.fixture
async def fake() -> AsyncIterator[FakeDiscord]:
    """A running fake Discord."""
    async with FakeDiscord() as server:
        yield server


@pytest.fixture
async def world(fake: FakeDiscord, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[World]:
    """A guild with a channel, a member and a manager, and a ready TinyBot."""
    guild = fake.add_guild("Test Guild")
    channel_id = guild.add_channel("general")
    alice = fake.add_user("alice")
    guild.add_member(alice)
    manager = fake.add_user("morgan")
    manager_role = guild.add_manager_role()
    guild.add_member(manager, roles=[manager_role])
    fake.install(monkeypatch)
    bot = TinyBot(guild.id)
    task = await start_bot(bot)
    try:
        yield World(fake, guild, channel_id, alice, manager, manager_role, bot)
    finally:
        await stop_bot(bot, task)


async def next_item(queue: "asyncio.Queue[Any]") -> Any:
    """Get the next item of a queue, failing after WAIT seconds."""
    return await asyncio.wait_for(queue.get(), WAIT)


async def until(check: Callable[[], Awaitable[bool]]) -> None:
    """Poll an async check until it holds, failing after WAIT seconds."""
    deadline = asyncio.get_running_loop().time() + WAIT
    while not await check():
        assert asyncio.get_running_loop().time() < deadline, "timed out"
        await asyncio.sleep(0.01)


def text_channel(world: World) -> discord.TextChannel:
    """Return the bot's cached TextChannel for the world's channel."""
    channel = world.bot.get_channel(world.channel_id)
    assert isinstance(channel, discord.TextChannel)
    return channel


async def test_startup_identify_ready_and_sync(world: World) -> None:
    fake, bot = world.fake, world.bot
    assert fake.identify_payloads[0]["intents"] & INTENT_MESSAGE_CONTENT
    assert fake.gateway_queries[0]["v"] == "10"
    assert fake.heartbeats_received >= 1
    assert fake.sync_log == [world.guild.id]
    synced = {(c["name"], c["type"]) for c in fake.synced_commands[world.guild.id]}
    assert synced == {("say", 1), ("ponder", 1), ("slow", 1), ("rude", 1), ("admin", 1), ("Remember this", 3)}
    assert bot.application_id == fake.application_id
    assert bot.user is not None and bot.user.id == fake.bot_user.id and bot.user.name == "Persona"
    guild = bot.get_guild(world.guild.id)
    assert guild is not None and guild.me is not None
    # Without the GUILD_MEMBERS intent GUILD_CREATE lists only the bot: the member cache is nearly empty.
    assert guild.get_member(world.alice.id) is None and guild.member_count == 4
    assert isinstance(guild.get_channel(world.channel_id), discord.TextChannel)
    assert fake.unknown_routes == []


async def test_on_message_sees_content_and_bot_mention_then_echo_reply(world: World) -> None:
    fake, bot = world.fake, world.bot
    sent = await fake.send_message(world.channel_id, world.alice, "hello there", mentions=[fake.bot_user])
    assert sent["content"] == f"<@{fake.bot_user.id}> hello there"
    message = await next_item(bot.messages)
    assert message.content == f"<@{fake.bot_user.id}> hello there"
    assert bot.user in message.mentions
    assert message.author.id == world.alice.id and isinstance(message.author, discord.Member)
    reply = await fake.wait_for_sent(lambda m: m.channel_id == world.channel_id)
    assert reply.content == "echo: hello there"
    assert reply.reference_message_id == int(sent["id"])
    assert reply.allowed_mentions == {"parse": [], "replied_user": False}
    assert (reply.pinged_everyone, reply.pinged_users, reply.pinged_roles) == (False, [], [])
    assert [int(m["id"]) for m in fake.history(world.channel_id)] == [int(sent["id"]), reply.id]


async def test_everyone_in_echo_does_not_ping_with_allowed_mentions_none(world: World) -> None:
    fake = world.fake
    await fake.send_message(world.channel_id, world.alice, "@everyone party", mentions=[fake.bot_user])
    reply = await fake.wait_for_sent()
    assert "@everyone" in reply.content
    assert reply.pinged_everyone is False
    channel = text_channel(world)
    await channel.send("@everyone loud", allowed_mentions=discord.AllowedMentions(everyone=True))
    assert fake.sent_messages[-1].pinged_everyone is True


async def test_content_over_2000_chars_raises_50035_and_empty_raises_50006(world: World) -> None:
    channel = text_channel(world)
    with pytest.raises(discord.HTTPException) as too_long:
        await channel.send("x" * 2001)
    assert too_long.value.status == 400 and too_long.value.code == 50035
    assert "2000" in str(too_long.value)
    with pytest.raises(discord.HTTPException) as empty:
        await channel.send("")
    assert empty.value.code == 50006
    await channel.send("x" * 2000)
    assert [len(m.content) for m in world.fake.sent_messages] == [2000]


async def test_slash_command_round_trip_ephemeral_and_public(world: World) -> None:
    fake = world.fake
    record = await fake.slash(world.guild.id, world.channel_id, world.alice, "say", {"text": "hi", "private": True})
    callback = await record.response()
    assert (callback.type, callback.ephemeral, callback.accepted, callback.late) == (4, True, True, False)
    say_id = next(c["id"] for c in fake.synced_commands[world.guild.id] if c["name"] == "say")
    assert record.payload["data"]["id"] == say_id
    [message] = await record.wait_done()
    assert (message.content, message.ephemeral) == ("hi", True)
    assert fake.history(world.channel_id) == []

    public = await fake.slash(world.guild.id, world.channel_id, world.alice, "say", {"text": "hello all"})
    [shown] = await public.wait_done()
    assert (shown.content, shown.ephemeral) == ("hello all", False)
    assert fake.history(world.channel_id)[-1]["content"] == "hello all"


async def test_deferred_command_with_followups(world: World) -> None:
    fake = world.fake
    record = await fake.slash(world.guild.id, world.channel_id, world.alice, "ponder", {"topic": "tea"})
    callback = await record.response()
    assert (callback.type, callback.ephemeral) == (5, True)
    followups = await record.wait_for_followups(2)
    # The first follow-up after a defer replaces the "thinking" placeholder and keeps its ephemeral flag.
    assert followups[0] is record.original
    assert [(m.content, m.ephemeral) for m in record.messages] == [("I pondered tea", True), ("one more thing", False)]
    assert record.done


async def test_late_response_is_rejected_and_discord_py_raises_not_found(world: World) -> None:
    fake = world.fake
    assert fake.interaction_deadline == 3.0
    fake.interaction_deadline = 0.5
    record = await fake.slash(world.guild.id, world.channel_id, world.alice, "slow", {"delay": 0.8})
    error = await next_item(world.bot.errors)
    assert isinstance(error, discord.NotFound) and error.code == 10062
    assert record.late is True
    assert record.accepted_callback is None and record.callbacks[0].late
    assert record.messages == []


async def test_followup_without_callback_is_rejected(world: World) -> None:
    record = await world.fake.slash(world.guild.id, world.channel_id, world.alice, "rude")
    error = await next_item(world.bot.errors)
    assert isinstance(error, discord.NotFound) and error.code == 10015
    assert [body["content"] for body in record.rejected_followups] == ["no ack first"]
    assert record.callbacks == [] and record.messages == []


async def test_message_context_menu_gets_the_target_message(world: World) -> None:
    fake = world.fake
    target = await fake.send_message(world.channel_id, world.alice, "remember me")
    target_id = int(target["id"])
    record = await fake.context_menu(world.guild.id, world.channel_id, world.manager, "Remember this", target_id)
    message = await next_item(world.bot.remembered)
    assert message.id == int(target["id"]) and message.content == "remember me"
    assert message.author.id == world.alice.id
    [reply] = await record.wait_done()
    assert (reply.content, reply.ephemeral) == ("remembered: remember me", True)


async def test_default_member_permissions_hide_commands_from_non_managers(world: World) -> None:
    fake = world.fake
    with pytest.raises(PermissionError):
        await fake.slash(world.guild.id, world.channel_id, world.alice, "admin")
    record = await fake.slash(world.guild.id, world.channel_id, world.manager, "admin")
    assert [m.content for m in await record.wait_done()] == ["done"]
    assert int(record.payload["member"]["permissions"]) & discord.Permissions.manage_guild.flag


async def test_update_delete_and_bulk_delete_reach_raw_handlers(world: World) -> None:
    fake, bot = world.fake, world.bot
    ids = [int((await fake.send_message(world.channel_id, world.alice, f"m{i}"))["id"]) for i in range(3)]
    await fake.edit_message(world.channel_id, ids[0], "m0 edited")
    edit = await next_item(bot.raw_edits)
    assert edit.message_id == ids[0] and edit.message.content == "m0 edited"
    await fake.delete_message(world.channel_id, ids[1])
    deleted = await next_item(bot.raw_deletes)
    assert (deleted.message_id, deleted.channel_id, deleted.guild_id) == (ids[1], world.channel_id, world.guild.id)
    assert deleted.cached_message is not None and deleted.cached_message.content == "m1"
    await fake.bulk_delete(world.channel_id, [ids[0], ids[2]])
    bulk = await next_item(bot.raw_bulk_deletes)
    assert bulk.message_ids == {ids[0], ids[2]}
    assert fake.history(world.channel_id) == []


async def test_guild_delete_reaches_on_guild_remove(world: World) -> None:
    await world.fake.remove_bot_from_guild(world.guild.id)
    removed = await next_item(world.bot.guild_removals)
    assert removed.id == world.guild.id
    assert world.bot.get_guild(world.guild.id) is None


async def test_rate_limited_send_is_retried_by_discord_py(world: World) -> None:
    fake = world.fake
    fake.rate_limit_next(f"POST /channels/{world.channel_id}/messages", retry_after=0.2)
    loop = asyncio.get_running_loop()
    started = loop.time()
    message = await text_channel(world).send("after the limit")
    assert loop.time() - started >= 0.2
    assert [hit.retry_after for hit in fake.rate_limited] == [0.2]
    attempts = fake.requests_to(f"POST /channels/{world.channel_id}/messages")
    assert [r.status for r in attempts] == [429, 200]
    assert message.content == "after the limit" and fake.sent_messages[-1].id == message.id


async def test_edits_past_five_in_five_seconds_are_rate_limited_and_recorded(world: World) -> None:
    fake = world.fake
    fake.edit_limit = (5, 1.0)  # Discord's count, in a shorter window for the test
    message = await text_channel(world).send("v0")
    loop = asyncio.get_running_loop()
    started = loop.time()
    for n in range(1, 7):
        await message.edit(content=f"v{n}")  # the sixth waits for the window: discord.py retries the 429
    assert loop.time() - started >= 0.5
    [hit] = fake.rate_limited
    assert hit.rule == "edit_limit" and hit.method == "PATCH" and 0 < hit.retry_after <= 1.001
    sent = fake.sent_messages[-1]
    assert [e["content"] for e in sent.edits] == [f"v{n}" for n in range(1, 7)]
    assert len(sent.edited_at) == 6 and sent.edited_at == sorted(sent.edited_at) and sent.sent_at <= sent.edited_at[0]
    assert sent.content == "v6"


async def test_file_upload_history_typing_and_unknown_routes(world: World) -> None:
    fake = world.fake
    channel = text_channel(world)
    async with channel.typing():
        pass
    assert [t.channel_id for t in fake.typing_events] == [world.channel_id]
    sent = await channel.send("notes", file=discord.File(io.BytesIO(b"memo body"), filename="memo.txt"))
    assert fake.sent_messages[-1].attachments[0]["filename"] == "memo.txt"
    assert await sent.attachments[0].read() == b"memo body"
    for i in range(3):
        await fake.send_message(world.channel_id, world.alice, f"h{i}")
    newest = [m.content async for m in channel.history(limit=2)]
    assert newest == ["h2", "h1"]
    oldest = [m.content async for m in channel.history(limit=2, oldest_first=True)]
    assert oldest == ["notes", "h0"]
    with pytest.raises(discord.NotFound):
        await world.bot.http.request(discord.http.Route("GET", "/voice/regions"))
    assert fake.unknown_routes == [("GET", "/voice/regions")]


async def test_dm_message_and_reply(world: World) -> None:
    fake = world.fake
    dm_id = fake.dm_channel(world.alice)
    await fake.send_message(dm_id, world.alice, "psst")
    message = await next_item(world.bot.messages)
    assert message.guild is None and message.content == "psst"
    reply = await fake.wait_for_sent(lambda m: m.channel_id == dm_id)
    assert reply.content == "echo: psst" and reply.guild_id is None


async def test_reconnect_resumes_session_and_keeps_delivering(world: World) -> None:
    fake = world.fake
    await fake.force_reconnect()
    await asyncio.wait_for(world.bot.resumed.wait(), WAIT)
    assert len(fake.resume_payloads) == 1 and len(fake.identify_payloads) == 1
    await fake.send_message(world.channel_id, world.alice, "still here")
    assert (await next_item(world.bot.messages)).content == "still here"


async def test_privileged_intents_rejected_raises(fake: FakeDiscord, monkeypatch: pytest.MonkeyPatch) -> None:
    guild = fake.add_guild("G")
    fake.install(monkeypatch)
    fake.reject_intents = True
    bot = TinyBot(guild.id)
    try:
        with pytest.raises(discord.PrivilegedIntentsRequired):
            await asyncio.wait_for(bot.start("token"), WAIT)
    finally:
        await bot.close()
    assert fake.gateway_close_codes == [4014]


async def test_wrong_token_is_a_login_failure(fake: FakeDiscord, monkeypatch: pytest.MonkeyPatch) -> None:
    guild = fake.add_guild("G")
    fake.install(monkeypatch)
    fake.valid_token = "right-token"
    bot = TinyBot(guild.id)
    try:
        with pytest.raises(discord.LoginFailure):
            await asyncio.wait_for(bot.start("wrong-token"), WAIT)
    finally:
        await bot.close()
    assert fake.requests[0].path == "/users/@me" and fake.requests[0].status == 401


async def test_my_guilds_lists_joined_guilds_with_the_bots_permissions(fake: FakeDiscord) -> None:
    full = fake.add_guild("Full")
    bare = fake.add_guild("Bare", bot_permissions=0)
    bare.everyone_role.permissions = 0
    gone = fake.add_guild("Gone")
    await fake.remove_bot_from_guild(gone.id)
    async with (aiohttp.ClientSession(headers={"Authorization": "Bot token"}) as session,
                session.get(f"{fake.api_base}/users/@me/guilds") as response):
        listed = {g["name"]: g for g in await response.json()}
    assert set(listed) == {"Full", "Bare"}
    assert int(listed["Full"]["permissions"]) == full.member_permissions(fake.bot_user.id)
    assert int(listed["Full"]["permissions"]) & SEND_MESSAGES
    assert listed["Bare"]["permissions"] == "0" and listed["Bare"]["owner"] is False


class ForgetView(discord.ui.View):
    """A one-button confirmation that edits its message when clicked."""

    def __init__(self) -> None:
        """No timeout, so the test controls the lifetime."""
        super().__init__(timeout=None)
        self.clicked_by: asyncio.Queue[int] = asyncio.Queue()

    @discord.ui.button(label="Forget", custom_id="forget-confirm")
    async def confirm(self, interaction: discord.Interaction, button: discord.ui.Button["ForgetView"]) -> None:
        """Replace the prompt and record who clicked."""
        await interaction.response.edit_message(content="forgotten", view=None)
        self.clicked_by.put_nowait(interaction.user.id)


class MemberBot(commands.Bot):
    """A bot with the GUILD_MEMBERS intent and a guild-only ``/memory forget`` subcommand."""

    def __init__(self, guild_id: int) -> None:
        """Configure intents and the command group."""
        intents = discord.Intents.default()
        intents.members = True
        intents.message_content = True
        super().__init__(command_prefix="!", intents=intents, guild_ready_timeout=0.05)
        self.guild_id = guild_id
        self.view = ForgetView()
        self.messages: asyncio.Queue[discord.Message] = asyncio.Queue()
        memory = app_commands.Group(name="memory", description="Manage memories")

        @memory.command(name="forget", description="Forget someone")
        async def forget(interaction: discord.Interaction, who: discord.Member) -> None:
            await interaction.response.send_message(f"Forget {who.display_name}?", view=self.view)

        self.tree.add_command(memory, guild=discord.Object(guild_id))

    async def setup_hook(self) -> None:
        """Sync the guild commands."""
        await self.tree.sync(guild=discord.Object(self.guild_id))

    async def on_message(self, message: discord.Message) -> None:
        """Record human messages."""
        if not message.author.bot:
            self.messages.put_nowait(message)


async def test_members_intent_threads_subcommands_and_buttons(
    fake: FakeDiscord, monkeypatch: pytest.MonkeyPatch
) -> None:
    guild = fake.add_guild("G")
    channel_id = guild.add_channel("general")
    thread_id = guild.add_thread(channel_id, "notes")
    alice = fake.add_user("alice")
    guild.add_member(alice)
    fake.install(monkeypatch)
    bot = MemberBot(guild.id)
    task = await start_bot(bot)
    try:
        cached = bot.get_guild(guild.id)
        assert cached is not None and cached.chunked and cached.get_member(alice.id) is not None
        assert isinstance(cached.get_thread(thread_id), discord.Thread)

        await fake.send_message(thread_id, alice, "thread hello")
        message = await next_item(bot.messages)
        assert isinstance(message.channel, discord.Thread) and message.channel.parent_id == channel_id

        record = await fake.slash(guild.id, thread_id, alice, "memory forget", {"who": alice})
        assert record.payload["data"]["guild_id"] == str(guild.id)
        assert record.payload["data"]["options"][0]["type"] == 1
        [prompt] = await record.wait_done()
        assert prompt.content == "Forget alice?" and prompt.message["components"]

        click = await fake.click(thread_id, prompt.id, alice, "forget-confirm")
        assert await next_item(bot.view.clicked_by) == alice.id
        assert (await click.response()).type == 7
        assert prompt.content == "forgotten" and prompt.message["components"] == []
    finally:
        await stop_bot(bot, task)


class ShardClient(discord.AutoShardedClient):
    """An unmodified AutoShardedClient that records the messages it receives."""

    def __init__(self, **options: Any) -> None:
        """Default intents with message content; fast readiness."""
        intents = discord.Intents.default()
        intents.message_content = True
        super().__init__(intents=intents, guild_ready_timeout=0.05, **options)
        self.seen: list[discord.Message] = []

    async def on_message(self, message: discord.Message) -> None:
        """Record the message."""
        self.seen.append(message)

    async def before_identify_hook(self, shard_id: int | None, *, initial: bool = False) -> None:
        """No 5 s pause between a client's shards (the fake has no identify rate limit)."""


@contextlib.asynccontextmanager
async def sharded(**options: Any) -> AsyncIterator[ShardClient]:
    """A ShardClient logged in and ready (every shard), closed at the end."""
    client = ShardClient(**options)
    task = asyncio.create_task(client.start("token"))
    try:
        await asyncio.wait_for(client.wait_until_ready(), WAIT)
        yield client
    finally:
        await client.close()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait_for(task, WAIT)


async def test_gateway_bot_gives_the_shard_count_that_auto_sharding_follows(monkeypatch: pytest.MonkeyPatch) -> None:
    async with FakeDiscord(shard_count=3) as fake:
        fake.install(monkeypatch)
        guilds = [fake.add_guild(f"G{n}", shard=(n, 3)) for n in range(3)]
        async with sharded() as client:  # no shard_count: discord.py asks GET /gateway/bot
            assert fake.live_shards() == {"token": [(0, 3), (1, 3), (2, 3)]}
            assert [p["shard"] for p in fake.identify_payloads] == [[0, 3], [1, 3], [2, 3]]
            assert {g.id: g.shard_id for g in client.guilds} == {g.id: n for n, g in enumerate(guilds)}
            limits = await client.fetch_session_start_limits()
            assert (limits.total, limits.remaining, limits.max_concurrency) == (1000, 997, 1)


async def test_each_shard_receives_only_its_guilds_and_dms_come_on_shard_0(monkeypatch: pytest.MonkeyPatch) -> None:
    async with FakeDiscord(shard_count=4) as fake:
        fake.install(monkeypatch)
        guilds = [fake.add_guild(f"G{n}", shard=(n, 4)) for n in range(4)]
        assert [(g.id >> 22) % 4 for g in guilds] == [0, 1, 2, 3]
        channels = [g.add_channel("general") for g in guilds]
        alice = fake.add_user("alice")
        for guild in guilds:
            guild.add_member(alice)
        async with sharded(shard_count=4, shard_ids=[0, 1]) as low, sharded(shard_count=4, shard_ids=[2, 3]) as high:
            assert {g.id for g in low.guilds} == {guilds[0].id, guilds[1].id}
            assert {g.id for g in high.guilds} == {guilds[2].id, guilds[3].id}
            for n in range(4):  # READY and GUILD_CREATE: each shard its own guild only
                [ready] = fake.events_on_shard(n, "READY")
                assert ready["shard"] == [n, 4] and [g["id"] for g in ready["guilds"]] == [str(guilds[n].id)]
                assert [g["id"] for g in fake.events_on_shard(n, "GUILD_CREATE")] == [str(guilds[n].id)]
            sent = [await fake.send_message(channel, alice, f"hello {n}") for n, channel in enumerate(channels)]
            dm = fake.dm_channel(alice)
            await fake.send_message(dm, alice, "psst")

            async def delivered() -> bool:
                return len(low.seen) == 3 and len(high.seen) == 2

            await until(delivered)
            assert sorted(m.content for m in low.seen) == ["hello 0", "hello 1", "psst"]
            assert sorted(m.content for m in high.seen) == ["hello 2", "hello 3"]
            assert [m["content"] for m in fake.events_on_shard(0, "MESSAGE_CREATE")] == ["hello 0", "psst"]
            await fake.delete_message(channels[2], int(sent[2]["id"]))
            await fake.delete_message(dm, int(fake.history(dm)[0]["id"]))
            deletes = {n: [e["channel_id"] for e in fake.events_on_shard(n, "MESSAGE_DELETE")] for n in range(4)}
            assert deletes == {0: [str(dm)], 1: [], 2: [str(channels[2])], 3: []}
            await fake.interact(guild_id=None, channel_id=dm, user=alice, data={"id": "1", "name": "x", "type": 1})
            await fake.interact(guild_id=guilds[3].id, channel_id=channels[3], user=alice,
                                data={"id": "2", "name": "y", "type": 1})
            interactions = {n: [e["data"]["name"] for e in fake.events_on_shard(n, "INTERACTION_CREATE")]
                            for n in range(4)}
            assert interactions == {0: ["x"], 1: [], 2: [], 3: ["y"]}


async def test_an_invalid_shard_is_closed_with_4010(fake: FakeDiscord) -> None:
    async with aiohttp.ClientSession() as session:
        for shard in ([4, 4], [0, 0], [-1, 2], "0"):
            async with session.ws_connect(str(fake.gateway_url) + "?v=10&encoding=json") as ws:
                hello = await ws.receive_json(timeout=WAIT)
                assert hello["op"] == 10
                await ws.send_json({"op": 2, "d": {"token": "t", "intents": 513, "shard": shard, "properties": {}}})
                closed = await ws.receive(timeout=WAIT)
                assert closed.type is aiohttp.WSMsgType.CLOSE and closed.data == 4010, shard
    assert not fake.live_shards()
