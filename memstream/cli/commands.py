"""`memstream`: talk to a persona, feed its memory, and look inside it from the terminal.

The modules that load numpy, the openai SDK or SQLite are imported by the commands that use them, so that
`memstream --help` and a mistyped option answer at once (tests/memstream/cli/test_startup.py).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import importlib
import json
import logging
import os
import sys
import threading
from collections.abc import Callable, Coroutine, Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from memstream.cli import init as init_persona
from memstream.cli.shell import STEPS, spinner_wanted, why_lines
from memstream.cli.spinner import Spinner
from memstream.clock import Clock, FixedClock, SystemClock
from memstream.config import BASELINES, PersonaConfig, load_persona
from memstream.config import PROFILE_NAMES as PROFILES
from memstream.data.history import parse_time, read_history
from memstream.errors import ConfigError, MemstreamError, ProviderError
from memstream.exits import EXIT_BAD_INPUT, EXIT_PENDING, exit_status
from memstream.records import DEFAULT_STREAM, EvidenceNode, Memory, ScoredMemory
from memstream.render import compact_ranges
from memstream.text import visible, visible_json

if TYPE_CHECKING:
    from memstream.models.llm import Completion
    from memstream.stream import MemoryStream, Reply

__all__ = ["build_parser", "main", "parse_time"]

log = logging.getLogger("memstream.cli.commands")
DEFAULT_PERSONA = "personas/isabella.toml"


class _NoModels:
    """Stands in for the models in commands that never call one."""

    async def complete(self, prompt: str, *, model: str) -> Completion:
        raise ConfigError("this command does not use a model")

    async def embed_batch(self, texts: Sequence[str]) -> Any:
        raise ConfigError("this command does not use a model")


# -- rendering -------------------------------------------------------------------------------------


def _short(text: str, width: int = 90) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= width else flat[: width - 1] + "…"


def memory_json(memory: Memory) -> dict[str, Any]:
    """A memory as JSON-ready data."""
    src = memory.source
    return {"id": memory.id, "stream": memory.stream, "kind": memory.kind, "text": memory.text,
            "created_at": memory.created_at.isoformat(), "last_accessed_at": memory.last_accessed_at.isoformat(),
            "importance": memory.importance, "importance_source": memory.importance_source,
            "depth": memory.depth, "status": memory.status,
            "source": {k: v for k, v in vars(src).items() if v is not None}}


def scored_json(item: ScoredMemory, rank: int) -> dict[str, Any]:
    """A ranked memory with its score parts."""
    return {"rank": rank, "score": round(item.score, 6), "recency": round(item.recency, 6),
            "importance": round(item.importance, 6), "relevance": round(item.relevance, 6),
            "cosine": round(item.cosine, 6), "memory": memory_json(item.memory)}


def tree_json(node: EvidenceNode) -> dict[str, Any]:
    """An evidence tree as nested JSON."""
    return {**memory_json(node.memory), "evidence": [tree_json(child) for child in node.evidence]}


def tree_lines(node: EvidenceNode, prefix: str = "", last: bool = True, root: bool = True) -> list[str]:
    """An evidence tree drawn with box characters."""
    m = node.memory
    label = (f"#{m.id} {m.kind} (importance {m.importance}"
             + (f", depth {m.depth}" if m.kind == "reflection" else "")
             + f") {m.created_at:%Y-%m-%d %H:%M} UTC {_short(m.text, 80)}")
    lines = [label if root else f"{prefix}{'└── ' if last else '├── '}{label}"]
    child_prefix = "" if root else prefix + ("    " if last else "│   ")
    for i, child in enumerate(node.evidence):
        lines += tree_lines(child, child_prefix, i == len(node.evidence) - 1, root=False)
    return lines


def ranking_lines(items: Sequence[ScoredMemory]) -> list[str]:
    """A ranking as a table."""
    lines = [f"{'#':>2} {'id':>6} {'kind':<11} {'score':>6} {'rec':>5} {'imp':>5} {'rel':>5}  "
             f"{'created (UTC)':<16}  text"]
    for rank, item in enumerate(items, 1):
        lines.append(f"{rank:>2} {item.memory.id:>6} {item.memory.kind:<11} {item.score:6.3f} {item.recency:5.2f} "
                     f"{item.importance:5.2f} {item.relevance:5.2f}  {item.memory.created_at:%Y-%m-%d %H:%M}  "
                     f"{_short(item.memory.text)}")
    return lines


def _emit(args: argparse.Namespace, data: Any, lines: Sequence[str]) -> None:
    if args.json:
        print(visible_json(json.dumps(data, indent=2, ensure_ascii=False, default=str)))
    else:
        print(visible("\n".join(lines)))


# -- commands --------------------------------------------------------------------------------------


async def cmd_observe(memory: MemoryStream, args: argparse.Namespace) -> int:
    """Observe one text."""
    stored = await memory.observe(args.text, stream=args.stream, at=args.at, importance=args.importance)
    _emit(args, memory_json(stored), [f"#{stored.id} importance {stored.importance} "
                                      f"({stored.importance_source}): {_short(stored.text)}"])
    return 0


async def cmd_import(memory: MemoryStream, args: argparse.Namespace) -> int:
    """Import a JSONL file or a DiscordChatExporter export; already imported messages are skipped."""
    history = read_history(Path(args.file), stream=args.stream if args.stream_given else None,
                           importance=args.importance, include_bots=args.include_bots)
    lines = history.observations
    # Reflections run only when asked (--reflect), at the imported messages' time, never behind the user's back.
    memory.auto_reflect = False
    # A run interrupted (or cut off by a model outage) left lines pending: finish all of them first.
    await _finish_pending(memory)
    stored = already = 0
    waiting: list[int] = []
    chunk = 256
    for start in range(0, len(lines), chunk):
        part = lines[start:start + chunk]
        known = await memory.store.find_messages([(o.stream, o.source.message_id) for o in part
                                                  if o.source.message_id])
        already += sum(1 for o in part if o.source.message_id and (o.stream, o.source.message_id) in known)
        memories = await memory.observe_many(part)
        stored += sum(1 for m in memories if m.status == "ready")
        waiting += [m.id for m in memories if m.status == "pending"]
        if args.reflect:
            await _reflect_due(memory, at=max(o.at for o in part if o.at) if any(o.at for o in part) else None)
        _progress(min(start + chunk, len(lines)), len(lines), chunk)
    if waiting:  # lines another import stored and is still completing, or whose model calls failed: try once more
        await memory.complete(sorted(set(waiting)))
        now = await memory.store.get_many(sorted(set(waiting)))
        stored += sum(1 for i in waiting if i in now and now[i].status == "ready")
    pending = len(lines) - stored
    left = (await memory.store.pending_state()).count  # of this file and of earlier runs
    due = await memory.due_streams()
    new = len(lines) - already
    summary = [f"read {len(lines)} {history.format} message(s): {new} new, {already} already imported; "
               f"{stored} ready, {pending} pending"
               + (f", {history.skipped} skipped (bots, joins, pins, empty)" if history.skipped else "")]
    if due:
        summary.append(f"due for reflection: {', '.join(due)} (run: memstream reflect --stream KEY, or import "
                       "with --reflect)")
    if left:
        why = f" ({memory.last_model_error})" if memory.last_model_error is not None else ""
        summary.append(f"{left} memory(ies) pending: the model server failed{why}; they are kept, and the same "
                       "import run again (or the bot) completes them once the server is back")
    _emit(args, {"format": history.format, "observations": len(lines), "new": new, "already_imported": already,
                 "skipped": history.skipped,
                 "ready": stored, "pending": pending, "pending_total": left, "due_for_reflection": due,
                 "error": None if memory.last_model_error is None or not left else str(memory.last_model_error)},
          summary)
    return 0 if left == 0 else 3


async def _finish_pending(memory: MemoryStream, chunk: int = 1000) -> None:
    """Complete every pending memory (not only the first thousand), a chunk at a time, each tried once."""
    ids = [m.id for m in await memory.store.pending_memories(limit=2**62, claim=True)]
    for start in range(0, len(ids), chunk):
        await memory.complete(ids[start:start + chunk])


async def _reflect_due(memory: MemoryStream, *, at: datetime | None) -> None:
    """Reflect on every stream that is due; a reflection the model server fails is skipped (it is counted,
    and runs again at the next import with --reflect, `memstream reflect`, or the bot), never the import."""
    for stream in await memory.due_streams():
        try:
            await memory.reflect(stream, at=at, only_if_due=True)
        except ProviderError as exc:
            print(visible(f"memstream: reflection on {stream} skipped, it is tried again later: {exc}"),
                  file=sys.stderr)


def _progress(done: int, total: int, step: int, verb: str = "imported") -> None:
    """A progress bar on a terminal; a line every 10% elsewhere (logs stay readable)."""
    if not total:
        return
    if sys.stderr.isatty():
        width = 30
        filled = width * done // total
        print(f"\r[{'#' * filled}{'.' * (width - filled)}] {done}/{total}", end="" if done < total else "\n",
              file=sys.stderr, flush=True)
    elif total >= 1000 and (done == total or done * 10 // total != (done - step) * 10 // total):
        print(f"{verb} {done}/{total} ({100 * done // total}%)", file=sys.stderr, flush=True)


async def cmd_memories(memory: MemoryStream, args: argparse.Namespace) -> int:
    """The most recent memories of a stream, newest first."""
    found = await memory.store.recent(args.stream, args.limit, include_pending=True)
    _emit(args, [memory_json(m) for m in found],
          [f"#{m.id} {m.created_at:%Y-%m-%d %H:%M} UTC {m.kind} (importance {m.importance or '-'}"
           f"{', pending' if m.status == 'pending' else ''}) {_short(m.text)}" for m in found]
          or [f"stream {args.stream!r} has no memories yet"])
    return 0


async def cmd_recall(memory: MemoryStream, args: argparse.Namespace) -> int:
    """The ranking for a query, read-only."""
    items = await memory.explain(args.query, stream=args.stream, k=args.k, at=args.at)
    _emit(args, [scored_json(item, i) for i, item in enumerate(items, 1)],
          ranking_lines(items) if items else [f"stream {args.stream!r} has no memories yet"])
    return 0


async def cmd_reflect(memory: MemoryStream, args: argparse.Namespace) -> int:
    """Reflect now."""
    result = await memory.reflect(args.stream, at=args.at)
    assert result is not None
    lines = [f"questions: {'; '.join(result.questions) or '(none)'}"]
    for insight in result.insights:
        cited = ", ".join(f"#{i}" for i in result.evidence.get(insight.id, []))
        lines.append(f"#{insight.id} {insight.text} (because of {cited})")
    lines += [f"dropped (too little evidence): {_short(text)}" for text in result.dropped]
    if result.skipped:
        lines.append(f"skipped: {result.skipped}")
    _emit(args, {"questions": result.questions, "skipped": result.skipped, "dropped": result.dropped,
                 "insights": [{**memory_json(m), "evidence": result.evidence.get(m.id, [])}
                              for m in result.insights]}, lines)
    return 0


async def cmd_why(memory: MemoryStream, args: argparse.Namespace) -> int:
    """The evidence tree of a memory."""
    tree = await memory.why(args.memory_id, stream=args.stream if args.stream_given else None)
    _emit(args, tree_json(tree), tree_lines(tree))
    return 0


def _forget_selection(args: argparse.Namespace) -> None:
    """Exactly one thing to forget (checked before the database is opened)."""
    if sum([bool(args.author), bool(args.message), bool(args.memory_ids), args.all]) != 1:
        raise ConfigError("say what to forget: --author USER_ID, --message MESSAGE_ID, memory ids, "
                          "or --stream KEY --all")
    if args.all and not args.stream_given:
        raise ConfigError("--all forgets one whole stream: give it with --stream KEY")


async def cmd_forget(memory: MemoryStream, args: argparse.Namespace) -> int:
    """Honour a deletion request: a user's messages, Discord messages, memory ids, or a whole stream."""
    _forget_selection(args)
    stream = args.stream if args.stream_given else None
    if args.all and stream is not None:
        removed = await memory.purge(stream)
        _emit(args, {"stream": stream, "memories": removed, "scrubbed": memory.scrubbed},
              [f"stream {stream}: {removed} memory(ies) forgotten", *_scrub_lines(memory)])
        return 0
    gone: list[int] = []
    missing: list[int] = []
    if args.author:
        for key in [stream] if stream is not None else await memory.store.streams():
            gone += await memory.forget_author(key, args.author)
    elif args.message:
        gone = await memory.forget_messages(args.message)
    else:
        found = await memory.store.get_many(sorted(set(args.memory_ids)))
        missing = [i for i in dict.fromkeys(args.memory_ids)
                   if i not in found or (stream is not None and found[i].stream != stream)]
        present = [i for i in args.memory_ids if i not in missing]
        gone = await memory.forget(present, stream=stream) if present else []
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
    _emit(args, {"forgotten": gone, "not_found": missing, "scrubbed": memory.scrubbed}, lines)
    return EXIT_BAD_INPUT if missing else 0


