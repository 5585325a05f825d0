"""The store of record: one SQLite file per persona, sqlite-vec loaded, schema from migrations/."""

from __future__ import annotations

import contextlib
import json
import re
import types
from collections.abc import AsyncIterator, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

import aiosqlite
import numpy as np
import numpy.typing as npt
import sqlite_vec

from memstream.clock import from_timestamp
from memstream.errors import MemoryNotFound, MigrationError, StoreError
from memstream.records import EvidenceNode, Memory, Source

__all__ = ["Migration", "NewMemory", "Store", "StreamArrays", "sqlite_module"]

_COLUMNS = ("id, stream, kind, text, created_at, last_accessed_at, importance, importance_source, depth, "
            "author, author_id, channel, channel_id, message_id, status")
_MIGRATION_NAME = re.compile(r"^(\d+)_(\w+)\.sql$")


@cache
def sqlite_module() -> types.ModuleType:
    """The one SQLite binding this process uses: one that can load extensions."""
    candidates = []
    with contextlib.suppress(ImportError):
        import pysqlite3.dbapi2 as pysqlite3

        candidates.append(pysqlite3)
    import sqlite3

    candidates.append(sqlite3)
    for module in candidates:
        if hasattr(module.Connection, "enable_load_extension"):
            chosen: types.ModuleType = module
            return chosen
    raise StoreError(
        "this Python's sqlite3 cannot load extensions (needed for sqlite-vec): "
        "pip install pysqlite3 (Linux), or use a Python built with loadable SQLite extensions"
    )


@dataclass(frozen=True)
class Migration:
    """One numbered SQL file."""

    version: int
    name: str
    sql: str


def _migration_dir() -> Path:
    source_tree = Path(__file__).resolve().parent.parent / "migrations"
    if source_tree.is_dir():
        return source_tree
    return Path(str(resources.files("memstream.migrations")))


def all_migrations(directory: Path | None = None) -> list[Migration]:
    """The migrations shipped with memstream, in order."""
    found = []
    for path in sorted((directory or _migration_dir()).glob("*.sql")):
        match = _MIGRATION_NAME.match(path.name)
        if not match:
            raise MigrationError(f"migration file {path.name} is not named NNNN_name.sql")
        found.append(Migration(int(match.group(1)), match.group(2), path.read_text(encoding="utf-8")))
    versions = [m.version for m in found]
    if len(set(versions)) != len(versions):
        raise MigrationError(f"two migrations share a number: {versions}")
    return sorted(found, key=lambda m: m.version)


def split_statements(sql: str) -> list[str]:
    """Split a script into complete statements (executescript would commit on its own)."""
    complete = sqlite_module().complete_statement
    statements, buffer = [], ""
    for line in sql.splitlines(keepends=True):
        buffer += line
        if complete(buffer):
            if buffer.strip():
                statements.append(buffer.strip())
            buffer = ""
    if buffer.strip() and not all(part.strip().startswith("--") for part in buffer.strip().splitlines()):
        raise MigrationError(f"incomplete SQL statement at the end of a migration: {buffer.strip()[:60]!r}")
    return statements


@dataclass(frozen=True)
class NewMemory:
    """A memory about to be written."""

    stream: str
    kind: str
    text: str
    created_at: float
    importance: int | None = None
    importance_source: str | None = None
    depth: int = 0
    source: Source = field(default_factory=Source)
    embedding: npt.NDArray[np.float32] | None = None


@dataclass
class StreamArrays:
    """Everything retrieval needs of one stream, column-wise."""

    ids: npt.NDArray[np.int64]
    embeddings: npt.NDArray[np.float32]
    importance: npt.NDArray[np.float32]
    last_accessed: npt.NDArray[np.float64]
    created: npt.NDArray[np.float64]


def to_blob(vector: npt.NDArray[np.float32]) -> bytes:
    """A vector in sqlite-vec's float32 format."""
    return np.ascontiguousarray(vector, dtype="<f4").tobytes()


def _memory(row: Sequence[Any]) -> Memory:
    return Memory(
        id=row[0], stream=row[1], kind=row[2], text=row[3],
        created_at=from_timestamp(row[4]), last_accessed_at=from_timestamp(row[5]),
        importance=row[6], importance_source=row[7], depth=row[8],
        source=Source(author=row[9], author_id=row[10], channel=row[11], channel_id=row[12],
                      message_id=row[13]),
        status=row[14],
    )


