"""The persona's memory, a command at a time: observe, memories, recall, reflect, why, stats and forget."""

from __future__ import annotations

import argparse
import dataclasses
from typing import TYPE_CHECKING

from memstream.cli.handlers import OnMemory
from memstream.cli.options import Parents, importance, memory_id, positive
from memstream.cli.output import emit
from memstream.config import PROFILE_NAMES, PersonaConfig, show_database
from memstream.errors import ConfigError
from memstream.exits import EXIT_BAD_INPUT
from memstream.render import (
    because_text,
    budget_lines,
    faults_text,
    histogram_lines,
    memory_json,
    pending_text,
    questions_text,
    ranking_lines,
    rater_alarm,
    scored_json,
    short,
    tree_json,
    tree_lines,
    usage_lines,
)

if TYPE_CHECKING:
    from memstream.cli.options import Subparsers
    from memstream.stream import MemoryStream

__all__ = ["add_parsers", "cmd_forget", "cmd_memories", "cmd_observe", "cmd_recall", "cmd_reflect", "cmd_stats",
           "cmd_why"]


async def cmd_observe(memory: MemoryStream, args: argparse.Namespace) -> int:
    """Observe one text."""
    stored = await memory.observe(args.text, stream=args.stream, at=args.at, importance=args.importance)
    emit(args, memory_json(stored), [f"#{stored.id} importance {stored.importance} "
                                     f"({stored.importance_source}): {short(stored.text)}"])
    return 0


async def cmd_memories(memory: MemoryStream, args: argparse.Namespace) -> int:
    """The most recent memories of a stream, newest first."""
    found = await memory.store.recent(args.stream, args.limit, include_pending=True)
    emit(args, [memory_json(m) for m in found],
         [f"#{m.id} {m.created_at:%Y-%m-%d %H:%M} UTC {m.kind} (importance {m.importance or '-'}"
          f"{', pending' if m.status == 'pending' else ''}) {short(m.text)}" for m in found]
         or [f"stream {args.stream!r} has no memories yet"])
    return 0


async def cmd_recall(memory: MemoryStream, args: argparse.Namespace) -> int:
    """The ranking for a query, read-only."""
    items = await memory.explain(args.query, stream=args.stream, k=args.k, at=args.at)
    emit(args, [scored_json(item, i) for i, item in enumerate(items, 1)],
         ranking_lines(items) if items else [await _empty_stream_line(memory, args.stream)])
    return 0


async def _empty_stream_line(memory: MemoryStream, stream: str) -> str:
    """A stream with nothing in it, and the ones that have something (an import into a server's stream is
    easy to look for in `default`)."""
    others = [key for key in await memory.streams() if key != stream]
    if not others:
        return f"stream {stream!r} has no memories yet"
    shown = ", ".join(others[:5]) + (f" and {len(others) - 5} more" if len(others) > 5 else "")
    return f"stream {stream!r} has no memories yet; this database holds {shown}: pass --stream KEY"


def _profile(args: argparse.Namespace, persona: PersonaConfig) -> PersonaConfig:
    """recall --profile: the persona scored with another profile."""
    if not args.profile:
        return persona
    from memstream.index.profiles import configured

    return dataclasses.replace(persona, memory=configured(persona.memory, args.profile))


async def cmd_reflect(memory: MemoryStream, args: argparse.Namespace) -> int:
    """Reflect now."""
    result = await memory.reflect(args.stream, at=args.at)
    assert result is not None
    lines = [f"questions: {questions_text(result)}"]
    lines += [f"#{insight.id} {insight.text} {because_text(result, insight.id)}" for insight in result.insights]
    lines += [f"dropped (too little evidence): {short(text)}" for text in result.dropped]
    if result.skipped:
        lines.append(f"skipped: {result.skipped}")
    emit(args, {"questions": result.questions, "skipped": result.skipped, "dropped": result.dropped,
                "insights": [{**memory_json(m), "evidence": result.evidence.get(m.id, [])}
                             for m in result.insights]}, lines)
    return 0


