"""The soak (issue 30): the real PersonaBot under a model server that fails a share of its calls at random (HTTP 500,
429, garbage, absurd usage counts, vectors of the wrong size) for MINUTES, through the fake Discord. Then the
server is healthy again, the bot's own retry job runs (its clock moved past the longest backoff), and the soak
checks what a community would: every message stored once, every mention answered or told the persona could not,
nothing left pending.

    python -m bench.soak                       # 10 minutes, 20% of calls failing
    python -m bench.soak --minutes 0.5         # the short version (tests/bot/test_soak.py runs one)
    python -m bench.soak --fault-rate 0.5 --seed 3 --rate 10

It prints the figures and exits 1 if any check fails. The fakes run on the bot's event loop (the load here is a
few messages a second; bench.load measures the bot's speed).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path

import discord
import yarl

from bot.bot import PersonaBot
from memstream import DiscordConfig, MemoryStream, ModelConfig, PersonaConfig, StreamConfig
from memstream.clock import SystemClock
from memstream.store import RETRY_CAP_SECONDS
from tests.fakes.discord_server import FakeDiscord
from tests.fakes.openai_server import ChatRequest, FakeOpenAIServer

QUESTIONS = "most salient high-level"
INSIGHTS = "high-level insights can you infer"
# bot/cogs/chat.py's answers when the models fail, and when the store cannot take the reply
COULD_NOT = ("Sorry, I can't think straight right now", "Sorry, I couldn't answer that just now")


@dataclass(frozen=True)
class Plan:
    """What the soak offers the bot."""

    minutes: float = 10.0
    fault_rate: float = 0.2
    rate: float = 4.0  # messages a second
    mention_every: float = 6.0  # seconds
    seed: int = 0
    recovery_timeout: float = 180.0  # seconds for the bot to finish once the server is healthy


@dataclass
class SoakReport:
    """What one soak saw."""

    plan: Plan
    sent: int = 0
    stored: int = 0
    duplicated: int = 0
    edits: int = 0
    edits_applied: int = 0  # the memory has the edited text
    deletions: int = 0
    deletions_applied: int = 0  # no memory left of the message
    mentions: int = 0
    replies: int = 0
    could_not: int = 0
    unanswered: int = 0
    pending_at_end: int = 0  # when the faults stopped
    pending_after: int = 0  # once the bot had recovered
    recovery_seconds: float = 0.0
    model_calls: int = 0
    faults: dict[str, int] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)  # lines logged at ERROR: a model's faults are no error of ours

    def failures(self) -> list[str]:
        """The checks that failed (none: the soak passed)."""
        out = []
        if self.stored != self.sent - self.deletions:
            out.append(f"{self.sent - self.deletions - self.stored} message(s) not stored")
        if self.edits_applied != self.edits:
            out.append(f"{self.edits - self.edits_applied} edit(s) not applied")
        if self.deletions_applied != self.deletions:
            out.append(f"{self.deletions - self.deletions_applied} deleted message(s) still remembered")
        if self.duplicated:
            out.append(f"{self.duplicated} message(s) stored more than once")
        if self.replies + self.could_not != self.mentions or self.unanswered:
            out.append(f"{self.unanswered} mention(s) neither answered nor told the persona could not")
        if self.pending_after:
            out.append(f"{self.pending_after} memory(ies) still pending after recovery")
        return out + [f"logged: {line}" for line in self.errors[:5]]

    def lines(self) -> list[str]:
        faults = ", ".join(f"{kind} {n}" for kind, n in sorted(self.faults.items()))
        return [
            f"soak: {self.plan.minutes:g} min, {self.plan.fault_rate:.0%} of model calls failing at random "
            f"(seed {self.plan.seed}), {self.plan.rate:g} msg/s, a mention every {self.plan.mention_every:g} s",
            f"model calls: {self.model_calls}, faults injected: {sum(self.faults.values())} ({faults})",
            f"messages sent: {self.sent}",
            f"memories stored: {self.stored} of {self.sent - self.deletions} kept messages (stored twice: "
            f"{self.duplicated})",
            f"edits: {self.edits_applied} of {self.edits} applied; deletions: {self.deletions_applied} of "
            f"{self.deletions} forgotten",
            f"mentions: {self.mentions}",
            f"replies: {self.replies} + could not answer: {self.could_not} = {self.replies + self.could_not} "
            f"(unanswered: {self.unanswered})",
            f"pending when the faults stopped: {self.pending_at_end}; after recovery: {self.pending_after} "
            f"({self.recovery_seconds:.1f} s)",
            f"errors logged by the bot: {len(self.errors)}",
        ]


class _Errors(logging.Handler):
    """Every record at ERROR or above, from anywhere (the bot, memstream, discord.py, asyncio)."""

    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(f"{record.name}: {record.getMessage()}"[:300])


class SkewedClock:
    """The system clock plus an offset the soak moves forward (past the longest retry backoff)."""

    def __init__(self) -> None:
        self.offset = timedelta()

    def now(self) -> datetime:
        return SystemClock().now() + self.offset


def _answer(request: ChatRequest) -> str:
    prompt = request.prompt
    if QUESTIONS in prompt:
        return "What is being planned?\nWho is talking most?\nWhat matters to them?"
    if INSIGHTS in prompt:
        return "People are busy planning the party (because of 1, 2)"
    if "Reply with a single integer" in prompt:
        return "6" if "party" in prompt else "3"
    return "Sure, see you at the party!"


class _Conversation:
    """The users' side: messages and mentions sent, and what came back for each mention."""

    def __init__(self, fake: FakeDiscord, plan: Plan) -> None:
        self.fake, self.plan = fake, plan
        guild = fake.add_guild("Smallville")
        self.guild = guild.id
        self.channels = [guild.add_channel(f"channel-{c}") for c in range(3)]
        self.users = [fake.add_user(f"user{u}") for u in range(8)]
        for user in self.users:
            guild.add_member(user)
        self.sent: list[str] = []
        self.mentions: list[int] = []
        self.edited: set[str] = set()  # one message in 10 is edited a few messages later
        self.deleted: set[str] = set()  # one in 25 is deleted
        self._later: list[tuple[int, int, int, str]] = []  # (at message, channel, id, "edit" or "delete")

    async def talk(self, seconds: float) -> None:
        total, every = int(self.plan.rate * seconds), max(1, round(self.plan.rate * self.plan.mention_every))
        start = time.monotonic()
        for i in range(total):
            delay = start + i / self.plan.rate - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            mention = i % every == every // 2
            channel = self.channels[i % len(self.channels)]
            message = await self.fake.send_message(
                channel, self.users[i % len(self.users)],
                f"message {i}: about the party, part {i % 13}" + (" — what do you think?" if mention else ""),
                mentions=[self.fake.bot_user] if mention else ())
            self.sent.append(str(message["id"]))
            if mention:
                self.mentions.append(int(message["id"]))
            elif i % 10 == 3:
                self._later.append((i + 8, channel, int(message["id"]), "edit"))
            elif i % 25 == 7:
                self._later.append((i + 5, channel, int(message["id"]), "delete"))
            await self._changes(i)
        await self._changes(total + 100)

    async def _changes(self, now: int) -> None:
        """Edit and delete the messages whose turn it is."""
        due = [change for change in self._later if change[0] <= now]
        self._later = [change for change in self._later if change[0] > now]
        for _, channel, message_id, what in due:
            if what == "edit":
                await self.fake.edit_message(channel, message_id, f"message {message_id} EDITED: no more party talk")
                self.edited.add(str(message_id))
            else:
                await self.fake.delete_message(channel, message_id)
                self.deleted.add(str(message_id))

    def answers(self) -> tuple[int, int, int]:
        """(answered, said it could not, neither) over the mentions."""
        first: dict[int, str] = {}
        for reply in self.fake.sent_messages:
            ref = reply.reference_message_id
            if ref is not None and ref not in first:
                first[ref] = reply.content
        could_not = sum(1 for m in self.mentions if m in first and first[m].startswith(COULD_NOT))
        answered = sum(1 for m in self.mentions if m in first) - could_not
        return answered, could_not, len(self.mentions) - answered - could_not


