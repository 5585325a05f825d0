"""The fake OpenAI server in a process of its own (a real model server is not on the bot's CPU):
`python -m bench.fake_server LATENCY DIM` prints its base URL, then serves until stdin closes.
GET /bench/stats gives the counts the benchmark checks; POST /bench/reset clears them. `spawned` runs it from a
benchmark and gives its base URL."""

from __future__ import annotations

import asyncio
import contextlib
import sys
from collections.abc import AsyncIterator
from pathlib import Path

from aiohttp import web

from tests.fakes.openai_server import CHAT_PATH, EMBEDDINGS_PATH, FakeOpenAIServer

RATER_NEEDLE = "Reply with a single integer"
_ROOT = Path(__file__).resolve().parent.parent


@contextlib.asynccontextmanager
async def spawned(latency: float, dim: int) -> AsyncIterator[str]:
    """The fake server in a process of its own while the block runs; its base URL."""
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "bench.fake_server", str(latency), str(dim), stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE, cwd=_ROOT)
    assert process.stdin is not None and process.stdout is not None
    try:
        yield (await process.stdout.readline()).decode().strip()
    finally:
        process.stdin.close()
        await process.wait()


async def serve(latency: float, dim: int) -> None:
    fake = FakeOpenAIServer(embed_dim=dim, latency=latency)

    async def stats(request: web.Request) -> web.Response:
        rating = sum(1 for r in fake.chat_requests if RATER_NEEDLE in r.prompt)
        return web.json_response({"rating_calls": rating, "other_chat_calls": len(fake.chat_requests) - rating,
                                  "embedding_calls": len(fake.embedding_requests),
                                  "embedded_texts": sum(len(b) for b in fake.embedding_requests)})

    async def reset(request: web.Request) -> web.Response:
        fake.reset()
        return web.json_response({})

    app = web.Application()
    app.router.add_post(CHAT_PATH, fake._handle_chat)
    app.router.add_post(EMBEDDINGS_PATH, fake._handle_embeddings)
    app.router.add_get("/bench/stats", stats)
    app.router.add_post("/bench/reset", reset)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    print(f"http://127.0.0.1:{runner.addresses[0][1]}/v1", flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
    await runner.cleanup()


if __name__ == "__main__":
    asyncio.run(serve(float(sys.argv[1]), int(sys.argv[2])))
