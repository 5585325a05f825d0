"""`memstream web`: check where it may listen, open the persona, serve the dashboard until Ctrl-C."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from aiohttp import web

from memstream.config import PersonaConfig
from memstream.errors import ConfigError
from memstream.models.llm import Completion
from memstream.stream import MemoryStream
from memstream.web.app import WebOptions, make_app
from memstream.web.security import resolve_token

__all__ = ["run", "serve"]


class _NoModel:
    """Stands in for models that cannot be reached: the pages work, search says why it cannot."""

    def __init__(self, error: ConfigError) -> None:
        self.error = error

    async def complete(self, prompt: str, *, model: str) -> Completion:
        raise ConfigError(str(self.error))

    async def embed_batch(self, texts: Sequence[str]) -> Any:
        raise ConfigError(str(self.error))


async def _open(persona: PersonaConfig) -> MemoryStream:
    try:
        return await MemoryStream.open(persona)
    except ConfigError as exc:  # no API key: browsing needs none
        print(f"memstream web: search is off ({exc})", file=sys.stderr)
        stand_in = _NoModel(exc)
        return await MemoryStream.open(persona, chat=stand_in, embedder=stand_in)


async def serve(memory: MemoryStream, options: WebOptions, *, started: asyncio.Event | None = None) -> None:
    """Serve the dashboard until cancelled (Ctrl-C); the address is printed once it listens."""
    runner = web.AppRunner(make_app(memory, options), access_log=None)
    await runner.setup()
    try:
        site = web.TCPSite(runner, options.host, options.port)
        try:
            await site.start()
        except OSError as exc:
            raise ConfigError(f"cannot listen on {options.host}:{options.port}: {exc.strerror or exc}") from exc
        port = runner.addresses[0][1] if runner.addresses else options.port
        host = f"[{options.host}]" if ":" in options.host else options.host
        mode = "forget allowed" if options.allow_forget else "read-only"
        token = "; token required (open it once as /?token=TOKEN)" if options.token else ""
        print(f"memstream web: {memory.name}'s memory at http://{host}:{port}/ ({mode}{token}); Ctrl-C stops",
              flush=True)
        if started is not None:
            started.set()
        await asyncio.Event().wait()
    finally:
        await runner.cleanup()


async def run(args: Any, persona: PersonaConfig, environ: Mapping[str, str] | None = None) -> int:
    """The `memstream web` command: the token is checked before the database is opened."""
    if not 0 <= args.port <= 65535:
        raise ConfigError(f"--port must be from 0 to 65535 (0: any free port), got {args.port}")
    options = WebOptions(host=args.host, port=args.port, allow_forget=args.allow_forget,
                         token=resolve_token(args.host, args.token, environ))
    memory = await _open(persona)
    try:
        await serve(memory, options)
    finally:
        await memory.close()
    return 0
