"""The store of record: one SQLite file per persona, sqlite-vec loaded, schema from migrations/."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import mmap
import os
import re
import types
from collections.abc import AsyncIterator, Iterable, Iterator, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import cache
from pathlib import Path
from typing import Any

import aiosqlite
import numpy as np
import numpy.typing as npt
import sqlite_vec

from memstream import _load, _sqlite
from memstream._sqlite import BUSY_TIMEOUT_MS
from memstream.clock import from_timestamp
from memstream.errors import MemoryNotFound, MigrationError, SchemaTooNew, StoreError
from memstream.records import EvidenceNode, Memory, Source

__all__ = ["Migration", "NewMemory", "Store", "StreamArrays", "deferred_touches", "retry_delay", "sqlite_module"]

log = logging.getLogger("memstream.store")
_COLUMNS = ("id, stream, kind, text, created_at, last_accessed_at, importance, importance_source, depth, "
            "author, author_id, channel, channel_id, message_id, status, number")
_MIGRATION_NAME = re.compile(r"^(\d+)_(\w+)\.sql$")
# A pending observation whose model calls failed waits RETRY_BASE * 2**(failures - 1) seconds, at most
# RETRY_CAP, before it is tried again (a restart tries every pending observation at once).
RETRY_BASE_SECONDS = 30.0
# A stream this large is read by worker processes when it is loaded (one per core, at most the maximum).
PARALLEL_LOAD_ROWS = 200_000
MAX_LOAD_PROCESSES = 8
RETRY_CAP_SECONDS = 900.0
# A deletion whose texts would take longer to search the file for than this many bytes (needles x file size)
# rewrites the file without searching.
SEARCH_BUDGET_BYTES = 4 * 2**30
# In the meta table while a scrub after a deletion could not truncate the WAL (a reader held it).
_SCRUB_MARK = "scrub_pending_since"
_touches: ContextVar[dict[int, float] | None] = ContextVar("memstream_deferred_touches", default=None)


def retry_delay(failures: int) -> float:
    """Seconds before the next attempt at a pending observation that has failed `failures` times."""
    return min(RETRY_CAP_SECONDS, RETRY_BASE_SECONDS * 2.0 ** min(max(failures - 1, 0), 30))


@contextlib.contextmanager
def deferred_touches() -> Iterator[dict[int, float]]:
    """Inside this block (in this task), Store.touch collects last-access updates instead of writing them.

    A reflection commits what its retrievals touched together with its insights (save_reflection), so a
    reflection that fails or is killed leaves every last-access time as it was.
    """
    outer = _touches.get()
    if outer is not None:  # nested: the outer block commits
        yield outer
        return
    collected: dict[int, float] = {}
    token = _touches.set(collected)
    try:
        yield collected
    finally:
        _touches.reset(token)


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
    here = Path(__file__).resolve().parent
    source_tree = here.parent / "migrations"
    return source_tree if source_tree.is_dir() else here / "migrations"  # in the wheel


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
    # One (n, dim) matrix, or consecutive blocks of rows (a load in several processes gives one each).
    embeddings: npt.NDArray[np.float32] | list[npt.NDArray[np.float32]]
    importance: npt.NDArray[np.float32]
    last_accessed: npt.NDArray[np.float64]
    created: npt.NDArray[np.float64]
    inverse_norms: npt.NDArray[np.float32] | None = None  # 1/|row| (0 for a zero row), if known

    def blocks(self) -> list[npt.NDArray[np.float32]]:
        """The embeddings as a list of blocks of rows, in row order."""
        return list(self.embeddings) if isinstance(self.embeddings, list) else [self.embeddings]

    def matrix(self) -> npt.NDArray[np.float32]:
        """The embeddings as one matrix (a copy if they are in several blocks)."""
        if isinstance(self.embeddings, list):
            return np.concatenate(self.embeddings) if self.embeddings else np.empty((0, 0), np.float32)
        return self.embeddings


_INSERT = ("INSERT INTO memories (stream, kind, text, created_at, last_accessed_at, importance, importance_source, "
           "depth, author, author_id, channel, channel_id, message_id, status, embedding) "
           "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)")


def _arrays(sink: _load.Sink) -> StreamArrays:
    """The filled rows of a sink as StreamArrays (views)."""
    n = sink.n
    return StreamArrays(sink.ids[:n], sink.embeddings[:n], sink.importance[:n], sink.last[:n], sink.created[:n],
                        sink.inverse_norms[:n])


def _joined(parts: Sequence[_load.Part], dim: int) -> StreamArrays:
    """The parts read by worker processes as StreamArrays: the embeddings stay in their blocks."""
    def column(name: str) -> npt.NDArray[Any]:
        return np.concatenate([part.columns[name] for part in parts])

    blocks = [part.embeddings for part in parts if len(part.embeddings)]
    return StreamArrays(column("ids"), blocks if blocks else np.empty((0, dim), np.float32), column("importance"),
                        column("last"), column("created"), column("inverse_norms"))


def _insert_row(m: NewMemory) -> tuple[Any, ...]:
    ready = m.importance is not None and m.embedding is not None
    return (m.stream, m.kind, m.text, m.created_at, m.created_at, m.importance, m.importance_source, m.depth,
            m.source.author, m.source.author_id, m.source.channel, m.source.channel_id, m.source.message_id,
            "ready" if ready else "pending", None if m.embedding is None else to_blob(m.embedding))


def to_blob(vector: npt.NDArray[np.float32]) -> bytes:
    """A vector in sqlite-vec's float32 format."""
    return np.ascontiguousarray(vector, dtype="<f4").tobytes()