async def _stored(memory: MemoryStream, stream: str, talk: _Conversation, report: SoakReport) -> None:
    """Messages stored (but the deleted ones), stored more than once, edits and deletions applied."""
    async with memory.store.conn.execute(  # type: ignore[attr-defined]  (the soak's store is SQLite)
            "SELECT message_id, COUNT(*), MAX(text) FROM memories WHERE stream = ? AND kind = 'observation' "
            "AND message_id IS NOT NULL GROUP BY message_id", (stream,)) as cursor:
        rows = {row[0]: (int(row[1]), str(row[2])) for row in await cursor.fetchall()}
    counts = Counter({m: n for m, (n, _) in rows.items()})
    kept = [m for m in talk.sent if m not in talk.deleted]
    report.stored, report.duplicated = sum(1 for m in kept if counts[m]), sum(1 for m in kept if counts[m] > 1)
    report.edits, report.deletions = len(talk.edited), len(talk.deleted)
    report.edits_applied = sum(1 for m in talk.edited if m in rows and "EDITED" in rows[m][1])
    report.deletions_applied = sum(1 for m in talk.deleted if not counts[m])


async def _pending(memory: MemoryStream) -> int:
    return (await memory.store.pending_state()).count


async def _wait_answers(talk: _Conversation, timeout: float) -> None:
    for _ in range(int(timeout * 10)):
        if not talk.answers()[2]:
            return
        await asyncio.sleep(0.1)