def _scrub_lines(memory: MemoryStream) -> list[str]:
    """The truth about old copies when another process kept the scrub from finishing."""
    if memory.scrubbed:
        return []
    return [f"note: another process is reading {memory.store.path}, so older copies of the forgotten text stay "
            "in its write-ahead log (or, on PostgreSQL, in its tables' dead rows) until it lets go; memstream "
            "removes them the next time it opens or closes this persona (run any memstream command on it after "
            "that process stops, or stop the bot briefly)"]


async def cmd_stats(memory: MemoryStream, args: argparse.Namespace) -> int:
    """Counts, histogram, fallbacks, reflection progress and model calls."""
    stream = args.stream if args.stream_given else None
    stats = await memory.stats(stream)
    streams = await memory.store.streams()
    database = _absolute(memory.store.path)
    counts, pending, state, hist = stats.counts, stats.pending, stats.state, stats.counts.histogram
    retry = "now" if pending.next_retry_at is None else pending.next_retry_at.isoformat()
    lines = [f"database: {database}",
             f"streams: {', '.join(streams) or '(none)'}",
             f"observations {counts.observations}, reflections {counts.reflections}, "
             f"pending {pending.count} ({pending.failed_attempts} failed attempt(s), next retry "
             f"{retry}), fallback ratings {counts.fallback}",
             f"importance of the {sum(hist.values())} rated memories (observations and reflections; pending ones "
             "are not rated yet):", *histogram_lines(hist)]
    if state is not None:
        lines.append(f"towards next reflection: {state.importance_since_reflection}/"
                     f"{stats.reflection_threshold} (reflections run {state.reflections}, "
                     f"skipped {state.skipped_reflections})")
    for role, usage in stats.usage.items():
        lines.append(f"{role}: {usage.calls} call(s), {usage.failures} failed, "
                     f"{stats.retries.get(role, 0)} retried, "
                     f"{usage.prompt_tokens} prompt + {usage.completion_tokens} completion tokens")
    if stats.faults:
        lines.append("faults: " + ", ".join(f"{kind.replace('_', ' ')} {n}" for kind, n in stats.faults.items()))
    _emit(args, {**stats.to_json(), "streams": streams, "database": database}, lines)
    return 0