async def cmd_why(memory: MemoryStream, args: argparse.Namespace) -> int:
    """The evidence tree of a memory."""
    tree = await memory.why(args.memory_id, stream=args.stream if args.stream_given else None)
    emit(args, tree_json(tree), tree_lines(tree))
    return 0


async def cmd_stats(memory: MemoryStream, args: argparse.Namespace) -> int:
    """Counts, histogram, fallbacks, reflection progress and model calls."""
    stream = args.stream if args.stream_given else None
    stats = await memory.stats(stream)
    streams = await memory.streams()
    database = show_database(memory.store.path)
    counts, state, hist = stats.counts, stats.state, stats.counts.histogram
    lines = [f"database: {database}",
             f"streams: {', '.join(streams) or '(none)'}",
             f"observations {counts.observations}, reflections {counts.reflections}, "
             f"pending {pending_text(stats.pending)}, fallback ratings {counts.fallback}",
             f"importance of the {sum(hist.values())} rated memories (observations and reflections; pending ones "
             "are not rated yet):", *histogram_lines(hist)]
    if state is not None:
        lines.append(f"towards next reflection: {state.importance_since_reflection}/"
                     f"{stats.reflection_threshold} (reflections run {state.reflections}, "
                     f"skipped {state.skipped_reflections})")
    lines += usage_lines(stats)
    lines += budget_lines(stats.budget)
    if stats.resident is not None:
        lines.append(f"in memory in this process: {stats.resident.text()}")
    if stats.faults:
        lines.append(f"faults: {faults_text(stats.faults)}")
    alarm = rater_alarm(stats)
    if alarm is not None:
        lines.append(f"warning: {alarm} (README: Importance ratings)")
    emit(args, {**stats.to_json(), "streams": streams, "database": database}, lines)
    return 0


def _forget_selection(args: argparse.Namespace, persona: PersonaConfig) -> PersonaConfig:
    """Exactly one thing to forget (checked before the database is opened)."""
    if sum([bool(args.author), bool(args.message), bool(args.memory_ids), args.all]) != 1:
        raise ConfigError("say what to forget: --author USER_ID, --message MESSAGE_ID, memory ids, "
                          "or --stream KEY --all")
    if args.all and not args.stream_given:
        raise ConfigError("--all forgets one whole stream: give it with --stream KEY")
    return persona


async def cmd_forget(memory: MemoryStream, args: argparse.Namespace) -> int:
    """Honour a deletion request: a user's messages, Discord messages, memory ids, or a whole stream."""
    stream = args.stream if args.stream_given else None
    if args.all and stream is not None:
        removed = await memory.purge(stream)
        emit(args, {"stream": stream, "memories": removed, "scrubbed": memory.scrubbed},
             [f"stream {stream}: {removed} memory(ies) forgotten", *_scrub_lines(memory)])
        return 0
    missing: list[int] = []
    if args.author:
        gone = [i for key in ([stream] if stream is not None else await memory.store.streams())
                for i in await memory.forget_author(key, args.author)]
    elif args.message:
        gone = await memory.forget_messages(args.message)
    else:
        gone, missing = await _forget_ids(memory, args.memory_ids, stream)
    emit(args, {"forgotten": gone, "not_found": missing, "scrubbed": memory.scrubbed},
         _forgotten_lines(memory, gone, missing, stream))
    return EXIT_BAD_INPUT if missing else 0


async def _forget_ids(memory: MemoryStream, ids: list[int], stream: str | None) -> tuple[list[int], list[int]]:
    """Forget memories by id; the ids that name no memory (of `stream`, when given) are returned as missing."""
    found = await memory.store.get_many(sorted(set(ids)))
    missing = [i for i in dict.fromkeys(ids) if i not in found or (stream is not None and found[i].stream != stream)]
    present = [i for i in ids if i not in missing]
    return (await memory.forget(present, stream=stream) if present else []), missing


