"""A stream's ready rows as PostgreSQL sends them at load: a binary COPY of groups of ~256 rows, one COPY row
per group, each column of a group one byte string (big-endian values end to end, pgvector's binary vectors end
to end). A group is read with a few numpy views, straight into the preallocated arrays: no Python step per
memory, on either side (PostgreSQL sends ~4,000 messages for a million memories, not a million).

The groups are planned first, in the load's snapshot, from the stream's index (PLAN: id buckets of 256,
gathered into groups of at least 256 rows); each COPY row says which group it is and how many rows it has,
so every row lands at its planned place, and anything that does not add up is an error, never garbage.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from memstream.store import _load

__all__ = ["PLAN", "Group", "GroupReader", "copy_sql", "split"]

# (lowest id, highest id, rows): a range of ids holding that many ready rows of the stream.
Group = tuple[int, int, int]

_BUCKET_BITS = 8  # ids are counted in buckets of 256, gathered into groups of at least _GROUP_ROWS rows
_GROUP_ROWS = 256
PLAN = f"""
WITH buckets AS MATERIALIZED (
    SELECT id >> {_BUCKET_BITS} AS bucket, count(*) AS n FROM memories
    WHERE stream = %s AND status = 'ready' GROUP BY 1)
SELECT min(bucket) << {_BUCKET_BITS}, (max(bucket) << {_BUCKET_BITS}) + {(1 << _BUCKET_BITS) - 1}, sum(n)::bigint
FROM (SELECT bucket, n, ((sum(n) OVER (ORDER BY bucket))::bigint - n) / {_GROUP_ROWS} AS g FROM buckets) AS s
GROUP BY g ORDER BY g"""

_SIGNATURE = b"PGCOPY\n\xff\r\n\x00"
_NUMBERS = 3  # group number, rows, rows without an embedding of the stream's dimension
# The small columns after them, and each one's big-endian type.
_COLUMNS = (("ids", ">i8"), ("importance", ">f4"), ("last", ">f8"), ("created", ">f8"))
# A row's source, in the order of memstream.records.Source's fields.
_SOURCES = ("author", "author_id", "channel", "channel_id", "message_id", "reply_to")


def copy_sql(dim: int, *, texts: bool, sources: bool = False) -> str:
    """The COPY of the groups given as two arrays (lowest ids, highest ids) for a stream (%s placeholders)."""
    def agg(expr: str) -> str:
        return f"string_agg({expr}, ''::bytea ORDER BY id)"

    columns = [agg("int8send(id)"), agg("float4send(importance::float4)"), agg("float8send(last_accessed_at)"),
               agg("float8send(created_at)"), agg("vector_send(embedding)")]
    if texts:  # each text's length in characters, then the texts end to end (in the client's encoding)
        columns += [agg("int4send(char_length(text))"), agg("textsend(text)")]
    for name in _SOURCES if sources else ():  # the same for each source field, a missing one of length -1
        columns += [agg(f"int4send(coalesce(char_length({name}), -1))"), agg(f"textsend(coalesce({name}, ''))")]
    return (f"COPY (SELECT g.k, x.* FROM unnest(%s::bigint[], %s::bigint[]) WITH ORDINALITY AS g(lo, hi, k), "
            f"LATERAL (SELECT count(*), count(*) FILTER (WHERE vector_dims(embedding) IS DISTINCT FROM {int(dim)}), "
            f"{', '.join(columns)} FROM memories "
            "WHERE stream = %s AND status = 'ready' AND id BETWEEN g.lo AND g.hi) AS x) TO STDOUT (FORMAT BINARY)")


def split(groups: Sequence[Group], parts: int) -> list[list[Group]]:
    """Consecutive runs of groups with about equal rows, at most `parts` of them, none empty."""
    total = sum(g[2] for g in groups)
    runs: list[list[Group]] = [[]]
    seen = 0
    for group in groups:
        if runs[-1] and len(runs) < parts and seen >= total * len(runs) / parts:
            runs.append([])
        runs[-1].append(group)
        seen += group[2]
    return [run for run in runs if run]


class GroupReader:
    """Reads the COPY of `groups` (copy_sql), message by message (feed), into preallocated arrays."""

    def __init__(self, groups: Sequence[Group], dim: int, *, texts: bool, sources: bool = False,
                 encoding: str = "utf-8") -> None:
        self.groups, self.dim, self.encoding = list(groups), dim, encoding
        self.starts = np.concatenate([[0], np.cumsum([g[2] for g in self.groups], dtype=np.int64)]).tolist()
        self.sink = _load.Sink(self.starts[-1], dim)
        self.texts: list[str] | None = [""] * self.starts[-1] if texts else None
        self.sources: list[tuple[str | None, ...]] | None = [()] * self.starts[-1] if sources else None
        self._vector = np.dtype([("dim", ">u2"), ("unused", ">u2"), ("values", ">f4", (dim,))])
        self._fields = _NUMBERS + len(_COLUMNS) + 1 + (2 if texts else 0) + (2 * len(_SOURCES) if sources else 0)
        self._seen = [False] * len(self.groups)
        self._pending = bytearray()
        self._header, self._ended = False, False

    def feed(self, data: Any) -> None:
        """One message of the COPY (PostgreSQL sends one COPY row per message; any cut is handled)."""
        if not self._pending:
            view = memoryview(data).cast("B")
            used = self._parse(view)
            if used < len(view):
                self._pending += view[used:]
            return
        self._pending += data
        with memoryview(self._pending) as view:
            used = self._parse(view)
        del self._pending[:used]

    def finish(self) -> _load.Part:
        """The rows read, once the COPY has ended: every group in, nothing left over."""
        if not self._ended or self._pending:
            raise _load.LoadError("the stream's rows came incomplete from the server")
        if not all(self._seen):
            missing = self.groups[self._seen.index(False)]
            raise _load.LoadError(f"memories #{missing[0]}..#{missing[1]} did not come from the server")
        self.sink.n = self.sink.capacity
        return _load.Part(self.sink.embeddings, self.sink.columns(), self.texts, self.sources)

    # -- parsing -------------------------------------------------------------------------------------------

    def _parse(self, view: memoryview) -> int:
        """Parse what is complete in `view` (the header, COPY rows, the trailer); the bytes used."""
        pos = 0
        if not self._header:
            if len(view) < 19:
                return 0
            if bytes(view[:11]) != _SIGNATURE or _int(view, 11, 4) & (1 << 16):
                raise _load.LoadError("the server's COPY is not in the expected binary format")
            end = 19 + _int(view, 15, 4)
            if len(view) < end:
                return 0
            self._header, pos = True, end
        while pos + 2 <= len(view):
            if self._ended:
                raise _load.LoadError("the server's COPY went on after its end")
            count = _int(view, pos, 2, signed=True)
            if count == -1:
                self._ended, pos = True, pos + 2
                continue
            if count != self._fields:
                raise _load.LoadError(f"the server sent rows of {count} fields, expected {self._fields}")
            fields, stop = _fields(view, pos + 2, count)
            if stop is None:
                break
            self._group(view, fields)
            pos = stop
        return pos

    def _group(self, view: memoryview, fields: list[tuple[int, int]]) -> None:
        k, n, bad = (_number(view, f) for f in fields[:_NUMBERS])
        if not 1 <= k <= len(self.groups) or self._seen[k - 1]:
            raise _load.LoadError(f"the server sent group {k} of {len(self.groups)} (or twice)")
        low, high, rows = self.groups[k - 1]
        where = f"among #{low}..#{high}"
        if n != rows:
            raise _load.LoadError(f"the server sent {n} memories {where}, expected {rows}")
        if bad:
            raise _load.LoadError(f"a memory {where} has an embedding of other than {self.dim} dimensions (or none)")
        start, columns = self.starts[k - 1], fields[_NUMBERS:]
        for (name, dtype), field in zip(_COLUMNS, columns, strict=False):
            getattr(self.sink, name)[start:start + n] = self._column(view, field, np.dtype(dtype), n, where)
        records = self._column(view, columns[len(_COLUMNS)], self._vector, n, where)
        if np.any(records["dim"] != self.dim) or np.any(records["unused"] != 0):
            raise _load.LoadError(f"a memory {where} has an embedding not in pgvector's binary format")
        matrix = self.sink.embeddings[start:start + n]
        matrix[...] = records["values"]
        self.sink.inverse_norms[start:start + n] = _load.inverse_norms(matrix)
        rest = columns[len(_COLUMNS) + 1:]
        if self.texts is not None:
            lengths, joined = rest[:2]
            self.texts[start:start + n] = [text or "" for text in self._texts(view, lengths, joined, n, where)]
            rest = rest[2:]
        if self.sources is not None:
            values = [self._texts(view, rest[2 * i], rest[2 * i + 1], n, where, nullable=True)
                      for i in range(len(_SOURCES))]
            self.sources[start:start + n] = list(zip(*values, strict=True))
        self._seen[k - 1] = True

    def _column(self, view: memoryview, field: tuple[int, int], dtype: np.dtype[Any], n: int,
                where: str) -> npt.NDArray[Any]:
        offset, length = field
        if length != n * dtype.itemsize:
            raise _load.LoadError(f"a memory {where} has a missing or malformed value")
        return np.frombuffer(view, dtype, n, offset)

    def _texts(self, view: memoryview, lengths: tuple[int, int], joined: tuple[int, int], n: int,
               where: str, *, nullable: bool = False) -> list[str | None]:
        """n strings, given their lengths in characters (with `nullable`, -1: None) and their text end to end."""
        sizes = self._column(view, lengths, np.dtype(">i4"), n, where)
        offset, length = joined
        malformed = _load.LoadError(f"the texts of the memories {where} came malformed from the server")
        try:
            text = str(view[offset:offset + max(length, 0)], self.encoding)
        except UnicodeDecodeError as exc:
            raise malformed from exc
        missing = sizes == -1
        ends = np.cumsum(np.where(missing, 0, sizes), dtype=np.int64)
        if ends[-1] != len(text) or sizes.min() < (-1 if nullable else 0):
            raise malformed
        bounds, gone = [0, *ends.tolist()], missing.tolist()
        return [None if gone[i] else text[bounds[i]:bounds[i + 1]] for i in range(n)]


def _int(view: memoryview, pos: int, size: int, *, signed: bool = False) -> int:
    return int.from_bytes(view[pos:pos + size], "big", signed=signed)


def _fields(view: memoryview, pos: int, count: int) -> tuple[list[tuple[int, int]], int | None]:
    """The (offset, length) of each field of a COPY row starting at `pos`, and its end (None: incomplete)."""
    fields: list[tuple[int, int]] = []
    for _ in range(count):
        if pos + 4 > len(view):
            return fields, None
        length = _int(view, pos, 4, signed=True)
        if length < -1:
            raise _load.LoadError("the server sent a field of negative length")
        fields.append((pos + 4, length))
        pos += 4 + max(length, 0)
    return fields, (pos if pos <= len(view) else None)


def _number(view: memoryview, field: tuple[int, int]) -> int:
    offset, length = field
    if length != 8:
        raise _load.LoadError("the server sent a group without its numbers")
    return _int(view, offset, 8, signed=True)
