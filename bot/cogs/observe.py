"""Every message in a watched channel becomes an observation in its server's stream; Discord is followed
when messages are edited or deleted and when the bot leaves a server."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
from collections import OrderedDict, deque

import discord
from discord.ext import commands

from bot.bot import PersonaBot, stream_key
from bot.changes import Changes, Edit
from memstream import MemstreamError, Observation, Source, StoreDamaged, StoreError
from memstream.ingest import retry_delay

__all__ = ["ObserveCog", "attributed", "setup"]

log = logging.getLogger("bot.observe")
BURST_WINDOW = 0.05   # seconds to gather a burst into one batch
BATCH = 256
# Stored observations waiting for their model calls. Past this many, the rest wait in the database only
# (pending), where the scheduler's retry finds them: memory stays bounded through a long model outage.
MAX_BACKLOG = 20_000
# A batch the store cannot take (a full disk, a lock held too long) stays queued and is tried again after
# STORE_RETRY seconds, doubling up to STORE_RETRY_CAP (memstream's one retry formula, retry_delay).
STORE_RETRY = 1.0
STORE_RETRY_CAP = 60.0
_SURROGATE = re.compile("[\ud800-\udfff]")


def attributed(message: discord.Message, channel: object = None) -> str | None:
    """'Klaus in #general: …' with mentions as names, attachments and stickers named; None if empty."""
    text = message.clean_content.strip()
    extras = [f"[attachment: {a.filename}]" for a in message.attachments]
    extras += [f"[sticker: {s.name}]" for s in message.stickers]
    # A lone surrogate (valid JSON, not UTF-8) could not be stored: it becomes U+FFFD, the rest is kept.
    body = _SURROGATE.sub("\ufffd", " ".join([text, *extras]).strip())
    if not body:
        return None
    channel = channel or message.channel
    if isinstance(channel, discord.DMChannel):
        where = "in a direct message"
    else:
        name = getattr(channel, "name", None)
        where = f"in #{name}" if name else "in a channel"
    return f"{message.author.display_name} {where}: {body}"


def watched(bot: PersonaBot, channel: discord.abc.Messageable) -> bool:
    """Whether the persona listens in this channel (threads follow their parent channel)."""
    if isinstance(channel, discord.DMChannel):
        return bot.persona.discord.dms
    allowed = bot.persona.discord.channels
    if not allowed:
        return True
    parent = getattr(channel, "parent_id", None)
    return getattr(channel, "id", None) in allowed or (parent is not None and parent in allowed)


def message_stream(message: discord.Message) -> str:
    """The stream a message belongs to."""
    if message.guild is not None:
        return stream_key(message.guild.id, message.author.id)
    other = getattr(message.channel, "recipient", None) or message.author
    return stream_key(None, other.id)


class ObserveCog(commands.Cog):
    """Queues observations and writes them in batches, off the gateway's event handlers: each batch is
    stored first (pending, no model call), then rated and embedded by a second worker, so a slow or
    failing model never keeps a message only in memory."""

    def __init__(self, bot: PersonaBot) -> None:
        self.bot = bot
        self.queue: OrderedDict[str, Observation] = OrderedDict()
        self.wake = asyncio.Event()
        self.backlog: deque[int] = deque()   # stored, waiting for their model calls
        self.more = asyncio.Event()
        self.deleted: OrderedDict[str, None] = OrderedDict()   # recent deletions, to catch races
        self.workers: list[asyncio.Task[None]] = []
        self.idle = asyncio.Event()
        self.idle.set()
        self._busy = 0
        self.storing = 0  # observations of the batch being stored now
        self.completing = 0  # stored ones whose model calls are running now
        self.store_retry = STORE_RETRY  # seconds before a batch the store refused is tried again (doubling)
        self.store_failures = 0  # in a row
        self.in_store: set[str] = set()  # message ids of the batch being stored now
        self.raced: dict[str, Edit] = {}  # edits of those messages, applied once the batch is in
        # Edits and deletions the store could not take at once, tried again until they are in.
        self.changes = Changes(bot.memory, retry=STORE_RETRY, cap=STORE_RETRY_CAP)

    async def cog_load(self) -> None:
        self.workers = [asyncio.create_task(self._work(), name="observe-store"),
                        asyncio.create_task(self._complete(), name="observe-complete"),
                        asyncio.create_task(self.changes.run(), name="observe-changes")]

    async def cog_unload(self) -> None:
        for worker in self.workers:
            worker.cancel()
        for worker in self.workers:
            with contextlib.suppress(asyncio.CancelledError):
                await worker

    def wants(self, message: discord.Message, channel: discord.abc.Messageable) -> bool:
        """The rule for whose messages are observed: never the persona's own (its replies are observed
        when it makes them), other bots only with observe_bots, only in watched channels."""
        me = self.bot.user
        if me is not None and message.author.id == me.id:
            return False
        if message.author.bot and not self.bot.persona.discord.observe_bots:
            return False
        if message.type not in (discord.MessageType.default, discord.MessageType.reply):
            return False
        return watched(self.bot, channel)

    @commands.Cog.listener()
    async def on_message(self, message: discord.Message) -> None:
        channel = await self.bot.resolve_channel(message.channel)
        if not self.wants(message, channel):
            return
        text = attributed(message, channel)
        if text is None:
            return
        source = Source(author=message.author.display_name, author_id=str(message.author.id),
                        channel=getattr(channel, "name", None), channel_id=str(message.channel.id),
                        message_id=str(message.id), reply_to=_replied(message))
        self.queue[str(message.id)] = Observation(text, message_stream(message), self.bot.memory.now(), None, source)
        self.idle.clear()
        self.wake.set()

    async def _work(self) -> None:
        while True:
            await self.wake.wait()
            await asyncio.sleep(BURST_WINDOW)
            self.wake.clear()
            self._busy += 1
            try:
                while self.queue:
                    batch = [self.queue.popitem(last=False)[1] for _ in range(min(BATCH, len(self.queue)))]
                    self.storing = len(batch)
                    self.in_store = {o.source.message_id for o in batch if o.source.message_id}
                    try:
                        stored = await self._store(batch)
                    finally:
                        self.storing = 0
                        self.in_store = set()
                    if not stored:
                        self._requeue(batch)
                        self.store_failures += 1  # a full disk, a lock: try again by itself
                        await asyncio.sleep(retry_delay(self.store_failures, base=self.store_retry,
                                                        cap=STORE_RETRY_CAP))
                        continue
                    if self.store_failures:
                        log.warning("storing observations works again; %d queued one(s) left", len(self.queue))
                    self.store_failures = 0
                    await self._forget_raced(batch)
                    await self._edit_raced()
            finally:
                self._busy -= 1
                self._settle()

    def _requeue(self, batch: list[Observation]) -> None:
        """Put a batch that could not be stored back at the head of the queue (a deletion meanwhile wins, an edit
        meanwhile is its text)."""
        for observation in reversed(batch):
            key = observation.source.message_id or str(id(observation))
            if key in self.deleted or key in self.queue:  # deleted, or a newer edit queued meanwhile
                continue
            edit = self.raced.pop(key, None)
            if edit is not None:
                observation = Observation(edit.text, observation.stream, observation.at, observation.importance,
                                          observation.source)
            self.queue[key] = observation
            self.queue.move_to_end(key, last=False)

    async def _store(self, batch: list[Observation]) -> bool:
        """Store a batch (pending); False if the store could not take it now (kept, tried again)."""
        try:
            stored = await self.bot.memory.observe_many(batch, defer=True)
        except StoreDamaged as exc:
            streams = sorted({o.stream for o in batch})
            if len(streams) > 1:
                # One server's damaged pages must not cost the others their messages, nor be blamed on them:
                # each stream's part on its own (a part stored now is not stored twice when the batch is retried:
                # message ids are unique per stream).
                return all([await self._store([o for o in batch if o.stream == stream]) for stream in streams])
            self.bot.report_damage(streams[0], exc)  # once per stream: the log stays readable
            return False
        except StoreError as exc:
            if self.store_failures == 0:
                log.warning("could not store %d observation(s), they are kept in memory and tried again every "
                            "%d s at most: %s", len(batch), STORE_RETRY_CAP, exc)
            return False
        except MemstreamError as exc:
            log.error("could not store %d observation(s): %s", len(batch), exc)
            return True
        except Exception:
            log.exception("storing a batch of observations failed")
            return True
        fresh = [m.id for m in stored if m.status == "pending"]
        room = MAX_BACKLOG - len(self.backlog)
        if len(fresh) > room:
            log.info("%d stored observation(s) wait for the periodic retry (model calls are behind)",
                     len(fresh) - room)
        self.backlog.extend(fresh[:max(room, 0)])
        self.more.set()
        return True

    async def _complete(self) -> None:
        while True:
            await self.more.wait()
            self.more.clear()
            self._busy += 1
            try:
                while self.backlog:
                    ids = [self.backlog.popleft() for _ in range(min(BATCH, len(self.backlog)))]
                    self.completing = len(ids)
                    try:
                        await self.bot.memory.complete(ids)
                    except MemstreamError as exc:
                        log.error("could not complete %d observation(s), they stay pending: %s", len(ids), exc)
                    except Exception:
                        log.exception("completing a batch of observations failed; they stay pending")
                    finally:
                        self.completing = 0
            finally:
                self._busy -= 1
                self._settle()

    def _settle(self) -> None:
        if not self.queue and not self.backlog and not self._busy:
            self.idle.set()

    async def _forget_raced(self, batch: list[Observation]) -> None:
        raced = [o.source.message_id for o in batch if o.source.message_id in self.deleted]
        if raced:
            await self.changes.delete([m for m in raced if m])

    async def _edit_raced(self) -> None:
        """Edits that came while their message was being stored: applied now that it is."""
        raced, self.raced = self.raced, {}
        for key, edit in raced.items():
            await self.changes.edit(key, edit)

    def unsettled(self) -> str:
        """What is not done yet, for the log of a stop that could not wait: the queued observations are lost, the
        stored ones wait (pending) for their model calls, which the next start's retry makes."""
        parts = []
        if self.queue:
            parts.append(f"{len(self.queue)} queued observation(s) were not stored")
        if self.storing:
            parts.append(f"{self.storing} were being stored (each batch is stored whole or not at all)")
        pending = len(self.backlog) + self.completing
        if pending:
            parts.append(f"{pending} stored observation(s) are not rated and embedded yet: they are kept as pending, "
                         "and completed after the next start")
        if self.changes.unsettled():
            parts.append(self.changes.unsettled())
        return "; ".join(parts) or "nothing was left"

    async def drained(self) -> None:
        """Wait until every queued observation has been written and no edit or deletion is being applied (tests
        and shutdown)."""
        await self.idle.wait()
        await self.changes.still()

    async def _forget(self, message_ids: list[str]) -> None:
        for message_id in message_ids:
            self.queue.pop(message_id, None)
            self.deleted[message_id] = None
            self.raced.pop(message_id, None)
        while len(self.deleted) > 10_000:
            self.deleted.popitem(last=False)
        await self.changes.delete(message_ids)

    @commands.Cog.listener()
    async def on_raw_message_delete(self, payload: discord.RawMessageDeleteEvent) -> None:
        await self._forget([str(payload.message_id)])

    @commands.Cog.listener()
    async def on_raw_bulk_message_delete(self, payload: discord.RawBulkMessageDeleteEvent) -> None:
        await self._forget([str(i) for i in payload.message_ids])

    @commands.Cog.listener()
    async def on_raw_message_edit(self, payload: discord.RawMessageUpdateEvent) -> None:
        message = payload.message
        channel = await self.bot.resolve_channel(message.channel)
        if "content" not in payload.data or not self.wants(message, channel):
            return
        text = attributed(message, channel)
        key = str(message.id)
        if key in self.queue and text is not None:
            old = self.queue[key]
            self.queue[key] = Observation(text, old.stream, old.at, old.importance, old.source)
            return
        if text is None:
            await self._forget([key])
            return
        edit = Edit(message_stream(message), text)
        if key in self.in_store:  # its batch is being stored: the edit follows it
            self.raced[key] = edit
            return
        await self.changes.edit(key, edit)

    @commands.Cog.listener()
    async def on_guild_remove(self, guild: discord.Guild) -> None:
        removed = await self.bot.memory.purge(stream_key(guild.id, 0))
        log.info("left server %s: its stream (%d memories) is purged", guild.id, removed)


async def setup(bot: commands.Bot) -> None:
    """Load the cog."""
    assert isinstance(bot, PersonaBot)
    await bot.add_cog(ObserveCog(bot))


def _replied(message: discord.Message) -> str | None:
    """The id of the message this one replies to, where Discord says so (a reply, not a forward or a pin)."""
    reference = message.reference
    if reference is None or reference.message_id is None or message.type != discord.MessageType.reply:
        return None
    return str(reference.message_id)
