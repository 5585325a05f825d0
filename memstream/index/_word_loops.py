"""The compiled loop of words.words_of (numba, loaded with _loops.py by _kernels.py): many texts cut into their
words in one pass over their characters.

The texts come lower-cased and joined, each followed by one character that is no part of a word, as an array of
code points (uint8 when all are ASCII, else uint32), with `wordy[c]` non-zero for the code points that words are
made of (str.isalnum: what `[^\\W_]` matches). Each word is hashed (64-bit FNV-1a over its code points) into a
table of the distinct words seen so far and compared with the one found there code point by code point, so two
words share a code only if they are equal: no hash collision can merge them.
"""

from __future__ import annotations

from typing import Any

import numba
import numpy as np

__all__ = ["count_terms", "cut_words", "slot_terms"]

jit = numba.njit(cache=True, nogil=True, error_model="numpy")
_OFFSET = np.uint64(14695981039346656037)
_PRIME = np.uint64(1099511628211)
_EMPTY = -1


@jit
def cut_words(chars: Any, ends: Any, wordy: Any) -> tuple[Any, Any, Any, Any]:
    # (each word's code, each text's count of words, where each distinct word first starts and ends); text i
    # ends before ends[i]. Codes are given in the order the words are first met.
    n = chars.size
    total = 0
    inside = False
    for i in range(n):
        word = wordy[chars[i]] != 0
        if word and not inside:
            total += 1
        inside = word
    codes = np.empty(total, np.int64)
    counts = np.zeros(ends.size, np.int64)
    size = 1024
    while size < total // 2:
        size *= 2
    table = np.full(size, _EMPTY, np.int64)
    hashes = np.empty(size // 2, np.uint64)
    first = np.empty(size // 2, np.int64)
    last = np.empty(size // 2, np.int64)
    mask = np.uint64(size - 1)
    distinct = 0
    t = 0
    text = 0
    i = 0
    while i < n:
        if wordy[chars[i]] == 0:
            i += 1
            continue
        start = i
        h = _OFFSET
        while i < n and wordy[chars[i]] != 0:
            h = (h ^ np.uint64(chars[i])) * _PRIME
            i += 1
        while ends[text] <= start:
            text += 1
        counts[text] += 1
        slot = h & mask
        while True:
            found = table[slot]
            if found == _EMPTY:
                if 2 * (distinct + 1) > size:  # half full: twice the table, every distinct word placed again
                    size *= 2
                    mask = np.uint64(size - 1)
                    table = np.full(size, _EMPTY, np.int64)
                    hashes, first, last = _grown(hashes, size // 2), _grown(first, size // 2), _grown(last, size // 2)
                    for d in range(distinct):
                        place = hashes[d] & mask
                        while table[place] != _EMPTY:
                            place = (place + np.uint64(1)) & mask
                        table[place] = d
                    slot = h & mask
                    continue
                table[slot] = distinct
                hashes[distinct] = h
                first[distinct] = start
                last[distinct] = i
                codes[t] = distinct
                distinct += 1
                break
            if hashes[found] == h and last[found] - first[found] == i - start and _same(chars, first[found], start,
                                                                                       i - start):
                codes[t] = found
                break
            slot = (slot + np.uint64(1)) & mask
        t += 1
    return codes, counts, first[:distinct].copy(), last[:distinct].copy()


@jit
def _same(chars: Any, a: int, b: int, length: int) -> bool:
    for m in range(length):  # noqa: SIM110 (numba compiles a loop, not a generator)
        if chars[a + m] != chars[b + m]:
            return False
    return True


@jit
def _grown(values: Any, size: int) -> Any:
    out = np.empty(size, values.dtype)
    out[: values.size] = values
    return out


@jit
def count_terms(term_of: Any, codes: Any, counts: Any, terms: int) -> tuple[Any, Any, Any, Any]:
    # Postings.feed's pairs: given each distinct word's term (-1: none), each word's code and each text's count
    # of words, every (term, text) pair once with its count, in (term, text) order, and each text's length (its
    # words that are terms). A counting sort by term: each term's pairs come in text order.
    texts = counts.size
    lengths = np.zeros(texts, np.int64)
    seen = np.full(terms, -1, np.int64)  # per term: its pair in the current text, if any
    since = np.full(terms, -1, np.int64)  # ... and which text that was
    pair_term = np.empty(codes.size, np.int64)
    pair_text = np.empty(codes.size, np.int64)
    pair_count = np.zeros(codes.size, np.int64)
    pairs = 0
    w = 0
    for text in range(texts):
        for _ in range(counts[text]):
            term = term_of[codes[w]]
            w += 1
            if term < 0:
                continue
            lengths[text] += 1
            if since[term] != text:
                since[term] = text
                seen[term] = pairs
                pair_term[pairs] = term
                pair_text[pairs] = text
                pairs += 1
            pair_count[seen[term]] += 1
    starts = np.zeros(terms + 1, np.int64)
    for p in range(pairs):
        starts[pair_term[p] + 1] += 1
    for t in range(terms):
        starts[t + 1] += starts[t]
    out_term = np.empty(pairs, np.int64)
    out_text = np.empty(pairs, np.int64)
    out_count = np.empty(pairs, np.int64)
    for p in range(pairs):
        at = starts[pair_term[p]]
        starts[pair_term[p]] += 1
        out_term[at] = pair_term[p]
        out_text[at] = pair_text[p]
        out_count[at] = pair_count[p]
    return out_term, out_text, out_count, lengths


@jit
def slot_terms(tids: Any, slots: Any, documents: int) -> tuple[Any, Any]:
    # postings.Block's document side: given postings in term order (each term's in slot order), where each slot's
    # terms start (documents + 1 offsets) and its terms in term order. A counting sort by slot (stable).
    starts = np.zeros(documents + 1, np.int64)
    for p in range(slots.size):
        starts[slots[p] + 1] += 1
    for d in range(documents):
        starts[d + 1] += starts[d]
    at = starts[:documents].copy()
    out = np.empty(slots.size, np.int64)
    for p in range(slots.size):
        out[at[slots[p]]] = tids[p]
        at[slots[p]] += 1
    return starts, out


@jit
def term_order(tids: Any, terms: int) -> Any:
    # postings.Block's order for postings gathered a chunk at a time (each chunk's in term order, the chunks in slot
    # order): the positions of the postings by term, each term's in the order given. A counting sort (stable).
    starts = np.zeros(terms + 1, np.int64)
    for p in range(tids.size):
        starts[tids[p] + 1] += 1
    for t in range(terms):
        starts[t + 1] += starts[t]
    out = np.empty(tids.size, np.int64)
    for p in range(tids.size):
        out[starts[tids[p]]] = p
        starts[tids[p]] += 1
    return out
