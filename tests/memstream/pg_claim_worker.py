"""A process racing another for pending work: claim a few, complete them, until none is left (test_postgres)."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import numpy as np

from memstream.store import Store


async def main(url: str) -> list[int]:
    done: list[int] = []
    async with await Store.open(url) as store:
        while claimed := await store.pending_memories(7, claim=True):
            for stream in sorted({m.stream for m in claimed}):
                items = [(m.id, 5, "rater", np.ones(4, np.float32)) for m in claimed if m.stream == stream]
                done += await store.complete_many(stream, items)
            await asyncio.sleep(0)
    return done


if __name__ == "__main__":
    Path(sys.argv[2]).write_text(" ".join(map(str, asyncio.run(main(sys.argv[1])))))