def residue_needles(texts: Iterable[str]) -> list[bytes]:
    """What to look for in the file to find a copy (or a piece of one, on an overflow page) of deleted texts:
    each text's UTF-8 bytes in 24-byte windows every 256 bytes; texts under 8 bytes are not searched for
    (they match everywhere, and say nothing)."""
    needles: set[bytes] = set()
    for text in texts:
        data = text.encode("utf-8", "surrogatepass")
        if len(data) < 8:
            continue
        if len(data) <= 24:
            needles.add(data)
            continue
        needles.update(data[i:i + 24] for i in range(0, len(data) - 23, 256))
    return sorted(needles)


def _create_private(path: Path) -> None:
    """A new database file is readable by its owner only (0600; SQLite gives its -wal and -shm the same
    mode), in folders made 0700. Existing files and folders keep the mode the operator gave them."""
    missing = []
    folder = path.parent
    while not folder.exists():
        missing.append(folder)
        folder = folder.parent
    for made in reversed(missing):
        with contextlib.suppress(FileExistsError):
            made.mkdir(mode=0o700)
    if not path.exists():
        with contextlib.suppress(FileExistsError):
            os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))


def _size(path: str) -> int:
    return os.path.getsize(path) if os.path.exists(path) else 0


def _file_holds_any(path: str, needles: Sequence[bytes]) -> bool:
    if not needles or not os.path.exists(path) or os.path.getsize(path) == 0:
        return False
    with open(path, "rb") as file, mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as data:
        return any(data.find(needle) >= 0 for needle in needles)


def _memory(row: Sequence[Any]) -> Memory:
    return Memory(
        id=row[0], stream=row[1], kind=row[2], text=row[3],
        created_at=from_timestamp(row[4]), last_accessed_at=from_timestamp(row[5]),
        importance=row[6], importance_source=row[7], depth=row[8],
        source=Source(author=row[9], author_id=row[10], channel=row[11], channel_id=row[12],
                      message_id=row[13]),
        status=row[14], number=row[15],
    )


