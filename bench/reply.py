"""Case 4: reply overhead. Everything in a mention's path except the models' own latency, at 100k memories:
MemoryStream.respond observes the message (a rating call and an embedding, both answered at once by in-process
fakes), embeds the query, retrieves (every memory scored), builds the prompt, calls the agent model (answered
at once), observes the persona's own reply (another rating and embedding) and records the trace.
"""

from __future__ import annotations

import hashlib
import shutil
import statistics
import tempfile
import time
from collections.abc import Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from bench.data import NOW, STREAM, store_file
from memstream.clock import from_timestamp
from memstream.config import StreamConfig
from memstream.models.roles import RoleModel
from memstream.records import Source
from memstream.store import Store
from memstream.stream import MemoryStream
from memstream.testing import FakeClock, ScriptedChat


class InstantEmbedder:
    """Deterministic unit vectors from a hash of the text, in microseconds (a model with no latency)."""

    def __init__(self, dim: int) -> None:
        self.dim = dim

    async def embed_batch(self, texts: Sequence[str]) -> npt.NDArray[np.float32]:
        """One row per text."""
        rows = []
        for text in texts:
            seed = int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little")
            rows.append(np.random.default_rng(seed).standard_normal(self.dim, dtype=np.float32))
        matrix = np.stack(rows)
        out: npt.NDArray[np.float32] = matrix / np.linalg.norm(matrix, axis=1, keepdims=True)
        return out


async def run(n: int = 100_000, dim: int = 384, mentions: int = 60) -> dict[str, Any]:
    """Median time of respond() over `mentions` mentions, after one that loads the stream."""
    chat = ScriptedChat().on("Reply with a single integer", "6").on("What do you do or say next?",
                                                                    "I'm going to Isabella's party at 5!")
    clock = FakeClock(from_timestamp(NOW))
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "reply.db"
        shutil.copy(store_file(n, dim), path)
        store = await Store.open(path)
        memory = MemoryStream(store, InstantEmbedder(dim), rater=RoleModel(chat, "rater"),
                              reflector=RoleModel(chat, "reflector"), agent=RoleModel(chat, "agent"),
                              name="Maria", summary="Maria is a student who loves painting.", config=StreamConfig(),
                              clock=clock, auto_reflect=False)
        start = time.perf_counter()
        await memory.respond("hello!", stream=STREAM, speaker="Klaus")
        first = time.perf_counter() - start
        times, retrieve_times = [], []
        for i in range(mentions):
            clock.advance(minutes=1)
            message = f"What are you doing tonight? ({i})"
            begin = time.perf_counter()
            reply = await memory.respond(message, stream=STREAM, speaker="Klaus",
                                         source=Source(author="Klaus", author_id="7", message_id=f"q{i}"))
            times.append(time.perf_counter() - begin)
            assert len(reply.memories) == 5 and reply.text
            begin = time.perf_counter()
            await memory.explain(message, stream=STREAM, at=clock.now() + timedelta(seconds=1))
            retrieve_times.append(time.perf_counter() - begin)
        await memory.close()
    return {"n": n, "dim": dim, "mentions": mentions, "first_s": first,
            "median_ms": statistics.median(times) * 1e3, "p90_ms": sorted(times)[int(0.9 * len(times))] * 1e3,
            "explain_median_ms": statistics.median(retrieve_times) * 1e3,
            "model_calls_per_mention": {"rater": 2, "embedding": 3, "agent": 1}}
