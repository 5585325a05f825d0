"""The words of a text and the terms they are indexed by: lower-cased runs of letters and digits, each reduced to
its stem by the Snowball stemmer of the persona's language (English stop words left out), for the lexical
index (lexical.py, postings.py) and the time cue (cues.py), which read a text's words once between them.

A stream's load reads the words of all its texts at once (words_of): by the compiled loop once it is loaded
(_word_loops.py: ~0.7 us a text, ASCII or not, and a string made only for each distinct word), else by one
pattern or split over the texts joined (~2.5 us a text; ~4.5 with text beyond ASCII).
"""

from __future__ import annotations

import re
import string
from collections.abc import Sequence
from itertools import chain
from typing import NamedTuple

import numpy as np
import numpy.typing as npt

from memstream.index import _kernels as kernels
from memstream.store.arrays import I64

__all__ = ["STOP_WORDS", "Words", "stems", "terms", "words", "words_of"]

_WORD = re.compile(r"[^\W_]+")
# In ASCII text the words are the runs of [a-z0-9] once lower-cased: every other character splits them.
_ASCII_BREAKS = str.maketrans({c: " " for c in map(chr, range(128)) if c not in string.ascii_lowercase + string.digits})
# Between the texts of a chunk read at once: a word no text of the chunk holds (checked).
_SEPARATOR = "0sep0"
_MEMO_WORDS = 1_000_000  # per language: the words seen, each with its term (None: a stop word)
# Per code point: whether words are made of it (str.isalnum, as the pattern's [^\W_]), for the compiled loop; beyond
# ASCII, filled in as code points are met (`_met`).
_ASCII_WORDY = np.array([chr(c).isalnum() for c in range(128)], np.uint8)
_WORDY = np.zeros(0x110000, np.uint8)
_WORDY[:128] = _ASCII_WORDY
_met = np.zeros(0x110000, np.bool_)
_met[:128] = True
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


def words(text: str) -> list[str]:
    """The words of a text: its lower-cased runs of letters and digits, in order."""
    return _WORD.findall(text.lower())


def terms(text: str, language: str = "english") -> list[str]:
    """The indexed terms of a text, in order (stop words left out)."""
    rule = stems(language)
    out = []
    for word in words(text):
        term = rule.term(word)
        if term is not None:
            out.append(term)
    return out


class Words(NamedTuple):
    """The words of many texts: each distinct word once, and the texts' words in order as codes into them, with
    how many words each text has."""

    distinct: list[str]
    codes: I64
    counts: I64

    def docs(self) -> I64:
        """The text of each word."""
        return np.repeat(np.arange(len(self.counts), dtype=np.int64), self.counts)


def words_of(texts: Sequence[str], compiled: bool | None = None) -> Words:
    """The words of many texts at once, as words() gives them text by text. `compiled`: by the compiled loop or
    not (default: the loop once loaded); the same words either way."""
    if compiled if compiled is not None else kernels.ready():
        return _cut(texts)
    n = len(texts)
    joined = f"\n{_SEPARATOR}\n".join(texts).lower()  # (newlines: no word runs across a join, nor cases change)
    if n == 0 or joined.count(_SEPARATOR) != n - 1:  # a text holds the separator: text by text
        said = [words(text) for text in texts]
        return _coded(list(chain.from_iterable(said)), np.fromiter(map(len, said), np.int64, n))
    joint = joined.translate(_ASCII_BREAKS).split() if joined.isascii() else _WORD.findall(joined)
    distinct = list(set(joint))
    code = {word: i for i, word in enumerate(distinct)}
    codes = np.fromiter(map(code.__getitem__, joint), np.int64, len(joint))
    apart = code[_SEPARATOR] if n > 1 else -1
    breaks = np.flatnonzero(codes == apart)  # the separators: n - 1 of them, none in a text (counted above)
    counts = np.diff(np.concatenate(([-1], breaks, [len(joint)]))) - 1
    if n > 1:
        distinct[apart] = distinct[-1]  # the separator's code given to the last word, and the separator gone
        codes[codes == len(distinct) - 1] = apart
        distinct.pop()
        codes = np.delete(codes, breaks)
    return Words(distinct, codes, counts.astype(np.int64))


def _cut(texts: Sequence[str]) -> Words:
    """words_of by the compiled loop: the texts lower-cased one by one (as words() does: the final sigma is a
    text's own), joined with a newline after each."""
    lowered = [text.lower() for text in texts]
    joined = "\n".join(lowered) + "\n"
    ends = np.cumsum(np.fromiter(map(len, lowered), np.int64, len(lowered)) + 1)
    if joined.isascii():
        chars: npt.NDArray[np.integer] = np.frombuffer(joined.encode("ascii"), np.uint8)
        wordy = _ASCII_WORDY
    else:
        chars = np.frombuffer(joined.encode("utf-32-le", "surrogatepass"), np.uint32)
        for code in np.unique(chars[chars >= 128]).tolist():
            if not _met[code]:
                _WORDY[code] = chr(code).isalnum()
                _met[code] = True  # (after the flag: a thread that sees it met sees the flag)
        wordy = _WORDY
    codes, counts, first, last = kernels.loops()["cut_words"](chars, ends, wordy)
    distinct = [joined[a:b] for a, b in zip(first.tolist(), last.tolist(), strict=True)]
    return Words(distinct, codes, counts)


def _coded(flat: list[str], counts: I64) -> Words:
    distinct = list(set(flat))
    code = {word: i for i, word in enumerate(distinct)}
    return Words(distinct, np.fromiter(map(code.__getitem__, flat), np.int64, len(flat)), counts)