class Store:
    """Async access to one persona's SQLite file. Open with `await Store.open(path)`."""

    def __init__(self, conn: aiosqlite.Connection, path: str, *, load_processes: int | None = None) -> None:
        self.conn, self.path = conn, path
        # Processes that read a stream's rows at load: None picks (several for a large stream), 1 never.
        self.load_processes = load_processes
        self._in_transaction = False
        self._owner: asyncio.Task[Any] | None = None
        self._lock = asyncio.Lock()
        self._closed = False
        # Texts deleted since the last scrub (looked for in the file by the scrub), or a whole stream.
        self._residue: list[str] = []
        self._vacuum_due = False
        self._data_version: int | None = None  # see changed_elsewhere

    # -- lifecycle -------------------------------------------------------------------------------

    @classmethod
    async def open(cls, path: str | Path, *, migrations: Path | None = None,
                   load_processes: int | None = None) -> Store:
        """Open (creating if needed) the file, load sqlite-vec, apply pending migrations.

        `load_processes`: how many processes read a stream's rows when it is first loaded; None (the
        default) uses one per core for a stream of PARALLEL_LOAD_ROWS memories or more, 1 never starts one.
        """
        if load_processes is not None and (isinstance(load_processes, bool) or not isinstance(load_processes, int)
                                           or load_processes < 1):
            raise ValueError(f"load_processes must be a whole number of 1 or more, or None; got {load_processes!r}")
        module = sqlite_module()
        location = str(path)
        if location != ":memory:":
            try:
                _create_private(Path(location))
            except OSError as exc:
                raise StoreError(f"cannot create {location}: {exc}") from exc

        def connector() -> Any:
            conn = module.connect(location, isolation_level=None, check_same_thread=False)
            conn.enable_load_extension(True)
            conn.load_extension(sqlite_vec.loadable_path())
            conn.enable_load_extension(False)
            return conn

        # SQLite errors become ours in the connection (memstream._sqlite).
        conn = _sqlite.Connection(connector, 64, path=location, errors=(module.Error,))
        try:
            await conn
        except (module.Error, StoreError) as exc:
            raise StoreError(f"cannot open {location}: {exc}") from exc
        store = cls(conn, location, load_processes=load_processes)
        try:
            # The busy timeout first: switching a new file to WAL waits for another process doing the same
            # (SQLite refuses at once there; the connection tries again within its lock wait).
            for pragma in (f"busy_timeout={BUSY_TIMEOUT_MS}", "journal_mode=WAL", "synchronous=NORMAL",
                           "foreign_keys=ON", "secure_delete=ON"):
                async with conn.execute(f"PRAGMA {pragma}"):
                    pass
        except StoreError:
            await conn.close()
            raise
        try:
            await store.migrate(all_migrations(migrations))
            await store.finish_scrub()
        except BaseException:
            await conn.close()
            raise
        return store

    async def close(self) -> None:
        """Close the connection (finishing a scrub a reader held up, if it can now)."""
        if self._closed:
            return
        self._closed = True
        try:
            with contextlib.suppress(StoreError):
                await self.finish_scrub()
        finally:
            await self.conn.close()

    async def __aenter__(self) -> Store:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    @contextlib.asynccontextmanager
    async def transaction(self) -> AsyncIterator[None]:
        """BEGIN IMMEDIATE ... COMMIT, or ROLLBACK on any error; nested uses (same task) join the outer one.

        Tasks sharing this connection take turns: another task's transaction waits for ours to end,
        instead of beginning inside it (an error) or silently joining it.
        """
        task = asyncio.current_task()
        if self._in_transaction and self._owner is task:
            yield
            return
        async with self._lock:
            self._owner = task
            try:
                await self.conn.execute("BEGIN IMMEDIATE")
                self._in_transaction = True
                try:
                    yield
                except BaseException:
                    self._in_transaction = False
                    if self.conn.in_transaction:  # SQLite rolls back by itself after some errors (a full disk)
                        with contextlib.suppress(StoreError):  # the first error is the one to report
                            await self.conn.execute("ROLLBACK")
                    raise
                self._in_transaction = False
                await self.conn.execute("COMMIT")
            finally:
                self._in_transaction = False
                self._owner = None

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
        applied: list[int] = []
        known = list(migrations or all_migrations())
        newer = sorted(set(await self.applied()) - {m.version for m in known})
        if newer and newer[-1] > max((m.version for m in known), default=0):
            raise SchemaTooNew(f"{self.path} was made by a newer memstream (schema {newer[-1]:04d}; this version "
                               f"knows up to {max(m.version for m in known):04d}): upgrade memstream to use it; "
                               "nothing was changed")
        todo = await self.pending(known)
        if not todo:
            return applied
        # A migration may rebuild a table (the only way SQLite changes a column's definition): with foreign
        # keys on, dropping the old table would cascade into every table that points at it. So they are off
        # while migrations run (the pragma cannot change inside a transaction) and checked before going on.
        await self.conn.execute("PRAGMA foreign_keys=OFF")
        try:
            for migration in todo:
                try:
                    async with self.transaction():
                        async with self.conn.execute("SELECT 1 FROM schema_migrations WHERE version = ?",
                                                     (migration.version,)) as cur:
                            if await cur.fetchone() is not None:  # another process applied it meanwhile
                                continue
                        for statement in split_statements(migration.sql):
                            await self.conn.execute(statement)
                        async with self.conn.execute("PRAGMA foreign_key_check") as cur:
                            broken = list(await cur.fetchall())
                        if broken:
                            raise MigrationError(f"{self.path}: migration {migration.version:04d}_{migration.name} "
                                                 f"left {len(broken)} broken reference(s), e.g. {tuple(broken[0])}")
                        await self.conn.execute(
                            "INSERT INTO schema_migrations (version, name, applied_at) VALUES (?, ?, ?)",
                            (migration.version, migration.name, datetime.now(UTC).isoformat()),
                        )
                except MigrationError:
                    raise
                except (StoreError, sqlite_module().Error) as exc:
                    raise MigrationError(
                        f"{self.path}: migration {migration.version:04d}_{migration.name} failed: {exc}"
                    ) from exc
                applied.append(migration.version)
        finally:
            await self.conn.execute("PRAGMA foreign_keys=ON")
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
        """Append memories (pending ones have no importance or embedding yet); one transaction.

        One executemany for the lot: inside our write transaction each new row gets the largest id so
        far plus one (SQLite's rule while ids are below 2**63 - 1), so the ids are known without a
        round trip per row.
        """
        if not memories:
            return []
        rows = [_insert_row(m) for m in memories]
        async with self.transaction():
            await self._check_dimensions(m.embedding for m in memories)
            top = await self._top_id()
            if top + len(rows) < 2**63 - 1:
                await self.conn.executemany(_INSERT, rows)
                return list(range(top + 1, top + len(rows) + 1))
            ids = []
            for values in rows:
                cursor = await self.conn.execute(_INSERT, values)
                assert cursor.lastrowid is not None
                ids.append(cursor.lastrowid)
            return ids

    async def _top_id(self) -> int:
        """The largest memory id ever given (ids are never reused: AUTOINCREMENT's sequence remembers ids
        of memories since deleted); the next insert gets this plus one."""
        async with self.conn.execute("SELECT COALESCE(MAX(id), 0) FROM memories") as cur:
            row = await cur.fetchone()
        top = int(row[0]) if row else 0
        async with self.conn.execute("SELECT 1 FROM sqlite_master WHERE name = 'sqlite_sequence'") as cur:
            if await cur.fetchone() is None:  # a file migrated only part of the way (tests)
                return top
        async with self.conn.execute("SELECT seq FROM sqlite_sequence WHERE name = 'memories'") as cur:
            row = await cur.fetchone()
        return max(top, int(row[0]) if row else 0)

    async def insert_unique(self, memories: Sequence[NewMemory]) -> list[tuple[int, bool]]:
        """Append memories whose (stream, message id) is not stored yet; for each, its id and whether it is
        new. The lookup and the insert are one write transaction, so processes importing the same messages
        at once each finish cleanly, every message stored once."""
        if not memories:
            return []
        async with self.transaction():
            known = await self.find_messages([(m.stream, m.source.message_id) for m in memories
                                              if m.source.message_id])
            fresh = [m for m in memories if not m.source.message_id or (m.stream, m.source.message_id) not in known]
            ids = iter(await self.insert(fresh))
            return [(known[(m.stream, m.source.message_id)], False)
                    if m.source.message_id and (m.stream, m.source.message_id) in known else (next(ids), True)
                    for m in memories]

    async def complete_many(self, stream: str, items: Sequence[tuple[int, int, str, npt.NDArray[np.float32]]],
                            usage: Sequence[tuple[str, str, int, int, int, int, int]] = ()) -> list[int]:
        """Make pending memories of one stream ready, add their importance to the stream's total and record
        model usage, in one transaction; returns the ids completed (not those deleted meanwhile).

        `items` are (id, importance, importance source, embedding); `usage` rows as in record_usage_many.
        """
        ids = [item[0] for item in items]
        if not ids:
            await self.record_usage_many(usage)
            return []
        async with self.transaction():
            await self._check_dimensions(vector for *_, vector in items)
            async with self.conn.execute(
                f"SELECT id FROM memories WHERE status = 'pending' AND stream = ? AND id IN "
                f"({','.join('?' * len(ids))})", (stream, *ids)
            ) as cur:
                completed = {int(row[0]) for row in await cur.fetchall()}  # not deleted meanwhile
            await self.conn.executemany(
                "UPDATE memories SET importance = ?, importance_source = ?, embedding = ?, status = 'ready' "
                "WHERE id = ? AND status = 'pending'",
                [(importance, source, to_blob(vector), memory_id) for memory_id, importance, source, vector in items
                 if memory_id in completed],
            )
            done = [memory_id for memory_id in ids if memory_id in completed]
            total = sum(importance for memory_id, importance, *_ in items if memory_id in completed)
            if done:
                await self.add_importance(stream, total)
            await self.record_usage_many(usage)
        return done

    async def find_messages(self, keys: Sequence[tuple[str, str]]) -> dict[tuple[str, str], int]:
        """The memories made from these (stream, Discord message id) pairs, where stored: one query per
        stream and 500 ids, not one per message."""
        by_stream: dict[str, list[str]] = {}
        for stream, message_id in keys:
            by_stream.setdefault(stream, []).append(message_id)
        found: dict[tuple[str, str], int] = {}
        for stream, message_ids in by_stream.items():
            unique = sorted(set(message_ids))
            for start in range(0, len(unique), 500):
                chunk = unique[start:start + 500]
                async with self.conn.execute(
                    f"SELECT message_id, id FROM memories WHERE stream = ? AND message_id IN "
                    f"({','.join('?' * len(chunk))})", (stream, *chunk)
                ) as cur:
                    found.update(((stream, row[0]), int(row[1])) for row in await cur.fetchall())
        return found

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

    async def count_attempt(self, memory_id: int, *, at: float | None = None) -> None:
        """Record one more failed attempt to complete a pending memory; given the time of the failure, its
        next attempt waits retry_delay(failures) seconds."""
        if at is None:
            await self.conn.execute("UPDATE memories SET attempts = attempts + 1 WHERE id = ?", (memory_id,))
            return
        await self.conn.execute(
            "UPDATE memories SET attempts = attempts + 1, next_attempt_at = ? + min(?, ? * (1 << min(attempts, 30))) "
            "WHERE id = ?", (at, RETRY_CAP_SECONDS, RETRY_BASE_SECONDS, memory_id),
        )

    async def update_text(self, memory_id: int, text: str, embedding: npt.NDArray[np.float32]) -> None:
        """Replace an observation's text and embedding (an edited message)."""
        async with self.transaction():
            await self._check_dimensions([embedding])
            async with self.conn.execute("SELECT text FROM memories WHERE id = ?", (memory_id,)) as cur:
                self._residue += [row[0] for row in await cur.fetchall()]
            await self.conn.execute("UPDATE memories SET text = ?, embedding = ? WHERE id = ?",
                                    (text, to_blob(embedding), memory_id))

    async def touch(self, ids: Sequence[int], at: float) -> None:
        """Set last access of these memories to `at` (collected instead inside `deferred_touches()`)."""
        collected = _touches.get()
        if collected is not None:
            for memory_id in ids:
                collected[memory_id] = max(at, collected.get(memory_id, at))
        elif ids:
            await self.conn.executemany("UPDATE memories SET last_accessed_at = ? WHERE id = ?",
                                        [(at, i) for i in ids])

    async def delete(self, ids: Iterable[int], *, messages: Sequence[str] = (),
                     author: tuple[str, str] | None = None, keep: Iterable[int] = ()) -> list[int]:
        """Delete memories and, transitively, every reflection that cites one of them and every reply built
        to answer one (with its trace, whose query is the message's text). Traces answering the Discord
        `messages`, or anything the (stream, author id) `author` said, go too, stored as memories or not.
        Memories in `keep` stay (an edited message: only what was drawn from its old text goes)."""
        doomed: set[int] = set()
        async with self.transaction():
            frontier = set(ids) | await self._drop_traces(messages, author)
            while frontier:
                doomed |= frontier
                frontier = (await self._citing(frontier) | await self._replies_to(frontier)
                            | await self._replies_using(frontier)) - doomed
            ordered = sorted(doomed - set(keep))
            for start in range(0, len(ordered), 500):
                chunk = ordered[start:start + 500]
                marks = ",".join("?" * len(chunk))
                async with self.conn.execute(f"SELECT text FROM memories WHERE id IN ({marks})", chunk) as cur:
                    self._residue += [row[0] for row in await cur.fetchall()]
                await self.conn.execute(f"DELETE FROM memories WHERE id IN ({marks})", tuple(chunk))
        return ordered

    async def _citing(self, ids: set[int]) -> set[int]:
        found: set[int] = set()
        ordered = sorted(ids)
        for start in range(0, len(ordered), 500):
            chunk = ordered[start:start + 500]
            marks = ",".join("?" * len(chunk))
            async with self.conn.execute(
                f"SELECT DISTINCT reflection_id FROM evidence WHERE memory_id IN ({marks})", chunk
            ) as cur:
                found |= {row[0] for row in await cur.fetchall()}
        return found

    async def _replies_to(self, ids: set[int]) -> set[int]:
        """The replies (memories) built to answer these memories' messages; their traces are deleted."""
        replies: set[int] = set()
        ordered = sorted(ids)
        for start in range(0, len(ordered), 500):
            chunk = ordered[start:start + 500]
            marks = ",".join("?" * len(chunk))
            where = (f"query_memory_id IN ({marks}) OR query_message_id IN (SELECT message_id FROM memories "
                     f"WHERE id IN ({marks}) AND message_id IS NOT NULL AND stream = reply_traces.stream)")
            async with self.conn.execute(f"SELECT reply_memory_id, query FROM reply_traces WHERE {where}",
                                         chunk + chunk) as cur:
                rows = list(await cur.fetchall())
            replies |= {row[0] for row in rows if row[0] is not None}
            self._residue += [row[1] for row in rows]
            await self.conn.execute(f"DELETE FROM reply_traces WHERE {where}", chunk + chunk)
        return replies

    async def _replies_using(self, ids: set[int]) -> set[int]:
        """The replies (memories) whose prompts held one of these memories; their traces are deleted."""
        replies: set[int] = set()
        ordered = sorted(ids)
        for start in range(0, len(ordered), 500):
            chunk = ordered[start:start + 500]
            where = f"id IN (SELECT trace_id FROM trace_items WHERE memory_id IN ({','.join('?' * len(chunk))}))"
            async with self.conn.execute(f"SELECT reply_memory_id, query FROM reply_traces WHERE {where}",
                                         chunk) as cur:
                rows = list(await cur.fetchall())
            replies |= {row[0] for row in rows if row[0] is not None}
            self._residue += [row[1] for row in rows]
            await self.conn.execute(f"DELETE FROM reply_traces WHERE {where}", chunk)
        return replies

    async def _drop_traces(self, messages: Sequence[str], author: tuple[str, str] | None) -> set[int]:
        """Delete the traces answering these messages or this (stream, author); their replies' ids."""
        wheres: list[tuple[str, list[Any]]] = []
        for start in range(0, len(messages), 500):
            chunk = list(messages[start:start + 500])
            wheres.append((f"query_message_id IN ({','.join('?' * len(chunk))})", chunk))
        if author is not None:
            wheres.append(("stream = ? AND query_author_id = ?", list(author)))
        replies: set[int] = set()
        for where, args in wheres:
            async with self.conn.execute(f"SELECT reply_memory_id, query FROM reply_traces WHERE {where}",
                                         args) as cur:
                rows = list(await cur.fetchall())
            replies |= {row[0] for row in rows if row[0] is not None}
            self._residue += [row[1] for row in rows]
            await self.conn.execute(f"DELETE FROM reply_traces WHERE {where}", args)
        return replies

    async def scrub(self, *, wait: float = 2.0) -> bool:
        """After a deletion for privacy: copy the WAL into the file and truncate it, so that the deleted
        text (zeroed in the file by secure_delete) survives in no old WAL frame either. True when done.

        Another connection in the middle of a read keeps the WAL from being truncated: this tries again for
        up to `wait` seconds, then returns False and leaves a mark, and the scrub is finished the next time
        this file is opened or closed by memstream (finish_scrub)."""
        if self.path == ":memory:":
            return True
        if await self._checkpoint(wait):
            await self._rewrite_residue()
            if await self.get_meta(_SCRUB_MARK) is not None:
                await self.conn.execute("DELETE FROM meta WHERE key = ?", (_SCRUB_MARK,))
                await self._checkpoint(wait)
            return True
        await self.set_meta(_SCRUB_MARK, datetime.now(UTC).isoformat())
        log.warning("%s: another connection is reading; deleted text stays in the write-ahead log until it "
                    "lets go (memstream finishes the scrub the next time it opens or closes this file)", self.path)
        return False

    async def _rewrite_residue(self) -> None:
        """secure_delete zeroes a deleted row, but a copy an earlier page split left in a page that still
        holds live rows stays. So the file is searched for the deleted texts (one pass per needle, ~2 GB/s;
        a deletion too large to search cheaply skips the search) and rewritten (VACUUM: time and space of
        one copy of the file) when a copy is found. Most deletions cost the search only."""
        texts, self._residue = self._residue, []
        vacuum, self._vacuum_due = self._vacuum_due, False
        if not texts and not vacuum:
            return
        if not vacuum:
            needles = residue_needles(texts)
            size = await asyncio.to_thread(_size, self.path)
            vacuum = len(needles) * size > SEARCH_BUDGET_BYTES or await asyncio.to_thread(
                _file_holds_any, self.path, needles)
        if vacuum:
            await self.conn.execute("VACUUM")
            await self._checkpoint(0.0)

    async def _checkpoint(self, wait: float) -> bool:
        """Copy the WAL into the file and truncate it, waiting up to `wait` seconds for readers; True if done."""
        async with self.conn.execute(f"PRAGMA busy_timeout={int(wait * 1000)}"):
            pass  # (closed at once: a pragma's result row left open would hold up a VACUUM)
        try:
            async with self.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)") as cur:
                row = await cur.fetchone()
        finally:
            async with self.conn.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}"):
                pass
        return row is None or not row[0]

    async def finish_scrub(self) -> bool:
        """Finish a scrub that a reader held up (see scrub); True if none is left to do."""
        if self.path == ":memory:" or await self.get_meta(_SCRUB_MARK) is None:
            return True
        return await self.scrub(wait=0.0)

    async def purge_stream(self, stream: str) -> int:
        """Delete a whole stream: memories, traces, state, usage and fault counts."""
        self._vacuum_due = True  # a whole stream: rewriting the file is cheaper than looking for its texts
        async with self.transaction():
            cursor = await self.conn.execute("DELETE FROM memories WHERE stream = ?", (stream,))
            for table in ("reply_traces", "stream_state", "model_usage", "faults", "stream_numbers"):
                await self.conn.execute(f"DELETE FROM {table} WHERE stream = ?", (stream,))
        return cursor.rowcount

    # -- reading memories ------------------------------------------------------------------------

    async def get(self, memory_id: int, *, stream: str | None = None) -> Memory:
        """One memory by id (restricted to `stream` when given)."""
        async with self.conn.execute(f"SELECT {_COLUMNS} FROM memories WHERE id = ?", (memory_id,)) as cur:
            row = await cur.fetchone()
        if row is None or (stream is not None and row[1] != stream):
            where = f" in stream {stream!r}" if stream is not None else ""
            raise MemoryNotFound(f"no memory #{memory_id}{where}", memory_id=memory_id)
        return _memory(row)

    async def by_number(self, stream: str, number: int) -> int:
        """The id of the memory a stream shows as #number (MemoryNotFound if there is none)."""
        async with self.conn.execute("SELECT id FROM memories WHERE stream = ? AND number = ?",
                                     (stream, number)) as cur:
            row = await cur.fetchone()
        if row is None:
            raise MemoryNotFound(f"no memory #{number} in stream {stream!r}", memory_id=number)
        return int(row[0])

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

    async def pending_memories(self, limit: int = 1000, *, due_at: float | None = None) -> list[Memory]:
        """Memories waiting for a rating or an embedding, oldest first; with `due_at`, only those whose
        next attempt is due by then."""
        async with self.conn.execute(
            f"SELECT {_COLUMNS} FROM memories WHERE status = 'pending' AND (? IS NULL OR next_attempt_at IS NULL "
            "OR next_attempt_at <= ?) ORDER BY id LIMIT ?", (due_at, due_at, limit)
        ) as cur:
            return [_memory(row) for row in await cur.fetchall()]

    async def by_author(self, stream: str, author_id: str) -> list[int]:
        """Ids of the observations made from one author's messages in a stream."""
        async with self.conn.execute(
            "SELECT id FROM memories WHERE stream = ? AND author_id = ? AND kind = 'observation'",
            (stream, author_id),
        ) as cur:
            return [row[0] for row in await cur.fetchall()]

    async def author_memories(self, author_id: str, *, stream: str | None = None) -> list[Memory]:
        """The observations made from one author's messages, oldest first: in one stream, or in every one."""
        where, args = ("stream = ? AND ", [stream]) if stream is not None else ("", [])
        async with self.conn.execute(
            f"SELECT {_COLUMNS} FROM memories WHERE {where}author_id = ? AND kind = 'observation' "
            "ORDER BY created_at, id", [*args, author_id],
        ) as cur:
            return [_memory(row) for row in await cur.fetchall()]

    async def stream_pages(self, stream: str, *, page: int = 1000) -> AsyncIterator[list[Memory]]:
        """Every memory of a stream, pending ones too, oldest first, a page at a time (a long stream is never
        held whole)."""
        after: tuple[float, int] | None = None
        while True:
            where, args = ("", []) if after is None else (
                "AND (created_at > ? OR (created_at = ? AND id > ?))", [after[0], after[0], after[1]])
            async with self.conn.execute(
                f"SELECT {_COLUMNS} FROM memories WHERE stream = ? {where} ORDER BY created_at, id LIMIT ?",
                [stream, *args, page],
            ) as cur:
                rows = list(await cur.fetchall())
            if not rows:
                return
            yield [_memory(row) for row in rows]
            after = (rows[-1][4], rows[-1][0])

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
        """The ready memories of a stream, as arrays for retrieval (rows in no particular order).

        A file is read by read-only connections off the event loop (they do not hold up this
        connection's writes), straight into preallocated arrays: one copy of the embeddings in memory,
        never two. A large stream is read by several processes at once (memstream._load).
        """
        dims = await self.get_meta("embedding_dimensions")
        dim = int(dims) if dims else 0
        async with self.conn.execute(
            "SELECT COUNT(*), MIN(id), MAX(id) FROM memories WHERE stream = ?", (stream,)
        ) as cur:
            row = await cur.fetchone()
        count, low, high = (int(row[0]), row[1], row[2]) if row else (0, None, None)
        if count == 0 or low is None or high is None:
            return _arrays(_load.Sink(0, dim))
        if self.path == ":memory:" or self._in_transaction:
            sink = _load.Sink(count, dim)
            async with self.conn.execute(_load.SELECT_READY, (stream, low, high)) as cur:
                while rows := list(await cur.fetchmany(_load.CHUNK)):
                    try:
                        sink.put(rows)
                    except _load.LoadError as exc:
                        raise StoreError(str(exc)) from exc
            return _arrays(sink)
        workers = self._load_workers(count)
        if workers > 1:
            try:
                parts = await asyncio.to_thread(_load.load_in_processes, sqlite_module().__name__, self.path,
                                                stream, int(low), int(high), count, dim, workers)
                return _joined(parts, dim)
            except _load.LoadError as exc:
                raise StoreError(str(exc)) from exc
            except _load.WorkerFailed as exc:
                log.warning("loading stream %r in %d processes failed (%s); loading it here", stream, workers, exc)
        return await asyncio.to_thread(self._read_range, stream, int(low), int(high), count, dim)

    async def stream_texts(self, stream: str) -> tuple[list[int], list[str]]:
        """(ids, texts) of the ready memories of a stream, for its lexical index."""
        sql = "SELECT id, text FROM memories WHERE stream = ? AND status = 'ready'"
        if self.path == ":memory:" or self._in_transaction:
            async with self.conn.execute(sql, (stream,)) as cur:
                rows = list(await cur.fetchall())
        else:
            def read() -> list[Any]:
                conn = _load.read_only(sqlite_module(), self.path)()
                try:
                    return list(conn.execute(sql, (stream,)).fetchall())
                finally:
                    conn.close()
            try:
                rows = await asyncio.to_thread(read)
            except sqlite_module().Error as exc:
                raise _sqlite.store_error(exc, self.path) from exc
        return [int(r[0]) for r in rows], [str(r[1]) for r in rows]

    def _load_workers(self, count: int) -> int:
        """How many processes read a stream of `count` rows (1: this one)."""
        if not _load.processes_available():
            return 1
        if self.load_processes is not None:
            return self.load_processes
        if count < PARALLEL_LOAD_ROWS:
            return 1
        try:
            cores = len(os.sched_getaffinity(0))
        except AttributeError:  # not Linux
            cores = os.cpu_count() or 1
        return max(1, min(cores, MAX_LOAD_PROCESSES, count // (PARALLEL_LOAD_ROWS // 2)))

    def _read_range(self, stream: str, low: int, high: int, count: int, dim: int) -> StreamArrays:
        sink = _load.Sink(count, dim)
        try:
            _load.read_range(_load.read_only(sqlite_module(), self.path), stream, low, high, sink)
        except _load.LoadError as exc:
            raise StoreError(str(exc)) from exc
        except sqlite_module().Error as exc:
            raise _sqlite.store_error(exc, self.path) from exc
        return _arrays(sink)

    async def changed_elsewhere(self) -> bool:
        """Whether another connection (another process, or another Store on this file) has committed since
        the last call: SQLite's data_version, one cheap pragma. The in-memory matrices catch up on it."""
        async with self.conn.execute("PRAGMA data_version") as cur:
            row = await cur.fetchone()
        version = int(row[0]) if row else 0
        changed = self._data_version is not None and version != self._data_version
        self._data_version = version
        return changed

    async def load_vector(self, memory_id: int) -> npt.NDArray[np.float32]:
        """One memory's embedding."""
        async with self.conn.execute("SELECT embedding FROM memories WHERE id = ?", (memory_id,)) as cur:
            row = await cur.fetchone()
        if row is None or row[0] is None:
            raise MemoryNotFound(f"no embedding for memory #{memory_id}")
        return np.frombuffer(row[0], dtype="<f4").astype(np.float32)

    # -- reflections and evidence ----------------------------------------------------------------

    async def save_reflection(self, stream: str, insights: Sequence[tuple[NewMemory, Sequence[int]]],
                              at: float, touches: dict[int, float] | None = None) -> list[int]:
        """Insights, their evidence pointers, the importance reset and the last-access updates of the
        reflection's retrievals (`touches`, id: time), in one transaction."""
        async with self.transaction():
            if touches:
                await self.conn.executemany("UPDATE memories SET last_accessed_at = max(last_accessed_at, ?) "
                                            "WHERE id = ?", [(t, i) for i, t in touches.items()])
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
                           prompt_tokens: int = 0, completion_tokens: int = 0, retries: int = 0) -> None:
        """Count model calls (failed ones, and retries the client made) and tokens per stream and role."""
        await self.conn.execute(
            "INSERT INTO model_usage (stream, role, calls, failures, prompt_tokens, completion_tokens, retries) "
            "VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (stream, role) DO UPDATE SET calls = calls + excluded.calls, "
            "failures = failures + excluded.failures, prompt_tokens = prompt_tokens + excluded.prompt_tokens, "
            "completion_tokens = completion_tokens + excluded.completion_tokens, "
            "retries = retries + excluded.retries",
            (stream, role, calls, failures, prompt_tokens, completion_tokens, retries),
        )

    async def count_fault(self, stream: str, kind: str, count: int = 1) -> None:
        """Count a degraded outcome (rating_fallback, insight_dropped, questions_trimmed, ...)."""
        await self.conn.execute(
            "INSERT INTO faults (stream, kind, count) VALUES (?, ?, ?) "
            "ON CONFLICT (stream, kind) DO UPDATE SET count = count + excluded.count", (stream, kind, count),
        )

    async def faults(self, stream: str | None = None) -> dict[str, int]:
        """Fault counts by kind (one stream, or all)."""
        where, args = ("WHERE stream = ?", (stream,)) if stream is not None else ("", ())
        async with self.conn.execute(
            f"SELECT kind, SUM(count) FROM faults {where} GROUP BY kind ORDER BY kind", args
        ) as cur:
            return {row[0]: int(row[1]) for row in await cur.fetchall()}

    async def pending_state(self, stream: str | None = None) -> dict[str, Any]:
        """Pending observations: how many, their failed attempts, and when the next retry is due."""
        where, args = ("AND stream = ?", (stream,)) if stream is not None else ("", ())
        async with self.conn.execute(
            f"SELECT COUNT(*), COALESCE(SUM(attempts), 0), MIN(next_attempt_at) FROM memories "
            f"WHERE status = 'pending' {where}", args
        ) as cur:
            row = await cur.fetchone()
        assert row is not None
        return {"pending": row[0], "failed_attempts": row[1],
                "next_retry_at": None if row[2] is None else from_timestamp(row[2]).isoformat()}

    async def record_usage_many(self, rows: Sequence[tuple[str, str, int, int, int, int, int]]) -> None:
        """Add many (stream, role, calls, failures, prompt tokens, completion tokens, retries) rows at once."""
        if rows:
            await self.conn.executemany(
                "INSERT INTO model_usage (stream, role, calls, failures, prompt_tokens, completion_tokens, retries) "
                "VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (stream, role) DO UPDATE SET "
                "calls = calls + excluded.calls, failures = failures + excluded.failures, "
                "prompt_tokens = prompt_tokens + excluded.prompt_tokens, "
                "completion_tokens = completion_tokens + excluded.completion_tokens, "
                "retries = retries + excluded.retries", list(rows),
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

    async def retries(self, stream: str | None = None) -> dict[str, int]:
        """Failed requests the model client retried, per role (one stream, or all)."""
        where, args = ("WHERE stream = ?", (stream,)) if stream is not None else ("", ())
        async with self.conn.execute(
            f"SELECT role, SUM(retries) FROM model_usage {where} GROUP BY role ORDER BY role", args
        ) as cur:
            return {row[0]: int(row[1]) for row in await cur.fetchall()}

    async def save_trace(self, stream: str, at: float, query: str, items: list[dict[str, Any]],
                         reply_memory_id: int | None, *, query_memory_id: int | None = None,
                         query_message_id: str | None = None, query_author_id: str | None = None) -> int:
        """Record what a reply was built from, and which message (whose) it answered."""
        async with self.transaction():
            return await self._save_trace(stream, at, query, items, reply_memory_id, query_memory_id,
                                          query_message_id, query_author_id)

    async def _save_trace(self, stream: str, at: float, query: str, items: list[dict[str, Any]],
                          reply_memory_id: int | None, query_memory_id: int | None, query_message_id: str | None,
                          query_author_id: str | None) -> int:
        cursor = await self.conn.execute(
            "INSERT INTO reply_traces (stream, created_at, query, reply_memory_id, items, query_memory_id, "
            "query_message_id, query_author_id) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (stream, at, query, reply_memory_id, json.dumps(items), query_memory_id, query_message_id,
             query_author_id),
        )
        assert cursor.lastrowid is not None
        await self.conn.executemany("INSERT OR IGNORE INTO trace_items (memory_id, trace_id) VALUES (?, ?)",
                                    [(int(item["id"]), cursor.lastrowid) for item in items])
        return cursor.lastrowid

    async def delete_trace(self, trace_id: int) -> None:
        """Delete a reply's trace (a reply that was never delivered; its query is a message still remembered)."""
        await self.conn.execute("DELETE FROM reply_traces WHERE id = ?", (trace_id,))

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
