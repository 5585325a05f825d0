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
from collections import Counter
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


def _channel_order(ids: Sequence[int], channels: Sequence[str | None], created: F64) -> tuple[I64, I64, list[str]]:
    """The memories with a channel in order of (channel, creation time, id): their places among `ids`, their
    channels' codes (in that order) and the channels by code."""
    code: dict[str | None, int] = {c: k for k, c in enumerate(c for c in dict.fromkeys(channels) if c is not None)}
    named = list(code)
    code[None] = _NONE
    codes = np.fromiter(map(code.__getitem__, channels), np.int64, len(channels))
    order = np.lexsort((np.asarray(ids, np.int64), created, codes))
    order = order[codes[order] != _NONE]
    return order, codes[order], named  # type: ignore[return-value]


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
        # A load's sources, kept for `complete` (ids, author keys, names, channels, fields, and the channel order
        # _link_all found), and its counts of message ids and replies (for nbytes meanwhile).
        self._later: tuple[list[int], list[str | None], list[str | None], list[str | None],
                           list[tuple[str | None, ...]], tuple[I64, I64, list[str]]] | None = None
        self._loaded: tuple[list[int], F64] | None = None
        self._later_counts = (0, 0)

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
        messages, replies = self._later_counts
        return (arrays + len(self._row_of) * _ROW_BYTES + (len(self._message_of) + messages) * _MESSAGE_BYTES
                + (len(self._reply_of) + replies) * _REPLY_BYTES)

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
        memory_ids = list(map(int, ids))
        times = np.asarray(created, np.float64)
        # A load's rows, the first added (ids and times, for _set_all: rows 0, 1, ... in the order it links them).
        self._loaded = (memory_ids, times) if first_row == 0 and not self._row_of else None
        self._row_of.update(zip(memory_ids, range(first_row, end), strict=True))
        self._created.update(zip(memory_ids, map(float, created), strict=True))
        self._unknown.update(memory_ids)
        for column in (self.author, self.prev, self.next, self.parent):
            column[first_row:end] = _NONE
        self.timed[first_row:end] = [holds_time(text) for text in texts] if timed is None else timed

    def set_sources(self, sources: Mapping[int, Source], asked: Sequence[int] = ()) -> None:
        """The sources of rows added before; `asked` ids the store did not find are taken as having none."""
        if self._fresh() and len(sources) > _BULK:  # a stream's load: every channel at once
            ids = sorted(sources)
            self._set_all(ids, [_fields(sources[i]) for i in ids], asked)
            return
        self.complete()
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
        order = np.asarray(ids, np.int64)
        if order.size > 1 and (np.diff(order) <= 0).any():  # (a load reads them in time order: mostly in id order)
            at = np.argsort(order, kind="stable").tolist()
            ids, fields = [ids[k] for k in at], [fields[k] for k in at]
        self._set_all(list(ids), list(fields), ids)

    def complete(self) -> None:
        """Build what a stream's load left for later: each memory's channel, name, message and reply by id and
        each channel's sorted list, which writes and removals need and queries do not (VectorIndex completes a
        loaded stream in a worker thread after its first query; any write here completes it first)."""
        if self._later is None:
            return
        ids, keys, names, channels, fields, (order, codes, names_of) = self._later
        self._name_of.update((i, (k, a or "")) for i, k, a in zip(ids, keys, names, strict=True) if k is not None)
        self._channel_of.update((i, c) for i, c in zip(ids, channels, strict=True) if c is not None)
        bounds = np.flatnonzero(np.diff(codes)) + 1
        # (the entries hold the id and time objects the context holds already: new ones would cost ~56 B a row)
        said = [(self._created[i], i) for i in map(ids.__getitem__, order.tolist())]
        for start, end in zip([0, *bounds.tolist()], [*bounds.tolist(), len(codes)], strict=True):
            if end > start:
                self._channels[names_of[int(codes[start])]] = said[start:end]
        messages: dict[int, str] = {i: m for i, f in zip(ids, fields, strict=True) if (m := f[_MESSAGE_ID])}
        self._message_of.update(messages)
        self._by_message.update(zip(messages.values(), messages.keys(), strict=True))  # (a repeated one: the last)
        for i, f in zip(ids, fields, strict=True):
            if (parent := f[_REPLY_TO]) and parent != f[_MESSAGE_ID]:
                self._reply_of[i] = parent
                self._replies.setdefault(parent, set()).add(i)
        self._later, self._later_counts = None, (0, 0)

    def incomplete(self) -> bool:
        """Whether a load left something to `complete`."""
        return self._later is not None

    def _fresh(self) -> bool:
        """Whether no source is linked yet."""
        return (self._later is None and not self._channels and not self._by_message and not self._replies
                and not self._name_of)

    def _set_all(self, ids: list[int], fields: list[tuple[str | None, ...]], asked: Sequence[int]) -> None:
        """set_sources into a context that links nothing yet, given ids in increasing order and their source
        fields: the same links, each channel sorted once (by numpy, on codes) rather than each memory inserted in
        order. What queries use is set now (authors, neighbours, parents); the maps by id that writes use are
        left for `complete`."""
        if len(self._unknown.intersection(ids)) < len(ids):  # some set already, or gone: left out
            kept = [k for k, i in enumerate(ids) if i in self._unknown and i in self._row_of]
            ids, fields = [ids[k] for k in kept], [fields[k] for k in kept]
        self._unknown.difference_update(ids)  # (an unknown id always has a row: add() and remove() see to it)
        self._unknown.difference_update(asked)
        loaded, self._loaded = self._loaded, None
        if loaded is not None and loaded[0] == ids:  # (the load's rows, in order: rows 0, 1, ...)
            rows, created = np.arange(len(ids), dtype=np.int64), loaded[1]
        else:
            rows, created = np.fromiter(map(self._row_of.__getitem__, ids), np.int64, len(ids)), self._created_of(ids)
        names = [f[_AUTHOR] for f in fields]
        keys = [f[_AUTHOR_ID] or (f"name:{a}" if a else None) for f, a in zip(fields, names, strict=True)]
        self._authors(rows, keys, names)  # (keys and names: each memory's, as _author takes them)
        channels = [f[_CHANNEL_ID] or (f"name:{f[_CHANNEL]}" if f[_CHANNEL] else None) for f in fields]
        in_order = self._link_all(ids, rows, channels, created)
        replies = [(k, parent) for k, f in enumerate(fields) if (parent := f[_REPLY_TO]) and parent != f[_MESSAGE_ID]]
        if replies:
            wanted = {parent for _, parent in replies}
            found = {m: i for i, f in zip(ids, fields, strict=True) if (m := f[_MESSAGE_ID]) in wanted}  # (the last)
            for k, parent in replies:
                self.parent[int(rows[k])] = self._row_of[found[parent]] if parent in found else _NONE
        self._later = (ids, keys, names, channels, fields, in_order)
        self._later_counts = (sum(1 for f in fields if f[_MESSAGE_ID]), len(replies))
        self.version += 1

    def _authors(self, rows: I64, keys: Sequence[str | None], names: Sequence[str | None]) -> None:
        """_author's codes and counts for many memories at once (none of them known yet)."""
        for key, count in Counter(keys).items():
            if key is None:
                continue
            if key not in self._codes:
                self._codes[key], self._next_code = self._next_code, self._next_code + 1
            self._authored[key] = self._authored.get(key, 0) + count
        codes: dict[str | None, int] = {None: _NONE}
        codes.update(self._codes)
        self.author[rows] = np.fromiter(map(codes.__getitem__, keys), np.int64, len(keys))
        for (key, name), count in Counter(zip(keys, names, strict=True)).items():  # (counted in C: a few distinct)
            if key is not None:
                pair = (key, name or "")
                self._names[pair] = self._names.get(pair, 0) + count

    def _link_all(self, ids: Sequence[int], rows: I64, channels: Sequence[str | None],
                  created: F64) -> tuple[I64, I64, list[str]]:
        """Each memory linked to the one before and after it in its channel, in order of (creation time, id); that
        order (_channel_order's), for `complete`."""
        order, codes, names = _channel_order(ids, channels, created)
        rows = rows[order]
        same = codes[1:] == codes[:-1]
        self.prev[rows[1:][same]] = rows[:-1][same]
        self.next[rows[:-1][same]] = rows[1:][same]
        return order, codes, names

    def _created_of(self, ids: Sequence[int]) -> F64:
        return np.fromiter(map(self._created.__getitem__, ids), np.float64, len(ids))

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
        self.complete()
        self._loaded = None
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
        self.complete()
        self._loaded = None
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
