"""Reader processes of a SQLite file: started on a first load that needs them, kept for the next ones.

A stream of PROCESS_ROWS memories or more is read by reader processes (memstream.store._load runs as each one's
script), one id range each, each on a core of its own: the parent turns no row into Python objects (the GIL
would make it read alone), and gets each reader's rows a chunk at a time, so that it can index one chunk's
texts (`each`) while the next is read. A reader that fails, or answers something unexpected, is ended; the next
load starts another. The readers end with the store (Readers.close), or when this process ends (their socket
closes).
"""

from __future__ import annotations

import contextlib
import json
import mmap
import os
import queue
import socket
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Sequence
from typing import IO, Any

import numpy as np

from memstream.store import _load
from memstream.store._load import LoadError, Part, WorkerFailed

__all__ = ["Readers", "processes_available", "split"]

_SCRIPT = os.path.abspath(_load.__file__)
_TIMEOUT = 600.0  # seconds a reader may go without sending anything before it is taken as stuck
_SLACK_ROWS = 1024  # rows allocated ahead for a reader beyond its share of the stream


def processes_available() -> bool:
    """Whether this system can load in reader processes (Linux: memfd; an interpreter to start)."""
    return bool(sys.executable) and hasattr(os, "memfd_create") and hasattr(socket, "send_fds")