async def _recover(bot: PersonaBot, memory: MemoryStream, clock: SkewedClock, timeout: float) -> float:
    """The bot's own retry job, once the clock is past every backoff, until nothing is pending; seconds taken."""
    clock.offset += timedelta(seconds=RETRY_CAP_SECONDS + 1)
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        await bot.reflections.check_pending()  # the scheduler's every-minute job, run now
        cog = bot.get_cog("ObserveCog")
        if cog is not None:
            await asyncio.wait_for(cog.drained(), timeout)  # type: ignore[attr-defined]
        if not await _pending(memory):
            break
        await asyncio.sleep(0.5)
    return time.monotonic() - started


async def run_soak(plan: Plan, directory: Path | None = None) -> SoakReport:
    """One soak; its report (the bot closed and the fakes stopped afterwards)."""
    report = SoakReport(plan)
    errors = _Errors()
    logging.getLogger().addHandler(errors)
    folder = Path(tempfile.mkdtemp(prefix="memstream-soak-")) if directory is None else directory
    async with FakeDiscord(bot_name="Isabella") as fake, FakeOpenAIServer(embed_dim=64) as server:
        server.on_chat(_answer)
        talk = _Conversation(fake, plan)
        old = discord.http.Route.BASE, discord.gateway.DiscordWebSocket.DEFAULT_GATEWAY
        discord.http.Route.BASE = fake.api_base
        discord.gateway.DiscordWebSocket.DEFAULT_GATEWAY = yarl.URL(str(fake.gateway_url))
        persona = PersonaConfig(name="Isabella", summary="Isabella runs Hobbs Cafe and plans a party.",
                                database=folder / "soak.db",
                                models=ModelConfig(base_url=server.base_url, max_retries=0, timeout=10),
                                memory=StreamConfig(reflection_threshold=150),
                                discord=DiscordConfig(guilds=(talk.guild,), history=4))
        clock = SkewedClock()
        memory = await MemoryStream.open(persona, clock=clock, environ={})
        bot = PersonaBot(memory, persona, guild_ready_timeout=0.05)
        task = asyncio.create_task(bot.start("token"))
        try:
            await asyncio.wait_for(bot.wait_until_ready(), 30)
            server.fail_at_random(plan.fault_rate, seed=plan.seed)
            await talk.talk(plan.minutes * 60)
            await _wait_answers(talk, 60)
            server.fail_at_random(0.0)  # healthy from here on
            report.faults = dict(server.random_faults)
            report.pending_at_end = await _pending(memory)
            report.recovery_seconds = await _recover(bot, memory, clock, plan.recovery_timeout)
            report.pending_after = await _pending(memory)
            report.sent, report.mentions = len(talk.sent), len(talk.mentions)
            await _stored(memory, f"guild:{talk.guild}", talk, report)
            report.replies, report.could_not, report.unanswered = talk.answers()
            report.model_calls = len(server.requests)
        finally:
            await bot.close()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await asyncio.wait_for(task, 10)
            await memory.close()
            discord.http.Route.BASE, discord.gateway.DiscordWebSocket.DEFAULT_GATEWAY = old
            logging.getLogger().removeHandler(errors)
            report.errors = errors.lines
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.soak", description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=10.0, help="how long the faults last (default 10)")
    parser.add_argument("--fault-rate", type=float, default=0.2, help="share of model calls failing (default 0.2)")
    parser.add_argument("--rate", type=float, default=4.0, help="messages a second (default 4)")
    parser.add_argument("--mention-every", type=float, default=6.0, help="seconds between mentions (default 6)")
    parser.add_argument("--seed", type=int, default=0, help="the faults' random seed (default 0)")
    ns = parser.parse_args(sys.argv[1:] if argv is None else argv)
    if not 0.0 <= ns.fault_rate <= 1.0 or ns.minutes <= 0 or ns.rate <= 0 or ns.mention_every <= 0:
        parser.error("--fault-rate is between 0 and 1; --minutes, --rate and --mention-every are above 0")
    report = asyncio.run(run_soak(Plan(ns.minutes, ns.fault_rate, ns.rate, ns.mention_every, ns.seed)))
    print("\n".join(report.lines()))
    failed = report.failures()
    print("OK: every message stored once (edits applied, deletions forgotten), every mention answered or told, "
          "nothing pending" if not failed
          else "FAILED: " + "; ".join(failed))
    return 0 if not failed else 1


if __name__ == "__main__":
    raise SystemExit(main())
