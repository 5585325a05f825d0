"""Small test helpers: prompt needles, a rater stub, a counting retriever, vectors with a chosen cosine."""

from __future__ import annotations

import math
import re
import subprocess
import sys
from collections.abc import Callable, Mapping
from datetime import datetime
from pathlib import Path
from typing import Any

import psycopg

from memstream.index.retriever import RetrieverLike
from memstream.records import ScoredMemory, TraceItem
from memstream.store import SQLiteStore, Store, all_migrations

# Text unique to each of the four prompts (checked in test_prompts.py).
RATER = "Reply with a single integer."
QUESTIONS = "most salient high-level"
INSIGHTS = "high-level insights can you infer"
AGENT = "What do you do or say next?"

_MEMORY = re.compile(r"<memory>(.*)</memory>", re.DOTALL)


def migrations_before(version: int, folder: Path) -> Path:
    """`folder` holding SQLite's migrations numbered below `version` (a file written as that version wrote it)."""
    folder.mkdir()
    for migration in all_migrations():
        if migration.version < version:
            (folder / f"{migration.version:04d}_{migration.name}.sql").write_text(migration.sql, encoding="utf-8")
    return folder


async def run_sql(store: Store, statement: str, *args: Any) -> list[tuple[Any, ...]]:
    """Rows of one SQL statement run beside the store (either backend; `?` placeholders), committed."""
    if isinstance(store, SQLiteStore):
        async with store.conn.execute(statement, args) as cur:
            return list(await cur.fetchall())
    async with await psycopg.AsyncConnection.connect(store.url, autocommit=True) as conn:  # type: ignore[attr-defined]
        cur = await conn.execute(statement.replace("?", "%s"), args)
        return list(await cur.fetchall()) if cur.description is not None else []


def trace_item(memory_id: int) -> TraceItem:
    """A trace item of a memory (score parts that matter to no test)."""
    return TraceItem(memory_id, score=1.0, recency=0.5, importance=0.5, relevance=0.5, cosine=0.5)


def memory_text(prompt: str) -> str:
    """The observation inside an importance prompt's <memory> tag."""
    match = _MEMORY.search(prompt)
    assert match, prompt
    return match.group(1)


def rate_by(scores: Mapping[str, int | str], default: int | str = 1) -> Callable[[str, str], str]:
    """A rater stub: the reply for the observation in the prompt, looked up by its exact text."""

    def answer(prompt: str, model: str) -> str:
        return str(scores.get(memory_text(prompt), default))

    return answer


def tagged(prompt: str, tag: str) -> str:
    """The text between <tag> and </tag> (the only such pair) in a prompt."""
    start, end = prompt.index(f"<{tag}>") + len(tag) + 2, prompt.index(f"</{tag}>")
    assert prompt.count(f"</{tag}>") == 1
    return prompt[start:end]


def cosine_vector(cos: float, dim: int = 3, axis: int = 1) -> list[float]:
    """A unit vector whose cosine with e0 = (1, 0, ...) is `cos` (the rest goes on `axis`)."""
    vec = [0.0] * dim
    vec[0] = cos
    vec[axis] = math.sqrt(max(0.0, 1.0 - cos * cos))
    return vec


def e0(dim: int = 3) -> list[float]:
    """The first unit vector: the query direction of the tests."""
    return cosine_vector(1.0, dim)


class CountingRetriever:
    """A RetrieverLike that records every call and delegates to the real retriever (set `inner`)."""

    def __init__(self) -> None:
        self.inner: RetrieverLike | None = None
        self.calls: list[tuple[str, str]] = []

    async def retrieve(self, query: str, *, stream: str, k: int | None = None,
                       at: datetime | None = None) -> list[ScoredMemory]:
        assert self.inner is not None, "wire CountingRetriever.inner to the stream's retriever"
        self.calls.append((query, stream))
        return await self.inner.retrieve(query, stream=stream, k=k, at=at)


class OtherProcess:
    """Another process holding a transaction open on a database file (a read, or the write lock) until
    `release()`: what a second memstream process, or an outside tool, does to ours."""

    def __init__(self, db: Path, *, write: bool = False) -> None:
        hold = ("c.execute('BEGIN IMMEDIATE')" if write else
                "c.execute('BEGIN'); c.execute('SELECT COUNT(*) FROM memories').fetchone()")
        script = (f"import sqlite3, sys; c = sqlite3.connect(sys.argv[1], isolation_level=None); {hold}; "
                  "print('holding', flush=True); sys.stdin.readline(); c.execute('COMMIT')")
        self.proc = subprocess.Popen([sys.executable, "-c", script, str(db)], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None and self.proc.stdout.readline().strip() == "holding"

    def release(self) -> None:
        """End the transaction and the process."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write("\n")
        self.proc.stdin.close()
        self.proc.wait(timeout=10)
        self.proc.stdout.close()
