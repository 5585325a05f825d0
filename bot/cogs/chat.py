"""The persona answers when mentioned, replied to, or written to directly."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
from collections.abc import Iterable
from datetime import datetime

import discord
from discord.ext import commands

from bot.bot import PersonaBot
from bot.cogs.observe import message_stream, watched
from bot.streaming import EDIT_EVERY, FIRST_AFTER, EditPace, GrowingReply
from memstream import BudgetSpent, MemstreamError, ProviderError, Source, StoreDamaged

__all__ = ["ChatCog", "setup"]

log = logging.getLogger("bot.chat")


class ChatCog(commands.Cog):
    """Answers with the agent prompt filled from retrieved memories and the channel's last messages."""

    def __init__(self, bot: PersonaBot) -> None:
        self.bot = bot
        self.tasks: set[asyncio.Task[None]] = set()
        self.pace = EditPace()  # the edits of every growing reply, per channel
        # the message answered -> its reply while written, and its text (an edit that changes it forgets it)
        self.answering: dict[int, tuple[GrowingReply, str]] = {}
        self.first_after, self.edit_every = FIRST_AFTER, EDIT_EVERY
        # Channel id -> the renewal of the spent budget it was told of: a decline once per channel and budget day.
        self.declined: dict[int, datetime | None] = {}

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

    @commands.Cog.listener()
    async def on_raw_message_delete(self, payload: discord.RawMessageDeleteEvent) -> None:
        self._question_gone([payload.message_id])

    @commands.Cog.listener()
    async def on_raw_bulk_message_delete(self, payload: discord.RawBulkMessageDeleteEvent) -> None:
        self._question_gone(payload.message_ids)

    @commands.Cog.listener()
    async def on_raw_message_edit(self, payload: discord.RawMessageUpdateEvent) -> None:
        answering = self.answering.get(payload.message_id)
        if answering is not None and payload.data.get("content", answering[1]) != answering[1]:
            self._question_gone([payload.message_id])

    def _question_gone(self, message_ids: Iterable[int]) -> None:
        """A message being answered was deleted (or its text edited): its reply is built from what is forgotten,
        so it is not remembered either (whatever was already sent of it stays on Discord)."""
        for message_id in message_ids:
            if message_id in self.answering:
                self.answering[message_id][0].forgotten = True

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
        """Think (typing), answer as the words come (one message growing by edits, more past 2,000 characters),
        record what the reply was built from and what of it was sent."""
        growing = GrowingReply(lambda text, first: self._send_safe(message, text, first=first), self._edit_safe,
                               self.pace, message.channel.id, first_after=self.first_after,
                               edit_every=self.edit_every, writing=self.bot.writing)
        self.answering[message.id] = (growing, message.content)
        try:
            await self._answer(message, growing)
        finally:
            growing.written()
            self.answering.pop(message.id, None)

    async def _answer(self, message: discord.Message, growing: GrowingReply) -> None:
        memory, me = self.bot.memory, self.bot.user
        assert me is not None
        query = self.query_of(message)
        try:
            async with contextlib.AsyncExitStack() as typing:  # typing until the first words are out
                await typing.enter_async_context(message.channel.typing())
                situation = await self.situation(message, query)
                draft = await memory.start_reply(
                    query, stream=message_stream(message), situation=situation,
                    speaker=message.author.display_name, observe_message=False, exclude_message=str(message.id),
                    # whose message it answers: forgetting that message (or its author) forgets the trace
                    source=Source(author_id=str(message.author.id), message_id=str(message.id)),
                    reply_source=Source(author=self.bot.persona.name, author_id=str(me.id),
                                        channel=getattr(message.channel, "name", None),
                                        channel_id=str(message.channel.id)),
                )
                delivered = await growing.run(draft, typing.aclose)
        except BudgetSpent as exc:
            await self._decline(message, exc)
            return
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
        if draft.cut is not None:
            log.warning("the reply to message %s broke off: %s", message.id, draft.cut)
        # What was sent is what the persona said: stored with its trace once it is out, then rated and embedded,
        # so that an answer waits for no model call but the agent's. Nothing sent: nothing said.
        if not delivered or growing.forgotten:
            await draft.close()
            return
        try:
            reply = await draft.finish(delivered)
            await memory.link_reply(reply, growing.message_ids)
            growing.written()  # "Why this reply?" can answer now
            await memory.reply_sent(reply, [])
        except MemstreamError as exc:  # the reply is out; its memory stays pending and is completed later
            log.warning("could not record the reply to message %s: %s", message.id, exc)

    async def _decline(self, message: discord.Message, exc: BudgetSpent) -> None:
        """The day's budget is spent (the persona file's [budget]): say so once in this channel until it renews;
        later mentions that day get no reply (they are still remembered)."""
        channel = message.channel.id
        if self.declined.get(channel) == exc.until:
            log.info("no reply to message %s (told in this channel already): %s", message.id, exc)
            return
        self.declined[channel] = exc.until
        log.warning("declined message %s: %s", message.id, exc)
        until = "tomorrow" if exc.until is None else f"<t:{int(exc.until.timestamp())}:t>"
        await self._send_safe(message, f"Sorry, I've used up my thinking for today and can't answer until {until}. "
                                       "I'm still listening, and I'll remember what's said here.")

    async def _send_safe(self, message: discord.Message, text: str, *, first: bool = True) -> discord.Message | None:
        try:
            if first:
                return await message.reply(text, allowed_mentions=_mentions(first))
            return await message.channel.send(text, allowed_mentions=_mentions(first))
        except discord.HTTPException as exc:
            log.warning("could not send a reply in %s: %s", message.channel.id, exc)
            return None

    async def _edit_safe(self, sent: discord.Message, text: str, first: bool) -> bool:
        try:
            await sent.edit(content=text, allowed_mentions=_mentions(first))
        except discord.HTTPException as exc:
            log.warning("could not edit a reply in %s: %s", sent.channel.id, exc)
            return False
        return True


def _mentions(first: bool) -> discord.AllowedMentions:
    """A reply pings nobody (its text is the model's: @everyone, roles and users stay text); only the first
    part of it, a reply to the message, notifies its author."""
    return discord.AllowedMentions(everyone=False, users=False, roles=False, replied_user=first)


async def setup(bot: commands.Bot) -> None:
    """Load the cog."""
    assert isinstance(bot, PersonaBot)
    await bot.add_cog(ChatCog(bot))
