"""Sustained load through the fake Discord: the real PersonaBot observes RATE messages a second across CHANNELS
channels in SERVERS servers for SECONDS seconds, with MODEL-LATENCY on every model call, and is mentioned every
few seconds. It prints what was absorbed, the event loop's worst lag, the process's memory and how long
mentions waited for their answer, and checks that no message was lost or stored twice.

    python -m bench.load                      # the issue's figures: 50 msg/s, 10 channels, 2 servers, 60 s, 50 ms
    python -m bench.load --seconds 10 --rate 100

The fake Discord and the fake OpenAI server (the network) run in a process of their own, so that the lag and
the memory measured are the bot's alone (`--network thread` runs them on a second thread instead, as the short
test does: quicker to start, but they then share the GIL and the memory figure with the bot). Measuring starts
once one mention has been answered (the first model call imports much of the SDK) and the bot has settled its
memory as `python -m bot` does after start (bot.__main__.settle_memory: gc.freeze()).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import discord
import yarl

from bot.__main__ import settle_memory
from bot.bot import PersonaBot
from memstream import DiscordConfig, MemoryStream, ModelConfig, PersonaConfig, StreamConfig
from tests.fakes.discord_server import FakeDiscord
from tests.fakes.openai_server import ChatRequest, FakeOpenAIServer

QUESTIONS = "most salient high-level"
INSIGHTS = "high-level insights can you infer"
ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Plan:
    """What to offer the bot."""

    rate: float = 50.0
    seconds: float = 60.0
    channels: int = 10
    servers: int = 2
    latency: float = 0.05
    mention_every: float = 5.0
    drain_timeout: float = 60.0


@dataclass
class LoadReport:
    """What one run measured."""

    plan: Plan
    sent: int = 0
    stored: int = 0
    missing: int = 0
    duplicated: int = 0
    not_ready: int = 0
    send_seconds: float = 0.0
    drain_seconds: float = 0.0
    mentions: int = 0
    answered: int = 0
    mention_latency: list[float] = field(default_factory=list)
    lags: list[float] = field(default_factory=list)
    rss_mb: list[float] = field(default_factory=list)
    reflections: int = 0

    @property
    def max_lag(self) -> float:
        return max(self.lags, default=0.0)

    def lines(self) -> list[str]:
        lags = sorted(self.lags) or [0.0]
        latency = sorted(self.mention_latency) or [0.0]
        rss = self.rss_mb or [0.0]
        half = len(rss) // 2
        return [
            f"load: {self.plan.rate:g} msg/s for {self.plan.seconds:g} s over {self.plan.channels} channels in "
            f"{self.plan.servers} servers, model latency {self.plan.latency * 1000:g} ms",
            f"messages: {self.sent} sent in {self.send_seconds:.1f} s, {self.stored} stored ({self.missing} missing, "
            f"{self.duplicated} twice, {self.not_ready} not ready), all ready {self.drain_seconds:.1f} s after the "
            f"last one; absorbed {self.stored / max(self.send_seconds + self.drain_seconds, 1e-9):.1f} msg/s",
            f"event-loop lag: max {lags[-1] * 1000:.1f} ms, p99 {lags[int(0.99 * (len(lags) - 1))] * 1000:.1f} ms, "
            f"median {statistics.median(lags) * 1000:.2f} ms over {len(self.lags)} ticks of 10 ms",
            f"mentions: {self.answered}/{self.mentions} answered, latency median "
            f"{statistics.median(latency) * 1000:.0f} ms, max {latency[-1] * 1000:.0f} ms",
            f"bot RSS: start {rss[0]:.0f} MB, first-half peak {max(rss[:half] or rss):.0f} MB, second-half peak "
            f"{max(rss[half:]):.0f} MB, end {rss[-1]:.0f} MB",
            f"reflections run: {self.reflections}",
        ]


def rss_mb() -> float:
    """Resident memory of this process, in MB (Linux /proc)."""
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


# -- the network: fake Discord and fake model server -------------------------------------------------


def _answer(request: ChatRequest) -> str:
    prompt = request.prompt
    if QUESTIONS in prompt:
        return "What is being planned?\nWho is talking most?\nWhat matters to them?"
    if INSIGHTS in prompt:
        return "People are busy planning the party (because of 1, 2)"
    if "Reply with a single integer" in prompt:
        return "5"
    return "Sure, see you at the party!"


async def network_side(plan: Plan, tell: Callable[[dict[str, Any]], None],
                       linger: Callable[[bool], Awaitable[object]]) -> None:
    """Serve the fakes, wait for the bot, warm it up, send the load; `tell` where the fakes are, that the bot is
    warm, then what was sent and when mentions were answered; `linger` waits for the bot side's go (after the
    warm-up) and for its end (before the fakes stop)."""
    fake = FakeDiscord(bot_name="Isabella")
    server = FakeOpenAIServer(embed_dim=64, latency=plan.latency)
    server.on_chat(_answer)
    async with fake, server:
        channels: list[tuple[int, int]] = []
        for s in range(plan.servers):
            guild = fake.add_guild(f"server {s}")
            channels += [(guild.id, guild.add_channel(f"channel-{c}"))
                         for c in range(plan.channels // plan.servers + (s < plan.channels % plan.servers))]
        users = [fake.add_user(f"user{u}") for u in range(20)]
        for guild in fake.guilds.values():
            for user in users:
                guild.add_member(user)
        tell({"api": fake.api_base, "gateway": str(fake.gateway_url), "openai": server.base_url,
                  "guilds": list(fake.guilds)})
        await fake.wait_for_ready_client(30)
        await fake.send_message(channels[0][1], users[0], "warming up", mentions=[fake.bot_user])
        await fake.wait_for_sent(lambda m: True, timeout=30)
        tell({"warm": True})
        await linger(True)  # until the bot side has settled its memory

        mentions: dict[int, float] = {}
        answered: dict[int, float] = {}
        stop, all_sent, all_answered = asyncio.Event(), asyncio.Event(), asyncio.Event()

        async def watch() -> None:
            seen = len(fake.sent_messages)
            while not stop.is_set():
                for reply in fake.sent_messages[seen:]:
                    ref = reply.reference_message_id
                    if ref in mentions and ref not in answered:
                        answered[ref] = time.monotonic()
                seen = len(fake.sent_messages)
                if all_sent.is_set() and len(answered) == len(mentions):
                    all_answered.set()
                await asyncio.sleep(0.005)

        watcher = asyncio.create_task(watch())
        sent: dict[str, list[str]] = {}
        total, every = int(plan.rate * plan.seconds), max(1, int(plan.rate * plan.mention_every))
        start = time.monotonic()
        for i in range(total):
            delay = start + i / plan.rate - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            guild_id, channel = channels[i % len(channels)]
            mention = i % every == every // 2
            message = await fake.send_message(channel, users[i % len(users)], f"message {i}: the party, part {i % 17}",
                                              mentions=[fake.bot_user] if mention else ())
            if mention:
                mentions[int(message["id"])] = time.monotonic()
            sent.setdefault(f"guild:{guild_id}", []).append(str(message["id"]))
        send_seconds = time.monotonic() - start
        all_sent.set()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(all_answered.wait(), plan.drain_timeout)
        stop.set()
        await watcher
        tell({"sent": sent, "send_seconds": send_seconds, "mentions": len(mentions),
              "latency": [answered[m] - mentions[m] for m in answered]})
        await linger(False)  # the bot may still be completing the last messages


def network_process(plan_json: str) -> None:
    """`python -m bench.load --network-side PLAN`: the network in its own process, talking JSON lines."""
    plan = Plan(**json.loads(plan_json))

    def tell(info: dict[str, Any]) -> None:
        print(json.dumps(info), flush=True)

    async def linger(go: bool) -> None:  # a line: go; the end of stdin: done
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(None, sys.stdin.readline if go else sys.stdin.read)

    asyncio.run(network_side(plan, tell, linger))


class _Thread:
    """The network on a second thread (its own event loop)."""

    def __init__(self, plan: Plan) -> None:
        self.loop = asyncio.new_event_loop()
        ours = asyncio.get_running_loop()
        self.told: list[asyncio.Future[dict[str, Any]]] = [ours.create_future() for _ in range(3)]
        self.announced, self.warm, self.result = self.told
        self.go, self.done = threading.Event(), threading.Event()
        self.thread = threading.Thread(target=self.loop.run_forever, name="fake-network", daemon=True)
        self.thread.start()

        def tell(info: dict[str, Any]) -> None:
            target = next(f for f in self.told if not f.done())
            ours.call_soon_threadsafe(target.set_result, info)

        async def linger(go: bool) -> None:
            await asyncio.to_thread((self.go if go else self.done).wait)

        self.side = asyncio.wrap_future(asyncio.run_coroutine_threadsafe(network_side(plan, tell, linger), self.loop))

    async def proceed(self) -> None:
        self.go.set()

    async def close(self) -> None:
        self.done.set()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.side, 10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        await asyncio.to_thread(self.thread.join, 10)
        self.loop.close()


class _Process:
    """The network in a child process."""

    async def start(self, plan: Plan) -> None:
        self.process = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "bench.load", "--network-side", json.dumps(asdict(plan)), cwd=ROOT,
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, limit=2**26)
        self.announced = asyncio.ensure_future(self._line())
        await self.announced
        self.warm = asyncio.ensure_future(self._line())
        self.result: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()

    async def proceed(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(b"go\n")
        await self.process.stdin.drain()
        self.result = asyncio.ensure_future(self._line())

    async def _line(self) -> dict[str, Any]:
        assert self.process.stdout is not None
        line = await self.process.stdout.readline()
        if not line:
            raise RuntimeError("the network process ended early")
        data: dict[str, Any] = json.loads(line)
        return data

    async def close(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.close()
        try:
            await asyncio.wait_for(self.process.wait(), 10)
        except TimeoutError:
            self.process.kill()
            await self.process.wait()


# -- the bot side ------------------------------------------------------------------------------------


async def _ticker(report: LoadReport, stop: asyncio.Event) -> None:
    """Measure how late a 10 ms sleep wakes up on the bot's loop; sample RSS once a second."""
    last_rss = 0.0
    while not stop.is_set():
        start = time.monotonic()
        await asyncio.sleep(0.01)
        report.lags.append(max(0.0, time.monotonic() - start - 0.01))
        if start - last_rss >= 1.0:
            report.rss_mb.append(rss_mb())
            last_rss = start


