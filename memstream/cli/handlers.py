"""How a command runs. Each command's parser carries its handler (`set_defaults(handler=...)`), one of three
kinds, by what the command is handed: its arguments alone (`Plain`), the persona (`OnPersona`), or the
persona's memory, opened for it and closed after (`OnMemory`). `run` loads the persona, starts the local
models around the command with --local, and opens the memory.
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any

from memstream.cli.output import say
from memstream.cli.shell import spinner_wanted
from memstream.cli.spinner import Spinner
from memstream.clock import Clock, FixedClock, SystemClock
from memstream.config import PersonaConfig, load_persona, show_database
from memstream.errors import ConfigError, MissingKey
from memstream.text import visible

if TYPE_CHECKING:
    from memstream.models.llm import Completion
    from memstream.stream import MemoryStream

__all__ = ["Handler", "OnMemory", "OnPersona", "Plain", "run"]


@dataclasses.dataclass(frozen=True)
class Plain:
    """A command handed its arguments alone: it finds what it needs itself."""

    function: Callable[[argparse.Namespace], Awaitable[int]]
    refuses_local: bool = False  # --local is for trying the pipeline, which this command is not
    takes_any: bool = False  # it accepts any further arguments (a stand-in that only explains itself)


@dataclasses.dataclass(frozen=True)
class OnPersona:
    """A command handed the persona (its database, models and settings), which it opens itself."""

    function: Callable[[argparse.Namespace, PersonaConfig], Awaitable[int]]
    models: bool = False  # it calls a model: --local gives it the local ones
    chat: bool = True  # False: only embeddings (--local starts no chat server for it)


@dataclasses.dataclass(frozen=True)
class OnMemory:
    """A command handed the persona's memory, open; `prepare` checks the arguments (and may adjust the persona)
    before the database is opened."""

    function: Callable[[MemoryStream, argparse.Namespace], Awaitable[int]]
    models: bool  # False: it never calls a model (stand-ins say so if it did)
    prepare: Callable[[argparse.Namespace, PersonaConfig], PersonaConfig] | None = None
    chat: bool = True  # False: only embeddings (its query), never a chat model


Handler = Plain | OnPersona | OnMemory


class _NoModels:
    """Stands in for the models in commands that never call one."""

    async def complete(self, prompt: str, *, model: str) -> Completion:
        raise ConfigError("this command does not use a model")

    async def embed_batch(self, texts: Sequence[str]) -> Any:
        raise ConfigError("this command does not use a model")


async def run(args: argparse.Namespace) -> int:
    """Run the command the arguments name, handing it what it needs."""
    handler: Handler = args.handler
    if isinstance(handler, Plain):
        if handler.refuses_local and getattr(args, "local", False):
            raise ConfigError(f"--local is for trying the pipeline from the terminal, not for {args.command}: for "
                              "a real persona on this machine, point [models] base_url at Ollama (README)")
        return await handler.function(args)
    persona = load_persona(args.persona)
    if args.db is not None:
        persona = persona.with_database(args.db)
    if not getattr(args, "local", False):
        return await _handle(handler, args, persona)
    return await _locally(handler, args, persona)


async def _locally(handler: OnPersona | OnMemory, args: argparse.Namespace, persona: PersonaConfig) -> int:
    """--local: the command on this machine's models (when it calls one) and their own database."""
    from memstream.models.local import running

    serve, embed = handler.models and handler.chat, handler.models and not handler.chat
    with Spinner((serve or embed) and spinner_wanted(args.json)) as spin:
        spin.show("starting the local models")
        note: Callable[[str], None] = lambda line: spin.note(visible(f"memstream: {line}"))  # noqa: E731
        async with running(persona, serve=serve, embed=embed, database=args.db, say=note) as local:
            spin.stop()
            say(f"local models: {local.models.agent} at {local.models.base_url} (a tiny model for trying the "
                f"pipeline), embeddings {local.models.embedding}; database {show_database(local.database)}" if serve
                else f"local embeddings {local.models.embedding}; database {show_database(local.database)}" if embed
                else f"local database: {show_database(local.database)}")
            return await _handle(handler, args, local)


async def _handle(handler: OnPersona | OnMemory, args: argparse.Namespace, persona: PersonaConfig) -> int:
    if isinstance(handler, OnPersona):
        return await handler.function(args, persona)
    if handler.prepare is not None:
        persona = handler.prepare(args, persona)
    clock: Clock = SystemClock() if getattr(args, "at", None) is None else FixedClock(args.at)
    fakes: dict[str, Any] = ({"chat": _NoModels(), "embedder": _NoModels()} if not handler.models
                             else {} if handler.chat else {"chat": _NoModels()})
    from memstream.stream import MemoryStream  # numpy, the SDK and SQLite: only once a command runs

    try:
        memory = await MemoryStream.open(persona, clock=clock, **fakes)
    except MissingKey as exc:
        if getattr(args, "local", None) is None:  # a command without --local (a plugin's)
            raise
        raise MissingKey(f"{exc}; or try memstream with no key at all: add --local (a small model and "
                         "embeddings on this machine, their own database)") from exc
    try:
        return await handler.function(memory, args)
    finally:
        await memory.close()
