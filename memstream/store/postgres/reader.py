"""Reading a stream's ready rows from PostgreSQL into arrays, in threads, each on its own connection inside one
exported snapshot (so that all of them read the same moment of the database).

The rows come as a binary COPY: with every embedding of the same dimension, each row is a record of one fixed
size (PostgreSQL's binary tuple format, pgvector's binary vector: big-endian), so a block of rows is read with
one numpy record view, checked (field counts and lengths, the vector's dimension) and converted into the
preallocated arrays at once: one Python step per row (the COPY's), not one object per column. psycopg waits
for the server with the GIL released, so two readers overlap their waits with each other's conversions.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import psycopg

from memstream import _load

__all__ = ["CHUNK", "SELECT_READY", "put_records", "put_rows", "read_parts"]

CHUNK = 8192
SELECT_READY = ("SELECT id, importance::float4, last_accessed_at, created_at, vector_send(embedding) FROM memories "
                "WHERE stream = %s AND status = 'ready' AND id BETWEEN %s AND %s")


def put_rows(sink: _load.Sink, rows: Sequence[Sequence[Any]], dim: int) -> None:
    """Copy a chunk of (id, importance, last access, created, vector_send bytes) rows into the sink."""
    n = len(rows)
    start, end = sink.n, sink.n + n
    if end > sink.capacity:
        raise _load.LoadError("the stream grew while it was being loaded; try again")
    raw = b"".join([r[4] for r in rows])
    if len(raw) != n * (dim + 1) * 4:
        raise _load.LoadError(f"a memory among #{rows[0][0]}..#{rows[-1][0]} has an embedding of other than {dim} "
                              "dimensions")
    words = np.frombuffer(raw, dtype=">u2").reshape(n, 2 * (dim + 1))
    if n and not (np.all(words[:, 0] == dim) and np.all(words[:, 1] == 0)):
        raise _load.LoadError(f"a memory among #{rows[0][0]}..#{rows[-1][0]} has an embedding of other than {dim} "
                              "dimensions")
    sink.ids[start:end] = [r[0] for r in rows]
    sink.importance[start:end] = [r[1] for r in rows]
    sink.last[start:end] = [r[2] for r in rows]
    sink.created[start:end] = [r[3] for r in rows]
    sink.embeddings[start:end] = np.frombuffer(raw, dtype=">f4").reshape(n, dim + 1)[:, 1:]
    sink.inverse_norms[start:end] = _load.inverse_norms(sink.embeddings[start:end])
    sink.n = end


_COPY = ("COPY (SELECT id, importance::float4, last_accessed_at, created_at, embedding FROM memories "
         "WHERE stream = %s AND status = 'ready' AND id BETWEEN %s AND %s) TO STDOUT (FORMAT BINARY)")
_HEADER = 19  # PGCOPY signature (11), flags (4), header extension length (4)
_BLOCK_BYTES = 8 << 20


def _record(dim: int) -> np.dtype[Any]:
    """One row of the COPY: field count, then (length, value) per column; the vector's 4-byte header."""
    return np.dtype([("fields", ">i2"), ("id_len", ">i4"), ("id", ">i8"), ("imp_len", ">i4"), ("imp", ">f4"),
                     ("last_len", ">i4"), ("last", ">f8"), ("created_len", ">i4"), ("created", ">f8"),
                     ("vec_len", ">i4"), ("vec_dim", ">u2"), ("vec_unused", ">u2"), ("vec", ">f4", (dim,))])


def put_records(sink: _load.Sink, block: memoryview, dim: int) -> None:
    """Copy whole COPY records (one numpy record view) into the sink, checking every length."""
    rows = np.frombuffer(block, dtype=_record(dim))
    n = len(rows)
    start, end = sink.n, sink.n + n
    if end > sink.capacity:
        raise _load.LoadError("the stream grew while it was being loaded; try again")
    bad = ((rows["fields"] != 5) | (rows["id_len"] != 8) | (rows["imp_len"] != 4) | (rows["last_len"] != 8)
           | (rows["created_len"] != 8) | (rows["vec_len"] != 4 + 4 * dim) | (rows["vec_dim"] != dim))
    if bad.any():
        first = int(np.argmax(bad))
        near = int(rows["id"][first - 1]) if first else None
        raise _load.LoadError(f"a memory {'after #' + str(near) if near else 'at the start'} has an embedding of "
                              f"other than {dim} dimensions")
    sink.ids[start:end] = rows["id"]
    sink.importance[start:end] = rows["imp"]
    sink.last[start:end] = rows["last"]
    sink.created[start:end] = rows["created"]
    sink.embeddings[start:end] = rows["vec"]
    sink.inverse_norms[start:end] = _load.inverse_norms(sink.embeddings[start:end])
    sink.n = end


def _read(url: str, snapshot: str, stream: str, low: int, high: int, capacity: int, dim: int) -> _load.Sink:
    sink = _load.Sink(capacity, dim)
    size = _record(dim).itemsize
    buffer = bytearray(max(_BLOCK_BYTES // size, 1) * size + (1 << 20))  # whole records, and room for one row
    view = memoryview(buffer)
    filled, skip = 0, _HEADER
    with psycopg.connect(url) as conn:
        conn.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
        conn.read_only = True
        conn.execute(f"SET TRANSACTION SNAPSHOT '{snapshot}'")  # an id PostgreSQL made (hex digits and dashes)
        with conn.cursor() as cur, cur.copy(_COPY, (stream, low, high)) as copy:
            for data in copy:
                if skip:  # the file header comes with the first row
                    data, skip = bytes(data)[skip:], 0
                k = len(data)
                if k != size:  # the trailer (-1), or a row of another size (checked by put_records below)
                    if k == 2 and bytes(data) == b"\xff\xff":
                        continue
                    raise _load.LoadError(f"a memory among those after #{int(sink.ids[sink.n - 1]) if sink.n else 0} "
                                          f"has an embedding of other than {dim} dimensions")
                view[filled:filled + k] = data
                filled += k
                if filled + size > len(buffer) - (1 << 20):
                    put_records(sink, view[:filled], dim)
                    filled = 0
        if filled:
            put_records(sink, view[:filled], dim)
        conn.rollback()
    return sink


def read_parts(url: str, snapshot: str, stream: str, ranges: Sequence[tuple[int, int, int]],
               dim: int) -> list[_load.Part]:
    """The ready rows of a stream in these (low id, high id, rows) ranges, one thread and connection each, all
    in the exported `snapshot`."""
    def one(spec: tuple[int, int, int]) -> _load.Part:
        low, high, count = spec
        sink = _read(url, snapshot, stream, low, high, count, dim)
        return _load.Part(sink.embeddings[:sink.n], sink.columns())

    if len(ranges) == 1:
        return [one(ranges[0])]
    with ThreadPoolExecutor(len(ranges), thread_name_prefix="memstream-load") as pool:
        return list(pool.map(one, ranges))
