"""PersonaBot: a discord.py commands.Bot that lives in channels as one memstream persona."""

from __future__ import annotations

import asyncio
import logging
import re

import discord
from discord import app_commands
from discord.ext import commands

from bot.health import write_status
from bot.scheduler import ReflectionScheduler
from bot.sharding import Shards
from memstream import MemoryNotFound, MemoryStream, MemstreamError, PersonaConfig

__all__ = ["COGS", "OneLineReconnects", "PersonaBot", "ShardedPersonaBot", "invite_url", "make_bot", "stream_key"]

log = logging.getLogger("bot")
COGS = ("bot.cogs.observe", "bot.cogs.chat", "bot.cogs.memory", "bot.cogs.mydata")
# How long closing waits for queued observations to be stored (SIGTERM: a container stops within seconds).
CLOSE_DRAIN_SECONDS = 5.0
# A stream key in an error text ("in stream 'guild:2100'"): shown to people as "in this server".
_STREAM_NAME = re.compile(r"in stream '?(?:guild|dm):\d+'?")
# Discord lets a bot identify once per 5 s (per max_concurrency bucket): a process with several shards waits
# this long between its shards' logins (discord.py's own default).
IDENTIFY_SECONDS = 5.0


def stream_key(guild_id: int | None, user_id: int) -> str:
    """The memory stream of a server, or of a direct-message conversation."""
    return f"guild:{guild_id}" if guild_id is not None else f"dm:{user_id}"


def invite_url(client_id: int) -> str:
    """The link that adds the persona to a server: the bot and its slash commands, with the permissions it
    uses (view channels, read history, send messages and threads' messages)."""
    permissions = discord.Permissions(view_channel=True, read_message_history=True, send_messages=True,
                                      send_messages_in_threads=True)
    return (f"https://discord.com/oauth2/authorize?client_id={client_id}&scope=bot+applications.commands"
            f"&permissions={permissions.value}")


class OneLineReconnects(logging.Filter):
    """discord.py logs every reconnect attempt with a full traceback; an outage would fill the log. This makes
    each attempt one warning line: what failed, and the delay before the next try."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info and str(record.msg).startswith("Attempting a reconnect"):
            exc = record.exc_info[1]
            record.msg = f"Discord unreachable ({type(exc).__name__}: {exc}); " + str(record.msg).lower()
            record.exc_info, record.exc_text, record.levelno, record.levelname = None, None, logging.WARNING, "WARNING"
        return True


class NoVoiceNotices(logging.Filter):
    """discord.py warns at every start that voice's libraries (PyNaCl, davey) are missing: the persona never
    speaks in voice channels, so the warning is only noise for the operator."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "voice will NOT be supported" not in str(record.msg)


def intents() -> discord.Intents:
    """What the persona needs: servers, messages and their content (a privileged intent)."""
    wanted = discord.Intents.none()
    wanted.guilds = True
    wanted.guild_messages = True
    wanted.dm_messages = True
    wanted.message_content = True
    return wanted


class PersonaTree(app_commands.CommandTree[discord.Client]):
    """The command tree: its errors go to the bot's one handler."""

    async def on_error(self, interaction: discord.Interaction[discord.Client],
                       error: app_commands.AppCommandError) -> None:
        bot = self.client
        assert isinstance(bot, PersonaBot)
        await bot.on_app_command_error(interaction, error)


