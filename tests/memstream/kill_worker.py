"""A process for tests to kill with SIGKILL: it ingests a burst of messages, or reflects once, against the
model server whose URL it is given (the fake OpenAI server of the test process).

    python -m tests.memstream.kill_worker ingest DB BASE_URL COUNT BATCH
    python -m tests.memstream.kill_worker reflect DB BASE_URL STREAM
"""

from __future__ import annotations

import asyncio
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

from memstream import MemoryStream, ModelConfig, Observation, PersonaConfig, Source, StreamConfig

T0 = datetime(2024, 2, 13, 9, 0, tzinfo=UTC)
STREAMS = ("guild:1", "guild:2")


def persona(db: Path, base_url: str, threshold: int = 10**9) -> PersonaConfig:
    """The persona both the worker and the test open (no client retries: a killed call is not retried)."""
    return PersonaConfig(name="Isabella", summary="Isabella runs Hobbs Cafe.", database=db,
                         models=ModelConfig(base_url=base_url, max_retries=0, timeout=30),
                         memory=StreamConfig(reflection_threshold=threshold))


def messages(count: int) -> list[Observation]:
    """The burst: Discord-like messages with ids, across two servers and seven authors."""
    return [Observation(f"Author {i % 7} in #general: message number {i} about the party", STREAMS[i % 2],
                        T0 + timedelta(seconds=i), None,
                        Source(author=f"Author {i % 7}", author_id=str(i % 7), channel="general",
                               channel_id="100", message_id=str(10_000 + i)))
            for i in range(count)]


async def ingest(db: Path, base_url: str, count: int, batch: int) -> None:
    """Observe the burst batch by batch, as the bot's observer does."""
    async with await MemoryStream.open(persona(db, base_url), environ={}) as memory:
        items = messages(count)
        for start in range(0, count, batch):
            await memory.observe_many(items[start:start + batch])
    print("done", flush=True)


async def reflect(db: Path, base_url: str, stream: str) -> None:
    """One reflection now."""
    async with await MemoryStream.open(persona(db, base_url), environ={}) as memory:
        await memory.reflect(stream, at=T0 + timedelta(days=1))
    print("done", flush=True)


def main(argv: list[str]) -> None:
    command, db, base_url, *rest = argv
    if command == "ingest":
        asyncio.run(ingest(Path(db), base_url, int(rest[0]), int(rest[1])))
    elif command == "reflect":
        asyncio.run(reflect(Path(db), base_url, rest[0]))
    else:
        raise SystemExit(f"unknown command {command!r}")


if __name__ == "__main__":
    main(sys.argv[1:])