def _forgotten_lines(memory: MemoryStream, gone: list[int], missing: list[int], stream: str | None) -> list[str]:
    done = f"forgotten: {len(gone)} memory(ies), with the insights and replies built on them"
    if memory.scrubbed and gone:
        done += "; no copy of their text is left in the database's files"
    lines = [done, *_scrub_lines(memory)]
    if missing:
        where = f" in stream {stream}" if stream is not None else ""
        lines.append(f"no memory {', '.join(f'#{i}' for i in missing)}{where}: nothing was forgotten for "
                     f"{'it' if len(missing) == 1 else 'them'} (check the numbers with recall or /memories)")
    elif not gone:
        lines.append("nothing matched: no memory was forgotten")
    return lines


def _scrub_lines(memory: MemoryStream) -> list[str]:
    """The truth about old copies when another process kept the scrub from finishing."""
    if memory.scrubbed:
        return []
    return [f"note: another process is reading {memory.store.path}, so older copies of the forgotten text stay "
            "in its write-ahead log (or, on PostgreSQL, in its tables' dead rows) until it lets go; memstream "
            "removes them the next time it opens or closes this persona (run any memstream command on it after "
            "that process stops, or stop the bot briefly)"]


def add_parsers(sub: Subparsers, shared: Parents) -> None:
    """observe, memories, recall, reflect, why, forget and stats."""
    common, scoped, timed = shared.common, shared.scoped, shared.timed
    p = sub.add_parser("observe", parents=[common, scoped, timed], help="observe one text",
                       description="Rate, embed and store one observation.")
    p.add_argument("text")
    p.add_argument("--importance", type=importance, help="skip the rater and use this importance (1-10)")
    p.set_defaults(handler=OnMemory(cmd_observe, models=True))
    p = sub.add_parser("memories", parents=[common, scoped], help="the most recent memories of a stream",
                       description="List a stream's most recent memories, newest first (as /memories does).")
    p.add_argument("-n", "--limit", type=positive, default=20, help="how many (default: %(default)s)")
    p.set_defaults(handler=OnMemory(cmd_memories, models=False))
    p = sub.add_parser("recall", parents=[common, scoped, timed], help="rank memories for a query (read-only)",
                       description="Rank every memory for a query with its score parts; touches nothing.")
    p.add_argument("query")
    p.add_argument("-k", "--k", dest="k", type=positive, help="how many (default: the persona's k)")
    p.add_argument("--profile", choices=PROFILE_NAMES, metavar="PROFILE",
                   help=f"score with this profile instead of the persona's ({', '.join(PROFILE_NAMES)})")
    p.set_defaults(handler=OnMemory(cmd_recall, models=True, prepare=_profile, chat=False))
    p = sub.add_parser("reflect", parents=[common, scoped, timed], help="reflect now",
                       description="Run one reflection on a stream now and show the insights with their evidence.")
    p.set_defaults(handler=OnMemory(cmd_reflect, models=True))
    p = sub.add_parser("why", parents=[common, scoped], help="the evidence tree of a memory",
                       description="Show a reflection's evidence, down to the observations.")
    p.add_argument("memory_id", type=memory_id)
    p.set_defaults(handler=OnMemory(cmd_why, models=False))
    _add_forget(sub, shared)
    p = sub.add_parser("stats", parents=[common, scoped], help="counts, importance histogram, model calls",
                       description="Counts, importance histogram, fallback ratings and model calls.")
    p.set_defaults(handler=OnMemory(cmd_stats, models=False))


def _add_forget(sub: Subparsers, shared: Parents) -> None:
    p = sub.add_parser("forget", parents=[shared.common, shared.scoped],
                       help="delete a user's data (deletion requests)",
                       description="Forget what a user said (--author, in every stream unless --stream is given), "
                                   "some Discord messages (--message), some memories (ids), or a whole stream "
                                   "(--stream KEY --all), with every insight, reply and reply trace built on it. "
                                   "No copy of the text stays in the database file.")
    p.add_argument("memory_ids", nargs="*", type=memory_id, help="memory ids")
    p.add_argument("--author", help="a Discord user id: everything they said")
    p.add_argument("--message", action="append", help="a Discord message id (repeatable)")
    p.add_argument("--all", action="store_true", help="the whole stream given with --stream")
    p.set_defaults(handler=OnMemory(cmd_forget, models=False, prepare=_forget_selection))
