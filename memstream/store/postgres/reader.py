"""Reading a stream's ready rows from PostgreSQL into arrays, in threads, each on its own connection inside one
exported snapshot (so that all of them read the same moment of the database).

A row's embedding comes as pgvector's binary form (vector_send: a 4-byte header, then big-endian float32s): a
chunk of rows is joined into one buffer and converted to the matrix's little-endian rows in one numpy
assignment. psycopg waits for the server with the GIL released, so two readers overlap their waits with each
other's conversions.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import psycopg

from memstream import _load

__all__ = ["CHUNK", "SELECT_READY", "put_rows", "read_parts"]

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


def _read(url: str, snapshot: str, stream: str, low: int, high: int, capacity: int, dim: int) -> _load.Sink:
    sink = _load.Sink(capacity, dim)
    with psycopg.connect(url) as conn:
        conn.isolation_level = psycopg.IsolationLevel.REPEATABLE_READ
        conn.read_only = True
        conn.execute(f"SET TRANSACTION SNAPSHOT '{snapshot}'")  # an id PostgreSQL made (hex digits and dashes)
        with conn.cursor(name="memstream_load", binary=True) as cur:
            cur.execute(SELECT_READY, (stream, low, high))
            while rows := cur.fetchmany(CHUNK):
                put_rows(sink, rows, dim)
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
