"""A reply that grows on Discord as the agent model writes it: the first message within a second of the first
words, then edits no faster than Discord allows, split into more messages past 2,000 characters exactly as
bot/render.py splits a whole reply."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

import discord

from bot.render import LIMIT, split_message
from memstream import ReplyDraft

__all__ = ["CURSOR", "CUT_NOTE", "EDIT_EVERY", "FIRST_AFTER", "EditPace", "GrowingReply"]

CURSOR = " ▌"  # at the end of a reply still being written
CUT_NOTE = "\n-# (cut off: I lost my train of thought)"  # under a reply whose stream broke (not remembered)
FIRST_AFTER = 0.5  # seconds of words gathered before the first message
EDIT_EVERY = 1.25  # seconds between two edits of a growing reply
TICK = 0.1

Send = Callable[[str, bool], Awaitable[discord.Message | None]]  # (text, first part) -> the message, None: failed
Edit = Callable[[discord.Message, str, bool], Awaitable[bool]]  # (message, text, first part) -> delivered


class EditPace:
    """Per channel, when the bot's recent edits were: a growing reply edits while there is room under Discord's
    limit (about 5 edits per 5 s per channel), keeping room for the edit that ends a reply."""

    def __init__(self, limit: int = 5, window: float = 5.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.limit, self.window, self.clock = limit, window, clock
        self._times: dict[int, list[float]] = {}

    def _recent(self, channel_id: int) -> list[float]:
        now = self.clock()
        times = self._times[channel_id] = [t for t in self._times.get(channel_id, []) if now - t < self.window]
        return times

    def room(self, channel_id: int, *, keep: int = 1) -> bool:
        """Whether an edit now leaves `keep` edits to spare in the window."""
        return len(self._recent(channel_id)) < self.limit - keep

    def until_room(self, channel_id: int) -> float:
        """Seconds until an edit is allowed (0: now)."""
        recent = self._recent(channel_id)
        return 0.0 if len(recent) < self.limit else max(0.01, self.window - (self.clock() - recent[0]))

    async def take(self, channel_id: int) -> None:
        """Wait until an edit is allowed, and count it."""
        delay = self.until_room(channel_id)
        while delay:
            await asyncio.sleep(delay)
            delay = self.until_room(channel_id)
        self._recent(channel_id).append(self.clock())


class GrowingReply:
    """The messages of one reply on Discord while its draft is written, and the text they carry."""

    def __init__(self, send: Send, edit: Edit, pace: EditPace, channel_id: int, *, first_after: float = FIRST_AFTER,
                 edit_every: float = EDIT_EVERY, writing: dict[int, asyncio.Event] | None = None) -> None:
        self.send, self.edit, self.pace, self.channel_id = send, edit, pace, channel_id
        self.first_after, self.edit_every = first_after, edit_every
        # Each message of the reply, while it is written (`written` sets its event and drops it).
        self.writing = {} if writing is None else writing
        self._written = asyncio.Event()
        self.messages: list[discord.Message] = []
        self.parts: list[str] = []  # what each message shows
        self.delivered = ""  # the reply text the messages carry in full
        self.failed = False
        self.forgotten = False  # the message it answers was deleted meanwhile: the reply is not to be stored
        self._shown_at = 0.0

    @property
    def message_ids(self) -> list[str]:
        """The ids of the messages carrying the reply."""
        return [str(m.id) for m in self.messages]

    def written(self) -> None:
        """The reply is stored (or never will be): whoever waits on one of its messages goes on."""
        self._written.set()
        for sent in self.messages:
            self.writing.pop(sent.id, None)

    async def run(self, draft: ReplyDraft, on_first: Callable[[], Awaitable[None]]) -> str:
        """Show the draft as it is written (`on_first` once the first message is out); the text delivered ("" if
        nothing could be sent). The draft's ProviderError if it failed before any text."""
        pump = asyncio.create_task(_drain(draft), name="reply-stream")
        loop = asyncio.get_running_loop()
        first_at: float | None = None
        try:
            while not pump.done():
                await asyncio.wait({pump}, timeout=TICK)
                if pump.done() or self.failed or not draft.text.strip():
                    continue
                now = loop.time()
                first_at = first_at or now
                due = now - self._shown_at >= self.edit_every if self.messages else now - first_at >= self.first_after
                if due:
                    await self._show(draft.text, final=False, on_first=on_first)
            pump.result()
        finally:
            if not pump.done():
                pump.cancel()
        await self._show(draft.text, final=True, on_first=on_first, note=CUT_NOTE if draft.cut else "")
        return self.delivered

    async def _show(self, text: str, *, final: bool, on_first: Callable[[], Awaitable[None]], note: str = "") -> None:
        """Bring the messages up to `text` (edits only as the pace allows, but the final one waits for room)."""
        text = text.strip()
        if self.failed or not text:
            return
        parts = split_message(text + note)
        if not final and len(parts[-1]) + len(CURSOR) <= LIMIT:
            parts[-1] += CURSOR
        self._shown_at = asyncio.get_running_loop().time()
        for i, part in enumerate(parts):
            if i < len(self.messages):
                if self.parts[i] == part:
                    continue
                if not final and not self.pace.room(self.channel_id):
                    return  # at the next tick
                await self.pace.take(self.channel_id)
                if not await self.edit(self.messages[i], part, i == 0):
                    self.failed = True
                    return
                self.parts[i] = part
            else:
                sent = await self.send(part, i == 0)
                if sent is None:
                    self.failed = True
                    return
                self.messages.append(sent)
                self.parts.append(part)
                self.writing[sent.id] = self._written
                if i == 0:
                    await on_first()
        self.delivered = text


async def _drain(draft: ReplyDraft) -> None:
    async for _ in draft.deltas():
        pass
