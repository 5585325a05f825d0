"""A stream's postings in bulk, for its lexical index (lexical.py): gathered from its texts' words a chunk at a
time (Postings), and held as one block of sorted arrays (Block), each term's postings a slice of it and each
document's terms a slice too.

Loading a stream indexes all of its texts at once: one Python list per term and per document, as texts added
one by one get, cost ~10 us a text (100 ms for 10k memories, most of a cold stream's load). In bulk, a chunk's
distinct words are mapped to term ids through one dict lookup each, and the (term, document) pairs are counted
and ordered by a compiled loop (_word_loops.count_terms: one walk and a counting sort) or, until it is loaded,
by numpy's sort: the same postings, under half a microsecond a text.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from memstream.index import _kernels as kernels
from memstream.index.words import Words, stems
from memstream.store.arrays import I64

__all__ = ["Block", "Postings"]


class Block(NamedTuple):
    """Postings as sorted arrays: term t's are posted_slots/posted_tfs[term_start[t]:term_start[t + 1]] (by
    slot), document d's distinct terms are doc_terms[doc_start[d]:doc_start[d + 1]]."""

    term_start: I64
    posted_slots: I64
    posted_tfs: I64
    doc_start: I64
    doc_terms: I64

    @classmethod
    def empty(cls) -> Block:
        """No postings, no documents."""
        none = np.zeros(0, np.int64)
        return cls(np.zeros(1, np.int64), none, none, np.zeros(1, np.int64), none)

    @classmethod
    def of(cls, tids: I64, slots: I64, tfs: I64, terms: int, documents: int, compiled: bool | None = None) -> Block:
        """The block of these postings ((term, slot) pairs listed once each, each term's in slot order: as
        documents are gathered and as a compaction lists them) of `terms` terms and `documents` document slots.
        `compiled`: each slot's terms gathered by the compiled counting sort or by numpy (default: the loop once
        loaded); the same block either way."""
        compiled = compiled if compiled is not None else kernels.ready()
        if tids.size > 1 and (np.diff(tids) < 0).any():  # (term, slot) order: each term's were in slot order
            by_term = kernels.loops()["term_order"](tids, terms) if compiled else np.argsort(tids, kind="stable")
            tids, slots, tfs = tids[by_term], slots[by_term], tfs[by_term]
        if compiled:
            doc_start, doc_terms = kernels.loops()["slot_terms"](tids, slots, documents)
            return cls(_starts(tids, terms), slots, tfs, doc_start, doc_terms)
        by_slot = np.argsort(slots, kind="stable")  # (within a slot, by term: they are sorted by term)
        return cls(_starts(tids, terms), slots, tfs, _starts(slots, documents), tids[by_slot])

    @property
    def documents(self) -> int:
        """The document slots it covers (0 .. documents - 1)."""
        return len(self.doc_start) - 1

    def of_term(self, tid: int) -> tuple[I64, I64]:
        """A term's postings: (slots, counts)."""
        if tid + 1 >= len(self.term_start):
            return self.posted_slots[:0], self.posted_tfs[:0]
        low, high = int(self.term_start[tid]), int(self.term_start[tid + 1])
        return self.posted_slots[low:high], self.posted_tfs[low:high]

    def terms_of(self, slot: int) -> I64:
        """A document's distinct terms."""
        return self.doc_terms[int(self.doc_start[slot]):int(self.doc_start[slot + 1])]

    def postings(self) -> tuple[I64, I64, I64]:
        """Every posting as (term, slot, count) arrays."""
        tids = np.repeat(np.arange(len(self.term_start) - 1, dtype=np.int64), np.diff(self.term_start))
        return tids, self.posted_slots.copy(), self.posted_tfs.copy()

    def nbytes(self) -> int:
        """Bytes held by its arrays."""
        return sum(part.nbytes for part in self)


class Postings:
    """Documents' postings gathered in bulk, chunk by chunk, with the vocabulary they built (term -> id)."""

    def __init__(self, language: str) -> None:
        self.rule = stems(language)
        self.vocab: dict[str, int] = {}
        self.documents = 0
        self._tid_of: dict[str, int] = {}  # the words seen: their term's id (-1: a stop word)
        self._parts: list[tuple[I64, I64, I64]] = []
        self._lengths: list[I64] = []

    def feed(self, said: Words, compiled: bool | None = None) -> None:
        """The next documents, by their words (words.words_of). `compiled`: pairs counted by the compiled loop or
        by numpy (default: the loop once loaded); the same postings either way."""
        n = len(said.counts)
        tid_of = self._tid_of
        for word in set(said.distinct).difference(tid_of):
            found = self.rule.term(word)
            tid_of[word] = -1 if found is None else self.vocab.setdefault(found, len(self.vocab))
        term_of = np.fromiter(map(tid_of.__getitem__, said.distinct), np.int64, len(said.distinct))
        if compiled if compiled is not None else kernels.ready():
            tids, docs, tfs, lengths = kernels.loops()["count_terms"](term_of, said.codes, said.counts,
                                                                      len(self.vocab))
            self._lengths.append(lengths)
            self._parts.append((tids, docs + self.documents, tfs))
            self.documents += n
            return
        tids = term_of[said.codes]
        docs = said.docs()
        kept = tids >= 0
        tids, docs = tids[kept], docs[kept]
        self._lengths.append(np.bincount(docs, minlength=n).astype(np.int64))
        pairs, counts = np.unique(tids * max(n, 1) + docs, return_counts=True)
        self._parts.append((pairs // max(n, 1), pairs % max(n, 1) + self.documents, counts.astype(np.int64)))
        self.documents += n

    def lengths(self) -> I64:
        """Each document's count of indexed words."""
        return np.concatenate(self._lengths) if self._lengths else np.zeros(0, np.int64)

    def postings(self) -> tuple[I64, I64, I64]:
        """Every (term, document, count), each (term, document) pair once."""
        if not self._parts:
            none = np.zeros(0, np.int64)
            return none, none, none
        tids, docs, tfs = (np.concatenate([part[i] for part in self._parts]) for i in range(3))
        return tids, docs, tfs


def _starts(keys: I64, size: int) -> I64:
    """Where each key's run starts in the sorted keys (and where the last ends): size + 1 offsets."""
    out = np.zeros(size + 1, np.int64)
    np.cumsum(np.bincount(keys, minlength=size)[:size], out=out[1:])
    return out
