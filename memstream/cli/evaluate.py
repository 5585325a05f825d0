"""`memstream eval`: replay a labeled file through the real pipeline, once per scoring profile, and report
hit@k and recall@k overall and per label (the replay itself is memstream.data.evaluate)."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from memstream.cli.handlers import OnPersona
from memstream.cli.options import Parents, positive
from memstream.cli.output import emit
from memstream.config import BASELINES, PROFILE_NAMES, PersonaConfig

if TYPE_CHECKING:
    from memstream.cli.options import Subparsers

__all__ = ["add_parsers", "cmd_eval", "eval_lines"]

DEFAULT_KS = (5, 10)


async def cmd_eval(args: argparse.Namespace, persona: PersonaConfig) -> int:
    """Replay a labeled file per scoring profile; hit@k and recall@k, overall and per label."""
    from memstream.data.evaluate import CachedChat, CachedEmbedder, ModelCache, evaluate, read_eval
    from memstream.models.connect import connect_models

    lines = read_eval(Path(args.file))
    ks = sorted(set(args.k or DEFAULT_KS))
    chat, embedder, client = connect_models(persona)
    beside = Path.cwd() if isinstance(persona.database, str) else persona.database.parent
    cache = ModelCache(args.cache or beside / "eval-cache.sqlite")
    try:
        report = await evaluate(
            lines, config=persona.memory, embedder=CachedEmbedder(embedder, cache, persona.models.embedding),
            chat=CachedChat(chat, cache), rater_model=persona.models.rater,
            profiles=args.profile or [*PROFILE_NAMES, *BASELINES], ks=ks, touch=not args.no_touch, name=persona.name,
        )
    finally:
        cache.close()
        if client is not None:
            await client.close()
    report["cache"] = {"hits": cache.hits, "misses": cache.misses}
    emit(args, report, eval_lines(report, ks))
    return 0


def eval_lines(report: dict[str, Any], ks: Sequence[int]) -> list[str]:
    """The eval report as a table: a row per profile and label."""
    cols = [f"{m}@{k}" for k in ks for m in ("hit", "recall")]
    lines = [f"{'profile':<10} {'label':<16} {'queries':>7} " + " ".join(f"{c:>9}" for c in cols)]
    for profile, result in report.items():
        if profile == "cache":
            continue
        rows = [("overall", result["overall"]), *result["labels"].items()]
        for label, row in rows:
            lines.append(f"{profile:<10} {label[:16]:<16} {row['queries']:>7} "
                         + " ".join(f"{row[c]:>9.3f}" for c in cols))
    cache = report.get("cache", {})
    lines.append(f"model cache: {cache.get('hits', 0)} hit(s), {cache.get('misses', 0)} miss(es)")
    return lines


def add_parsers(sub: Subparsers, shared: Parents) -> None:
    """eval."""
    p = sub.add_parser("eval", parents=[shared.common],
                       help="measure retrieval on a labeled file, per scoring profile",
                       description="Replay a labeled JSONL file (observations with keys, queries with the keys "
                                   "they expect) through the real pipeline with a replay clock, once per profile, "
                                   "and report hit@k and recall@k overall and per label. Embeddings and ratings "
                                   "are cached, so a second run costs no model calls.")
    p.add_argument("file")
    p.add_argument("--profile", action="append", choices=[*PROFILE_NAMES, *BASELINES],
                   help="a scoring profile or baseline (repeatable; default: every profile, then the baselines "
                        "relevance (plain vector search) and lexical (keywords only))")
    p.add_argument("-k", "--k", dest="k", action="append", type=positive,
                   help="a cut-off (repeatable; default: 5 and 10)")
    p.add_argument("--no-touch", action="store_true",
                   help="the static view: queries do not update last access (default: they do, as the bot's do)")
    p.add_argument("--cache", type=Path, help="model cache file (default: eval-cache.sqlite beside the database)")
    p.set_defaults(handler=OnPersona(cmd_eval, models=True))
