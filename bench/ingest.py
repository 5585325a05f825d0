"""Case 3: ingestion. A burst of observations through the real openai SDK to the fake OpenAI server, which
adds `latency` seconds to every call; counts are taken at the server and in the store.

The fake server runs in its own process (bench/fake_server.py), like a real model server, off the bot's
event loop; `in_process=True` runs it in the bot's loop instead (its CPU then counts against the bot).
"""

from __future__ import annotations

import contextlib
import json
import tempfile
import time
import urllib.request
from collections.abc import AsyncIterator, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from bench.data import NOW, STREAM, text
from bench.fake_server import spawned
from memstream.clock import from_timestamp
from memstream.config import StreamConfig
from memstream.models.embed import OpenAIEmbedder
from memstream.models.llm import Completion, OpenAIChat, make_client
from memstream.models.roles import RoleModel
from memstream.records import RoleUsage, Source
from memstream.store import Store
from memstream.stream import MemoryStream, Observation
from memstream.testing import FakeClock
from tests.fakes.openai_server import FakeOpenAIServer

RATER_NEEDLE = "Reply with a single integer"


class InFlight:
    """Counts model calls in flight at the client, and the most at once."""

    def __init__(self) -> None:
        self.now = 0
        self.most = 0

    def enter(self) -> None:
        self.now += 1
        self.most = max(self.most, self.now)

    def leave(self) -> None:
        self.now -= 1


class CountedChat:
    """A ChatModel wrapper that counts calls in flight."""

    def __init__(self, inner: OpenAIChat, gauge: InFlight) -> None:
        self.inner, self.gauge = inner, gauge

    async def complete(self, prompt: str, *, model: str) -> Completion:
        self.gauge.enter()
        try:
            return await self.inner.complete(prompt, model=model)
        finally:
            self.gauge.leave()


class CountedEmbedder(OpenAIEmbedder):
    """OpenAIEmbedder counting calls in flight."""

    gauge: InFlight

    async def embed_batch(self, texts: Sequence[str]) -> npt.NDArray[np.float32]:
        self.gauge.enter()
        try:
            return await super().embed_batch(texts)
        finally:
            self.gauge.leave()


class _Remote:
    """The fake server in another process."""

    def __init__(self, base_url: str) -> None:
        self.base_url = base_url

    def call(self, path: str, method: str = "GET") -> dict[str, Any]:
        url = self.base_url.removesuffix("/v1") + path
        with urllib.request.urlopen(urllib.request.Request(url, method=method, data=b"" if method == "POST"
                                                           else None)) as response:
            found: dict[str, Any] = json.loads(response.read())
            return found


@contextlib.asynccontextmanager
async def _server(latency: float, dim: int, in_process: bool) -> AsyncIterator[tuple[str, Any]]:
    if in_process:
        async with FakeOpenAIServer(embed_dim=dim, latency=latency) as fake:
            yield fake.base_url, fake
        return
    async with spawned(latency, dim) as base_url:
        yield base_url, _Remote(base_url)


def _server_counts(server: Any) -> dict[str, int]:
    if isinstance(server, _Remote):
        return server.call("/bench/stats")
    rating = sum(1 for r in server.chat_requests if RATER_NEEDLE in r.prompt)
    return {"rating_calls": rating, "other_chat_calls": len(server.chat_requests) - rating,
            "embedding_calls": len(server.embedding_requests),
            "embedded_texts": sum(len(batch) for batch in server.embedding_requests)}


async def run(n: int = 2000, latency: float = 0.05, concurrency: int | None = None, dim: int = 384,
              in_process: bool = False, database: str | None = None) -> dict[str, Any]:
    """Absorb a burst of n observations; throughput, calls per role at the server, and what was stored.
    `database`: a PostgreSQL URL to store into (default: a new SQLite file)."""
    config = StreamConfig() if concurrency is None else StreamConfig(max_concurrency=concurrency)
    gauge = InFlight()
    async with _server(latency, dim, in_process) as (base_url, server):
        client = make_client(base_url=base_url, api_key="bench", timeout=60.0, max_retries=0)
        chat = CountedChat(OpenAIChat(client), gauge)
        embedder = CountedEmbedder(client, model="text-embedding-fake")
        embedder.gauge = gauge
        with tempfile.TemporaryDirectory() as tmp:
            store = await Store.open(database or Path(tmp) / "ingest.db")
            memory = MemoryStream(store, embedder, rater=RoleModel(chat, "gpt-fake"),  # type: ignore[arg-type]
                                  reflector=RoleModel(chat, "gpt-fake"), agent=RoleModel(chat, "gpt-fake"),  # type: ignore[arg-type]
                                  name="Maria", summary="A painter.", config=config,
                                  clock=FakeClock(from_timestamp(NOW)), auto_reflect=False)
            await memory.observe("the first message", stream=STREAM)
            await memory.index.get(STREAM)  # a running bot has its stream loaded
            if isinstance(server, _Remote):
                server.call("/bench/reset", "POST")
            else:
                server.reset()
            gauge.most = 0
            usage_before = await store.usage(STREAM)
            burst = [Observation(text(i), stream=STREAM, source=Source(author="Klaus", author_id="7",
                                                                         channel="general", message_id=f"m{i}"))
                     for i in range(n)]
            start = time.perf_counter()
            memories = await memory.observe_many(burst)
            elapsed = time.perf_counter() - start
            counts = await store.counts(STREAM)
            usage = await store.usage(STREAM)
            loaded = memory.index.loaded(STREAM)
            stats = await memory.stats(STREAM)
            await memory.close()
        await client.close()
        at_server = _server_counts(server)
    return {
        "n": n, "latency_s": latency, "max_concurrency": config.max_concurrency, "server_in_process": in_process,
        "embed_batch_size": config.embed_batch_size, "seconds": elapsed, "per_second": n / elapsed,
        **at_server,
        "most_in_flight": gauge.most, "ready": sum(m.status == "ready" for m in memories),
        "stored_ready": counts.observations - counts.pending - 1, "pending": counts.pending,
        "in_matrix": None if loaded is None else loaded.n - 1,
        "usage": {role: {key: value - getattr(usage_before.get(role, RoleUsage()), key)
                         for key, value in asdict(row).items()} for role, row in usage.items()},
        "stats_usage": stats.to_json()["usage"],
    }
