"""Lexical relevance: an in-memory BM25 index of one stream's texts, kept row for row beside its matrix.

Why in memory and not SQLite's FTS5: the statistics must be the stream's own (FTS5 counts document
frequencies over the whole table, so one server's words would move another server's ranking); the scores must
be the same on every storage backend; no second copy of the text is written to disk, so nothing is left to
scrub after a deletion; and scoring reads a few posting lists instead of returning rows through SQL.

Every memory gets a score, 0 when it shares no term with the query:

    bm25(d, q) = sum over the distinct terms t of q in d of
                 idf(t) * tf * (K1 + 1) / (tf + K1 * (1 - B + B * len(d) / avglen))
    idf(t)     = max(0, ln((N - df(t) + 0.5) / (df(t) + 0.5)))

over the live memories of the stream (N of them, average length avglen). A term in half the stream or more
weighs 0 and is never read, and English stop words are not indexed, so common words cannot make a query slow.
Words are lower-cased runs of letters and digits, reduced to their stem by the Snowball stemmer of the
persona's language (StreamConfig.stemmer: English by default; "none" keeps whole words): "studies",
"studied" and "studying" are one term. Another language gets its own Snowball stemmer and no stop-word
list (its common words weigh little or nothing by the idf above).
"""

from __future__ import annotations

import math
from array import array
from collections import Counter
from collections.abc import Iterable, Sequence

import numpy as np

from memstream.index import _kernels as kernels
from memstream.index.postings import Block, Postings
from memstream.index.words import stems, terms, words
from memstream.store.arrays import F64, I64

__all__ = ["K1", "B", "StreamTerms", "bm25_reference"]

K1 = 1.2
B = 0.75
# Memory of the lexical index (nbytes), measured with tracemalloc on 10k chat-like texts: 3.9 MB loaded in bulk, 7.9
# MB added one by one.
_TERM_BYTES = 120  # its word and its vocabulary entry
_LIST_BYTES = 200  # a term's two posting lists beside the block, and their entries
_POSTING_BYTES = 34  # in those lists: slot and count (8 B each, grown by an eighth), the term in the document's list
_SLOT_BYTES = 72  # a document's term list, beside the block


def _idf(live: int, df: int) -> float:
    return max(0.0, math.log((live - df + 0.5) / (df + 0.5)))


def bm25_reference(documents: Sequence[str], query: str, language: str = "english") -> list[float]:
    """The definition above, one document at a time in plain Python: the test oracle."""
    docs = [Counter(terms(d, language)) for d in documents]
    lengths = [sum(d.values()) for d in docs]
    n = len(docs)
    avg = sum(lengths) / n if n else 0.0
    scores = [0.0] * n
    for term in sorted(set(terms(query, language))):
        df = sum(1 for d in docs if term in d)
        idf = _idf(n, df)
        if idf <= 0.0:
            continue
        for i, d in enumerate(docs):
            tf = d.get(term, 0)
            if tf:
                scores[i] += idf * (tf * (K1 + 1.0)) / (tf + K1 * (1.0 - B + B * (lengths[i] / avg)))
    return scores


