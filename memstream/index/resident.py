"""The resident budget of one process: which streams' matrices stay in memory, and which to drop.

VectorIndex (vector_index.py) keeps one StreamVectors per stream it has scored. Without a bound, a persona in
a thousand servers would keep every one of them for the life of the process. Resident is the book of what is
held, in least recently used order, with each stream's size (StreamVectors.nbytes); when the total goes over
the budget, `over` names the streams to drop: those larger than the whole budget first, then the least
recently used. A stream being scored, loaded or written (`busy`) is never named, nor the one that grew
(`keep`): so the total stays within the budget plus one stream. A dropped stream is reloaded from the store
on its next query (the store holds every committed write: nothing is lost while it is away), and room is made
for it before its reload, at the size it had (`expected`): only a stream never loaded before can take the
total past the budget, by its own size, until its load ends.
"""

from __future__ import annotations

import contextlib
from collections import Counter, OrderedDict
from collections.abc import Callable, Iterator

from memstream.records import ResidentStats

__all__ = ["RESIDENT_MB", "Resident", "bytes_per_memory", "load_room"]

# The default budget: 1 GiB holds about 300k memories of 384 dimensions (about 3.5 KB each with the screen, the
# lexical index and the context: README, Memory per process), 30 streams of 10k, on a host with 2 GiB for the bot.
RESIDENT_MB = 1024
# Per memory, beside its row and screen row: id, importance, last access, creation, recency proxy (8 B each), inverse
# norm (4 B); and the share of the lexical index and the context, as the process's resident memory grows (100 streams
# of bench.persona's file: 409 B the lexical index, 623 the context; Discord's message ids add about 140 to the
# context, replies more).
_COLUMN_BYTES = 44
# What a load holds beside what its stream keeps, until it is built (tracemalloc's peak less what is kept, streams of
# 10k and 39k memories of bench.persona's file): a chunk of rows and their temporaries while the rows are read,
# about 14 MB (less for a smaller stream); with a lexical index or a context, the texts, sources and words until
# they are built, about 650 B a memory (a quarter of what the stream keeps).
_LOAD_BYTES = 16 << 20
_LEXICAL_BYTES = 1170


class Resident:
    """Streams held in memory, least recently used first, with their sizes; the budget's decision."""

    def __init__(self, budget: int) -> None:
        if budget < 0:
            raise ValueError(f"a resident budget is a number of bytes >= 0, got {budget}")
        self.budget = budget  # bytes; 0: no budget (every stream stays once loaded)
        self._sizes: OrderedDict[str, int] = OrderedDict()
        self._total = 0
        self._pins: Counter[str] = Counter()
        self._dropped: set[str] = set()  # dropped for the budget, not reloaded yet
        self._last: dict[str, int] = {}  # the size each stream had when it was last dropped
        self.drops = 0
        self.reloads = 0
        self.peak = 0  # the most held at once, as each stream was counted (before others were dropped for it)

    def touch(self, stream: str) -> None:
        """A stream was used: it is now the most recently used."""
        if stream in self._sizes:
            self._sizes.move_to_end(stream)

    def account(self, stream: str, nbytes: int) -> None:
        """A stream holds `nbytes` now (a new one counts as the most recently used)."""
        if stream not in self._sizes and stream in self._dropped:
            self._dropped.discard(stream)
            self.reloads += 1
        self._total += nbytes - self._sizes.get(stream, 0)
        self._sizes[stream] = nbytes
        self.peak = max(self.peak, self._total)

    def forget(self, stream: str) -> None:
        """A stream's matrix is gone (dropped for any reason)."""
        size = self._sizes.pop(stream, None)
        if size is not None:
            self._total -= size
            self._last[stream] = size

    def expected(self, stream: str) -> int:
        """About what a stream will hold once loaded: its size when last dropped (0: never loaded here)."""
        return 0 if stream in self._sizes else self._last.get(stream, 0)

    def evicted(self, stream: str) -> None:
        """A stream is about to be dropped for the budget (counted; its next load is a reload)."""
        self.drops += 1
        self._dropped.add(stream)

    @contextlib.contextmanager
    def pinned(self, stream: str) -> Iterator[None]:
        """While the block runs, the stream is not dropped for the budget (a query from load to last read)."""
        self._pins[stream] += 1
        try:
            yield
        finally:
            self._pins[stream] -= 1
            if self._pins[stream] <= 0:
                del self._pins[stream]

    def is_pinned(self, stream: str) -> bool:
        """Whether a query holds the stream."""
        return self._pins[stream] > 0

    def total(self) -> int:
        """Bytes held by every resident stream."""
        return self._total

    def over(self, keep: str, busy: Callable[[str], bool], incoming: int = 0) -> list[str]:
        """The streams to drop to bring the total (and `incoming` bytes about to be loaded) within the budget:
        larger than the whole budget first, then least recently used; never `keep` nor a busy one (so the total
        may stay above while they are held)."""
        if not self.budget:
            return []
        excess = self.total() + incoming - self.budget
        if excess <= 0:
            return []
        candidates = [s for s in self._sizes if s != keep and not busy(s)]
        candidates.sort(key=lambda s: self._sizes[s] <= self.budget)  # stable: LRU order within each group
        chosen: list[str] = []
        for stream in candidates:
            if excess <= 0:
                break
            chosen.append(stream)
            excess -= self._sizes[stream]
        return chosen

    def stats(self) -> ResidentStats:
        """The figures of this process."""
        return ResidentStats(streams=len(self._sizes), bytes=self.total(), budget=self.budget,
                             largest=max(self._sizes.values(), default=0), drops=self.drops, reloads=self.reloads)


def bytes_per_memory(dim: int, *, lexical: bool) -> int:
    """About what one memory of `dim` dimensions costs a loaded stream (StreamVectors.nbytes): its float32 row,
    its int16 screen row (a stream of 4k memories or more), its per-row columns, and with `lexical` its share
    of the lexical index and the context (measured on bench.data's chat-like texts with Discord's message ids:
    README, Memory per process)."""
    return dim * 4 + dim * 2 + _COLUMN_BYTES + (_LEXICAL_BYTES if lexical else 0)


def load_room(kept: int, *, texts: bool, read: bool = False) -> int:
    """About what a stream's load holds beside what the stream keeps once loaded (`kept` bytes) until it is built:
    room made for it too, so the process stays within the budget while it loads (`texts`: with a lexical index or
    a context; `read`: its rows are read already)."""
    return (0 if read else min(kept, _LOAD_BYTES)) + (kept // 4 if texts else 0)
