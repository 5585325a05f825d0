"""Case: what 1,000 channel messages cost in model calls and tokens, per role. The real bot (PersonaBot and its
cogs, the example persona personas/isabella.toml: hybrid profile, reflection threshold 150, 6 messages of
history) against the fake Discord and the fake OpenAI server, both over real sockets: eight people talk in three
channels of one server, about one message in fifty mentions the persona (each answer is waited for, as people
do), and reflections come when the importance total reaches the threshold, as in production (the messages come
in groups of 20, each absorbed before the next, as in a day of talk rather than one burst).

    python -m bench.cost [--messages 1000] [--mentions-every 50]

The fake rater answers by what a message is about (small talk 2, plans 4, news 6, life events 8: a mean near
3); it counts a token per whitespace-separated word (real tokenizers count about 1.3 per English word).
The figures are the product's own accounting (`memstream stats`), checked against the requests the fake
server received.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import random
import re
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from bench.botrun import running
from bench.report import cost_lines
from bot.bot import PersonaBot
from memstream import MemoryStream, load_persona
from memstream.config import BudgetConfig, RoleLimit
from tests.fakes.discord_server import FakeDiscord, SentMessage
from tests.fakes.openai_server import ChatRequest, FakeOpenAIServer

ROOT = Path(__file__).resolve().parent.parent
PERSONA = ROOT / "personas" / "isabella.toml"
AGENT = "What do you do or say next?"
QUESTIONS = "most salient high-level"
INSIGHTS = "high-level insights can you infer"
RATER = "Reply with a single integer"
DECLINE = "Sorry, I've used up my thinking for today"
PEOPLE = ("Klaus", "Maria", "Sam", "Jennifer", "Tom", "Ayesha", "Carmen", "Wolfgang")
# What people say, by how much it matters (the fake rater's answer), and how often (weights).
TALK: dict[int, tuple[float, tuple[str, ...]]] = {
    2: (0.6, ("good morning everyone", "lol that's great", "anyone seen my umbrella?", "the coffee is good today",
              "it's raining again", "haha yes", "thanks {who}!", "what time is it there?", "same here",
              "I'm so tired today", "did you watch the game last night?", "nice photo {who}")),
    4: (0.25, ("who wants to get lunch at Hobbs Cafe on {day}?", "I'm painting at the park on {day}",
               "study group at the library on {day} at 6", "I'll bring cookies to the meeting on {day}",
               "we should go hiking on {day}", "movie night at my place on {day}?")),
    6: (0.1, ("I started a new job at the {place} today", "my sister is moving to town next month",
              "the {place} is closing down for good", "I finally finished my research paper on gentrification",
              "I adopted a dog from the shelter, her name is Biscuit")),
    8: (0.05, ("I'm getting married to {who} in June!", "my grandfather passed away last night",
               "I got into the graduate program!", "we're expecting a baby in the spring")),
}
# A line of talk as a pattern: its words, anything where a name, day or place was filled in.
_PATTERNS = {line: re.compile(".*".join(re.escape(part) for part in re.split(r"\{\w+\}", line)))
             for _, lines in TALK.values() for line in lines}
DAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")
PLACES = ("pharmacy", "library", "bakery", "college", "hardware store")
MENTIONS = ("what are you doing tonight?", "are you having a party soon?", "what's good at the cafe today?",
            "do you remember what I told you last week?", "how's the cafe going?")


def message(rng: random.Random) -> str:
    """One line of channel talk."""
    weights = [w for w, _ in TALK.values()]
    _, lines = rng.choices(list(TALK.values()), weights)[0]
    return rng.choice(lines).format(who=rng.choice(PEOPLE), day=rng.choice(DAYS), place=rng.choice(PLACES))


def answer(request: ChatRequest) -> str:
    """The fake model: a rating by topic, three questions, two insights, a short answer."""
    prompt = request.prompt
    if RATER in prompt:
        memory = prompt.rsplit("<memory>", 1)[-1]
        return next((str(level) for level, (_, lines) in TALK.items() if any(_PATTERNS[line].search(memory)
                                                                            for line in lines)), "3")
    if QUESTIONS in prompt:
        return ("What are the people of the cafe planning?\nWhat matters most to Klaus right now?\n"
                "How are Maria and Sam getting on?")
    if INSIGHTS in prompt:
        return ("People in town are making plans together at the cafe (because of 1, 2)\n"
                "Big life events are being shared with the community (because of 3)")
    return ("Oh, I'm getting ready for the Valentine's Day party at Hobbs Cafe, from 5 to 7 on the 14th. "
            "You should come, everyone is welcome!")


def in_channel(channel: int) -> Callable[[SentMessage], bool]:
    """Whether a message the bot sent went to `channel`."""
    return lambda sent: sent.channel_id == channel


async def settled(memory: MemoryStream, bot: PersonaBot, timeout: float) -> None:
    """Wait until every observation is stored and rated, and no stream is due for a reflection."""
    deadline = time.monotonic() + timeout
    cog: Any = bot.get_cog("ObserveCog")
    quiet = 0
    while time.monotonic() < deadline:
        await asyncio.wait_for(cog.drained(), timeout)
        due = await memory.store.pending_memories(1, due_at=time.time())  # not those a spent budget holds back
        quiet = quiet + 1 if not due and not await memory.due_streams() else 0
        if quiet == 3:  # a reflection under way keeps its stream due until it is saved
            return
        await asyncio.sleep(0.1)
    raise RuntimeError("the bot did not settle")


async def run(messages: int = 1000, mentions_every: int = 50, seed: int = 7,
              budget: BudgetConfig | None = None) -> dict[str, Any]:
    """Feed `messages` channel messages to the bot (under `budget`, if given); the calls and tokens per role, and
    the checks."""
    rng = random.Random(seed)
    monkeypatch = pytest.MonkeyPatch()
    started = time.perf_counter()
    async with FakeDiscord(bot_name="Isabella") as fake, FakeOpenAIServer(embed_dim=64) as openai:
        openai.on_chat(answer)
        town = fake.add_guild("Smallville")
        channels = [town.add_channel(name) for name in ("general", "cafe", "random")]
        people = [fake.add_user(name) for name in PEOPLE]
        for person in people:
            town.add_member(person)
        fake.install(monkeypatch)
        with tempfile.TemporaryDirectory() as folder:
            example = load_persona(PERSONA, environ={})
            persona = replace(example, database=Path(folder) / "isabella.db",
                              models=replace(example.models, base_url=openai.base_url, max_retries=0, timeout=30),
                              discord=replace(example.discord, guilds=(town.id,)), budget=budget or BudgetConfig())
            memory = await MemoryStream.open(persona, environ={})
            mentions = 0
            try:
                async with running(memory, persona) as bot:
                    for n in range(messages):
                        channel, person = rng.choice(channels), rng.choice(people)
                        if (n + 1) % mentions_every == 0:
                            before = len(fake.sent_messages)
                            await fake.send_message(channel, person, f"Isabella, {rng.choice(MENTIONS)}",
                                                    mentions=[fake.bot_user])
                            with contextlib.suppress(TimeoutError):  # a spent agent budget declines once a channel
                                await fake.wait_for_sent(in_channel(channel), since=before, timeout=60 if budget is None
                                                         else 3)
                            mentions += 1
                        else:
                            await fake.send_message(channel, person, message(rng))
                        if n % 20 == 19:  # people take their time: each reflection comes at its threshold, as in a
                            await settled(memory, bot, 180)  # day of talk, not after a burst that passed it twice
                    await settled(memory, bot, 180)
                    sent = [m.content for m in fake.sent_messages]
                    stats, state = await memory.stats(), await memory.store.state(f"guild:{town.id}")
            finally:
                monkeypatch.undo()
        served = {"rater": sum(RATER in r.prompt for r in openai.chat_requests),
                  "reflector": sum(QUESTIONS in r.prompt or INSIGHTS in r.prompt for r in openai.chat_requests),
                  "agent": sum(AGENT in r.prompt for r in openai.chat_requests),
                  "embedding": len(openai.embedding_requests)}
    roles = {role: {"calls": use.calls, "failures": use.failures, "prompt_tokens": use.prompt_tokens,
                    "completion_tokens": use.completion_tokens} for role, use in stats.usage.items()}
    return {"messages": messages, "mentions": mentions, "replies": sum(1 for m in sent if not m.startswith(DECLINE)),
            "declined": sum(1 for m in sent if m.startswith(DECLINE)), "pending": stats.pending.count,
            "observations": stats.counts.observations, "reflections": state.reflections,
            "insights": stats.counts.reflections, "roles": roles, "served": served,
            "agrees": all(roles.get(role, {}).get("calls", 0) == n for role, n in served.items()),
            "seconds": time.perf_counter() - started}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.cost", description=__doc__.split("\n\n")[0])
    parser.add_argument("--messages", type=int, default=1000)
    parser.add_argument("--mentions-every", type=int, default=50)
    parser.add_argument("--budget", metavar="ROLE=CALLS", action="append", default=[],
                        help="a daily budget of calls for a role (rater, reflector, agent, embedding); repeatable")
    args = parser.parse_args(argv)
    limits = dict(item.split("=", 1) for item in args.budget)
    budget = BudgetConfig({role: RoleLimit(calls_per_day=int(n)) for role, n in limits.items()}) if limits else None
    result = asyncio.run(run(args.messages, args.mentions_every, budget=budget))
    print("\n".join(cost_lines(result)))
    print(f"({result['seconds']:.0f} s)")
    return 0 if result["agrees"] else 1


if __name__ == "__main__":
    sys.exit(main())
