"""Slash commands to look inside the persona's memory of this server, and to make it forget."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import Any, TypeVar

import discord
from discord import app_commands
from discord.ext import commands

from bot.bot import PersonaBot, stream_key
from bot.render import evidence_lines, fit, memory_line, ranking_lines
from memstream import MemoryNotFound
from memstream.render import (
    because_text,
    budget_lines,
    faults_text,
    pending_text,
    questions_text,
    rater_alarm,
    usage_lines,
)

__all__ = ["MemoryCog", "is_manager", "setup"]

log = logging.getLogger("bot.memory")
PAGE = 10
WRITING_WAIT = 120.0  # seconds "Why this reply?" waits for a reply still being written (deferred: up to 15 min)
Interaction = discord.Interaction[discord.Client]
T = TypeVar("T", bound=Callable[..., Any])


def is_manager(interaction: Interaction) -> bool:
    """Server managers (Manage Server), checked in code whatever the server's command permissions say;
    in a DM the user is the only other party, so they manage their own stream."""
    if interaction.guild_id is None:
        return True
    return bool(interaction.permissions.manage_guild or interaction.permissions.administrator)


def managers_only() -> Callable[[T], T]:
    """A check that refuses everyone but server managers."""
    async def predicate(interaction: Interaction) -> bool:
        if not is_manager(interaction):
            raise app_commands.CheckFailure("Only server managers (Manage Server) can do that.")
        return True
    return app_commands.check(predicate)


def _stream(interaction: Interaction) -> str:
    return stream_key(interaction.guild_id, interaction.user.id)


class MemoryCog(commands.Cog):
    """Inspection output is ephemeral and only ever shows the invoking server's (or DM's) stream."""

    def __init__(self, bot: PersonaBot) -> None:
        self.bot = bot
        self.why_menu = app_commands.ContextMenu(name="Why did you say that?", callback=self.why_reply)
        self.bot.tree.add_command(self.why_menu)

    async def cog_unload(self) -> None:
        self.bot.tree.remove_command(self.why_menu.name, type=self.why_menu.type)

    @app_commands.command(name="why")
    @app_commands.describe(memory_id="The memory's number, e.g. 42 (shown by /memories and /recall)")
    async def why(self, interaction: Interaction, memory_id: int) -> None:
        """Trace a memory or insight back to the observations it rests on."""
        await interaction.response.defer(ephemeral=True, thinking=True)
        stream = _stream(interaction)
        tree = await self.bot.memory.why(await self.bot.memory.by_number(stream, memory_id), stream=stream)
        lines = evidence_lines(tree, self.bot.persona.tz, interaction.guild_id)
        await interaction.followup.send(fit(lines), ephemeral=True)

    async def why_reply(self, interaction: Interaction, message: discord.Message) -> None:
        """What one of the persona's replies was built from."""
        await interaction.response.defer(ephemeral=True, thinking=True)
        writing = self.bot.writing.get(message.id)
        if writing is not None:  # still being written: its trace is stored with it, at its end
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(writing.wait(), WRITING_WAIT)
        found = await self.bot.memory.explain_reply(message_id=str(message.id), stream=_stream(interaction))
        if found is None:
            await interaction.followup.send("That message is not one of my replies here (or I have forgotten "
                                            "what it was built from).", ephemeral=True)
            return
        lines = [f"Asked: “{' '.join(found.trace.query.split())[:200]}” — built from:"]
        tz = self.bot.persona.tz
        for n, (part, mem) in enumerate(found.items, 1):
            head = (f"**{n}.** score {part.score:.2f} (rec {part.recency:.2f} · imp {part.importance:.2f}"
                    f" · rel {part.relevance:.2f}) ")
            if mem is None:
                lines.append(head + "(a memory since forgotten)")
                continue
            lines.append(head + memory_line(mem, tz, interaction.guild_id, 120))
            if mem.kind == "reflection":
                tree = await self.bot.memory.why(mem.id)
                lines += ["　" + line for line in evidence_lines(tree, tz, interaction.guild_id)[1:]]
        await interaction.followup.send(fit(lines), ephemeral=True)

    @app_commands.command(name="recall")
    @app_commands.describe(query="What to look for, as you would ask the persona")
    async def recall(self, interaction: Interaction, query: app_commands.Range[str, 1, 500]) -> None:
        """Show what the persona would remember for a question now, with score parts (changes nothing)."""
        await interaction.response.defer(ephemeral=True, thinking=True)
        items = await self.bot.memory.explain(query, stream=_stream(interaction))
        lines = ranking_lines(items, self.bot.persona.tz, interaction.guild_id)
        await interaction.followup.send(fit(lines, empty="I have no memories here yet."), ephemeral=True)

    @app_commands.command(name="memories")
    @app_commands.describe(page="Page number, 1 is the most recent")
    async def memories(self, interaction: Interaction, page: app_commands.Range[int, 1, 10_000] = 1) -> None:
        """The persona's most recent memories of this server."""
        recent = await self.bot.memory.recent(_stream(interaction), PAGE, (page - 1) * PAGE)
        lines = [memory_line(m, self.bot.persona.tz, interaction.guild_id, 140) for m in recent]
        footer = f"\nPage {page}. Use `/memories page:{page + 1}` for older ones." if len(recent) == PAGE else ""
        await interaction.response.send_message(fit(lines, empty="Nothing on this page.") + footer, ephemeral=True)

    @app_commands.command(name="reflect")
    @app_commands.default_permissions(manage_guild=True)
    @managers_only()
    async def reflect(self, interaction: Interaction) -> None:
        """Make the persona reflect on this server now (server managers only)."""
        await interaction.response.defer(ephemeral=True, thinking=True)
        result = await self.bot.memory.reflect(_stream(interaction))
        assert result is not None
        tz = self.bot.persona.tz
        cited = await self.bot.memory.get_many(sorted({i for ids in result.evidence.values() for i in ids}))
        numbers = {i: m.number for i, m in cited.items()}  # the server's own numbers, never global ids
        lines = [f"Questions: {questions_text(result)}"]
        lines += [f"{memory_line(insight, tz, interaction.guild_id, 200)} {because_text(result, insight.id, numbers)}"
                  for insight in result.insights]
        if result.dropped:
            lines.append(f"{len(result.dropped)} insight(s) dropped for lack of evidence.")
        if result.skipped:
            lines.append(f"Skipped: {result.skipped}.")
        await interaction.followup.send(fit(lines), ephemeral=True)

    @app_commands.command(name="forget")
    @app_commands.describe(memory_id="(Managers) forget this one memory; leave empty to forget your own messages")
    async def forget(self, interaction: Interaction, memory_id: int | None = None) -> None:
        """Forget what you said here; insights drawn from it are forgotten too."""
        await interaction.response.defer(ephemeral=True, thinking=True)
        stream = _stream(interaction)
        if memory_id is None:
            own = await self.bot.memory.by_author(stream, str(interaction.user.id))
            gone = await self.bot.memory.forget_author(stream, str(interaction.user.id))
            text = (f"Forgotten: {len(own)} memory(ies) made from your messages here, and "
                    f"{len(gone) - len(own)} insight(s) and repl(ies) drawn from them.")
        elif not is_manager(interaction):
            text = "Only server managers can forget a memory by number. Use `/forget` alone for your own messages."
        else:
            try:
                gone = await self.bot.memory.forget([await self.bot.memory.by_number(stream, memory_id)],
                                                    stream=stream)
            except MemoryNotFound:
                text = f"There is no memory #{memory_id} here."
            else:
                text = (f"Forgotten: #{memory_id}" + (f", and {len(gone) - 1} insight(s) and repl(ies) built from it."
                                                      if len(gone) > 1 else "."))
        await interaction.followup.send(text, ephemeral=True)

    @app_commands.command(name="memory-stats")
    async def memory_stats(self, interaction: Interaction) -> None:
        """Counts, importance histogram, fallback ratings, progress to the next reflection, model calls."""
        stats = await self.bot.memory.stats(_stream(interaction))
        counts, pending, state = stats.counts, stats.pending, stats.state
        assert state is not None  # one stream's stats
        hist = " ".join(f"{k}:{v}" for k, v in counts.histogram.items())
        lines = [f"Observations {counts.observations} · insights {counts.reflections} · "
                 f"pending {pending.count} · fallback ratings {counts.fallback}",
                 f"Importance: {hist}",
                 f"Towards the next reflection: {state.importance_since_reflection}/{stats.reflection_threshold}"
                 f" (run {state.reflections}, failed/skipped {state.skipped_reflections})"]
        if pending.count:
            lines.append(f"Pending: {pending_text(pending)}")
        lines += usage_lines(stats, compact=True)
        lines += budget_lines(stats.budget)
        if stats.faults:
            lines.append(f"Faults: {faults_text(stats.faults)}")
        alarm = rater_alarm(stats)
        if alarm is not None:
            lines.append(f"Warning: {alarm}.")
        await interaction.response.send_message(fit(lines), ephemeral=True)


async def setup(bot: commands.Bot) -> None:
    """Load the cog."""
    assert isinstance(bot, PersonaBot)
    await bot.add_cog(MemoryCog(bot))