class StreamTerms:
    """Posting lists of one stream, addressed by the rows of its matrix (which move when rows are removed).

    Each text added gets a document slot; postings name slots, and each slot knows its current row (-1 once
    removed). A slot's distinct terms are kept so that a removal lowers the document frequencies at once.
    The postings of a stream's load and of each compaction are one block of arrays (postings.py: built by numpy
    in one pass, a term's postings a slice of it); a text added later gets its postings in a list per term
    beside the block, read after the term's slice.
    """

    def __init__(self, language: str = "english", *, compact_after: int = 4096) -> None:
        self.language = language
        self.compact_after = compact_after  # removed documents still listed before a compaction, at least
        self._vocab: dict[str, int] = {}
        self._block = Block.empty()  # the postings of the load or of the last compaction
        self._slots: dict[int, array[int]] = {}  # per term: the document slots added since the block
        self._tfs: dict[int, array[int]] = {}  # per term: occurrences in those documents
        self._df: I64 = np.zeros(64, np.int64)  # per term: live documents holding it
        self._slot_row: I64 = np.zeros(64, np.int64)
        self._slot_len: I64 = np.zeros(64, np.int64)
        self._slot_terms: list[array[int]] = []  # per slot added since the block: its terms
        self._row_slot: I64 = np.zeros(64, np.int64)
        self._used = 0
        self._dead = 0  # removed documents whose postings are still listed
        self._postings = 0  # (slot, term) pairs listed beside the block, for nbytes
        self.live = 0
        self.live_length = 0

    # -- writing -----------------------------------------------------------------------------------

    def add(self, first_row: int, texts: Iterable[str]) -> None:
        """Index texts as the rows first_row, first_row + 1, ..."""
        row = first_row
        for text in texts:
            self._add(row, words(text))
            row += 1

    def load(self, first_row: int, gathered: Postings) -> None:
        """Into an empty index: the documents gathered in bulk (postings.py), as rows first_row, ..."""
        if self._used:
            raise ValueError("a lexical index is loaded in bulk only when empty")
        self._vocab = gathered.vocab
        n = gathered.documents
        self._grow_slots(n)
        self._grow_rows(first_row + n)
        rows = np.arange(first_row, first_row + n, dtype=np.int64)
        self._slot_row[:n] = rows
        self._row_slot[rows] = np.arange(n, dtype=np.int64)
        lengths = gathered.lengths()
        self._slot_len[:n] = lengths
        self._used = self.live = n
        self.live_length = int(lengths.sum())
        self._seal(*gathered.postings())

    def replace(self, row: int, text: str) -> None:
        """A row's text changed."""
        self.remove(row)
        self._add(row, words(text))

    def remove(self, row: int) -> None:
        """A row's memory is gone."""
        slot = int(self._row_slot[row])
        if slot < 0 or self._slot_row[slot] != row:
            return
        self._slot_row[slot] = -1
        self._row_slot[row] = -1
        self.live -= 1
        self.live_length -= int(self._slot_len[slot])
        if slot < self._block.documents:
            self._df[self._block.terms_of(slot)] -= 1
        else:
            held = self._slot_terms[slot - self._block.documents]
            self._df[np.frombuffer(held, dtype=np.int64)] -= 1
            self._slot_terms[slot - self._block.documents] = array("q")
        self._dead += 1
        if self._dead > max(self.compact_after, self.live):
            self._compact()

    def _compact(self) -> None:
        """Drop the postings of removed documents, and fold every list beside the block into it (amortized:
        once as many have gone as are left)."""
        parts = [self._block.postings()]
        for tid, listed in self._slots.items():
            at = np.frombuffer(listed, dtype=np.int64)
            parts.append((np.full(at.size, tid, np.int64), at.copy(), np.frombuffer(self._tfs[tid], np.int64).copy()))
            del at
        tids, slots, tfs = (np.concatenate([part[i] for part in parts]) for i in range(3))
        live = self._slot_row[slots] >= 0
        self._seal(tids[live], slots[live], tfs[live])

    def _seal(self, tids: I64, slots: I64, tfs: I64) -> None:
        """Make these postings (every one listed) the block, covering every slot used so far."""
        self._block = Block.of(tids, slots, tfs, len(self._vocab), self._used)
        self._df = np.bincount(tids, minlength=max(64, len(self._vocab))).astype(np.int64)
        self._slots, self._tfs, self._slot_terms = {}, {}, []
        self._dead = self._postings = 0

    def move(self, source: int, target: int) -> None:
        """The memory in row `source` now sits in row `target`."""
        slot = int(self._row_slot[source])
        self._grow_rows(target + 1)
        self._row_slot[target] = slot
        self._row_slot[source] = -1
        if slot >= 0:
            self._slot_row[slot] = target

    def _add(self, row: int, said: list[str]) -> None:
        rule = stems(self.language)
        counts = Counter(term for term in map(rule.term, said) if term is not None)
        slot = self._used
        self._grow_slots(slot + 1)
        self._grow_rows(row + 1)
        self._used += 1
        ids = array("q")
        for term, tf in counts.items():
            tid = self._vocab.get(term)
            if tid is None:
                tid = self._vocab[term] = len(self._vocab)
                if tid >= len(self._df):
                    self._df = _grown(self._df, tid + 1)
            self._slots.setdefault(tid, array("q")).append(slot)
            self._tfs.setdefault(tid, array("q")).append(tf)
            self._df[tid] += 1
            ids.append(tid)
        self._postings += len(ids)
        length = sum(counts.values())
        self._slot_terms.append(ids)
        self._slot_row[slot] = row
        self._slot_len[slot] = length
        self._row_slot[row] = slot
        self.live += 1
        self.live_length += length

    def nbytes(self) -> int:
        """About the memory this index holds (per term, posting and document, as measured)."""
        arrays = self._slot_row.nbytes + self._slot_len.nbytes + self._row_slot.nbytes + self._df.nbytes
        return (len(self._vocab) * _TERM_BYTES + self._block.nbytes() + len(self._slots) * _LIST_BYTES
                + self._postings * _POSTING_BYTES + len(self._slot_terms) * _SLOT_BYTES + arrays)

    def _grow_slots(self, size: int) -> None:
        if size > len(self._slot_row):
            self._slot_row = _grown(self._slot_row, size)
            self._slot_len = _grown(self._slot_len, size)

    def _grow_rows(self, size: int) -> None:
        if size > len(self._row_slot):
            self._row_slot = _grown(self._row_slot, size, fill=-1)

    # -- reading -----------------------------------------------------------------------------------

    def score(self, query: str, rows: int, compiled: bool | None = None, *, out: F64 | None = None) -> F64:
        """The BM25 score of each of the first `rows` rows for the query (0 where no weighted term matches), in
        `out` if given (`rows` long: it is zeroed first). `compiled`: _kernels.py's loop or numpy (default: the
        loop once loaded); the same floats either way."""
        if out is None:
            out = np.zeros(rows, np.float64)
        else:
            out.fill(0.0)
        compiled = kernels.ready() if compiled is None else compiled
        if self.live == 0:
            return out
        avg = self.live_length / self.live
        # Terms in sorted order, as the reference adds them: within one term, a row appears once.
        for term in sorted(set(terms(query, self.language))):
            tid = self._vocab.get(term)
            if tid is None or self._df[tid] == 0:
                continue
            idf = _idf(self.live, int(self._df[tid]))
            if idf <= 0.0:
                continue
            self._score(out, *self._block.of_term(tid), idf, avg, compiled)
            if tid in self._slots:
                slots, tfs = np.frombuffer(self._slots[tid], np.int64), np.frombuffer(self._tfs[tid], np.int64)
                self._score(out, slots, tfs, idf, avg, compiled)
                del slots, tfs  # (a buffer still exported would keep the posting list from growing)
        return out

    def _score(self, out: F64, slots: I64, tfs: I64, idf: float, avg: float, compiled: bool) -> None:
        """One term's BM25 added to the rows of these postings."""
        if not slots.size:
            return
        if compiled:
            kernels.loops()["bm25"](out, slots, tfs, self._slot_row, self._slot_len, idf, avg, K1, B)
            return
        found = self._slot_row[slots]
        live = found >= 0
        tf = tfs[live].astype(np.float64)
        length = self._slot_len[slots[live]].astype(np.float64)
        out[found[live]] += idf * (tf * (K1 + 1.0)) / (tf + K1 * (1.0 - B + B * (length / avg)))


def _grown(values: I64, size: int, fill: int = 0) -> I64:
    out = np.full(max(size, 2 * len(values)), fill, np.int64)
    out[: len(values)] = values
    return out
