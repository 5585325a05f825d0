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
import re
from array import array
from collections import Counter
from collections.abc import Iterable, Sequence

import numpy as np

from memstream.index import _kernels as kernels
from memstream.store.arrays import F64, I64

__all__ = ["K1", "B", "StreamTerms", "bm25_reference", "stems", "terms"]

K1 = 1.2
B = 0.75
# Memory of the lexical index (nbytes), measured with sys.getsizeof on 10k chat-like texts (13.3 MB).
_TERM_BYTES = 250  # its word, its vocabulary entry, two empty posting arrays
_POSTING_BYTES = 34  # slot and count (8 B each, grown by an eighth), the term in the document's list
_SLOT_BYTES = 72  # a document's term list

_WORD = re.compile(r"[^\W_]+")
_MEMO_WORDS = 1_000_000  # per language: the words seen, each with its term (None: a stop word)
_STOP_TEXT = """
# noqa: SIM905 (a word list reads better as text) a about above after again against all am an and any are as
at be been before being below between both but by can could did do does doing don down during each few for
from further had has have having he her here hers herself him himself his how i if in into is it its itself
just let me more most my myself no nor not now of off on once only or other ought our ours ourselves out over
own same she should so some such t than that the their theirs them themselves then there these they this those
through to too under until up very was we were what when where which while who whom why will with would you
your yours yourself yourselves m re ve ll d s
"""
STOP_WORDS = frozenset(_STOP_TEXT.split())


class _Stems:
    """One language's word -> term rule, with a memo (stemming a word costs ~25 us; a stream has few words)."""

    def __init__(self, language: str) -> None:
        self.stop = STOP_WORDS if language in ("english", "porter") else frozenset()
        if language == "none":
            self.stemmer = None
        else:  # imported when a stream is first indexed, not by every command (its 36 languages cost 16 ms)
            import snowballstemmer

            self.stemmer = snowballstemmer.stemmer(language)
        self.memo: dict[str, str | None] = {}

    def term(self, word: str) -> str | None:
        found = self.memo.get(word, "")
        if found != "":
            return found
        if word.isdigit():  # a number has no stem (and numbers would fill the memo)
            return word
        term = None if word in self.stop else word if self.stemmer is None else self.stemmer.stemWord(word)
        if len(self.memo) < _MEMO_WORDS:
            self.memo[word] = term
        return term


def stems(language: str, _made: dict[str, _Stems] = {}) -> _Stems:  # noqa: B006 (one per language)
    """The word -> term rule of a language ("english", another Snowball language, or "none")."""
    found = _made.get(language)
    if found is None:
        found = _made[language] = _Stems(language)
    return found


