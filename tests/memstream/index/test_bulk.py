"""A stream's load builds its lexical index and context in bulk (words.words_of, postings.py, cues.hold_times,
StreamContext.load_sources): the same words, postings, time flags and links as texts and sources added one by
one, before and after any writes that follow."""

from __future__ import annotations

import itertools
import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memstream.index import _kernels as kernels
from memstream.index.context import StreamContext
from memstream.index.cues import TIME_WORDS, hold_times, holds_time
from memstream.index.postings import Block, Postings
from memstream.index.vectors import StreamVectors
from memstream.index.words import words, words_of
from memstream.records import Source
from tests.memstream.index.test_hybrid import apply_writes, assert_scores_are_the_reference

# The definitions before the fast paths, written out: a time word, or the date pattern anywhere.
_WORD = re.compile(r"[^\W_]+")
_PATTERN = re.compile(r"\b(?:1[89]\d\d|20\d\d)s?\b|\b\d{1,2}:\d\d\b|\b\d{1,2}(?:st|nd|rd|th|am|pm)\b"
                      r"|\b\d{1,2}/\d{1,2}(?:/\d{2,4})?\b|\bMay \d|\d May\b", re.IGNORECASE)
PIECES = ["May 3", "3 MAY", "may", "mayor 5", "10:30", "1:5", "3pm", "21st", "4TH", "1999", "1850", "2024", "2020s",
          "2100", "1700", "123", "12345", "7/4", "7/4/2021", "0sep0", "x0sep0y", "Σ", "ΣΑΣ", "İ12", "٣", "½", "1²",
          "a_b", "yesterday", "Monday", "week", "the", "Studies", "studying", "café", "naïve", "🙂", "\n", " ", ",",
          "-", "_", "0"]
texts = st.lists(st.sampled_from(PIECES), max_size=8).map(" ".join) | st.text(max_size=30)


def _reference_time(text: str) -> bool:
    return not TIME_WORDS.isdisjoint(_WORD.findall(text.lower())) or _PATTERN.search(text) is not None


@settings(max_examples=400, deadline=None, derandomize=True, database=None)
@given(st.lists(texts | st.text(st.characters(codec="utf-8"), max_size=40), max_size=12))
def test_words_of_many_texts_are_each_texts_words(batch: list[str]) -> None:
    expected = [words(text) for text in batch]
    for compiled in (False, True) if kernels.available() else (False,):  # the compiled loop and the joined text
        said = words_of(batch, compiled=compiled)
        docs = said.docs()
        got = [[said.distinct[c] for c, d in zip(said.codes.tolist(), docs.tolist(), strict=True) if d == i]
               for i in range(len(batch))]
        assert got == expected, compiled
        assert len(set(said.distinct)) == len(said.distinct)  # each distinct word once, with one code
        assert said.counts.tolist() == [len(w) for w in expected]


@settings(max_examples=200, deadline=None, derandomize=True, database=None)
@given(st.lists(st.lists(texts, max_size=10), min_size=1, max_size=4), st.sampled_from(["english", "none"]))
def test_postings_counted_by_the_compiled_loop_are_numpys(chunks: list[list[str]], language: str) -> None:
    if not kernels.available():
        pytest.skip("numba is not available here")
    gathered = {True: Postings(language), False: Postings(language)}
    for chunk in chunks:  # (chunk after chunk: documents numbered on, the vocabulary grown)
        for compiled, postings in gathered.items():
            postings.feed(words_of(chunk, compiled=False), compiled=compiled)
    fast, plain = gathered[True], gathered[False]
    assert fast.vocab == plain.vocab and fast.documents == plain.documents
    assert fast.lengths().tolist() == plain.lengths().tolist()
    got, expected = fast.postings(), plain.postings()
    assert [part.tolist() for part in got] == [part.tolist() for part in expected]


@settings(max_examples=200, deadline=None, derandomize=True, database=None)
@given(st.lists(st.tuples(st.integers(0, 30), st.integers(0, 40)), unique=True, max_size=200), st.integers(0, 5),
       st.booleans())
def test_a_block_s_slots_gathered_by_the_compiled_loop_are_numpys(pairs: list[tuple[int, int]], spare: int,
                                                                  shuffled: bool) -> None:
    # (term, slot) pairs, each term's in slot order, as gathered; or in any order, as a compaction lists them
    if not kernels.available():
        pytest.skip("numba is not available here")
    listed = pairs if shuffled else sorted(pairs)
    tids = np.array([t for t, _ in listed], np.int64)
    slots = np.array([d for _, d in listed], np.int64)
    tfs = np.arange(1, len(listed) + 1, dtype=np.int64)
    documents = 41 + spare  # (slots past the last listed: documents with no term)
    fast, plain = (Block.of(tids, slots, tfs, 31, documents, compiled=c) for c in (True, False))
    assert [part.tolist() for part in fast] == [part.tolist() for part in plain]
    assert all(fast.terms_of(d).tolist() == sorted(t for t, s in pairs if s == d) for d in range(documents))


