"""A stream's memories in memory: its float32 matrix and per-row columns (StreamVectors).

The store stays the source of truth: every write goes to the store first, and reaches a loaded matrix as the
store's event after COMMIT (vector_index.py, the listener that holds the matrices). Rows are kept exactly as
stored (float32, not renormalized) with their inverse norms beside them, so scoring here can be checked
bit for bit against the reference computed from the store. The matrix lives in blocks that never move once
written: appending never copies it, and a loaded stream costs one copy of its embeddings, not two (and, for a
stream large enough and within its budget, the half-size copy pass 1 reads: screen.py).
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections.abc import Callable, Iterator, Mapping, Sequence

import numpy as np
import numpy.typing as npt

from memstream.index import _kernels as kernels
from memstream.index import _pages as pages
from memstream.index._scratch import Scratch
from memstream.index.context import StreamContext
from memstream.index.gathering import Gathering
from memstream.index.grounding import Grounding
from memstream.index.lexical import StreamTerms
from memstream.index.screen import Screen
from memstream.store import StreamArrays
from memstream.store.arrays import F32, F64, I64, inverse_norms, large_empty

__all__ = ["SCREEN_BYTES", "SCREEN_ROWS", "StreamVectors"]

_MIN_BLOCK = 256
_CHUNK = 8192
# Texts indexed in bulk a chunk at a time (their words are held meanwhile).
_TEXT_CHUNK = 32_768
# Rows whose norm is outside this range could underflow or overflow in float32 arithmetic: a stream that
# holds one is scored without trusting its float32 cosines (see exact.error_bound).
_NORM_RANGE = (2.0**-60, 2.0**60)
# Above this exponent, exp() in the recency proxy is rebased so that it cannot overflow.
_REBASE_EXPONENT = 500.0
# From this many rows on, pass 1 reads the stream's screen (screen.py): half the bytes, half again the memory;
# up to this many bytes of it (StreamConfig.screen_mb), beyond which pass 1 reads the float32 rows. As large as the
# default resident budget (the screen counts in it, nbytes): at 1M x 384 the screen (733 MiB) is what keeps pass 1
# at the floor, the float32 rows being loaded in ordinary pages (4 KB: a plain pass over them read 62 ms where one
# over the same bytes in huge pages read 30 ms; python -m bench.hybrid).
SCREEN_ROWS = 4096
SCREEN_BYTES = 1024 << 20
# A reflection's grounding in memory: one dict entry (key, float, slot).
_GROUNDING_ITEM_BYTES = 120


class StreamVectors:
    """The ready memories of one stream, column-wise: raw float32 rows in blocks, and per-row columns.

    Not thread-safe: VectorIndex serializes scoring and writes per stream.
    """

    def __init__(self, arrays: StreamArrays | None = None, *, copy: bool = True,
                 screen_rows: int = SCREEN_ROWS, screen_bytes: int = SCREEN_BYTES) -> None:
        self.n = 0
        self.screen_rows, self.screen_bytes = screen_rows, screen_bytes
        self.screen_after = 0  # queries that read the rows before the screen is built (see screen())
        self._screen: Screen | None = None
        self.terms: StreamTerms | None = None  # the lexical index, when the profile uses one (index_texts)
        self.grounding: Grounding | None = None  # each reflection's grounding, when the profile uses it
        self.context: StreamContext | None = None  # authors, neighbours, time words (index_context)
        self._yc: tuple[float, F64, float] | None = None
        self._memo: dict[object, F64] = {}
        self.scratch = Scratch()  # a query's per-row arrays, reused in a large stream (_scratch.py)
        self.dim = 0
        self._blocks: list[F32] = []
        self._starts: list[int] = []
        self._ids: I64 = np.zeros(64, np.int64)
        self._imp: F64 = np.zeros(64, np.float64)
        self._last: F64 = np.zeros(64, np.float64)
        self._created: F64 = np.zeros(64, np.float64)
        self._inv: F32 = np.zeros(64, np.float32)
        self._y: F64 | None = None
        self._decay = 1.0
        self._t0 = 0.0
        self._lam = 0.0
        self._limits: dict[str, float] | None = None
        self._odd = 0
        if arrays is not None and len(arrays.ids):
            self._adopt(arrays, copy)

    # -- reading -----------------------------------------------------------------------------------

    @property
    def ids(self) -> I64:
        """Memory ids, row by row."""
        return self._ids[: self.n]

    @property
    def embeddings(self) -> F32:
        """The rows as stored (a copy when the matrix spans several blocks)."""
        views = [view for _, view in self.blocks()]
        if len(views) == 1:
            return views[0]
        return np.concatenate(views) if views else np.zeros((0, self.dim), np.float32)

    @property
    def importance(self) -> F64:
        """Importance 1..10, row by row."""
        return self._imp[: self.n]

    @property
    def last_accessed(self) -> F64:
        """Last access, seconds since the epoch."""
        return self._last[: self.n]

    @property
    def created(self) -> F64:
        """Creation time, seconds since the epoch."""
        return self._created[: self.n]

    @property
    def inverse_norms(self) -> F32:
        """1 / the Euclidean norm of each row (0 for a zero row)."""
        return self._inv[: self.n]

    @property
    def trusted(self) -> bool:
        """Whether every row's norm is in the range where float32 scoring has a known error bound."""
        return self._odd == 0

    def blocks(self) -> Iterator[tuple[int, F32]]:
        """(first row, view of the filled rows) for each block, in row order."""
        for start, block in zip(self._starts, self._blocks, strict=True):
            if start >= self.n:
                return
            yield start, block[: min(len(block), self.n - start)]

    def screen(self) -> Screen | None:
        """The rows at half the bytes, for pass 1 (screen.py), built on first use and kept in step with every
        write from then on; None for a stream of fewer than `screen_rows` rows, one whose screen would take more
        than `screen_bytes`, or without the compiled loops; None also for the first `screen_after` queries that
        ask (VectorIndex: the first after a load, so that a stream loaded for one query, as a cold stream under the
        resident budget often is, never builds it: 6-13 ms at 10k memories, 1-2 s at 1M)."""
        if self._screen is None and self.n >= max(1, self.screen_rows) and self._screen_fits() and kernels.ready():
            if self.screen_after > 0:
                self.screen_after -= 1
                return None
            screen = Screen(self.dim, self._starts, [len(block) for block in self._blocks])
            screen.fill(list(self.blocks()))
            self._screen = screen
            pages.collapse_in_background(screen)
        return self._screen

    def _screen_fits(self) -> bool:
        return self.n * self.dim * 2 <= self.screen_bytes

    def gather(self, rows: npt.ArrayLike) -> F32:
        """The stored rows at these row numbers, as one (m, dim) matrix."""
        index = np.asarray(rows, dtype=np.int64).reshape(-1)
        if len(self._blocks) == 1:
            found: F32 = self._blocks[0][index]
            return found
        out = np.empty((index.size, self.dim), np.float32)
        which = np.searchsorted(np.asarray(self._starts, dtype=np.int64), index, side="right") - 1
        for b in np.unique(which).tolist():
            mask = which == b
            out[mask] = self._blocks[b][index[mask] - self._starts[b]]
        return out

    def rows_of(self, ids: Sequence[int], hint: Sequence[int] | None = None) -> I64:
        """Row numbers of these memory ids (those held here); `hint` is a guess checked before searching."""
        wanted = [int(i) for i in ids]
        if hint is not None and len(hint) == len(wanted):
            rows = np.asarray(hint, dtype=np.int64)
            if rows.size == 0 or (rows.max() < self.n and np.array_equal(self._ids[rows], wanted)):
                return rows
        if not wanted:
            return np.zeros(0, np.int64)
        return np.flatnonzero(np.isin(self.ids, np.asarray(wanted, dtype=np.int64))).astype(np.int64)

    def limits(self) -> dict[str, float]:
        """Smallest and largest last access and importance (cached, kept up to date by writes)."""
        if self._limits is None:
            last, imp = self.last_accessed, self.importance
            self._limits = {"last_min": float(last.min()), "last_max": float(last.max()),
                            "imp_min": float(imp.min()), "imp_max": float(imp.max())}
        return self._limits

    def nbytes(self) -> int:
        """The memory this stream holds (the resident budget, resident.py): its filled rows, its screen, every
        per-row array, its lexical index, context and grounding (those three estimated)."""
        total = self.n * self.dim * 4
        if self._screen is not None:
            total += self._screen.n * (self.dim * 2 + 4)
        arrays = [*vars(self).values(), *self._memo.values(), *(self._yc[1:2] if self._yc else ())]
        total += sum(value.nbytes for value in arrays if isinstance(value, np.ndarray)) + self.scratch.nbytes()
        if self.terms is not None:
            total += self.terms.nbytes()
        if self.context is not None:
            total += self.context.nbytes()
        if self.grounding is not None:
            total += len(self.grounding.value) * _GROUNDING_ITEM_BYTES
        return total

    def recency_proxy(self, decay: float) -> tuple[F64, float]:
        """(y, t0) with y = decay ** ((last_accessed - t0) / 3600) for every row.

        Recency for a query at `now` is y * decay ** ((t0 - now) / 3600): one factor shared by all rows,
        which min-max normalization cancels, so no per-memory power is computed per query.
        """
        if self._y is None or decay != self._decay:
            self._decay = decay
            self._lam = -math.log(decay) / 3600.0
            self._rebase()
        assert self._y is not None
        return self._y[: self.n], self._t0

    # -- writing -----------------------------------------------------------------------------------

    def index_texts(self, ids: Sequence[int], texts: Sequence[str], language: str = "english") -> None:
        """Start the lexical index from the texts of every row's memory (given by id, in any order), its words
        stemmed by `language`'s Snowball stemmer (lexical.py)."""
        self.index(ids, texts, language=language, context=False)

    def index_context(self, ids: Sequence[int], texts: Sequence[str]) -> StreamContext:
        """Start the context (context.py) from the texts of every row's memory (given by id, in any order); the
        sources follow (StreamContext.set_sources)."""
        context = self.index(ids, texts, language=None, context=True)
        assert context is not None
        return context

    def index(self, ids: Sequence[int], texts: Sequence[str], *, language: str | None, context: bool,
              chunk: int = _TEXT_CHUNK, gathered: Gathering | None = None) -> StreamContext | None:
        """Start the lexical index (its words stemmed in `language`; None: no lexical index) and, with `context`,
        the context, from the texts of every row's memory (given by id, in any order), reading each text's words
        once, `chunk` rows at a time (postings.py); the context's sources follow (StreamContext.set_sources).
        `gathered`: what the load gathered of the first rows' texts as it read them (gathering.py), if anything,
        with the same language and context; the rest are read here."""
        rows = self.ids.tolist()
        in_order = len(ids) == len(rows) and list(ids) == rows  # (a load gives them in row order: no mapping)
        if not in_order:
            by_id = dict(zip([int(i) for i in ids], texts, strict=True))
            texts = [by_id.get(memory_id, "") for memory_id in rows]
        if gathered is None or not in_order or not gathered.fed(texts):
            gathered = Gathering(language, context)
        for start in range(gathered.rows, len(rows), chunk):
            gathered.feed(texts[start:start + chunk])
        if gathered.postings is not None:
            self.terms = StreamTerms(language or "english")
            self.terms.load(0, gathered.postings)
        if not context:
            return None
        self.context = StreamContext()
        self.context.add(0, rows, self.created.tolist(), texts, timed=gathered.timed())
        return self.context

    def memo(self, key: object, make: Callable[[], F64]) -> F64:
        """A per-row array computed from the rows' creation times and importance only (kept until rows are
        added or removed; last access and embeddings may change meanwhile)."""
        found = self._memo.get(key)
        if found is None or len(found) != self.n:
            found = self._memo[key] = make()
        return found

    def creation_proxy(self, decay: float) -> tuple[F64, float]:
        """(y, t0) with y = decay ** ((created - t0) / 3600) for every row, t0 the newest creation: recency
        from creation at any `now` >= t0 is y times one shared factor (see recency_proxy)."""
        if self._yc is None or self._yc[0] != decay:
            created = self.created
            t0 = float(created.max()) if self.n else 0.0
            self._yc = (decay, np.exp(-math.log(decay) / 3600.0 * (created - t0)), t0)
        return self._yc[1], self._yc[2]

    def append(self, ids: Sequence[int] | I64, embeddings: npt.ArrayLike, importance: npt.ArrayLike,
               last_accessed: npt.ArrayLike, created: npt.ArrayLike, texts: Sequence[str] | None = None) -> None:
        """Add rows (stored as given, in float32); `texts` feed the lexical index, if there is one."""
        matrix = np.asarray(embeddings, dtype=np.float32)
        if matrix.ndim == 1:
            matrix = matrix.reshape(1, -1)
        count = len(ids)
        if count == 0:
            return
        if matrix.shape[0] != count:
            raise ValueError(f"{count} ids but {matrix.shape[0]} embeddings")
        if self.dim == 0 and self.n == 0:
            self.dim = matrix.shape[1]
            self._blocks, self._starts, self._screen = [], [], None
        if matrix.shape[1] != self.dim:
            raise ValueError(f"embeddings of {matrix.shape[1]} dimensions in a matrix of {self.dim}")
        start = self.n
        self._reserve(count)
        self._write_rows(start, matrix)
        end = start + count
        self._ids[start:end] = ids
        self._imp[start:end] = importance
        self._last[start:end] = last_accessed
        self._created[start:end] = created
        self._inv[start:end] = inverse_norms(matrix)
        self._odd += self._count_odd(self._inv[start:end])
        self.n = end
        if self._screen is not None and not self._screen_fits():
            self._screen = None  # grown past its budget: pass 1 reads the float32 rows from now on
        self._widen_limits(start, end)
        if self._y is not None:
            self._set_y(np.arange(start, end))
        self._yc = None
        self._memo.clear()
        if (self.terms is not None or self.context is not None) and texts is None:
            raise ValueError("this stream has a lexical index: rows need their texts")
        if self.terms is not None and texts is not None:
            self.terms.add(start, texts)
        if self.context is not None and texts is not None:
            self.context.add(start, [int(i) for i in ids], np.asarray(created, np.float64).reshape(-1).tolist(), texts)

    def touch(self, ids: Sequence[int], at: float, rows: Sequence[int] | None = None) -> None:
        """Set last access of these memories (`rows`, if given, is a hint for where they are)."""
        found = self.rows_of(ids, rows)
        if found.size == 0:
            return
        lim = self._limits
        if lim is not None and bool((self._last[found] == lim["last_min"]).any()):
            self._limits = None
        self._last[found] = at
        if self._limits is not None:
            self._limits["last_min"] = min(self._limits["last_min"], at)
            self._limits["last_max"] = max(self._limits["last_max"], at)
        if self._y is not None:
            self._set_y(found)

    def overlay(self, touches: Mapping[int, float]) -> Callable[[], None]:
        """Set these last accesses (id: time) until the returned undo is called: writes not committed yet,
        seen by the task that made them (VectorIndex.locked)."""
        rows = self.rows_of(list(touches))
        if rows.size == 0:
            return lambda: None
        before = self._last[rows].copy()
        self._set_last(rows, np.asarray([touches[int(i)] for i in self._ids[rows].tolist()], dtype=np.float64))
        return lambda: self._set_last(rows, before)

    def _set_last(self, rows: I64, values: F64) -> None:
        self._last[rows] = values
        self._limits = None
        if self._y is not None:
            self._set_y(rows)

    def update(self, memory_id: int, embedding: npt.ArrayLike, text: str | None = None) -> None:
        """Replace one memory's embedding (and its text in the lexical index)."""
        found = self.rows_of([memory_id])
        if found.size == 0:
            return
        row = int(found[0])
        vector = np.asarray(embedding, dtype=np.float32).reshape(1, -1)
        self._odd -= self._count_odd(self._inv[row:row + 1])
        self._write_rows(row, vector)
        self._inv[row] = inverse_norms(vector)[0]
        self._odd += self._count_odd(self._inv[row:row + 1])
        if (self.terms is not None or self.context is not None) and text is None:
            raise ValueError("this stream has a lexical index: an edit needs the new text")
        if self.terms is not None and text is not None:
            self.terms.replace(row, text)
        if self.context is not None and text is not None:
            self.context.retext(row, text)

    def remove(self, ids: Sequence[int]) -> None:
        """Drop rows: each hole is filled with the last row, so a removal costs O(rows removed)."""
        if self.grounding is not None:
            self.grounding.discard(ids)
        found = np.sort(self.rows_of(ids))[::-1]
        if found.size == 0:
            return
        self._odd -= self._count_odd(self._inv[found])
        for row in found.tolist():
            last = self.n - 1
            if self.terms is not None:
                self.terms.remove(row)
                if row != last:
                    self.terms.move(last, row)
            if self.context is not None:
                self.context.remove(row, int(self._ids[row]))
                if row != last:
                    self.context.move(last, row, int(self._ids[last]))
            if row != last:
                self._write_rows(row, self.gather([last]))
                for column in (self._ids, self._imp, self._last, self._created, self._inv):
                    column[row] = column[last]
                if self._y is not None:
                    self._y[row] = self._y[last]
            self.n = last
        if self._screen is not None:
            self._screen.truncate(self.n)
        while len(self._blocks) > 1 and self._starts[-1] >= self.n:
            self._blocks.pop()
            self._starts.pop()
            if self._screen is not None:
                self._screen.drop_block()
        self._limits = None
        self._yc = None
        self._memo.clear()

    # -- internals ---------------------------------------------------------------------------------

    def _adopt(self, arrays: StreamArrays, copy: bool) -> None:
        if copy:
            blocks = [np.array(arrays.matrix(), dtype=np.float32, order="C")]
        else:
            blocks = [np.ascontiguousarray(block, dtype=np.float32) for block in arrays.blocks()]
        n = len(arrays.ids)
        if sum(len(b) for b in blocks) != n:
            raise ValueError(f"{n} ids but {sum(len(b) for b in blocks)} embeddings")
        self.dim = blocks[0].shape[1]
        self._blocks, self._starts = blocks, [0, *np.cumsum([len(b) for b in blocks[:-1]]).tolist()]
        self._screen = None
        cap = max(n, 64)
        self._ids = np.zeros(cap, np.int64)
        self._imp, self._last, self._created = (np.zeros(cap, np.float64) for _ in range(3))
        self._inv = np.zeros(cap, np.float32)
        self._ids[:n] = arrays.ids
        self._imp[:n] = arrays.importance
        self._last[:n] = arrays.last_accessed
        self._created[:n] = arrays.created
        if arrays.inverse_norms is not None and not copy:
            self._inv[:n] = arrays.inverse_norms
        else:
            for first, block in zip(self._starts, blocks, strict=True):
                for start in range(0, len(block), _CHUNK):
                    end = min(len(block), start + _CHUNK)
                    self._inv[first + start:first + end] = inverse_norms(block[start:end])
        self._odd = self._count_odd(self._inv[:n])
        self.n = n

    @staticmethod
    def _count_odd(inv: F32) -> int:
        low, high = _NORM_RANGE
        nonzero = inv[inv != 0.0]
        bad = ~np.isfinite(nonzero) | (nonzero < 1.0 / high) | (nonzero > 1.0 / low)
        return int(bad.sum())

    def _capacity(self) -> int:
        return self._starts[-1] + len(self._blocks[-1]) if self._blocks else 0

    def _reserve(self, extra: int) -> None:
        needed = self.n + extra
        if needed > len(self._ids):
            cap = max(needed, 2 * len(self._ids))
            for name in ("_ids", "_imp", "_last", "_created", "_inv"):
                old = getattr(self, name)
                new = np.zeros(cap, old.dtype)
                new[: self.n] = old[: self.n]
                setattr(self, name, new)
            if self._y is not None:
                y = np.zeros(cap, np.float64)
                y[: self.n] = self._y[: self.n]
                self._y = y
        if needed > self._capacity():
            # A new block of about a quarter of the rows so far: few blocks, no copy, and untouched
            # pages of the spare room are not resident.
            size = max(_MIN_BLOCK, needed - self._capacity(), self.n // 4)
            if self._screen is not None:
                self._screen.add_block(self._capacity(), size)
            self._starts.append(self._capacity())
            self._blocks.append(large_empty((size, self.dim)))

    def _write_rows(self, start: int, matrix: F32) -> None:
        done = 0
        while done < len(matrix):
            b = bisect_right(self._starts, start + done) - 1
            block, offset = self._blocks[b], start + done - self._starts[b]
            take = min(len(block) - offset, len(matrix) - done)
            block[offset:offset + take] = matrix[done:done + take]
            done += take
        if self._screen is not None:
            self._screen.write(start, matrix)

    def _widen_limits(self, start: int, end: int) -> None:
        if self._limits is None or start == 0:
            self._limits = None
            return
        last, imp = self._last[start:end], self._imp[start:end]
        lim = self._limits
        lim["last_min"] = min(lim["last_min"], float(last.min()))
        lim["last_max"] = max(lim["last_max"], float(last.max()))
        lim["imp_min"] = min(lim["imp_min"], float(imp.min()))
        lim["imp_max"] = max(lim["imp_max"], float(imp.max()))

    def _rebase(self) -> None:
        self._t0 = float(self._last[: self.n].max()) if self.n else 0.0
        y = np.zeros(len(self._ids), np.float64)
        np.exp(self._lam * (self._last[: self.n] - self._t0), out=y[: self.n])
        self._y = y

    def _set_y(self, rows: npt.NDArray[np.int64]) -> None:
        assert self._y is not None
        exponent = self._lam * (self._last[rows] - self._t0)
        if exponent.size and float(exponent.max()) > _REBASE_EXPONENT:
            self._rebase()
        else:
            self._y[rows] = np.exp(exponent)