async def _stored(memory: MemoryStream, sent: dict[str, list[str]]) -> tuple[int, int, int, int]:
    """(stored, missing, stored twice, not ready) over every message sent."""
    stored = missing = twice = not_ready = 0
    for stream, ids in sent.items():
        async with memory.store.conn.execute(
                "SELECT message_id, COUNT(*), MIN(status) FROM memories WHERE stream = ? AND kind = 'observation' "
                "AND message_id IS NOT NULL GROUP BY message_id", (stream,)) as cursor:
            found = {row[0]: (row[1], row[2]) for row in await cursor.fetchall()}
        stored += sum(1 for m in ids if m in found)
        missing += sum(1 for m in ids if m not in found)
        twice += sum(1 for m in ids if m in found and found[m][0] > 1)
        not_ready += sum(1 for m in ids if m in found and found[m][1] != "ready")
    return stored, missing, twice, not_ready


async def run_load(plan: Plan, *, network: str = "process", directory: Path | None = None) -> LoadReport:
    """One run; returns its report (the bot is closed and the network stopped afterwards)."""
    report = LoadReport(plan)
    side: _Thread | _Process
    if network == "thread":
        side = _Thread(plan)
        info = await side.announced
    else:
        side = _Process()
        await side.start(plan)
        info = await side.announced
    old = discord.http.Route.BASE, discord.gateway.DiscordWebSocket.DEFAULT_GATEWAY
    discord.http.Route.BASE = info["api"]
    discord.gateway.DiscordWebSocket.DEFAULT_GATEWAY = yarl.URL(info["gateway"])
    folder = Path(tempfile.mkdtemp(prefix="memstream-load-")) if directory is None else directory
    persona = PersonaConfig(name="Isabella", summary="Isabella runs Hobbs Cafe.", database=folder / "load.db",
                            models=ModelConfig(base_url=info["openai"], max_retries=0, timeout=10),
                            memory=StreamConfig(), discord=DiscordConfig(guilds=tuple(info["guilds"]), history=4))
    memory = await MemoryStream.open(persona, environ={})
    bot = PersonaBot(memory, persona, guild_ready_timeout=0.05)
    task = asyncio.create_task(bot.start("token"))
    stop = asyncio.Event()
    ticker: asyncio.Task[None] | None = None
    try:
        await asyncio.wait_for(bot.wait_until_ready(), 30)
        await asyncio.wait_for(side.warm, 30)
        await settle_memory(bot, delay=0.0)  # what `python -m bot` does 30 s after start
        ticker = asyncio.create_task(_ticker(report, stop))
        await side.proceed()
        result = await asyncio.wait_for(side.result, plan.seconds + plan.drain_timeout + 60)
        done_at = time.monotonic()
        sent: dict[str, list[str]] = result["sent"]
        while time.monotonic() < done_at + plan.drain_timeout:
            counts = await _stored(memory, sent)
            if counts[1] == counts[3] == 0:
                break
            await asyncio.sleep(0.05)
        report.drain_seconds = time.monotonic() - done_at
        stop.set()
        await ticker
        report.sent = sum(len(ids) for ids in sent.values())
        report.stored, report.missing, report.duplicated, report.not_ready = await _stored(memory, sent)
        report.send_seconds, report.mentions = result["send_seconds"], result["mentions"]
        report.mention_latency = result["latency"]
        report.answered = len(report.mention_latency)
        for stream in sent:
            report.reflections += (await memory.store.state(stream)).reflections
    finally:
        gc.unfreeze()  # as it was (a test runs this in pytest's process)
        stop.set()
        if ticker is not None:
            await asyncio.gather(ticker, return_exceptions=True)
        await bot.close()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await asyncio.wait_for(task, 10)
        await memory.close()
        discord.http.Route.BASE, discord.gateway.DiscordWebSocket.DEFAULT_GATEWAY = old
        await side.close()
    return report


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args[:1] == ["--network-side"]:
        network_process(args[1])
        return 0
    parser = argparse.ArgumentParser(prog="python -m bench.load", description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--rate", type=float, default=50.0, help="messages a second (default 50)")
    parser.add_argument("--seconds", type=float, default=60.0, help="how long (default 60)")
    parser.add_argument("--channels", type=int, default=10, help="channels, spread over the servers (default 10)")
    parser.add_argument("--servers", type=int, default=2, help="servers (default 2)")
    parser.add_argument("--latency", type=float, default=0.05, help="seconds per model call (default 0.05)")
    parser.add_argument("--mention-every", type=float, default=5.0, help="seconds between mentions (default 5)")
    parser.add_argument("--network", choices=("process", "thread"), default="process",
                        help="where the fakes run (default: their own process)")
    ns = parser.parse_args(args)
    plan = Plan(ns.rate, ns.seconds, ns.channels, ns.servers, ns.latency, ns.mention_every)
    report = asyncio.run(run_load(plan, network=ns.network))
    print("\n".join(report.lines()))
    ok = report.missing == report.duplicated == report.not_ready == 0 and report.answered == report.mentions
    print("OK: nothing lost, nothing doubled, every mention answered" if ok else "FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