def test_the_compiled_cut_tells_apart_many_words_with_the_same_letters() -> None:
    # (more distinct words than its first table holds, so it grows; and words of equal length and letters)
    batch = ["".join(p) + " " + "".join(reversed(p)) for p in itertools.permutations("abcdefg")]
    if not kernels.available():
        pytest.skip("numba is not available here")
    said = words_of(batch, compiled=True)
    assert len(said.distinct) == len({w for text in batch for w in words(text)}) == 5040
    assert [said.distinct[c] for c in said.codes.tolist()] == [w for text in batch for w in words(text)]


def test_time_flags_of_every_piece_and_pair_are_the_definitions() -> None:
    batch = [*PIECES, *(f"{a}{glue}{b}" for a, b in itertools.product(PIECES, repeat=2) for glue in (" ", ""))]
    expected = [_reference_time(text) for text in batch]
    assert [holds_time(text) for text in batch] == expected
    assert hold_times(batch, words_of(batch)).tolist() == expected
    kinds: dict[str, int] = {}  # (kept across chunks, as a load's gathering keeps it)
    chunks = [batch[start:start + 97] for start in range(0, len(batch), 97)]
    assert [flag for chunk in chunks for flag in hold_times(chunk, words_of(chunk), kinds).tolist()] == expected


@settings(max_examples=400, deadline=None, derandomize=True, database=None)
@given(st.lists(texts, max_size=12))
def test_time_flags_at_once_are_the_definitions(batch: list[str]) -> None:
    expected = [_reference_time(text) for text in batch]
    assert [holds_time(text) for text in batch] == expected
    assert hold_times(batch, words_of(batch)).tolist() == expected
    kinds: dict[str, int] = {}  # (kept across chunks, as a load's gathering keeps it)
    chunks = [batch[start:start + 3] for start in range(0, len(batch), 3)]
    assert [flag for chunk in chunks for flag in hold_times(chunk, words_of(chunk), kinds).tolist()] == expected


WORDS = ["paint", "painting", "sunrise", "the", "boat", "Klaus", "party", "2024", "café", "studies", "studied"]


@settings(max_examples=150, deadline=None, derandomize=True, database=None)
@given(st.lists(st.lists(st.sampled_from(WORDS), max_size=6).map(" ".join), min_size=1, max_size=30),
       st.lists(st.tuples(st.sampled_from(["add", "remove", "edit"]), st.integers(0, 50), st.integers(0, 10**6)),
                max_size=30),
       st.lists(st.sampled_from(WORDS), min_size=1, max_size=3), st.sampled_from([1, 2, 4096]),
       st.sampled_from([1, 3, 10_000]))
def test_a_bulk_loaded_index_equals_the_reference_after_any_writes(loaded: list[str], ops: list[tuple[str, int, int]],
                                                                  query: list[str], compact_after: int,
                                                                  chunk: int) -> None:
    vectors = StreamVectors()
    ids = list(range(1, len(loaded) + 1))
    vectors.append(ids, np.ones((len(ids), 3), np.float32), [5.0] * len(ids), [0.0] * len(ids), [0.0] * len(ids))
    # (in any order, as a load gives them; a chunk of 1 or 3: postings gathered over many chunks)
    vectors.index(ids[::-1], loaded[::-1], language="english", context=False, chunk=chunk)
    assert vectors.terms is not None
    vectors.terms.compact_after = compact_after  # 1-2: compactions folding the lists beside the block, often
    held = dict(zip(ids, loaded, strict=True))
    apply_writes(vectors, held, ops, WORDS, width=5)
    assert_scores_are_the_reference(vectors, held, " ".join(query))


sources = st.builds(
    Source, author=st.sampled_from([None, "Ann", "Bob", "Will"]), author_id=st.sampled_from([None, "1", "2"]),
    channel=st.sampled_from([None, "general", "random"]), channel_id=st.sampled_from([None, "10", "11"]),
    message_id=st.sampled_from([None, "m1", "m2", "m3", "m4", "m5"]),
    reply_to=st.sampled_from([None, "m1", "m2", "m3", "m9"]))


