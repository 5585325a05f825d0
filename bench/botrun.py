"""The real bot, started against the fake Discord for a bench, and stopped cleanly however the bench ends."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from bot.bot import PersonaBot
from memstream import MemoryStream, PersonaConfig


@contextlib.asynccontextmanager
async def running(memory: MemoryStream, persona: PersonaConfig) -> AsyncIterator[PersonaBot]:
    """`persona`'s bot over `memory`, logged in (the fake Discord must be installed); closed with its memory."""
    bot = PersonaBot(memory, persona, guild_ready_timeout=0.05)
    task = asyncio.create_task(bot.start("token"))
    try:
        await asyncio.wait_for(bot.wait_until_ready(), 30)
        yield bot
    finally:
        await bot.close()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait_for(task, 30)
        await memory.close()