def split(low: int, high: int, parts: int) -> list[tuple[int, int]]:
    """[low, high] cut into `parts` consecutive id ranges of (nearly) equal width."""
    width = high - low + 1
    bounds = [low + width * i // parts for i in range(parts + 1)]
    return [(bounds[i], bounds[i + 1] - 1) for i in range(parts) if bounds[i + 1] > bounds[i]]


class _Reader:
    """One reader process and the parent's end of its socket."""

    def __init__(self) -> None:
        mine, theirs = socket.socketpair()
        self.errors: IO[bytes] = tempfile.TemporaryFile()  # noqa: SIM115 (closed by close())
        try:
            self.process = subprocess.Popen([sys.executable, "-P", _SCRIPT], stdin=theirs.fileno(),
                                            stdout=subprocess.DEVNULL, stderr=self.errors,
                                            env={**os.environ, **_load.READER_ENV}, start_new_session=True)
        except OSError as exc:
            mine.close()
            self.errors.close()
            raise WorkerFailed(f"cannot start a loader process: {exc}") from exc
        finally:
            theirs.close()
        self.sock = mine
        self.frames: queue.Queue[tuple[bytes, bytes]] = queue.Queue()

    def ask(self, spec: dict[str, Any], fd: int) -> None:
        """Send a request (the memfd with it), and receive its answer's frames in a thread meanwhile."""
        data = json.dumps(spec).encode()
        socket.send_fds(self.sock, [len(data).to_bytes(8, "little") + data], [fd])
        threading.Thread(target=self._receive, daemon=True, name="memstream-reader").start()

    def _receive(self) -> None:
        """The answer's frames into `frames`, up to its last (DONE, BAD_DATA, FAILED; b"" at the socket's end)."""
        try:
            while True:
                head = self._exactly(9)
                kind, payload = head[:1], self._exactly(int.from_bytes(head[1:], "little"))
                self.frames.put((kind, payload))
                if kind != _load.ROWS:
                    return
        except (OSError, EOFError):
            self.frames.put((b"", b""))

    def _exactly(self, size: int) -> bytes:
        chunks, left = [], size
        while left:
            got = self.sock.recv(min(left, 1 << 20))
            if not got:
                raise EOFError
            chunks.append(got)
            left -= len(got)
        return b"".join(chunks)

    def next_frame(self, timeout: float) -> tuple[bytes, bytes]:
        try:
            return self.frames.get(timeout=timeout)
        except queue.Empty:
            raise WorkerFailed(f"a loader process sent nothing for {timeout:.0f} s") from None

    def failure(self, message: str | None = None) -> WorkerFailed:
        """Why the reader could not answer: its message, or how it ended and the last line it wrote."""
        if message is not None:
            return WorkerFailed(f"a loader process failed: {message}")
        try:
            code = self.process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            return WorkerFailed("a loader process stopped answering")
        self.errors.seek(0)
        lines = self.errors.read().decode("utf-8", "replace").strip().splitlines()
        return WorkerFailed(f"a loader process exited with {code}: {lines[-1] if lines else 'no message'}")

    def alive(self) -> bool:
        return self.process.poll() is None

    def close(self) -> None:
        """End the reader: its socket closed, it ends; killed if it does not within a second."""
        with contextlib.suppress(OSError):
            self.sock.close()
        try:
            self.process.wait(timeout=1)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.errors.close()


class Readers:
    """The reader processes of one SQLite file (`module`: the SQLite binding's module name), at most `keep` kept
    between loads."""

    def __init__(self, module: str, path: str, keep: int) -> None:
        self.module, self.path, self.keep = module, path, keep
        self._idle: list[_Reader] = []
        self._lock = threading.Lock()
        self._closed = False

    def read(self, stream: str, low: int, high: int, capacity: int, dim: int, parts: int, *,
             texts: bool = False, sources: bool = False, seek: bool = False,
             each: Callable[[list[str]], None] | None = None, timeout: float = _TIMEOUT) -> list[Part]:
        """The stream's ready rows with ids in [low, high] (and their texts, with `texts`, and sources, with
        `sources`), read by `parts` readers, one block each, in row order. `each`: called with the texts of each
        chunk of rows, in row order, as they come (in this thread, while the readers read on).

        `capacity` bounds the rows of any one part (the stream's row count). Raises LoadError for bad data
        (as the reader reported it) and WorkerFailed when the processes themselves could not do the work.
        """
        ranges = split(low, high, parts)
        readers = self._take(len(ranges))
        fds: list[int] = []
        done = False
        try:
            for reader, (first, last) in zip(readers, ranges, strict=True):
                fds.append(os.memfd_create(f"memstream-load-{first}"))
                os.ftruncate(fds[-1], max(capacity, 1) * dim * 4)
                _allocate_soon(fds[-1], min(capacity, capacity // len(ranges) + _SLACK_ROWS) * dim * 4)
                reader.ask({"module": self.module, "path": self.path, "stream": stream, "low": first, "high": last,
                            "capacity": capacity, "dim": dim, "texts": texts, "sources": sources, "seek": seek},
                           fds[-1])
            found = [_collect(reader, fd, dim, texts, sources, each, timeout)
                     for reader, fd in zip(readers, fds, strict=True)]
            done = True
            return found
        except OSError as exc:  # (no memfd, or a reader's socket closed under us)
            raise WorkerFailed(f"cannot reach a loader process: {exc}") from exc
        finally:
            for fd in fds:
                os.close(fd)
            self._give_back(readers, done)

    def pids(self) -> list[int]:
        """The process ids of the readers waiting for a load (for what watches their memory)."""
        with self._lock:
            return [reader.process.pid for reader in self._idle if reader.alive()]

    def close(self) -> None:
        """End every reader (one at work ends when its load is over)."""
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for reader in idle:
            reader.close()

    def _take(self, count: int) -> list[_Reader]:
        with self._lock:
            taken = [reader for reader in self._idle[:count] if reader.alive()]
            gone = [reader for reader in self._idle[:count] if not reader.alive()]
            del self._idle[:count]
        for reader in gone:
            reader.close()
        try:
            while len(taken) < count:
                taken.append(_Reader())
        except BaseException:
            for reader in taken:
                reader.close()
            raise
        return taken

    def _give_back(self, readers: Sequence[_Reader], answered: bool) -> None:
        """Readers that answered in full wait for the next load; the others (a failure, an answer left half
        read) are ended."""
        kept = []
        with self._lock:
            for reader in readers:
                if answered and not self._closed and len(self._idle) < self.keep and reader.alive():
                    self._idle.append(reader)
                    kept.append(reader)
        for reader in readers:
            if reader not in kept:
                reader.close()


def _allocate_soon(fd: int, size: int) -> None:
    """Have the kernel allocate the first `size` bytes of a memfd in a thread, while its reader starts: the reader
    then maps pages that exist rather than faulting each one in (15 MB: 11.6 ms of its time, against 3.3 ms of
    this thread's and 6.5 of its own). The pages it needs beyond are faulted in as before."""
    if size <= 0 or not hasattr(os, "posix_fallocate"):
        return
    own = os.dup(fd)  # (its own descriptor: the caller may close its own meanwhile)

    def allocate() -> None:
        try:
            os.posix_fallocate(own, 0, size)
        except OSError:
            pass  # (no room: the reader's page faults will say so, as they would have)
        finally:
            os.close(own)

    threading.Thread(target=allocate, daemon=True, name="memstream-allocate").start()


def _collect(reader: _Reader, fd: int, dim: int, texts: bool, sources: bool,
             each: Callable[[list[str]], None] | None, timeout: float) -> Part:
    """One reader's answer as a Part: its chunks' columns, texts and sources, and its memfd as its block."""
    columns: list[dict[str, Any]] = []
    words: list[str] = []
    fields: list[tuple[str | None, ...]] = []
    while True:
        kind, payload = reader.next_frame(timeout)
        if kind == _load.DONE:
            break
        if kind == _load.BAD_DATA:
            raise LoadError(payload.decode("utf-8", "replace"))
        if kind == _load.FAILED:
            raise reader.failure(payload.decode("utf-8", "replace"))
        if kind != _load.ROWS:
            raise reader.failure()
        chunk, said, told = _rows(payload, texts, sources)
        columns.append(chunk)
        if said is not None:
            words.extend(said)
            if each is not None:
                each(said)
        if told is not None:
            fields.extend(told)
    n = sum(len(chunk["ids"]) for chunk in columns)
    joined = {name: (np.concatenate([chunk[name] for chunk in columns]) if columns else np.zeros(0, dtype))
              for name, dtype in _load.COLUMNS}
    length = n * dim * 4
    os.ftruncate(fd, length)  # frees the pages mapped ahead of the rows the reader did not need
    if length == 0:
        return Part(np.empty((0, dim), np.float32), joined, words if texts else None, fields if sources else None)
    region = mmap.mmap(fd, length, flags=mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0))
    return Part(np.frombuffer(region, dtype=np.float32).reshape(n, dim), joined, words if texts else None,
                fields if sources else None)


def _rows(payload: bytes, texts: bool, sources: bool) -> tuple[dict[str, Any], list[str] | None,
                                                               list[tuple[str | None, ...]] | None]:
    """A ROWS frame's columns, texts and sources (_load.rows_payload)."""
    if len(payload) < 8:
        raise WorkerFailed("a loader process sent rows without their count")
    n = int.from_bytes(payload[:8], "little")
    columns, offset = {}, 8
    for name, dtype in _load.COLUMNS:
        size = n * np.dtype(dtype).itemsize
        if offset + size > len(payload):
            raise WorkerFailed(f"a loader process sent {len(payload)} bytes for {n} rows")
        columns[name] = np.frombuffer(payload, dtype=dtype, count=n, offset=offset)
        offset += size
    said, told = None, None
    if texts:
        found, offset = _unpack_strings(payload, offset, n)
        said = [text or "" for text in found]
    if sources:
        columns_of: list[list[str | None]] = []
        for _ in range(_load.SOURCE_FIELDS):
            column, offset = _decoded(payload, offset, n)
            columns_of.append(column)
        told = list(zip(*columns_of, strict=True))
    if offset != len(payload):
        raise WorkerFailed(f"a loader process sent {len(payload)} bytes for {n} rows")
    return columns, said, told


def _decoded(out: bytes, offset: int, n: int) -> tuple[list[str | None], int]:
    """The column of n strings _load._coded packed at `offset`, and the offset after it."""
    if len(out) < offset + 4:
        raise WorkerFailed(f"a loader process sent {len(out)} bytes for {n} rows")
    distinct = int.from_bytes(out[offset:offset + 4], "little")
    values, offset = _unpack_strings(out, offset + 4, distinct)
    if len(out) < offset + 4 * n:
        raise WorkerFailed(f"a loader process sent {len(out)} bytes for {n} rows")
    codes = np.frombuffer(out, np.uint32, n, offset)
    if n and int(codes.max()) >= distinct:
        raise WorkerFailed("a loader process sent a code beyond its values")
    return list(map(values.__getitem__, codes.tolist())), offset + 4 * n


def _unpack_strings(out: bytes, offset: int, n: int) -> tuple[list[str | None], int]:
    """The n strings _load._pack_strings packed at `offset`, and the offset after them."""
    if len(out) < offset + 4 * n + 8:
        raise WorkerFailed(f"a loader process sent {len(out)} bytes for {n} strings")
    lengths = np.frombuffer(out, np.uint32, n, offset)
    start = offset + 4 * n + 8
    end = start + int.from_bytes(out[start - 8:start], "little")
    try:
        joined = out[start:end].decode("utf-8", "surrogatepass")
    except UnicodeDecodeError as exc:
        raise WorkerFailed(f"a loader process sent texts that are not UTF-8: {exc}") from exc
    missing = lengths == _load.NONE
    bounds = [0, *np.cumsum(np.where(missing, 0, lengths), dtype=np.int64).tolist()]
    if bounds[-1] != len(joined) or end > len(out):
        raise WorkerFailed(f"a loader process sent {len(joined)} characters of texts, not {bounds[-1]}")
    gone = missing.tolist()
    return [None if gone[i] else joined[bounds[i]:bounds[i + 1]] for i in range(n)], end
