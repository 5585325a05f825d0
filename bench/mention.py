"""Case: mention to first byte on Discord with slow models. The real bot (PersonaBot, its cogs) against the fake
Discord (gateway and REST over real sockets) and the fake OpenAI server, every model call delayed by LATENCY
seconds: from a mention's MESSAGE_CREATE to the reply arriving at Discord.

    python -m bench.mention [--latency 1.0] [--mentions 5]

A reply needs the query's embedding and the agent's answer: two calls, 2 x LATENCY. The rating and embedding
of the persona's own reply come after it is sent (then stored, pending), so they add nothing.

With --word-delay S the agent's reply (--words long) is streamed a word every S seconds: the first message
appears once the first words are in (about 0.5 s after them), the whole reply by edits as it is written.

    python -m bench.mention --latency 1.0 --words 60 --word-delay 0.05
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest

from bench.botrun import running
from memstream import DiscordConfig, MemoryStream, ModelConfig, PersonaConfig, StreamConfig
from tests.fakes.discord_server import FakeDiscord
from tests.fakes.openai_server import FakeOpenAIServer

AGENT = "What do you do or say next?"
REPLY = "I'm going to my party at 5 pm!"


async def run(latency: float, mentions: int, *, words: int = 0, word_delay: float = 0.0) -> dict[str, Any]:
    """Median mention-to-reply time (its first message) and to the whole reply, and the model calls made before
    each reply arrived."""
    monkeypatch = pytest.MonkeyPatch()
    said = " ".join((REPLY.split() * (words // len(REPLY.split()) + 1))[:words]) if words else REPLY
    async with FakeDiscord(bot_name="Isabella") as fake, FakeOpenAIServer(embed_dim=64, latency=latency) as openai:
        openai.on_chat(lambda request: said if AGENT in request.prompt else "5")
        openai.stream_delay = word_delay
        town = fake.add_guild("Smallville")
        general = town.add_channel("general")
        klaus = fake.add_user("Klaus")
        town.add_member(klaus)
        fake.install(monkeypatch)
        with tempfile.TemporaryDirectory() as folder:
            persona = PersonaConfig(name="Isabella", summary="Isabella runs Hobbs Cafe.",
                                    database=Path(folder) / "isabella.db",
                                    models=ModelConfig(base_url=openai.base_url, max_retries=0, timeout=30),
                                    memory=StreamConfig(), discord=DiscordConfig(guilds=(town.id,), history=0))
            memory = await MemoryStream.open(persona, environ={})
            times, whole, calls = [], [], []
            try:
                async with running(memory, persona):
                    await fake.send_message(general, klaus, "The party at Hobbs Cafe is at 5 pm on Friday.")
                    await asyncio.sleep(3 * latency + 0.5)  # observed: rated and embedded
                    for i in range(mentions):
                        before = len(fake.sent_messages)
                        requests = len(openai.requests)
                        start, wall = time.perf_counter(), time.time()
                        await fake.send_message(general, klaus, f"what are you doing tonight? ({i})",
                                                mentions=[fake.bot_user])
                        first = await fake.wait_for_sent(lambda m: m.channel_id == general, since=before, timeout=60)
                        times.append(time.perf_counter() - start)
                        while first.content != said:  # grown by edits to the whole reply
                            if time.perf_counter() - start > 120:
                                raise TimeoutError("the reply never came whole")
                            await asyncio.sleep(0.01)
                        whole.append(time.perf_counter() - start)
                        made = openai.requests[requests:]
                        # the model calls a reply waited for: those that began and ended before it arrived
                        calls.append(sum(1 for r in made if r.time <= wall + times[-1] - latency))
                        await asyncio.sleep(3 * latency + 0.5)  # let the observations of this round finish
            finally:
                monkeypatch.undo()
    return {"latency_s": latency, "mentions": mentions, "median_s": statistics.median(times),
            "whole_median_s": statistics.median(whole), "words": len(said.split()), "word_delay_s": word_delay,
            "in_latencies": statistics.median(times) / latency if latency else None,
            "calls_before_reply_median": statistics.median(calls)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.mention")
    parser.add_argument("--latency", type=float, default=1.0)
    parser.add_argument("--mentions", type=int, default=5)
    parser.add_argument("--words", type=int, default=0, help="the reply's length in words (default: 8)")
    parser.add_argument("--word-delay", type=float, default=0.0, help="seconds between two streamed words")
    args = parser.parse_args(argv)
    r = asyncio.run(run(args.latency, args.mentions, words=args.words, word_delay=args.word_delay))
    print(f"mention to reply with {r['latency_s']:.1f} s per model call: median {r['median_s']:.2f} s "
          f"({r['in_latencies']:.2f} model latencies; a reply needs 2: the query's embedding and the agent), "
          f"model calls answered before the reply: {r['calls_before_reply_median']:.0f} (median of "
          f"{r['mentions']}; the question's own rating and embedding, by the observer, run beside the reply's two); "
          f"the whole reply ({r['words']} words, {r['word_delay_s']:g} s each) at {r['whole_median_s']:.2f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
