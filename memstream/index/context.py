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

from memstream.index.cues import author_key, channel_key, holds_time, named
from memstream.records import Source
from memstream.store.arrays import F64, I64

__all__ = ["StreamContext"]

_NONE = -1


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

    def add(self, first_row: int, ids: Sequence[int], created: Sequence[float], texts: Sequence[str]) -> None:
        """New rows first_row, first_row + 1, ...; their sources come later (set_sources)."""
        self._grow(first_row + len(ids))
        for offset, (memory_id, at, text) in enumerate(zip(ids, created, texts, strict=True)):
            row = first_row + offset
            memory_id = int(memory_id)
            self._row_of[memory_id] = row
            self._created[memory_id] = float(at)
            self._unknown.add(memory_id)
            self.author[row] = self.prev[row] = self.next[row] = self.parent[row] = _NONE
            self.timed[row] = holds_time(text)

    def set_sources(self, sources: Mapping[int, Source], asked: Sequence[int] = ()) -> None:
        """The sources of rows added before; `asked` ids the store did not find are taken as having none."""
        for memory_id in [*sorted(sources), *asked]:
            if memory_id not in self._unknown or memory_id not in self._row_of:
                continue
            self._unknown.discard(memory_id)
            source = sources.get(memory_id)
            if source is None:
                continue
            row = self._row_of[memory_id]
            key = author_key(source)
            if key is not None:
                if key not in self._codes:
                    self._codes[key], self._next_code = self._next_code, self._next_code + 1
                self._authored[key] = self._authored.get(key, 0) + 1
                self.author[row] = self._codes[key]
                pair = (key, source.author or "")
                self._name_of[memory_id] = pair
                self._names[pair] = self._names.get(pair, 0) + 1
            channel = channel_key(source)
            if channel is not None:
                self._link(memory_id, row, channel)
            self._thread(memory_id, row, source)

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