class PersonaBot(commands.Bot):
    """The persona on Discord; its memory and config come in through the constructor."""

    sharding: Shards | None = None  # (not "shards": AutoShardedClient.shards is discord.py's)

    def __init__(self, memory: MemoryStream, persona: PersonaConfig, **options: object) -> None:
        super().__init__(
            command_prefix=commands.when_mentioned, intents=intents(), help_command=None,
            allowed_mentions=discord.AllowedMentions(everyone=False, users=False, roles=False, replied_user=True),
            tree_cls=PersonaTree, **options,  # type: ignore[arg-type]
        )
        self.memory = memory
        self.persona = persona
        self.reflections = ReflectionScheduler(memory, check_minutes=persona.discord.reflect_check_minutes,
                                               owns=self.sharding.owns if self.sharding is not None else None)
        self._synced: set[int] = set()
        self._channels: dict[int, object] = {}
        self.damaged: set[str] = set()  # streams whose damaged storage was reported (once each)
        # The messages of replies still being written, each with an event set once the reply and its trace are
        # stored: "Why this reply?" on one of them waits for it.
        self.writing: dict[int, asyncio.Event] = {}
        self._announced = False

    def report_damage(self, stream: str, exc: MemstreamError) -> None:
        """Log damaged storage once per stream; the bot goes on serving the streams it can read."""
        if stream not in self.damaged:
            self.damaged.add(stream)
            log.error("the database is damaged where stream %s is stored: %s; other streams are still served "
                      "(copy out what can be read with: memstream salvage SRC DEST)", stream, exc)

    async def process_commands(self, message: discord.Message) -> None:
        """No text commands: a mention is a message to the persona (ChatCog answers it), never a command
        to look up (which would log "CommandNotFound" with a traceback for every mention)."""

    async def setup_hook(self) -> None:
        """Load the cogs, start the scheduler, sync commands to the configured servers."""
        for name in COGS:
            await self.load_extension(name)
        self.memory.on_reflection_due = self.reflections.request
        self.reflections.start()
        if self.sharding is None or self.sharding.dms:  # the configured servers: synced by the shard-0 process
            for guild_id in self.persona.discord.guilds:
                await self.sync_guild(guild_id)

    async def sync_guild(self, guild_id: int) -> None:
        """Sync the slash commands to one server (never globally: that takes an hour to spread)."""
        if guild_id in self._synced:
            return
        guild = discord.Object(id=guild_id)
        self.tree.copy_global_to(guild=guild)
        await self.tree.sync(guild=guild)
        self._synced.add(guild_id)

    async def on_resumed(self) -> None:
        """The gateway is back: healthy again."""
        write_status("connected")

    async def on_disconnect(self) -> None:
        """The gateway dropped (discord.py reconnects by itself): unhealthy until it is back."""
        write_status("disconnected")

    async def on_ready(self) -> None:
        """One start-up line: who is online, where, and how to invite it (again after a reconnect's resume)."""
        write_status("connected")
        if self._announced or self.user is None:
            return
        self._announced = True
        servers = ", ".join(f"{g.name} ({g.id})" for g in self.guilds[:10]) + (", ..." if len(self.guilds) > 10
                                                                                 else "")
        where = f" on {self.sharding.describe()}" if self.sharding is not None else ""
        log.info("%s is online as %s (id %s)%s in %d server(s): %s; invite: %s", self.persona.name, self.user,
                 self.user.id, where, len(self.guilds), servers or "none yet", invite_url(self.user.id))

    async def on_guild_available(self, guild: discord.Guild) -> None:
        """With no servers configured, sync to each server the persona is in, once per process (sharded, a
        server's events reach one process only: each server is synced once, by the process serving it)."""
        if not self.persona.discord.guilds:
            try:
                await self.sync_guild(guild.id)
            except discord.HTTPException as exc:
                log.warning("could not sync commands to %s: %s", guild.id, exc)

    async def resolve_channel(self, channel: discord.abc.Messageable) -> discord.abc.Messageable:
        """The full channel behind a partial one (a thread the cache has not seen), fetched once."""
        if not isinstance(channel, discord.PartialMessageable):
            return channel
        cached = self._channels.get(channel.id) or self.get_channel(channel.id)
        if cached is None:
            try:
                cached = await self.fetch_channel(channel.id)
            except discord.HTTPException as exc:
                log.info("channel %s cannot be fetched: %s", channel.id, exc)
                return channel
            self._channels[channel.id] = cached
        return cached if isinstance(cached, discord.abc.Messageable) else channel

    async def close(self) -> None:
        """Stop the scheduler, store what is still queued (a few seconds at most), then disconnect."""
        self.reflections.shutdown()
        observe = self.get_cog("ObserveCog")
        if observe is not None and not self.is_closed():
            try:
                await asyncio.wait_for(observe.drained(), CLOSE_DRAIN_SECONDS)  # type: ignore[attr-defined]
            except TimeoutError:
                log.warning("closing before every observation was done: %s",
                            observe.unsettled())  # type: ignore[attr-defined]
        write_status("stopped")
        await super().close()
        if observe is not None:  # an edit or deletion the gateway delivered meanwhile: the memory outlives it
            try:
                await asyncio.wait_for(observe.changes.still(), CLOSE_DRAIN_SECONDS)  # type: ignore[attr-defined]
            except TimeoutError:
                log.warning("closing while an edit or deletion is still being applied: it may not be in the memory")

    async def on_app_command_error(self, interaction: discord.Interaction[discord.Client],
                                   error: app_commands.AppCommandError) -> None:
        """One place for command errors: ours become a friendly ephemeral reply, the rest is logged."""
        cause = error.original if isinstance(error, app_commands.CommandInvokeError) else error
        place = "this server" if interaction.guild is not None else "this conversation"
        if isinstance(cause, MemoryNotFound) and cause.memory_id is not None:
            text = f"Sorry: there is no memory #{cause.memory_id} in {place}."
        elif isinstance(cause, MemstreamError):  # never an internal name such as a stream key
            text = "Sorry: " + _STREAM_NAME.sub(f"in {place}", str(cause))
        elif isinstance(cause, app_commands.CheckFailure):
            text = str(cause) or "You are not allowed to do that here."
        else:
            log.error("command %s failed", interaction.command and interaction.command.name, exc_info=cause)
            text = "Something went wrong; it has been logged."
        try:
            if interaction.response.is_done():
                await interaction.followup.send(text[:2000], ephemeral=True)
            else:
                await interaction.response.send_message(text[:2000], ephemeral=True)
        except discord.HTTPException:
            log.warning("could not report an error to the user")


class ShardedPersonaBot(PersonaBot, commands.AutoShardedBot):
    """The persona on some of the bot's shards (discord.py's AutoShardedBot): it serves, reflects on and retries
    only the streams of those shards; the configured servers' commands are synced by the shard-0 process."""

    def __init__(self, memory: MemoryStream, persona: PersonaConfig, shards: Shards, **options: object) -> None:
        self.sharding = shards
        super().__init__(memory, persona, shard_count=shards.count, shard_ids=list(shards.ids), **options)

    async def before_identify_hook(self, shard_id: int | None, *, initial: bool = False) -> None:
        """Wait between this process's shard logins (Discord's identify rate limit)."""
        if not initial:
            await asyncio.sleep(IDENTIFY_SECONDS)


def make_bot(memory: MemoryStream, persona: PersonaConfig, shards: Shards | None = None,
             **options: object) -> PersonaBot:
    """The persona's bot: one unsharded connection, or the given shards of a sharded bot."""
    if shards is None:
        return PersonaBot(memory, persona, **options)
    return ShardedPersonaBot(memory, persona, shards, **options)
