"""The persona answers when mentioned, replied to, or written to directly."""

from __future__ import annotations

import asyncio
import logging
import re

import discord
from discord.ext import commands

from bot.bot import PersonaBot
from bot.cogs.observe import message_stream, watched
from bot.render import split_message
from memstream import MemstreamError, ProviderError, Source, StoreDamaged

__all__ = ["ChatCog", "setup"]

log = logging.getLogger("bot.chat")


class ChatCog(commands.Cog):
    """Answers with the agent prompt filled from retrieved memories and the channel's last messages."""

    def __init__(self, bot: PersonaBot) -> None:
        self.bot = bot
        self.tasks: set[asyncio.Task[None]] = set()

    async def cog_unload(self) -> None:
        for task in self.tasks:
            task.cancel()

    def addressed(self, message: discord.Message, channel: discord.abc.Messageable) -> bool:
        """Mentioned, replied to, or in a DM; never to itself, to bots only with answer_bots."""
        me = self.bot.user
        if me is None or message.author.id == me.id:
            return False
        if message.author.bot and not self.bot.persona.discord.answer_bots:
            return False
        if not watched(self.bot, channel):
            return False
        if isinstance(message.channel, discord.DMChannel):
            return True
        if me in message.mentions:
            return True
        ref = message.reference.resolved if message.reference else None
        return isinstance(ref, discord.Message) and ref.author.id == me.id

    @commands.Cog.listener()
    async def on_message(self, message: discord.Message) -> None:
        if self.addressed(message, await self.bot.resolve_channel(message.channel)):
            task = asyncio.create_task(self.answer(message), name=f"answer-{message.id}")
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)

    def query_of(self, message: discord.Message) -> str:
        """The message as a query: its text without the mention of the persona."""
        me = self.bot.user
        text = message.content
        if me is not None:
            text = re.sub(rf"<@!?{me.id}>", "", text)
            text = text.replace(f"@{me.display_name}", "")
        cleaned = " ".join(text.split())
        if not cleaned and message.attachments:
            cleaned = " ".join(f"[attachment: {a.filename}]" for a in message.attachments)
        return cleaned or "(says nothing, but mentions you)"

    async def situation(self, message: discord.Message, query: str) -> str:
        """Where the persona is, who said what lately, and what it was just asked."""
        channel = message.channel
        where = "a direct message" if isinstance(channel, discord.DMChannel) else f"#{getattr(channel, 'name', '?')}"
        lines: list[str] = []
        limit = self.bot.persona.discord.history
        if limit:
            try:
                async for earlier in channel.history(limit=limit, before=message):
                    body = " ".join(earlier.clean_content.split())[:300]
                    if body:
                        lines.append(f"{earlier.author.display_name}: {body}")
            except discord.HTTPException as exc:
                log.info("no channel history for the situation: %s", exc)
        recent = "\n".join(reversed(lines))
        recent_block = f" The last messages there were:\n{recent}\n" if recent else " "
        return (f"You are in {where} on Discord.{recent_block}"
                f'{message.author.display_name} says to you: "{query}"')

    async def answer(self, message: discord.Message) -> None:
        """Think (typing), answer in parts of at most 2,000 characters, record what the reply was built from."""
        memory, me = self.bot.memory, self.bot.user
        assert me is not None
        query = self.query_of(message)
        try:
            async with message.channel.typing():
                situation = await self.situation(message, query)
                reply = await memory.respond(
                    query, stream=message_stream(message), situation=situation,
                    speaker=message.author.display_name, observe_message=False,
                    exclude_message=str(message.id), defer_reply=True,
                    # whose message it answers: forgetting that message (or its author) forgets the trace
                    source=Source(author_id=str(message.author.id), message_id=str(message.id)),
                    reply_source=Source(author=self.bot.persona.name, author_id=str(me.id),
                                        channel=getattr(message.channel, "name", None),
                                        channel_id=str(message.channel.id)),
                )
        except ProviderError as exc:
            log.warning("could not answer message %s: %s", message.id, exc)
            await self._send_safe(message, "Sorry, I can't think straight right now. Try me again in a bit.")
            return
        except StoreDamaged as exc:
            self.bot.report_damage(message_stream(message), exc)
            await self._send_safe(message, "Sorry, my memory of this place is damaged; I've told my keeper.")
            return
        except MemstreamError as exc:  # the store could not take the reply (full, locked, away): say so
            log.error("could not answer message %s: %s", message.id, exc)
            await self._send_safe(message, "Sorry, I couldn't answer that just now. Try me again in a bit.")
            return
        # The reply and its trace are stored (the reply as a pending memory): send first, then rate and embed
        # it, so that an answer waits for no model call but the agent's.
        sent: list[str] = []
        for n, part in enumerate(split_message(reply.text) if reply.text.strip() else []):
            msg = await self._send_safe(message, part, first=n == 0)
            if msg is None:
                break
            sent.append(str(msg.id))
        try:
            if sent:
                await memory.reply_sent(reply, sent)
            else:
                await memory.reply_unsent(reply)
        except MemstreamError as exc:  # the reply is out; its memory stays pending and is completed later
            log.warning("could not record the reply to message %s: %s", message.id, exc)

    async def _send_safe(self, message: discord.Message, text: str, *, first: bool = True) -> discord.Message | None:
        mentions = discord.AllowedMentions(everyone=False, users=False, roles=False, replied_user=first)
        try:
            if first:
                return await message.reply(text, allowed_mentions=mentions)
            return await message.channel.send(text, allowed_mentions=mentions)
        except discord.HTTPException as exc:
            log.warning("could not send a reply in %s: %s", message.channel.id, exc)
            return None


async def setup(bot: commands.Bot) -> None:
    """Load the cog."""
    assert isinstance(bot, PersonaBot)
    await bot.add_cog(ChatCog(bot))
