"""`memstream reembed`: the way out when the persona's embedding model changed. The store refuses to mix two
models' vectors (store/base.py `use_embedding_model`); this re-embeds every memory of the stream(s) with the
persona's model, in batches, then records the model. Each batch commits with how far its stream is, so a run
interrupted resumes where it stopped; the model is recorded only once no stream holds the old vectors."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from memstream.cli.handlers import OnMemory
from memstream.cli.options import Parents, positive
from memstream.cli.output import emit, progress
from memstream.config import PersonaConfig

if TYPE_CHECKING:
    from memstream.cli.options import Subparsers
    from memstream.stream import MemoryStream

__all__ = ["BATCH", "add_parsers", "cmd_reembed"]

BATCH = 64  # texts per embedding call (and per transaction)
ALL = "all"


def _model(args: argparse.Namespace, persona: PersonaConfig) -> PersonaConfig:
    args.embedding_model = persona.models.embedding
    return persona


async def cmd_reembed(memory: MemoryStream, args: argparse.Namespace) -> int:
    """Re-embed the stream(s) with the persona's embedding model; record it when every stream is done."""
    model: str = args.embedding_model
    known = await memory.streams()
    chosen = known if not args.stream_given or args.stream == ALL else [args.stream]
    left = {stream: await memory.store.reembed_left(stream, model) for stream in chosen}
    total, done, dimensions = sum(left.values()), 0, None
    for stream in chosen:
        while batch := await memory.store.reembed_todo(stream, model, args.batch):
            vectors = await memory.models.embed([text for _, text in batch], stream=stream, any_size=True)
            dimensions = int(vectors.shape[1])
            await memory.store.reembed(stream, model, [(memory_id, vectors[i]) for i, (memory_id, _) in
                                                       enumerate(batch)])
            done += len(batch)
            progress(min(done, total), total, len(batch), "re-embedded")
    waiting = [stream for stream in known if await memory.store.reembed_left(stream, model)]
    if not waiting:
        if dimensions is None and total == 0 and await memory.store.get_meta("embedding_model") != model:
            dimensions = int((await memory.models.embed(["dimensions"], stream=chosen[0] if chosen else "default",
                                                        any_size=True)).shape[1])
        await memory.store.finish_reembed(model, dimensions)
    lines = [f"re-embedded {done} memories of {len(chosen)} stream(s) with {model}"]
    lines.append(f"{model} is recorded as the store's embedding model" if not waiting else
                 f"still made by the old model: {', '.join(waiting)} (run: memstream reembed --stream all)")
    emit(args, {"model": model, "reembedded": done, "streams": chosen, "recorded": not waiting,
                "waiting": waiting}, lines)
    return 0


def add_parsers(sub: Subparsers, shared: Parents) -> None:
    """reembed."""
    p = sub.add_parser("reembed", parents=[shared.common, shared.scoped],
                       help="re-embed memories with the persona's embedding model (after changing it)",
                       description="Re-embed every memory of a stream (--stream KEY) or of all of them (the "
                                   "default, or --stream all) with the persona's embedding model, in batches, "
                                   "then record it as the store's model. Safe to run again after an interruption: "
                                   "it resumes.")
    p.add_argument("--batch", type=positive, default=BATCH, help="texts per embedding call (default: %(default)s)")
    p.set_defaults(handler=OnMemory(cmd_reembed, models=True, prepare=_model, chat=False))

