"""Reading a stream's ready rows into arrays: in this process, or in reader processes (readers.py).

Python spends ~2.7 us per row turning SQLite rows into objects, under the GIL, so a second reader thread
does not help; a second process does. A stream is split into id ranges, one per reader process; each reader
writes its embeddings into the memfd (shared memory) it was given and sends the small columns, texts and
sources back through its socket, a chunk of rows at a time, so that the parent can index the texts of one
chunk while the next is read. The parent maps each memfd as one block of the matrix: the embeddings are
copied once, by the reader that read them.

This module imports nothing from memstream: a reader runs it as a script (`python -P _load.py`, its socket
as stdin) and starts in ~0.1 s, where importing the package (the openai SDK) takes over a second.
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib
import json
import mmap
import os
import socket
import sys
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

__all__ = ["CHUNK", "CHUNK_ROWS", "COLUMNS", "LoadError", "Part", "Sink", "WorkerFailed", "frame", "inverse_norms",
           "large_empty", "ranges", "read_only", "read_range", "rows_payload", "runs", "seeks", "select_ready",
           "serve"]

# NOT INDEXED: walk the table in id order over a range of ids, not the stream index in time order, where the
# stream holds much of its id range (a persona file of one server, a stream imported at once); INDEXED BY: its
# own rows only, through the stream index, where many streams' rows are interleaved (a persona in many servers:
# at 10M memories in 1,000 streams, 7.2 s to walk a 10k stream's id range, its own rows alone in milliseconds).
_SELECT_READY = ("SELECT id, importance, last_accessed_at, created_at, embedding{} FROM memories {} "
                 "WHERE stream = ? AND status = 'ready' AND id BETWEEN ? AND ?")
_WALK = "NOT INDEXED"
_SEEK = "INDEXED BY memories_by_stream"
# From this share of its id range on, a stream's rows are read by walking the range.
WALK_DENSITY = 0.25
# Below it, a stream whose ids make runs of this many rows on average, the same share of each (ids given in
# blocks per stream since migration 0010: memstream.store.idblocks), is read by walking each run, neighbouring
# rows; one whose rows are scattered (a file written before) is read through the stream index, a seek per row.
# Ids at most RUN_GAP apart (deleted rows between) make one run.
RUN_ROWS = 16
RUN_GAP = 64
_IDS = f"SELECT id FROM memories {_SEEK} WHERE stream = ? AND id BETWEEN ? AND ?"
CHUNK = 4096
# A row's source, in the order of memstream.records.Source's fields.
_SOURCE_COLUMNS = ", author, author_id, channel, channel_id, message_id, reply_to"
SOURCE_FIELDS = 6
NONE = 2**32 - 1  # a missing string's length, between processes
_MADV_POPULATE_WRITE = 23  # Linux 5.14+; not exported by Python 3.11's mmap module
# The small columns a reader sends back, in this order, after an 8-byte row count.
COLUMNS = (("ids", np.int64), ("importance", np.float32), ("last", np.float64), ("created", np.float64),
           ("inverse_norms", np.float32))
READER_ENV = {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


class LoadError(Exception):
    """A row that cannot be loaded, or a stream that grew while it was being loaded."""


class WorkerFailed(Exception):
    """A worker process could not start or did not finish; the caller loads in its own process instead."""


def cores() -> int:
    """The cores this process may run on (its affinity on Linux)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def inverse_norms(matrix: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
    """1 / the Euclidean norm of each row (summed in float64), 0 for a zero row."""
    squares = np.einsum("ij,ij->i", matrix, matrix, dtype=np.float64)
    inv = np.zeros(len(matrix), np.float64)
    np.divide(1.0, np.sqrt(squares), out=inv, where=squares > 0.0)
    out: npt.NDArray[np.float32] = inv.astype(np.float32)
    return out


def large_empty(shape: tuple[int, int], *, populate: bool = False, dtype: Any = np.float32) -> npt.NDArray[Any]:
    """An uninitialized float32 (or `dtype`) matrix; one of 4 MiB or more in its own mapping, in ordinary pages.

    Touching 1.5 GB of fresh memory costs 1-3 s of page faults on this kind of VM. With `populate`, a
    background thread has the kernel map the pages ahead of the writer (without writing to them), while
    the writer spends its time reading: a 10k-memory stream's 15 MB load spends 11.5 ms in Sink.put with it,
    19 ms without. Not in transparent huge pages: mapping 1.5 GB of them took from
    0.2 s (huge pages just freed) to 3.9 s (the kernel zeroing fresh ones) on this VM, ordinary pages a
    steady 0.34-0.4 s; queries scan the matrix as fast either way.
    """
    size = shape[0] * shape[1] * np.dtype(dtype).itemsize
    if size < 1 << 22 or not hasattr(mmap, "MADV_NOHUGEPAGE"):
        return np.empty(shape, dtype)
    region = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    with contextlib.suppress(OSError):
        region.madvise(mmap.MADV_NOHUGEPAGE)  # where Linux would use them by default
    matrix = np.frombuffer(region, dtype=dtype).reshape(shape)  # the array keeps the mapping alive
    if populate:
        threading.Thread(target=_Populator(matrix).run, daemon=True).start()
    return matrix


class _Populator:
    """Has the kernel map a matrix's pages (MADV_POPULATE_WRITE, without writing them), ahead of its writer."""

    def __init__(self, matrix: npt.NDArray[Any]) -> None:
        self.matrix = matrix

    def run(self) -> None:
        try:
            libc = ctypes.CDLL(None, use_errno=True)  # ctypes releases the GIL during the call
            madvise = libc.madvise
            madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        except (OSError, AttributeError):
            return
        base, total, step = self.matrix.ctypes.data, self.matrix.nbytes, 32 << 20
        for done in range(0, total, step):
            if madvise(base + done, min(step, total - done), _MADV_POPULATE_WRITE) != 0:
                return  # an older kernel: the writer takes the page faults itself


def select_ready(*, texts: bool = False, sources: bool = False, seek: bool = False) -> str:
    """The SQLite query of a stream's ready rows in an id range (stream, low, high), with texts or not, and
    sources or not; walking the range, or with `seek` through the stream index."""
    return _SELECT_READY.format((", text" if texts else "") + (_SOURCE_COLUMNS if sources else ""),
                                _SEEK if seek else _WALK)


def seeks(count: int, low: int, high: int) -> bool:
    """Whether a stream of `count` rows with ids from `low` to `high` is read through its index (its rows are a
    small share of the range: interleaved with other streams')."""
    return count < WALK_DENSITY * (high - low + 1)


class Sink:
    """Preallocated columns (and a matrix, given or made) filled chunk by chunk, in place; with `texts`, a list
    of the rows' texts too, and with `sources` of their sources (tuples in Source's field order)."""

    def __init__(self, capacity: int, dim: int, *, matrix: npt.NDArray[np.float32] | None = None,
                 texts: bool = False, sources: bool = False) -> None:
        self.capacity, self.width, self.n = capacity, dim * 4, 0
        self.texts: list[str] | None = [] if texts else None
        self.sources: list[tuple[str | None, ...]] | None = [] if sources else None
        self.ids = np.empty(capacity, np.int64)
        self.importance = np.empty(capacity, np.float32)
        self.last = np.empty(capacity, np.float64)
        self.created = np.empty(capacity, np.float64)
        self.embeddings = large_empty((capacity, dim), populate=True) if matrix is None else matrix
        self.inverse_norms = np.empty(capacity, np.float32)

    def put(self, rows: Sequence[Sequence[Any]]) -> None:
        """Copy a chunk of (id, importance, last access, created, embedding[, text]) rows in."""
        start, end = self.n, self.n + len(rows)
        if end > self.capacity:
            raise LoadError("the stream grew while it was being loaded; try again")
        self.ids[start:end] = [r[0] for r in rows]
        self.importance[start:end] = [r[1] for r in rows]
        self.last[start:end] = [r[2] for r in rows]
        self.created[start:end] = [r[3] for r in rows]
        flat, width, offset = self.embeddings.data.cast("B"), self.width, start * self.width
        for r in rows:
            blob = r[4]
            if len(blob) != width:
                raise LoadError(f"memory #{r[0]} has an embedding of {len(blob)} bytes, expected {width}")
            flat[offset:offset + width] = blob
            offset += width
        self.inverse_norms[start:end] = inverse_norms(self.embeddings[start:end])
        if self.texts is not None:
            self.texts.extend([r[5] for r in rows])
        if self.sources is not None:
            after = 5 if self.texts is None else 6
            self.sources.extend([tuple(r[after:]) for r in rows])
        self.n = end

    def columns(self) -> dict[str, npt.NDArray[Any]]:
        """The filled part of each small column."""
        return {name: getattr(self, name)[: self.n] for name, _ in COLUMNS}


def runs(ids: Sequence[int], gap: int = RUN_GAP) -> list[tuple[int, int]]:
    """The id ranges that hold `ids` (sorted): ids at most `gap` apart in one range."""
    found: list[tuple[int, int]] = []
    if not ids:
        return found
    first = last = ids[0]
    for i in ids[1:]:
        if i - last > gap:
            found.append((first, last))
            first = i
        last = i
    found.append((first, last))
    return found


def ranges(conn: Any, stream: str, low: int, high: int) -> list[tuple[int, int]] | None:
    """The id ranges in which a stream with a small share of [low, high] has its rows: the runs of its ids where
    they make long runs, mostly its own (ids given in blocks), None where they are scattered (a seek a row)."""
    ids = sorted(row[0] for row in conn.execute(_IDS, (stream, low, high)))
    found = runs(ids)
    long_runs = len(found) * RUN_ROWS <= len(ids)
    mostly_its_own = len(ids) >= WALK_DENSITY * sum(b - a + 1 for a, b in found)
    return found if long_runs and mostly_its_own else None


def read_range(connect: Any, stream: str, low: int, high: int, sink: Sink, *, seek: bool = False,
               after: Callable[[], None] | None = None, chunk: int = CHUNK) -> None:
    """Fill `sink` with the stream's ready rows whose ids are in [low, high], read through `connect()`: walking
    the range; with `seek` (a stream with a small share of the range), walking each of its `ranges`, or through
    the stream index where they are scattered. One read transaction: one snapshot. `after`: called after each
    chunk of rows (at most `chunk`) is put into the sink."""
    conn = connect()
    try:
        conn.execute("BEGIN")
        walks = ranges(conn, stream, low, high) if seek else None
        query = select_ready(texts=sink.texts is not None, sources=sink.sources is not None,
                             seek=seek and walks is None)
        for first, last in [(low, high)] if walks is None else walks:
            cursor = conn.execute(query, (stream, first, last))
            while rows := cursor.fetchmany(chunk):
                sink.put(rows)
                if after is not None:
                    after()
    finally:
        conn.close()


def read_only(module: Any, path: str) -> Any:
    """A function opening `path` read-only with the SQLite binding `module`."""
    from pathlib import Path

    uri = Path(path).resolve().as_uri() + "?mode=ro"

    def connect() -> Any:
        return module.connect(uri, uri=True, check_same_thread=False)

    return connect


# -- reader processes ---------------------------------------------------------------------------------------


@dataclass
class Part:
    """What one reader read: its block of embeddings (a reader process's: a view of shared memory), its columns
    and, when asked for, its texts and sources (in row order)."""

    embeddings: npt.NDArray[np.float32]
    columns: dict[str, npt.NDArray[Any]]
    texts: list[str] | None = None
    sources: list[tuple[str | None, ...]] | None = None


def _pack_strings(values: Sequence[str | None]) -> bytes:
    """Strings (or None) as their lengths in characters (4 bytes each; None: 2^32 - 1), the byte length of what
    follows (8 bytes), and then all of them, in UTF-8, end to end."""
    lengths = np.fromiter((NONE if v is None else len(v) for v in values), np.uint32, len(values))
    joined = "".join(v for v in values if v is not None).encode("utf-8", "surrogatepass")
    return lengths.tobytes() + len(joined).to_bytes(8, "little") + joined


# A reader process's answer is a series of frames: a kind (one byte), the payload's length (8 bytes), the payload.
CHUNK_ROWS = 1024  # rows a reader sends at a time, at least (the last chunk: what is left)
ROWS, DONE, BAD_DATA, FAILED = b"R", b"D", b"L", b"F"


def frame(kind: bytes, *payload: bytes) -> bytes:
    """One frame of a reader's answer."""
    return kind + sum(map(len, payload)).to_bytes(8, "little") + b"".join(payload)


def rows_payload(sink: Sink, start: int, end: int) -> list[bytes]:
    """Rows start..end of a sink as a ROWS frame's payload: the count (8 bytes), each small column, then the
    texts if kept (_pack_strings) and the sources if kept, field by field (_coded). Their embeddings are in the
    reader's memfd already."""
    out = [(end - start).to_bytes(8, "little")]
    out.extend(column[start:end].tobytes() for column in sink.columns().values())
    if sink.texts is not None:
        out.append(_pack_strings(sink.texts[start:end]))
    if sink.sources is not None:
        for column in zip(*sink.sources[start:end], strict=True) if end > start else [()] * SOURCE_FIELDS:
            out.extend(_coded(column))
    return out


def _coded(values: Sequence[str | None]) -> list[bytes]:
    """A column of strings as its distinct values (their count, 4 bytes, then _pack_strings) and each value's
    code among them (4 bytes each): a source's author and channel repeat across a stream's rows."""
    index: dict[str | None, int] = {}
    codes = np.fromiter(map(lambda v: index.setdefault(v, len(index)), values), np.uint32, len(values))
    return [len(index).to_bytes(4, "little"), _pack_strings(list(index)), codes.tobytes()]


def _request(sock: socket.socket) -> tuple[dict[str, Any], int] | None:
    """The next request (its JSON spec, after an 8-byte length) and the memfd sent with it; None at the end."""
    data, fds, _, _ = socket.recv_fds(sock, 1 << 16, 1)
    while data and len(data) < 8 + int.from_bytes(data[:8].ljust(8, b"\0"), "little"):
        more = sock.recv(1 << 16)
        if not more:
            break
        data += more
    if not data:
        for fd in fds:
            os.close(fd)
        return None
    if len(fds) != 1:
        raise ValueError("a request came without its memfd")
    return json.loads(data[8:]), fds[0]


def _answer(sock: socket.socket, spec: dict[str, Any], fd: int) -> None:
    """Read one id range of a stream into the memfd `fd`, sending its rows a chunk at a time, then DONE (or
    BAD_DATA: the rows cannot be loaded; the parent gets the message)."""
    module = importlib.import_module(spec["module"])
    capacity, dim = int(spec["capacity"]), int(spec["dim"])
    region = mmap.mmap(fd, max(capacity, 1) * dim * 4, flags=mmap.MAP_SHARED)
    matrix = np.frombuffer(region, dtype=np.float32).reshape(max(capacity, 1), dim)
    sink = Sink(capacity, dim, matrix=matrix, texts=bool(spec.get("texts")), sources=bool(spec.get("sources")))
    sent = 0

    def after(last: bool = False) -> None:
        nonlocal sent
        if sink.n - sent >= CHUNK_ROWS or (last and sink.n > sent):
            sock.sendall(frame(ROWS, *rows_payload(sink, sent, sink.n)))
            sent = sink.n

    try:
        connect = read_only(module, spec["path"])
        read_range(connect, spec["stream"], int(spec["low"]), int(spec["high"]), sink, seek=bool(spec.get("seek")),
                   after=after, chunk=CHUNK_ROWS)
        after(last=True)
        sock.sendall(frame(DONE))
    except LoadError as exc:
        sock.sendall(frame(BAD_DATA, str(exc).encode("utf-8", "replace")))
    except module.Error as exc:
        message = f"cannot read stream {spec['stream']!r} from {spec['path']}: {exc}"
        sock.sendall(frame(BAD_DATA, message.encode("utf-8", "replace")))
    # (the memfd's mapping goes with the last reference to it, as this function returns)


def _give_back_memory() -> None:
    """What the last answer freed, handed back to the system (glibc's malloc_trim): an idle reader holds ~30 MB,
    not its largest load's heap."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None).malloc_trim(0)


def serve(sock: socket.socket) -> int:
    """A reader process: answer requests one at a time until the parent closes the socket. Anything unexpected
    is sent back as FAILED, and the reader ends (the parent starts another)."""
    while True:
        request = _request(sock)
        if request is None:
            return 0
        spec, fd = request
        try:
            _answer(sock, spec, fd)
            _give_back_memory()
        except Exception as exc:
            with contextlib.suppress(OSError):
                sock.sendall(frame(FAILED, f"{type(exc).__name__}: {exc}".encode("utf-8", "replace")))
            return 1
        finally:
            os.close(fd)


if __name__ == "__main__":
    sys.exit(serve(socket.socket(fileno=sys.stdin.fileno())))