def _absolute(path: str) -> str:
    return path if path == ":memory:" else os.path.abspath(path)


def histogram_lines(counts: Mapping[int, int], width: int = 40) -> list[str]:
    """One bar per importance, scaled to the largest count (a count above zero shows at least a sliver)."""
    top = max(counts.values(), default=0)
    lines = []
    for key, n in counts.items():
        cells = 0 if top == 0 else n * width * 8 // top
        bar = "█" * (cells // 8) + ("" if cells % 8 == 0 else chr(0x2590 - cells % 8))
        if n and not bar:
            bar = "▏"
        lines.append(f"  {key:>2} {bar:<{width}} {n}")
    return lines


CHAT_HELP = ("/help  these commands\n/why   what the last reply was built from\n/quit  leave (or Ctrl-D, Ctrl-C)\n"
             "Anything else is said to the persona. Lines starting with / are never stored.")


async def cmd_chat(memory: MemoryStream, args: argparse.Namespace) -> int:
    """Talk to the persona: each line is observed and answered; /commands are the shell's own."""
    name = args.speaker
    tty = sys.stdin.isatty()
    if tty:
        with contextlib.suppress(ImportError):  # line editing and history for input(), where the platform has it
            import readline  # noqa: F401
    print(f"Talking to {memory.name} (stream {args.stream!r}). /help for commands, Ctrl-D to leave.",
          file=sys.stderr)
    last: Reply | None = None
    remembering: asyncio.Future[None] | None = None  # the last reply's rating and embedding, while the user reads
    spin = Spinner(spinner_wanted(args.json))
    try:
        while True:
            line = await _read_line(f"{name}> " if tty else None)
            if line is None:  # Ctrl-D: leave the shell's prompt on a line of its own
                if tty:
                    print(file=sys.stderr)
                with spin:
                    await _remembered(remembering, spin)
                return 0
            text = line.strip()
            if not text:
                continue
            if text.startswith("/"):
                if text in ("/quit", "/exit"):
                    with spin:
                        await _remembered(remembering, spin)
                    return 0
                if text == "/help":
                    print(CHAT_HELP, file=sys.stderr)
                elif text == "/why":
                    with spin:
                        await _remembered(remembering, spin)
                    print(visible("\n".join(await why_lines(memory, last))))
                else:
                    print(f"unknown command {visible(text.split()[0])}: /help lists them", file=sys.stderr)
                continue
            with spin:
                await _remembered(remembering, spin)
                last = await memory.respond(text, stream=args.stream, speaker=name, at=args.at, defer_reply=True,
                                            on_step=lambda step: spin.show(STEPS[step]))
            remembering = asyncio.ensure_future(memory.reply_sent(last, []))
            if args.json:
                print(json.dumps({"reply": last.text, "trace": last.trace_id,
                                  "memories": [scored_json(m, i) for i, m in enumerate(last.memories, 1)]}))
            else:
                print(visible(f"{memory.name}: {last.text}"), flush=True)
    except (KeyboardInterrupt, asyncio.CancelledError):
        spin.stop()
        if remembering is not None:  # left pending: completed by the next command on this persona
            remembering.cancel()
        if tty:
            print(file=sys.stderr)
        raise


async def _remembered(remembering: asyncio.Future[None] | None, spin: Spinner) -> None:
    """Wait for the last reply to be rated and embedded (it runs while the user reads and types)."""
    if remembering is not None and not remembering.done():
        spin.show(STEPS["remembering"])
    if remembering is not None:
        await remembering


async def _read_line(prompt: str | None) -> str | None:
    """One line of input, None at end of input. Read on a daemon thread: Ctrl-C ends the program at once
    instead of waiting for the blocked read (an executor thread would keep the process alive until Enter)."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[str | None] = loop.create_future()

    def read() -> None:
        value: str | None = None
        failure: BaseException | None = None
        try:
            value = input(prompt) if prompt is not None else sys.stdin.readline() or None
        except EOFError:
            value = None
        except Exception as exc:  # handed to the waiting coroutine
            failure = exc

        def hand_over() -> None:
            if not done.done():
                if failure is not None:
                    done.set_exception(failure)
                else:
                    done.set_result(value)

        with contextlib.suppress(RuntimeError):  # the loop is gone: the program is ending
            loop.call_soon_threadsafe(hand_over)

    threading.Thread(target=read, name="chat-input", daemon=True).start()
    return await done


async def cmd_eval(args: argparse.Namespace, persona: PersonaConfig) -> int:
    """Replay a labeled file per scoring profile; hit@k and recall@k, overall and per label."""
    from memstream.data.evaluate import CachedChat, CachedEmbedder, ModelCache, evaluate, read_eval
    from memstream.stream import connect_models

    lines = read_eval(Path(args.file))
    chat, embedder, client = connect_models(persona)
    beside = Path.cwd() if isinstance(persona.database, str) else persona.database.parent
    cache = ModelCache(args.cache or beside / "eval-cache.sqlite")
    try:
        report = await evaluate(
            lines, config=persona.memory, embedder=CachedEmbedder(embedder, cache, persona.models.embedding),
            chat=CachedChat(chat, cache), rater_model=persona.models.rater,
            profiles=args.profile or [*PROFILES, *BASELINES], ks=sorted(set(args.k or [5, 10])),
            touch=not args.no_touch, name=persona.name,
        )
    finally:
        cache.close()
        if client is not None:
            await client.close()
    report["cache"] = {"hits": cache.hits, "misses": cache.misses}
    _emit(args, report, eval_lines(report, sorted(set(args.k or [5, 10]))))
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


async def cmd_export(memory: MemoryStream, args: argparse.Namespace) -> int:
    """A data-access request (--author: one JSON document), or a stream as import lines (--stream)."""
    from memstream.data.export import author_document, document_text, private_file, write_stream

    out = args.output
    with contextlib.ExitStack() as stack:
        handle = sys.stdout if out is None else stack.enter_context(private_file(out, force=args.force))
        if args.author is not None:
            document = await author_document(memory.store, persona=memory.name, author_id=args.author,
                                             at=memory.now())
            handle.write(document_text(document))
            count, what = document["count"], f"author {args.author}"
            streams = sorted({m["stream"] for m in document["memories"]})
            data: dict[str, Any] = {"author_id": args.author, "memories": count, "streams": streams}
        else:
            done = await write_stream(memory.store, args.stream, handle)
            count, what = done.lines, f"stream {args.stream}"
            data = {"stream": args.stream, "memories": count, "reflections_left_out": done.reflections}
        handle.flush()
    if out is not None:  # stdout is free for a summary
        lines = [f"exported {count} memory(ies) of {what} to {out}"
                 + (f" from {len(data['streams'])} stream(s)" if "streams" in data else "")]
        if data.get("reflections_left_out"):
            lines.append(f"{data['reflections_left_out']} insight(s) left out: they are drawn again after an "
                         "import (memstream import --reflect)")
        _emit(args, {**data, "file": str(out)}, lines)
    return 0


async def cmd_backup(args: argparse.Namespace, persona: PersonaConfig, backup: Callable[..., int]) -> int:
    """A consistent copy of the persona's database, safe while the bot runs."""
    if isinstance(persona.database, str):
        raise ConfigError("backup copies a SQLite file; back up a PostgreSQL database with pg_dump, or copy it to a "
                          "file with: memstream copy")
    source = Path(persona.database)
    pages = await asyncio.to_thread(backup, source, args.dest, force=args.force,
                                    progress=lambda done, total: _progress(done, total, max(1, total // 10), "copied"))
    _emit(args, {"source": str(source), "backup": str(args.dest), "pages": pages},
          [f"backed up {source} to {args.dest} ({pages} pages)"])
    return 0


async def cmd_salvage(args: argparse.Namespace) -> int:
    """Copy what can be read from a damaged database into a new one."""
    from memstream.data.filecare import salvage

    report = await salvage(args.src, args.dest)
    lines = [f"salvaged into {args.dest}: " + ", ".join(f"{n} {table}" for table, n in report.copied.items())]
    for table, ids in report.unreadable.items():
        if ids:
            lines.append(f"could not read {len(ids)} row(s) of {table}: {_ranges(ids)}")
    for table, n in report.dropped.items():
        lines.append(f"left out {n} row(s) of {table} that cite rows that could not be read")
    if report.complete:
        lines.append("every row could be read")
    _emit(args, {"copied": report.copied, "unreadable": report.unreadable, "dropped": report.dropped}, lines)
    return 0 if report.complete else EXIT_PENDING


def _location(value: str) -> Path | str:
    """A copy's SRC or DST: a persona file's database, a postgresql:// URL, or a SQLite file."""
    from memstream.config import is_database_url

    if is_database_url(value):
        return value
    if value.endswith(".toml"):
        return load_persona(value).database
    return Path(value)


async def cmd_copy(args: argparse.Namespace) -> int:
    """Copy a persona's memory between databases (SQLite <-> PostgreSQL), resumable, checked at the end."""
    from memstream.data.transfer import copy_store, describe
    from memstream.store import Store

    src, dst = _location(args.src), _location(args.dest)
    if isinstance(src, Path) and not src.exists():
        raise ConfigError(f"{src}: no such database file")
    if describe(src) == describe(dst):
        raise ConfigError("SRC and DST are the same database")
    shown: dict[str, int] = {}

    def progress(table: str, done: int, total: int) -> None:
        if table not in shown and sys.stderr.isatty():
            print(f"{table}:", file=sys.stderr)
        _progress(done, total, done - shown.get(table, 0), "copied")
        shown[table] = done

    async with await Store.open(src) as source, await Store.open(dst) as dest:
        report = await copy_store(source, dest, source=describe(src), batch=args.batch, progress=progress)
    lines = [f"copied {describe(src)} to {describe(dst)}: " + ", ".join(f"{n} {table}" for table, n
                                                                       in report.total.items() if n),
             f"checked: row counts, {report.streams} stream(s), the same top 10 for {report.queries} sample "
             "queries"]
    _emit(args, {"source": describe(src), "dest": describe(dst), "copied_now": report.copied, "rows": report.total,
                 "streams": report.streams, "queries_compared": report.queries}, lines)
    return 0


def _ranges(ids: Sequence[str]) -> str:
    """Ids as compact ranges: 3-7, 9."""
    parts = compact_ranges(int(i) for i in ids)
    return ", ".join(parts[:20]) + (", ..." if len(parts) > 20 else "")


async def cmd_bot(args: argparse.Namespace) -> int:
    """Run the Discord bot (the `bot` package, kept out of the core)."""
    runner = importlib.import_module("bot.__main__")
    runner.configure_logging(verbose=args.verbose)  # the same default as `python -m bot`
    result: int = await runner.run(args)
    return result


COMMANDS: dict[str, tuple[Callable[[MemoryStream, argparse.Namespace], Coroutine[Any, Any, int]], bool]] = {
    # name: (function, needs models)
    "observe": (cmd_observe, True), "import": (cmd_import, True), "recall": (cmd_recall, True),
    "reflect": (cmd_reflect, True), "why": (cmd_why, False), "stats": (cmd_stats, False),
    "chat": (cmd_chat, True), "forget": (cmd_forget, False), "memories": (cmd_memories, False),
    "export": (cmd_export, False),
}


# -- argument parsing ------------------------------------------------------------------------------


def _merge_top_options(args: argparse.Namespace) -> None:
    """Common options given before the command count as if given after it (after it wins)."""
    if args.top_persona is not None and args.persona == os.environ.get("MEMSTREAM_PERSONA", DEFAULT_PERSONA):
        args.persona = args.top_persona
    if args.top_db is not None and args.db is None:
        args.db = args.top_db
    args.json = args.json or args.top_json
    args.verbose = args.verbose or args.top_verbose


def _version() -> str:
    from memstream import __version__

    return __version__


def _time(text: str) -> datetime:
    try:
        return parse_time(text)
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


def _importance(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if not 1 <= value <= 10:
        raise argparse.ArgumentTypeError(f"must be a whole number from 1 to 10, got {text!r}")
    return value


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a whole number >= 1, got {text!r}")
    return value


def _stream_key(text: str) -> str:
    if not text.strip():
        raise argparse.ArgumentTypeError("must be a non-empty key such as guild:123, dm:456 or default")
    return text


def _user_id(text: str) -> str:
    if not text.strip():
        raise argparse.ArgumentTypeError("must be a Discord user id such as 123456789012345678")
    return text.strip()


def _database(value: str) -> Path | str:
    """A --db value: a PostgreSQL URL as given, else a file path."""
    from memstream.config import is_database_url

    return value if is_database_url(value) else Path(value)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of every command."""
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--persona", default=os.environ.get("MEMSTREAM_PERSONA", DEFAULT_PERSONA),
                        help="persona file (default: $MEMSTREAM_PERSONA or %(default)s)")
    common.add_argument("--db", type=_database, help="use this database (a file, or a postgresql:// URL) instead of "
                        "the persona's")
    common.add_argument("--json", action="store_true", help="machine-readable output")
    common.add_argument("-v", "--verbose", action="store_true", help="log what happens")
    common.add_argument("--local", action="store_true",
                        help="no key at all: a tiny chat model and embeddings on this machine, and their own "
                             "database beside the persona's (pip install 'memstream[local]'; for trying the "
                             "pipeline, not for a real persona)")
    scoped = argparse.ArgumentParser(add_help=False)
    scoped.add_argument("--stream", type=_stream_key,
                        help=f"stream key, e.g. guild:123 or dm:456 (default: {DEFAULT_STREAM})")
    timed = argparse.ArgumentParser(add_help=False)
    timed.add_argument("--at", type=_time, help="act at this ISO-8601 time (replays, imports)")

    parser = argparse.ArgumentParser(prog="memstream", description=__doc__)
    parser.add_argument("--version", action="version", version=f"memstream {_version()}")
    # The common options are accepted before the command too (memstream --persona FILE stats).
    parser.add_argument("--persona", dest="top_persona", help=argparse.SUPPRESS)
    parser.add_argument("--db", dest="top_db", type=_database, help=argparse.SUPPRESS)
    parser.add_argument("--json", dest="top_json", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("-v", "--verbose", dest="top_verbose", action="store_true", help=argparse.SUPPRESS)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    p = sub.add_parser("chat", parents=[common, scoped, timed], help="talk to the persona in the terminal",
                       description="Talk to the persona: each line you type is observed and answered.")
    p.add_argument("--as", dest="speaker", default="You", help="your name in the persona's memory")
    p = sub.add_parser("observe", parents=[common, scoped, timed], help="observe one text",
                       description="Rate, embed and store one observation.")
    p.add_argument("text")
    p.add_argument("--importance", type=_importance, help="skip the rater and use this importance (1-10)")
    p = sub.add_parser("import", parents=[common, scoped, timed],
                       help="import a JSONL file or a DiscordChatExporter JSON export",
                       description='Import lines of {"text", "at", optional "stream", "importance"}, or a '
                                   "DiscordChatExporter JSON export of a channel (authors, times and message ids "
                                   "kept). Everything is validated before anything is stored; messages already "
                                   "imported are skipped, so an interrupted import can be re-run.")
    p.add_argument("file")
    p.add_argument("--importance", type=_importance, help="importance for messages that have none (skips the rater)")
    p.add_argument("--include-bots", action="store_true", help="also import bots' messages (exports)")
    p.add_argument("--reflect", action="store_true", help="reflect whenever a stream crosses the threshold")
    p = sub.add_parser("memories", parents=[common, scoped], help="the most recent memories of a stream",
                       description="List a stream's most recent memories, newest first (as /memories does).")
    p.add_argument("-n", "--limit", type=_positive, default=20, help="how many (default: %(default)s)")
    p = sub.add_parser("recall", parents=[common, scoped, timed], help="rank memories for a query (read-only)",
                       description="Rank every memory for a query with its score parts; touches nothing.")
    p.add_argument("query")
    p.add_argument("-k", "--k", dest="k", type=_positive, help="how many (default: the persona's k)")
    p.add_argument("--profile", choices=PROFILES, metavar="PROFILE",
                   help=f"score with this profile instead of the persona's ({', '.join(PROFILES)})")
    sub.add_parser("reflect", parents=[common, scoped, timed], help="reflect now",
                   description="Run one reflection on a stream now and show the insights with their evidence.")
    p = sub.add_parser("why", parents=[common, scoped], help="the evidence tree of a memory",
                       description="Show a reflection's evidence, down to the observations.")
    p.add_argument("memory_id", type=int)
    p = sub.add_parser("forget", parents=[common, scoped], help="delete a user's data (deletion requests)",
                       description="Forget what a user said (--author, in every stream unless --stream is given), "
                                   "some Discord messages (--message), some memories (ids), or a whole stream "
                                   "(--stream KEY --all), with every insight, reply and reply trace built on it. "
                                   "No copy of the text stays in the database file.")
    p.add_argument("memory_ids", nargs="*", type=int, help="memory ids")
    p.add_argument("--author", help="a Discord user id: everything they said")
    p.add_argument("--message", action="append", help="a Discord message id (repeatable)")
    p.add_argument("--all", action="store_true", help="the whole stream given with --stream")
    p = sub.add_parser("export", parents=[common], help="export a user's memories (access requests) or a stream",
                       description="--author USER_ID: everything the persona remembers from that Discord user's "
                                   "messages, in every stream, as one JSON document (for a data-access request). "
                                   "--stream KEY: a whole stream's observations as the JSONL lines `memstream "
                                   "import` reads (texts, times, authors, message ids, importance), oldest first; "
                                   "insights are left out. Written to standard output, or to a new file with -o.")
    chosen = p.add_mutually_exclusive_group(required=True)
    chosen.add_argument("--author", type=_user_id, metavar="USER_ID", help="a Discord user id")
    chosen.add_argument("--stream", type=_stream_key, metavar="KEY", help="a stream key, e.g. guild:123 or dm:456")
    p.add_argument("-o", "--output", type=Path, metavar="FILE", help="write to this new file (readable by you only)")
    p.add_argument("--force", action="store_true", help="replace FILE if it exists")
    sub.add_parser("stats", parents=[common, scoped], help="counts, importance histogram, model calls",
                   description="Counts, importance histogram, fallback ratings and model calls.")
    p = sub.add_parser("eval", parents=[common], help="measure retrieval on a labeled file, per scoring profile",
                       description="Replay a labeled JSONL file (observations with keys, queries with the keys "
                                   "they expect) through the real pipeline with a replay clock, once per profile, "
                                   "and report hit@k and recall@k overall and per label. Embeddings and ratings "
                                   "are cached, so a second run costs no model calls.")
    p.add_argument("file")
    p.add_argument("--profile", action="append", choices=[*PROFILES, *BASELINES],
                   help="a scoring profile or baseline (repeatable; default: every profile, then the baselines "
                        "relevance (plain vector search) and lexical (keywords only))")
    p.add_argument("-k", "--k", dest="k", action="append", type=_positive,
                   help="a cut-off (repeatable; default: 5 and 10)")
    p.add_argument("--no-touch", action="store_true",
                   help="the static view: queries do not update last access (default: they do, as the bot's do)")
    p.add_argument("--cache", type=Path, help="model cache file (default: eval-cache.sqlite beside the database)")
    p = sub.add_parser("backup", parents=[common], help="a consistent copy of the database (safe while running)",
                       description="Copy the persona's database to DEST with SQLite's online backup: consistent "
                                   "even while the bot writes. Forgotten text is not in the copy, but a backup made "
                                   "before a deletion request still holds it (see the README's Privacy section).")
    p.add_argument("dest", type=Path)
    p.add_argument("--force", action="store_true", help="replace DEST if it exists")
    p = sub.add_parser("salvage", parents=[common], help="copy what can be read from a damaged database",
                       description="Copy every memory, evidence pointer and reply trace that can still be read "
                                   "from the damaged database SRC into a new database DEST (same ids), and report "
                                   "what could not be read.")
    p.add_argument("src", type=Path)
    p.add_argument("dest", type=Path)
    p = sub.add_parser("copy", parents=[common], help="copy a persona's memory to another database (SQLite <-> "
                       "PostgreSQL)",
                       description="Copy every memory, evidence pointer, reply trace, counter and meta value from SRC "
                                   "to DST, same ids, a batch at a time (each batch one transaction): run it again "
                                   "to resume a copy that stopped. SRC and DST are each a persona file (its "
                                   "database), a SQLite file or a postgresql:// URL; DST must be new or empty. Stop "
                                   "the bot first. The copy is checked at the end: row counts, per-stream counts, "
                                   "and the same top k for sample queries.")
    p.add_argument("src", metavar="SRC")
    p.add_argument("dest", metavar="DST")
    p.add_argument("--batch", type=_positive, default=2000, help="rows per transaction (default: %(default)s)")
    p = sub.add_parser("web", parents=[common], help="the memory dashboard in the browser (read-only)",
                       description="Serve a dashboard of the persona's memory: streams, timeline, search ranking "
                                   "with score parts, evidence graphs, stats. Read-only unless --allow-forget; on "
                                   "127.0.0.1 unless --host, which then needs a token.")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default: %(default)s)")
    p.add_argument("--port", type=int, default=8765, help="port (default: %(default)s; 0 picks a free one)")
    p.add_argument("--allow-forget", action="store_true", help="offer a forget button on each memory")
    p.add_argument("--token", help="require this token (default: $MEMSTREAM_WEB_TOKEN; needed beyond localhost)")
    p = sub.add_parser("bot", parents=[common], help="run the persona on Discord (needs DISCORD_TOKEN)",
                       description="Run the persona as a Discord bot: one process, or with --shard-count and "
                                   "--shards some shards of a bot run as several processes on one database.")
    p.add_argument("--shard-count", metavar="N", help="the bot's total number of shards, across all its processes "
                                                     "(or $MEMSTREAM_SHARD_COUNT); without it, no sharding")
    p.add_argument("--shards", metavar="IDS", help="the shards this process runs: 0-3, 0,2 (or $MEMSTREAM_SHARDS; "
                                                   "default: all of them); the one with shard 0 serves DMs")
    sub.add_parser("doctor", parents=[common], help="check the set-up: persona, SQLite, database, models, Discord",
                   description="One line per check (ok, warn or fail, and what to do); exit status 1 when any "
                               "fails. $MEMSTREAM_DISCORD_API points the Discord checks at another API address.")
    init_persona.add_parser(sub)
    return parser


async def _run(args: argparse.Namespace) -> int:
    if args.command in ("bot", "salvage", "doctor") and getattr(args, "local", False):
        raise ConfigError(f"--local is for trying the pipeline from the terminal, not for {args.command}: for a "
                          "real persona on this machine, point [models] base_url at Ollama (README)")
    if args.command == "bot":
        return await cmd_bot(args)
    if args.command == "salvage":
        return await cmd_salvage(args)
    if args.command == "copy":
        return await cmd_copy(args)
    if args.command == "init":
        return await init_persona.cmd_init(args)
    if args.command == "doctor":  # its checks import the model and HTTP clients: only when it runs
        return await importlib.import_module("memstream.doctor.report").cmd_doctor(args)  # type: ignore[no-any-return]
    persona: PersonaConfig = load_persona(args.persona)
    if args.db is not None:
        persona = persona.with_database(args.db)
    if not getattr(args, "local", False):
        return await _run_persona(args, persona)
    from memstream.models.local import running

    serve = args.command == "eval" or COMMANDS.get(args.command, (cmd_stats, False))[1]
    with Spinner(serve and spinner_wanted(args.json)) as spin:
        spin.show("starting the local models")
        say: Callable[[str], None] = lambda line: spin.note(visible(f"memstream: {line}"))  # noqa: E731
        async with running(persona, serve=serve, database=args.db, say=say) as local:
            spin.stop()
            _say(f"local models: {local.models.agent} at {local.models.base_url} (a tiny model for trying the "
                 f"pipeline), embeddings {local.models.embedding}; database {local.database}" if serve
                 else f"local database: {local.database}")
            return await _run_persona(args, local)


def _say(line: str) -> None:
    print(visible(f"memstream: {line}"), file=sys.stderr, flush=True)


async def _run_persona(args: argparse.Namespace, persona: PersonaConfig) -> int:
    if getattr(args, "profile", None) and args.command == "recall":
        from memstream.index.profiles import configured

        persona = dataclasses.replace(persona, memory=configured(persona.memory, args.profile))
    if args.command == "backup":
        from memstream.data.filecare import backup

        return await cmd_backup(args, persona, backup)
    if args.command == "eval":
        return await cmd_eval(args, persona)
    if args.command == "web":  # aiohttp is imported only to serve
        from memstream.web.serve import run as run_web

        return await run_web(args, persona)
    function, needs_models = COMMANDS[args.command]
    if args.command == "forget":
        _forget_selection(args)
    clock: Clock = SystemClock() if getattr(args, "at", None) is None else FixedClock(args.at)
    fakes: dict[str, Any] = {} if needs_models else {"chat": _NoModels(), "embedder": _NoModels()}
    from memstream.stream import MemoryStream

    memory = await MemoryStream.open(persona, clock=clock, **fakes)
    try:
        return await function(memory, args)
    finally:
        await memory.close()


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the console script."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:  # `memstream` alone: what it can do, not only "COMMAND is required"
        parser.print_help(sys.stderr)
        return EXIT_BAD_INPUT
    _merge_top_options(args)
    args.stream_given = getattr(args, "stream", None) is not None
    if hasattr(args, "stream") and args.stream is None:
        args.stream = DEFAULT_STREAM
    logging.basicConfig(level=logging.INFO if args.verbose else logging.ERROR,
                        format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("aiosqlite").setLevel(logging.INFO)  # its DEBUG lines carry every statement's values
    try:
        return asyncio.run(_run(args))
    except MemstreamError as exc:
        print(visible(f"memstream: error: {exc}"), file=sys.stderr)
        return exit_status(exc)
    except KeyboardInterrupt:
        return 130