class Store:
    """Async access to one persona's SQLite file. Open with `await Store.open(path)`."""

    def __init__(self, conn: aiosqlite.Connection, path: str) -> None:
        self.conn, self.path = conn, path
        self._in_transaction = False

    # -- lifecycle -------------------------------------------------------------------------------

    @classmethod
    async def open(cls, path: str | Path, *, migrations: Path | None = None) -> Store:
        """Open (creating if needed) the file, load sqlite-vec, apply pending migrations."""
        module = sqlite_module()
        location = str(path)
        if location != ":memory:":
            try:
                Path(location).parent.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise StoreError(f"cannot create the folder for {location}: {exc}") from exc

        def connector() -> Any:
            conn = module.connect(location, isolation_level=None, check_same_thread=False)
            conn.enable_load_extension(True)
            conn.load_extension(sqlite_vec.loadable_path())
            conn.enable_load_extension(False)
            return conn

        try:
            conn = await aiosqlite.Connection(connector, 64)
            store = cls(conn, location)
            for pragma in ("journal_mode=WAL", "synchronous=NORMAL", "foreign_keys=ON",
                           "secure_delete=ON", "busy_timeout=5000"):
                await conn.execute(f"PRAGMA {pragma}")
        except module.Error as exc:
            raise StoreError(f"cannot open {location}: {exc}") from exc
        try:
            await store.migrate(all_migrations(migrations))
        except BaseException:
            await conn.close()
            raise
        return store

    async def close(self) -> None:
        """Close the connection."""
        await self.conn.close()

    async def __aenter__(self) -> Store:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    @contextlib.asynccontextmanager
    async def transaction(self) -> AsyncIterator[None]:
        """BEGIN IMMEDIATE ... COMMIT, or ROLLBACK on any error; nested uses join the outer one."""
        if self._in_transaction:
            yield
            return
        await self.conn.execute("BEGIN IMMEDIATE")
        self._in_transaction = True
        try:
            yield
        except BaseException:
            self._in_transaction = False
            await self.conn.execute("ROLLBACK")
            raise
        self._in_transaction = False
        await self.conn.execute("COMMIT")

    # -- migrations ------------------------------------------------------------------------------

    async def applied(self) -> list[int]:
        """Versions already applied to this file."""
        await self.conn.execute(
            "CREATE TABLE IF NOT EXISTS schema_migrations (version INTEGER PRIMARY KEY, name TEXT NOT NULL, "
            "applied_at TEXT NOT NULL)"
        )
        async with self.conn.execute("SELECT version FROM schema_migrations ORDER BY version") as cur:
            return [row[0] for row in await cur.fetchall()]

    async def pending(self, migrations: Iterable[Migration] | None = None) -> list[Migration]:
        """Migrations not yet applied."""
        done = set(await self.applied())
        return [m for m in (migrations or all_migrations()) if m.version not in done]

    async def migrate(self, migrations: Iterable[Migration] | None = None) -> list[int]:
        """Apply pending migrations in order, each in one transaction with its record row."""
        applied = []
        for migration in await self.pending(migrations):
            try:
                async with self.transaction():
                    for statement in split_statements(migration.sql):
                        await self.conn.execute(statement)
                    await self.conn.execute(
                        "INSERT INTO schema_migrations (version, name, applied_at) VALUES (?, ?, ?)",
                        (migration.version, migration.name, datetime.now(UTC).isoformat()),
                    )
            except sqlite_module().Error as exc:
                raise MigrationError(
                    f"{self.path}: migration {migration.version:04d}_{migration.name} failed: {exc}"
                ) from exc
            applied.append(migration.version)
        return applied

    # -- writing memories ------------------------------------------------------------------------

    async def _check_dimensions(self, vectors: Iterable[npt.NDArray[np.float32] | None]) -> None:
        dims = {v.shape[-1] for v in vectors if v is not None}
        if not dims:
            return
        known = await self.get_meta("embedding_dimensions")
        if len(dims) > 1 or (known is not None and int(known) not in dims):
            raise StoreError(
                f"{self.path}: embeddings of {sorted(dims)} dimensions do not match the store's {known}; "
                "use the embedding model this store was built with, or a new database file"
            )
        if known is None:
            await self.set_meta("embedding_dimensions", str(dims.pop()))

    async def insert(self, memories: Sequence[NewMemory]) -> list[int]:
        """Append memories (pending ones have no importance or embedding yet); one transaction."""
        ids = []
        async with self.transaction():
            await self._check_dimensions(m.embedding for m in memories)
            for m in memories:
                ready = m.importance is not None and m.embedding is not None
                cursor = await self.conn.execute(
                    "INSERT INTO memories (stream, kind, text, created_at, last_accessed_at, importance, "
                    "importance_source, depth, author, author_id, channel, channel_id, message_id, status, "
                    "embedding) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (m.stream, m.kind, m.text, m.created_at, m.created_at, m.importance, m.importance_source,
                     m.depth, m.source.author, m.source.author_id, m.source.channel, m.source.channel_id,
                     m.source.message_id, "ready" if ready else "pending",
                     None if m.embedding is None else to_blob(m.embedding)),
                )
                assert cursor.lastrowid is not None
                ids.append(cursor.lastrowid)
        return ids

    async def find_message(self, stream: str, message_id: str) -> int | None:
        """The memory made from a Discord message, if any."""
        async with self.conn.execute(
            "SELECT id FROM memories WHERE stream = ? AND message_id = ?", (stream, message_id)
        ) as cur:
            row = await cur.fetchone()
        return None if row is None else int(row[0])

    async def complete(self, memory_id: int, importance: int, source: str,
                       embedding: npt.NDArray[np.float32]) -> bool:
        """Make a pending memory ready; False if it was deleted meanwhile."""
        async with self.transaction():
            await self._check_dimensions([embedding])
            cursor = await self.conn.execute(
                "UPDATE memories SET importance = ?, importance_source = ?, embedding = ?, status = 'ready' "
                "WHERE id = ? AND status = 'pending'",
                (importance, source, to_blob(embedding), memory_id),
            )
        return cursor.rowcount == 1

    async def count_attempt(self, memory_id: int) -> None:
        """Record one more failed attempt to complete a pending memory."""
        await self.conn.execute("UPDATE memories SET attempts = attempts + 1 WHERE id = ?", (memory_id,))

    async def update_text(self, memory_id: int, text: str, embedding: npt.NDArray[np.float32]) -> None:
        """Replace an observation's text and embedding (an edited message)."""
        async with self.transaction():
            await self._check_dimensions([embedding])
            await self.conn.execute("UPDATE memories SET text = ?, embedding = ? WHERE id = ?",
                                    (text, to_blob(embedding), memory_id))

    async def touch(self, ids: Sequence[int], at: float) -> None:
        """Set last access of these memories to `at`."""
        if ids:
            await self.conn.executemany("UPDATE memories SET last_accessed_at = ? WHERE id = ?",
                                        [(at, i) for i in ids])

    async def delete(self, ids: Iterable[int]) -> list[int]:
        """Delete memories and, transitively, every reflection that cites one of them."""
        doomed: set[int] = set()
        frontier = set(ids)
        async with self.transaction():
            while frontier:
                doomed |= frontier
                marks = ",".join("?" * len(frontier))
                async with self.conn.execute(
                    f"SELECT DISTINCT reflection_id FROM evidence WHERE memory_id IN ({marks})",
                    tuple(frontier),
                ) as cur:
                    frontier = {row[0] for row in await cur.fetchall()} - doomed
            ordered = sorted(doomed)
            for start in range(0, len(ordered), 500):
                chunk = ordered[start:start + 500]
                marks = ",".join("?" * len(chunk))
                await self.conn.execute(f"DELETE FROM memories WHERE id IN ({marks})", tuple(chunk))
        return sorted(doomed)

    async def purge_stream(self, stream: str) -> int:
        """Delete a whole stream: memories, traces, state and usage."""
        async with self.transaction():
            cursor = await self.conn.execute("DELETE FROM memories WHERE stream = ?", (stream,))
            for table in ("reply_traces", "stream_state", "model_usage"):
                await self.conn.execute(f"DELETE FROM {table} WHERE stream = ?", (stream,))
        return cursor.rowcount

    # -- reading memories ------------------------------------------------------------------------

    async def get(self, memory_id: int, *, stream: str | None = None) -> Memory:
        """One memory by id (restricted to `stream` when given)."""
        async with self.conn.execute(f"SELECT {_COLUMNS} FROM memories WHERE id = ?", (memory_id,)) as cur:
            row = await cur.fetchone()
        if row is None or (stream is not None and row[1] != stream):
            where = f" in stream {stream!r}" if stream is not None else ""
            raise MemoryNotFound(f"no memory #{memory_id}{where}")
        return _memory(row)

    async def get_many(self, ids: Sequence[int]) -> dict[int, Memory]:
        """Memories by id (missing ones are left out)."""
        found: dict[int, Memory] = {}
        for start in range(0, len(ids), 500):
            chunk = list(ids[start:start + 500])
            marks = ",".join("?" * len(chunk))
            async with self.conn.execute(f"SELECT {_COLUMNS} FROM memories WHERE id IN ({marks})", chunk) as cur:
                for row in await cur.fetchall():
                    found[row[0]] = _memory(row)
        return found

    async def recent(self, stream: str, limit: int, *, offset: int = 0,
                     include_pending: bool = False) -> list[Memory]:
        """The most recent memories of a stream, newest first."""
        status = "" if include_pending else "AND status = 'ready'"
        async with self.conn.execute(
            f"SELECT {_COLUMNS} FROM memories WHERE stream = ? {status} "
            "ORDER BY created_at DESC, id DESC LIMIT ? OFFSET ?", (stream, limit, offset)
        ) as cur:
            return [_memory(row) for row in await cur.fetchall()]

    async def pending_memories(self, limit: int = 1000) -> list[Memory]:
        """Memories waiting for a rating or an embedding, oldest first."""
        async with self.conn.execute(
            f"SELECT {_COLUMNS} FROM memories WHERE status = 'pending' ORDER BY id LIMIT ?", (limit,)
        ) as cur:
            return [_memory(row) for row in await cur.fetchall()]

    async def by_author(self, stream: str, author_id: str) -> list[int]:
        """Ids of the observations made from one author's messages in a stream."""
        async with self.conn.execute(
            "SELECT id FROM memories WHERE stream = ? AND author_id = ? AND kind = 'observation'",
            (stream, author_id),
        ) as cur:
            return [row[0] for row in await cur.fetchall()]

    async def by_message(self, message_ids: Sequence[str]) -> list[int]:
        """Ids of the memories made from these Discord messages, in any stream."""
        found: list[int] = []
        for start in range(0, len(message_ids), 500):
            chunk = list(message_ids[start:start + 500])
            marks = ",".join("?" * len(chunk))
            async with self.conn.execute(f"SELECT id FROM memories WHERE message_id IN ({marks})", chunk) as cur:
                found.extend(row[0] for row in await cur.fetchall())
        return found

    async def streams(self) -> list[str]:
        """Every stream key in this file."""
        async with self.conn.execute("SELECT DISTINCT stream FROM memories ORDER BY stream") as cur:
            keys = {row[0] for row in await cur.fetchall()}
        async with self.conn.execute("SELECT stream FROM stream_state") as cur:
            keys |= {row[0] for row in await cur.fetchall()}
        return sorted(keys)

    async def load_stream(self, stream: str) -> StreamArrays:
        """The ready memories of a stream, as arrays for retrieval."""
        async with self.conn.execute(
            "SELECT id, importance, last_accessed_at, created_at, embedding FROM memories "
            "WHERE stream = ? AND status = 'ready' ORDER BY id", (stream,)
        ) as cur:
            rows = list(await cur.fetchall())
        dims = await self.get_meta("embedding_dimensions")
        dim = int(dims) if dims else 0
        blob = b"".join(row[4] for row in rows)
        return StreamArrays(
            ids=np.fromiter((row[0] for row in rows), dtype=np.int64, count=len(rows)),
            embeddings=np.frombuffer(blob, dtype="<f4").reshape(len(rows), dim).astype(np.float32),
            importance=np.fromiter((row[1] for row in rows), dtype=np.float32, count=len(rows)),
            last_accessed=np.fromiter((row[2] for row in rows), dtype=np.float64, count=len(rows)),
            created=np.fromiter((row[3] for row in rows), dtype=np.float64, count=len(rows)),
        )

    async def load_vector(self, memory_id: int) -> npt.NDArray[np.float32]:
        """One memory's embedding."""
        async with self.conn.execute("SELECT embedding FROM memories WHERE id = ?", (memory_id,)) as cur:
            row = await cur.fetchone()
        if row is None or row[0] is None:
            raise MemoryNotFound(f"no embedding for memory #{memory_id}")
        return np.frombuffer(row[0], dtype="<f4").astype(np.float32)

    # -- reflections and evidence ----------------------------------------------------------------

    async def save_reflection(self, stream: str, insights: Sequence[tuple[NewMemory, Sequence[int]]],
                              at: float) -> list[int]:
        """Insights, their evidence pointers and the importance reset, in one transaction."""
        async with self.transaction():
            ids = await self.insert([insight for insight, _ in insights])
            for reflection_id, (_, cited) in zip(ids, insights, strict=True):
                await self.conn.executemany(
                    "INSERT INTO evidence (reflection_id, memory_id, position) VALUES (?, ?, ?)",
                    [(reflection_id, memory_id, pos) for pos, memory_id in enumerate(cited)],
                )
            await self.conn.execute(
                "INSERT INTO stream_state (stream, importance_since_reflection, last_reflection_at, reflections) "
                "VALUES (?, 0, ?, 1) ON CONFLICT (stream) DO UPDATE SET importance_since_reflection = 0, "
                "last_reflection_at = excluded.last_reflection_at, reflections = reflections + 1",
                (stream, at),
            )
        return ids

    async def evidence(self, reflection_id: int) -> list[int]:
        """The memories a reflection cites, in citation order."""
        async with self.conn.execute(
            "SELECT memory_id FROM evidence WHERE reflection_id = ? ORDER BY position", (reflection_id,)
        ) as cur:
            return [row[0] for row in await cur.fetchall()]

    async def evidence_tree(self, memory_id: int, *, stream: str | None = None) -> EvidenceNode:
        """A memory with its evidence, down to observations."""
        memory = await self.get(memory_id, stream=stream)
        return await self._tree(memory, set())

    async def _tree(self, memory: Memory, seen: set[int]) -> EvidenceNode:
        if memory.kind != "reflection" or memory.id in seen:
            return EvidenceNode(memory)
        cited = await self.evidence(memory.id)
        found = await self.get_many(cited)
        children = [await self._tree(found[i], seen | {memory.id}) for i in cited if i in found]
        return EvidenceNode(memory, tuple(children))

    # -- stream state, usage, traces, meta -------------------------------------------------------

    async def add_importance(self, stream: str, amount: int) -> int:
        """Add to the importance total since the last reflection; return the new total."""
        async with self.conn.execute(
            "INSERT INTO stream_state (stream, importance_since_reflection) VALUES (?, ?) "
            "ON CONFLICT (stream) DO UPDATE SET importance_since_reflection = importance_since_reflection + ? "
            "RETURNING importance_since_reflection", (stream, amount, amount)
        ) as cur:
            row = await cur.fetchone()
        assert row is not None
        return int(row[0])

    async def state(self, stream: str) -> dict[str, Any]:
        """The importance total, last reflection time and counters of a stream."""
        async with self.conn.execute(
            "SELECT importance_since_reflection, last_reflection_at, reflections, skipped_reflections "
            "FROM stream_state WHERE stream = ?", (stream,)
        ) as cur:
            row = await cur.fetchone()
        if row is None:
            return {"importance_since_reflection": 0, "last_reflection_at": None, "reflections": 0,
                    "skipped_reflections": 0}
        return {"importance_since_reflection": row[0],
                "last_reflection_at": None if row[1] is None else from_timestamp(row[1]),
                "reflections": row[2], "skipped_reflections": row[3]}

    async def count_skipped_reflection(self, stream: str) -> None:
        """A reflection that could not run (it will be tried again)."""
        await self.conn.execute(
            "INSERT INTO stream_state (stream, skipped_reflections) VALUES (?, 1) "
            "ON CONFLICT (stream) DO UPDATE SET skipped_reflections = skipped_reflections + 1", (stream,)
        )

    async def due_streams(self, threshold: int) -> list[str]:
        """Streams whose importance total has reached the threshold."""
        async with self.conn.execute(
            "SELECT stream FROM stream_state WHERE importance_since_reflection >= ? ORDER BY stream",
            (threshold,),
        ) as cur:
            return [row[0] for row in await cur.fetchall()]

    async def record_usage(self, stream: str, role: str, *, calls: int = 1, failures: int = 0,
                           prompt_tokens: int = 0, completion_tokens: int = 0) -> None:
        """Count model calls and tokens per stream and role."""
        await self.conn.execute(
            "INSERT INTO model_usage (stream, role, calls, failures, prompt_tokens, completion_tokens) "
            "VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (stream, role) DO UPDATE SET calls = calls + excluded.calls, "
            "failures = failures + excluded.failures, prompt_tokens = prompt_tokens + excluded.prompt_tokens, "
            "completion_tokens = completion_tokens + excluded.completion_tokens",
            (stream, role, calls, failures, prompt_tokens, completion_tokens),
        )

    async def usage(self, stream: str | None = None) -> dict[str, dict[str, int]]:
        """Model calls and tokens per role (one stream, or all)."""
        where, args = ("WHERE stream = ?", (stream,)) if stream is not None else ("", ())
        async with self.conn.execute(
            f"SELECT role, SUM(calls), SUM(failures), SUM(prompt_tokens), SUM(completion_tokens) "
            f"FROM model_usage {where} GROUP BY role ORDER BY role", args
        ) as cur:
            return {row[0]: {"calls": row[1], "failures": row[2], "prompt_tokens": row[3],
                             "completion_tokens": row[4]} for row in await cur.fetchall()}

    async def save_trace(self, stream: str, at: float, query: str, items: list[dict[str, Any]],
                         reply_memory_id: int | None) -> int:
        """Record what a reply was built from."""
        cursor = await self.conn.execute(
            "INSERT INTO reply_traces (stream, created_at, query, reply_memory_id, items) VALUES (?, ?, ?, ?, ?)",
            (stream, at, query, reply_memory_id, json.dumps(items)),
        )
        assert cursor.lastrowid is not None
        return cursor.lastrowid

    async def link_reply(self, trace_id: int, message_ids: Sequence[str], reply_memory_id: int | None) -> None:
        """Attach the Discord message ids of a sent reply to its trace (and the first to its memory)."""
        async with self.transaction():
            await self.conn.executemany(
                "INSERT OR REPLACE INTO trace_messages (message_id, trace_id) VALUES (?, ?)",
                [(m, trace_id) for m in message_ids],
            )
            if message_ids:
                await self.conn.execute("UPDATE reply_traces SET message_id = ? WHERE id = ?",
                                        (message_ids[0], trace_id))
            if reply_memory_id is not None and message_ids:
                await self.conn.execute("UPDATE memories SET message_id = ? WHERE id = ? AND message_id IS NULL",
                                        (message_ids[0], reply_memory_id))

    async def trace(self, *, trace_id: int | None = None, message_id: str | None = None) -> dict[str, Any] | None:
        """A reply trace by its id or by the Discord message id of any part of the reply."""
        if trace_id is None and message_id is not None:
            async with self.conn.execute("SELECT trace_id FROM trace_messages WHERE message_id = ?",
                                         (message_id,)) as cur:
                row = await cur.fetchone()
            if row is None:
                return None
            trace_id = int(row[0])
        async with self.conn.execute(
            "SELECT id, stream, created_at, query, reply_memory_id, message_id, items FROM reply_traces "
            "WHERE id = ?", (trace_id,)
        ) as cur:
            found = await cur.fetchone()
        if found is None:
            return None
        return {"id": found[0], "stream": found[1], "created_at": from_timestamp(found[2]), "query": found[3],
                "reply_memory_id": found[4], "message_id": found[5], "items": json.loads(found[6])}

    async def get_meta(self, key: str) -> str | None:
        """A value of the meta table."""
        async with self.conn.execute("SELECT value FROM meta WHERE key = ?", (key,)) as cur:
            row = await cur.fetchone()
        return None if row is None else str(row[0])

    async def set_meta(self, key: str, value: str) -> None:
        """Set a value of the meta table."""
        await self.conn.execute("INSERT INTO meta (key, value) VALUES (?, ?) ON CONFLICT (key) DO UPDATE "
                                "SET value = excluded.value", (key, value))

    async def counts(self, stream: str | None = None) -> dict[str, Any]:
        """Counts by kind and status, the importance histogram and fallback ratings."""
        where, args = ("WHERE stream = ?", (stream,)) if stream is not None else ("", ())
        async with self.conn.execute(
            f"SELECT kind, status, importance, importance_source, COUNT(*) FROM memories {where} "
            "GROUP BY kind, status, importance, importance_source", args
        ) as cur:
            rows = await cur.fetchall()
        out: dict[str, Any] = {"observations": 0, "reflections": 0, "pending": 0, "fallback": 0,
                               "histogram": {str(i): 0 for i in range(1, 11)}}
        for kind, status, importance, source, n in rows:
            out["observations" if kind == "observation" else "reflections"] += n
            if status == "pending":
                out["pending"] += n
            if source == "fallback":
                out["fallback"] += n
            if importance is not None:
                out["histogram"][str(importance)] += n
        return out
