"""Who wrote each memory of a stream and what was said around it: StreamContext, kept row for row beside the
matrix (like the lexical index) for the `hybrid` profile's neighbours, names and time words.

Per row: its author (a small code), whether its text holds a time (cues.holds_time), and its neighbours: the
memories just before and after it in its channel (by creation time, then id), and the message it replies to
where Discord says so (its parent, in the stream, at any distance in time), as row numbers kept in step
with every append, removal and row move, so the neighbour term of a query is a few array operations. A
forgotten memory is unlinked at once (its two neighbours become each other's) and its author's display name
is known only while a live memory carries it. A memory's source (author, channel) reaches the context after
its row (`set_sources`; VectorIndex reads it from the store): until then it has no author and no neighbour.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Mapping, Sequence

import numpy as np
import numpy.typing as npt

from memstream.index.cues import channel_key, holds_time, named
from memstream.records import Source
from memstream.store.arrays import F64, I64

__all__ = ["StreamContext"]

_NONE = -1
# Memory per entry (nbytes): a row's id, time, channel, name and place in its channel; a message id; a reply. As
# the process's resident memory grows, not as tracemalloc counts the objects (327 B a row, half of it: malloc's and
# Python's allocators keep more than each object asks, among a load's freed temporaries): a context of 261k rows
# over 100 streams of bench.persona's file (no message ids) took 623 B a row of anonymous memory more than the
# `spec` profile's load of the same streams (RssAnon, after a trim), 33 of them its arrays; message ids and
# replies were measured the same way on synthetic sources.
_ROW_BYTES = 590
_MESSAGE_BYTES = 140
_REPLY_BYTES = 300
# More sources than this, set into a context that links nothing yet, are linked channel by channel.
_BULK = 64
# Where each of Source's fields sits in the tuples of a load (StreamArrays.sources).
_AUTHOR, _AUTHOR_ID, _CHANNEL, _CHANNEL_ID, _MESSAGE_ID, _REPLY_TO = range(6)


def _fields(source: Source) -> tuple[str | None, ...]:
    return (source.author, source.author_id, source.channel, source.channel_id, source.message_id,
            source.reply_to)


class StreamContext:
    """Authors, time flags and channel neighbours of one stream's rows."""

    def __init__(self) -> None:
        self.author: I64 = np.full(64, _NONE, np.int64)  # per row: author code
        self.prev: I64 = np.full(64, _NONE, np.int64)  # per row: the row said just before in its channel
        self.next: I64 = np.full(64, _NONE, np.int64)  # ... and just after
        self.parent: I64 = np.full(64, _NONE, np.int64)  # per row: the row of the message it replies to
        self.timed = np.zeros(64, np.bool_)
        self._row_of: dict[int, int] = {}
        self._created: dict[int, float] = {}
        self._unknown: set[int] = set()  # ids whose source has not reached the context yet
        self._channel_of: dict[int, str] = {}
        self._channels: dict[str, list[tuple[float, int]]] = {}  # (created, id), in order
        self._codes: dict[str, int] = {}  # author key -> code, while a live memory has that author
        self._authored: dict[str, int] = {}  # author key -> live memories
        self._next_code = 0
        self._name_of: dict[int, tuple[str, str]] = {}  # id -> (author key, display name or "")
        self._names: dict[tuple[str, str], int] = {}  # (author key, display name) -> live memories carrying it
        self.version = 0  # changes whenever a link does
        self._near: tuple[tuple[float, int, int], I64, I64] | None = None
        self._message_of: dict[int, str] = {}  # id -> its Discord message id
        self._by_message: dict[str, int] = {}  # Discord message id -> id
        self._reply_of: dict[int, str] = {}  # id -> the Discord message it replies to
        self._replies: dict[str, set[int]] = {}  # Discord message id -> the ids replying to it (here or not yet)

    # -- reading -----------------------------------------------------------------------------------

    def unknown(self) -> list[int]:
        """Ids whose source is still to be set."""
        return sorted(self._unknown)

    def neighbours(self, created: F64, gap: float) -> tuple[I64, I64, I64]:
        """Every row's neighbour before and after it in its channel (-1: none), if said within `gap` seconds,
        and the message it replies to (-1: none here)."""
        n = created.size
        key = (gap, self.version, n)
        if self._near is None or self._near[0] != key:
            self._near = (key, self._within(self.prev[:n], created, gap), self._within(self.next[:n], created, gap))
        return self._near[1], self._near[2], self.parent[:n]

    @staticmethod
    def _within(rows: I64, created: F64, gap: float) -> I64:
        linked = rows >= 0
        apart = np.abs(created - created[np.where(linked, rows, 0)])
        out: I64 = np.where(linked & (apart <= gap), rows, _NONE)
        return out

    def nbytes(self) -> int:
        """About the memory this context holds (its arrays, and per row, message and reply as measured)."""
        columns = (self.author, self.prev, self.next, self.parent, self.timed, *(self._near[1:] if self._near else ()))
        arrays = int(sum(column.nbytes for column in columns))
        return (arrays + len(self._row_of) * _ROW_BYTES + len(self._message_of) * _MESSAGE_BYTES
                + len(self._reply_of) * _REPLY_BYTES)

    def named_rows(self, query: str, n: int) -> I64 | None:
        """The rows (of the first n) written by someone the query names; None if it names nobody."""
        keys = named(query, self._names)
        codes = [self._codes[key] for key in sorted(keys) if key in self._codes]
        if not codes:
            return None
        authors = self.author[:n]
        chosen = authors == codes[0] if len(codes) == 1 else np.isin(authors, np.asarray(codes, np.int64))
        return np.flatnonzero(chosen).astype(np.int64)

    # -- writing -----------------------------------------------------------------------------------

    def add(self, first_row: int, ids: Sequence[int], created: Sequence[float], texts: Sequence[str], *,
            timed: npt.NDArray[np.bool_] | None = None) -> None:
        """New rows first_row, first_row + 1, ...; their sources come later (set_sources). `timed`: whether
        each text holds a time, if known (cues.holds_time)."""
        end = first_row + len(ids)
        self._grow(end)
        memory_ids = [int(i) for i in ids]
        self._row_of.update(zip(memory_ids, range(first_row, end), strict=True))
        self._created.update(zip(memory_ids, map(float, created), strict=True))
        self._unknown.update(memory_ids)
        for column in (self.author, self.prev, self.next, self.parent):
            column[first_row:end] = _NONE
        self.timed[first_row:end] = [holds_time(text) for text in texts] if timed is None else timed

    def set_sources(self, sources: Mapping[int, Source], asked: Sequence[int] = ()) -> None:
        """The sources of rows added before; `asked` ids the store did not find are taken as having none."""
        if self._fresh() and len(sources) > _BULK:  # a stream's load: every channel at once
            self._set_all([(i, _fields(sources[i])) for i in sorted(sources)], asked)
            return
        for memory_id in [*sorted(sources), *asked]:
            if memory_id not in self._unknown or memory_id not in self._row_of:
                continue
            self._unknown.discard(memory_id)
            source = sources.get(memory_id)
            if source is None:
                continue
            row = self._row_of[memory_id]
            self._author(memory_id, row, _fields(source))
            channel = channel_key(source)
            if channel is not None:
                self._link(memory_id, row, channel)
            self._thread(memory_id, row, source)

    def load_sources(self, ids: Sequence[int], fields: Sequence[tuple[str | None, ...]]) -> None:
        """The sources of every row, as a stream's load reads them: each as a tuple in Source's field order
        (StreamArrays.sources)."""
        if not self._fresh():
            self.set_sources({i: Source(*f) for i, f in zip(ids, fields, strict=True)}, ids)
            return
        self._set_all(sorted(zip(ids, fields, strict=True)), ids)

    def _fresh(self) -> bool:
        """Whether no source is linked yet."""
        return not self._channels and not self._by_message and not self._replies and not self._name_of

    def _set_all(self, entries: Sequence[tuple[int, tuple[str | None, ...]]], asked: Sequence[int]) -> None:
        """set_sources into a context that links nothing yet, given (id, source fields) in id order: the same
        links, each channel sorted once rather than each memory inserted in order."""
        known = [(i, f) for i, f in entries if i in self._unknown and i in self._row_of]
        self._unknown.difference_update(i for i, _ in known)
        self._unknown.difference_update(asked)
        said: dict[str, list[tuple[float, int]]] = {}
        for memory_id, fields in known:
            self._author(memory_id, self._row_of[memory_id], fields)
            channel = fields[_CHANNEL_ID] or (f"name:{fields[_CHANNEL]}" if fields[_CHANNEL] else None)
            if channel is not None:
                self._channel_of[memory_id] = channel
                said.setdefault(channel, []).append((self._created[memory_id], memory_id))
            message = fields[_MESSAGE_ID]
            if message:
                self._message_of[memory_id] = message
                self._by_message[message] = memory_id
        for channel, entries_ in said.items():
            entries_.sort()
            rows = np.asarray([self._row_of[memory_id] for _, memory_id in entries_], np.int64)
            self.prev[rows[1:]], self.next[rows[:-1]] = rows[:-1], rows[1:]
            self._channels[channel] = entries_
        for memory_id, fields in known:
            parent = fields[_REPLY_TO]
            if parent and parent != fields[_MESSAGE_ID]:
                self._reply_of[memory_id] = parent
                self._replies.setdefault(parent, set()).add(memory_id)
                found = self._by_message.get(parent)
                self.parent[self._row_of[memory_id]] = _NONE if found is None else self._row_of[found]
        self.version += 1

    def _author(self, memory_id: int, row: int, fields: tuple[str | None, ...]) -> None:
        author = fields[_AUTHOR]
        key = fields[_AUTHOR_ID] or (f"name:{author}" if author else None)  # (cues.author_key)
        if key is None:
            return
        if key not in self._codes:
            self._codes[key], self._next_code = self._next_code, self._next_code + 1
        self._authored[key] = self._authored.get(key, 0) + 1
        self.author[row] = self._codes[key]
        pair = (key, author or "")
        self._name_of[memory_id] = pair
        self._names[pair] = self._names.get(pair, 0) + 1

    def retext(self, row: int, text: str) -> None:
        """A row's text changed."""
        self.timed[row] = holds_time(text)

    def remove(self, row: int, memory_id: int) -> None:
        """A row's memory is gone: nobody's neighbour nor parent, its author and name no longer known through
        it."""
        self._unknown.discard(memory_id)
        self._unlink(memory_id)
        self._unthread(memory_id)
        pair = self._name_of.pop(memory_id, None)
        if pair is not None:  # a forgotten author's id and names are not kept here either
            self._names[pair] -= 1
            if self._names[pair] == 0:
                del self._names[pair]
            self._authored[pair[0]] -= 1
            if self._authored[pair[0]] == 0:
                del self._authored[pair[0]], self._codes[pair[0]]
        self._row_of.pop(memory_id, None)
        self._created.pop(memory_id, None)
        self.author[row] = self.prev[row] = self.next[row] = self.parent[row] = _NONE

    def move(self, source: int, target: int, memory_id: int) -> None:
        """The memory in row `source` now sits in row `target`."""
        self._row_of[memory_id] = target
        for column in (self.author, self.prev, self.next, self.parent, self.timed):
            column[target] = column[source]
        before, after = int(self.prev[target]), int(self.next[target])
        if before != _NONE:
            self.next[before] = target
        if after != _NONE:
            self.prev[after] = target
        for child in self._replies.get(self._message_of.get(memory_id, ""), ()):
            if self.parent[self._row_of[child]] == source:
                self.parent[self._row_of[child]] = target
        self.prev[source] = self.next[source] = self.parent[source] = _NONE
        self.version += 1

    # -- internals ---------------------------------------------------------------------------------

    def _link(self, memory_id: int, row: int, channel: str) -> None:
        said = self._channels.setdefault(channel, [])
        entry = (self._created[memory_id], memory_id)
        insort(said, entry)
        self._channel_of[memory_id] = channel
        at = bisect_left(said, entry)
        before = self._row_of[said[at - 1][1]] if at > 0 else _NONE
        after = self._row_of[said[at + 1][1]] if at + 1 < len(said) else _NONE
        self.prev[row], self.next[row] = before, after
        if before != _NONE:
            self.next[before] = row
        if after != _NONE:
            self.prev[after] = row
        self.version += 1

    def _thread(self, memory_id: int, row: int, source: Source) -> None:
        """A reply finds its parent, and a message its replies, whichever came first."""
        if source.message_id:
            self._message_of[memory_id] = source.message_id
            self._by_message[source.message_id] = memory_id
            for child in self._replies.get(source.message_id, ()):
                self.parent[self._row_of[child]] = row
        if source.reply_to and source.reply_to != source.message_id:
            self._reply_of[memory_id] = source.reply_to
            self._replies.setdefault(source.reply_to, set()).add(memory_id)
            found = self._by_message.get(source.reply_to)
            self.parent[row] = _NONE if found is None else self._row_of[found]
        self.version += 1

    def _unthread(self, memory_id: int) -> None:
        """A forgotten message is nobody's parent any more, and no longer waits for its own."""
        message = self._message_of.pop(memory_id, None)
        if message is not None:
            self._by_message.pop(message, None)
            for child in self._replies.get(message, ()):
                self.parent[self._row_of[child]] = _NONE
        parent = self._reply_of.pop(memory_id, None)
        if parent is not None:
            waiting = self._replies[parent]
            waiting.discard(memory_id)
            if not waiting:
                del self._replies[parent]
        self.version += 1

    def _unlink(self, memory_id: int) -> None:
        channel = self._channel_of.pop(memory_id, None)
        if channel is None:
            return
        said = self._channels[channel]
        at = bisect_left(said, (self._created[memory_id], memory_id))
        del said[at]
        if not said:
            del self._channels[channel]
        row = self._row_of[memory_id]
        before, after = int(self.prev[row]), int(self.next[row])
        if before != _NONE:
            self.next[before] = after
        if after != _NONE:
            self.prev[after] = before
        self.version += 1

    def _grow(self, size: int) -> None:
        if size <= len(self.author):
            return
        cap = max(size, 2 * len(self.author))
        for name in ("author", "prev", "next", "parent", "timed"):
            old = getattr(self, name)
            new = np.full(cap, _NONE, old.dtype) if old.dtype != np.bool_ else np.zeros(cap, np.bool_)
            new[: len(old)] = old
            setattr(self, name, new)