def _state(context: StreamContext, n: int, *, complete: bool = True) -> tuple[object, ...]:
    """What a query reads, and with `complete` (done first) what writes read."""
    authors = context.author[:n].tolist()  # codes are arbitrary: compare who shares one
    same = [[a == b and a >= 0 for b in authors] for a in authors]
    read = (same, [a >= 0 for a in authors], context.prev[:n].tolist(), context.next[:n].tolist(),
            context.parent[:n].tolist(), sorted(context._names.items()), context.unknown(), context.nbytes())
    if not complete:
        return read
    context.complete()
    return (*read, {k: sorted(v) for k, v in context._channels.items()}, sorted(context._name_of.items()),
            sorted(context._channel_of.items()), sorted(context._message_of.items()),
            sorted(context._by_message.items()), sorted(context._reply_of.items()),
            sorted((k, sorted(v)) for k, v in context._replies.items()), sorted(context._authored.items()))


@settings(max_examples=300, deadline=None, derandomize=True, database=None)
@given(st.lists(st.tuples(sources | st.none(), st.integers(0, 5)), min_size=1, max_size=90))
def test_sources_at_once_link_as_one_by_one(rows: list[tuple[Source | None, int]]) -> None:
    ids = [10 + 3 * i for i in range(len(rows))]
    created = [float(minute * 60) for _, minute in rows]  # (ties in time: ordered by id)
    given_sources = {i: s for i, (s, _) in zip(ids, rows, strict=True) if s is not None}
    one_by_one, at_once, by_load = StreamContext(), StreamContext(), StreamContext()
    for context in (one_by_one, at_once, by_load):
        context.add(0, ids, created, [""] * len(ids))
    for i in sorted(given_sources):  # below the bulk threshold: one memory at a time
        one_by_one.set_sources({i: given_sources[i]})
    one_by_one.set_sources({}, ids)
    at_once.set_sources(given_sources, ids)
    empty = Source()
    read = ids[::-1] if len(ids) % 2 else ids  # (a load reads them in time order: in any order of ids)
    by_load.load_sources(read, [tuple(vars(given_sources.get(i, empty)).values()) for i in read])
    assert by_load.incomplete() and _state(by_load, len(ids), complete=False) == _state(one_by_one, len(ids),
                                                                                          complete=False)
    expected = _state(one_by_one, len(ids))
    assert _state(at_once, len(ids)) == expected
    assert _state(by_load, len(ids)) == expected and not by_load.incomplete()


@settings(max_examples=200, deadline=None, derandomize=True, database=None)
@given(st.lists(st.tuples(sources | st.none(), st.integers(0, 5)), min_size=1, max_size=60),
       st.lists(st.tuples(st.sampled_from(["remove", "add"]), st.integers(0, 10**6), sources), max_size=8))
def test_writes_after_a_load_find_what_it_left_for_later(rows: list[tuple[Source | None, int]],
                                                         ops: list[tuple[str, int, Source]]) -> None:
    # A load leaves its maps by id for later (complete); a removal, a move or new sources complete them first.
    ids = [10 + 3 * i for i in range(len(rows))]
    created = [float(minute * 60) for _, minute in rows]
    given_sources = {i: s for i, (s, _) in zip(ids, rows, strict=True) if s is not None}
    reference, loaded = StreamContext(), StreamContext()
    for context in (reference, loaded):
        context.add(0, ids, created, [""] * len(ids))
    for i in sorted(given_sources):
        reference.set_sources({i: given_sources[i]})
    reference.set_sources({}, ids)
    loaded.load_sources(ids, [tuple(vars(given_sources.get(i, Source())).values()) for i in ids])
    held, fresh, wrote = list(ids), 10**6, False
    for op, k, source in ops:
        wrote = wrote or op == "add" or bool(held)
        if op == "remove" and held:  # as StreamVectors.remove does: the last row moves into the gap
            row = k % len(held)
            for context in (reference, loaded):
                context.remove(row, held[row])
                if row != len(held) - 1:
                    context.move(len(held) - 1, row, held[-1])
            held[row] = held[-1]
            held.pop()
        elif op == "add":
            fresh += 1
            for context in (reference, loaded):
                context.add(len(held), [fresh], [float(k % 400)], [""])
                context.set_sources({fresh: source})
            held.append(fresh)
        assert _state(loaded, len(held), complete=False) == _state(reference, len(held), complete=False)
    assert loaded.incomplete() == (not wrote)  # (what a query reads never needed it)
    assert _state(loaded, len(held)) == _state(reference, len(held))