def terms(text: str, language: str = "english") -> list[str]:
    """The indexed terms of a text, in order (stop words left out)."""
    rule = stems(language)
    out = []
    for word in _WORD.findall(text.lower()):
        term = rule.term(word)
        if term is not None:
            out.append(term)
    return out


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
    """

    def __init__(self, language: str = "english") -> None:
        self.language = language
        self._vocab: dict[str, int] = {}
        self._slots: list[array[int]] = []  # per term: document slots
        self._tfs: list[array[int]] = []  # per term: occurrences in that document
        self._df: array[int] = array("q")  # per term: live documents holding it
        self._slot_row: I64 = np.zeros(64, np.int64)
        self._slot_len: I64 = np.zeros(64, np.int64)
        self._slot_terms: list[array[int]] = []
        self._row_slot: I64 = np.zeros(64, np.int64)
        self._used = 0
        self._dead = 0  # removed documents whose postings are still listed
        self._postings = 0  # (slot, term) pairs listed, for nbytes
        self.live = 0
        self.live_length = 0

    # -- writing -----------------------------------------------------------------------------------

    def add(self, first_row: int, texts: Iterable[str]) -> None:
        """Index texts as the rows first_row, first_row + 1, ..."""
        row = first_row
        for text in texts:
            self._add(row, text)
            row += 1

    def replace(self, row: int, text: str) -> None:
        """A row's text changed."""
        self.remove(row)
        self._add(row, text)

    def remove(self, row: int) -> None:
        """A row's memory is gone."""
        slot = int(self._row_slot[row])
        if slot < 0 or self._slot_row[slot] != row:
            return
        self._slot_row[slot] = -1
        self._row_slot[row] = -1
        self.live -= 1
        self.live_length -= int(self._slot_len[slot])
        for term in self._slot_terms[slot]:
            self._df[term] -= 1
        self._slot_terms[slot] = array("q")
        self._dead += 1
        if self._dead > max(4096, self.live):
            self._compact()

    def _compact(self) -> None:
        """Drop the postings of removed documents (amortized: once as many have gone as are left)."""
        for tid, slots in enumerate(self._slots):
            if not slots:
                continue
            at = np.frombuffer(slots, dtype=np.int64)
            keep = self._slot_row[at] >= 0
            if not keep.all():
                tfs = np.frombuffer(self._tfs[tid], dtype=np.int64)
                self._slots[tid] = array("q", at[keep].tobytes())
                self._tfs[tid] = array("q", tfs[keep].tobytes())
            del at
        self._dead = 0
        self._postings = sum(len(slots) for slots in self._slots)

    def move(self, source: int, target: int) -> None:
        """The memory in row `source` now sits in row `target`."""
        slot = int(self._row_slot[source])
        self._grow_rows(target + 1)
        self._row_slot[target] = slot
        self._row_slot[source] = -1
        if slot >= 0:
            self._slot_row[slot] = target

    def _add(self, row: int, text: str) -> None:
        counts = Counter(terms(text, self.language))
        slot = self._used
        if slot >= len(self._slot_row):
            self._slot_row = _grown(self._slot_row, slot + 1)
            self._slot_len = _grown(self._slot_len, slot + 1)
        self._grow_rows(row + 1)
        self._used += 1
        ids = array("q")
        for term, tf in counts.items():
            tid = self._vocab.get(term)
            if tid is None:
                tid = self._vocab[term] = len(self._slots)
                self._slots.append(array("q"))
                self._tfs.append(array("q"))
                self._df.append(0)
            self._slots[tid].append(slot)
            self._tfs[tid].append(tf)
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
        arrays = self._slot_row.nbytes + self._slot_len.nbytes + self._row_slot.nbytes
        return (len(self._slots) * _TERM_BYTES + self._postings * _POSTING_BYTES + self._used * _SLOT_BYTES
                + arrays)

    def _grow_rows(self, size: int) -> None:
        if size > len(self._row_slot):
            self._row_slot = _grown(self._row_slot, size, fill=-1)

    # -- reading -----------------------------------------------------------------------------------

    def score(self, query: str, rows: int, compiled: bool | None = None) -> F64:
        """The BM25 score of each of the first `rows` rows for the query (0 where no weighted term matches).
        `compiled`: _kernels.py's loop or numpy (default: the loop once loaded); the same floats either way."""
        out = np.zeros(rows, np.float64)
        compiled = kernels.ready() if compiled is None else compiled
        if self.live == 0:
            return out
        avg = self.live_length / self.live
        # Terms in sorted order, as the reference adds them: within one term, a row appears once.
        for term in sorted(set(terms(query, self.language))):
            tid = self._vocab.get(term)
            if tid is None or self._df[tid] == 0:
                continue
            idf = _idf(self.live, self._df[tid])
            if idf <= 0.0:
                continue
            slots = np.frombuffer(self._slots[tid], dtype=np.int64)
            if compiled:
                tfs = np.frombuffer(self._tfs[tid], dtype=np.int64)
                kernels.loops()["bm25"](out, slots, tfs, self._slot_row, self._slot_len, idf, avg, K1, B)
                del slots, tfs  # (a buffer still exported would keep the posting list from growing)
                continue
            found = self._slot_row[slots]
            live = found >= 0
            tf = np.frombuffer(self._tfs[tid], dtype=np.int64)[live].astype(np.float64)
            length = self._slot_len[slots[live]].astype(np.float64)
            out[found[live]] += idf * (tf * (K1 + 1.0)) / (tf + K1 * (1.0 - B + B * (length / avg)))
            del slots
        return out


def _grown(values: I64, size: int, fill: int = 0) -> I64:
    out = np.full(max(size, 2 * len(values)), fill, np.int64)
    out[: len(values)] = values
    return out
