"""What a text says besides its words, for the `hybrid` profile: who a query names, whether it asks "when",
whether a memory holds a time, and where a memory was said.

Plain rules, the same for the fast path (context.py, hybrid.py) and the reference (hybrid.rank_hybrid_reference):

- A query names a person who wrote in the stream by a Discord mention of them (`<@id>`, `<@!id>`), or by a
  display name the store knows for them: the whole name, or its first word, as words of the query (any case).
  A name word that is a common word ("Will", "May", a stop word) or shorter than 3 letters counts only as
  written in the name, capital and all.
- A query asks "when" if it holds "when", or "what"/"which" + year, month, day, date or time, or "how long".
  English only: a persona in another language gets no time cue.
- A memory holds a time if it holds a time word (yesterday, last week, Monday, March, ...), a year, a clock
  time, an ordinal day or a date written with slashes.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

import numpy as np
import numpy.typing as npt

from memstream.index.words import STOP_WORDS, Words, words
from memstream.records import Source

__all__ = ["asks_when", "author_key", "channel_key", "hold_times", "holds_time", "named"]

_WORD = re.compile(r"[^\W_]+")
_MENTION = re.compile(r"<@!?(\d+)>")
_DIGIT = re.compile(r"\d")
_CENTURIES = frozenset({"18", "19", "20"})
_TIME_TEXT = """
yesterday today tonight tomorrow ago recently earlier later lately soon week weeks weekend weekends month months
year years day days morning afternoon evening night nights last next ago monday tuesday wednesday thursday friday
saturday sunday january february march april june july august september october november december spring summer
autumn fall winter birthday anniversary holiday holidays christmas
"""
TIME_WORDS = frozenset(_TIME_TEXT.split())
# a year, a clock time, an ordinal day or a time of day, a date with slashes; "May" only next to a day
_TIME_PATTERN = re.compile(r"\b(?:1[89]\d\d|20\d\d)s?\b|\b\d{1,2}:\d\d\b|\b\d{1,2}(?:st|nd|rd|th|am|pm)\b"
                           r"|\b\d{1,2}/\d{1,2}(?:/\d{2,4})?\b|\bMay \d|\d May\b", re.IGNORECASE)
_UNITS = frozenset({"year", "years", "month", "months", "day", "days", "date", "time", "week", "weeks"})
_COMMON_NAMES = frozenset({"will", "may", "mark", "bill", "rose", "grace", "joy", "faith", "hope", "art", "sky"})


def holds_time(text: str) -> bool:
    """Whether a memory's text holds a date or a time word."""
    return not TIME_WORDS.isdisjoint(words(text)) or _holds_date(text)


def hold_times(texts: Sequence[str], said: Words, kinds_of: dict[str, int] | None = None) -> npt.NDArray[np.bool_]:
    """holds_time of each text, given their words (words.words_of), at once: each distinct word is looked at
    once (`kinds_of`: what words seen before are, kept across calls), and the date pattern is searched only in the
    texts holding a word it could match."""
    if kinds_of is None:
        kinds = [_kind(word) for word in said.distinct]
    else:
        for word in set(said.distinct).difference(kinds_of):
            kinds_of[word] = _kind(word)
        kinds = list(map(kinds_of.__getitem__, said.distinct))
    kind = np.asarray(kinds, np.int8)[said.codes]
    docs = said.docs()
    timed = np.zeros(len(texts), np.bool_)
    timed[docs[kind == 1]] = True
    maybe = np.zeros(len(texts), np.bool_)
    maybe[docs[kind == 2]] = True
    for i in np.flatnonzero(maybe & ~timed).tolist():
        timed[i] = _TIME_PATTERN.search(texts[i]) is not None
    return timed


def _kind(word: str) -> int:
    """1: a time word; 2: a word the date pattern could match within; 0: neither."""
    return 1 if word in TIME_WORDS else 2 if _may_date(word) else 0


def _holds_date(text: str) -> bool:
    # The date pattern costs ~7 us a text: searched only where _may_date says it could match.
    if _DIGIT.search(text) is None and "may" not in text.lower():
        return False
    return any(map(_may_date, words(text))) and _TIME_PATTERN.search(text) is not None


def _may_date(word: str) -> bool:
    """Whether the date pattern could match within this word (lower-cased, words.words): every match of it holds
    a run of 1-2 digits (a clock time, an ordinal, a date), a run of 4 digits from 18, 19 or 20 (a year), or the
    word "may". A word of ASCII digits only is its own run; any other word with a digit may hold one."""
    if word.isalpha():
        return word == "may"
    if word.isascii() and word.isdigit():
        return len(word) <= 2 or (len(word) == 4 and word[:2] in _CENTURIES)
    return True


def asks_when(query: str) -> bool:
    """Whether a query asks when something happened (English)."""
    said = _WORD.findall(query.lower())
    for i, word in enumerate(said):
        if word == "when":
            return True
        following = said[i + 1] if i + 1 < len(said) else ""
        if (word in ("what", "which") and following in _UNITS) or (word == "how" and following == "long"):
            return True
    return False


def author_key(source: Source) -> str | None:
    """Who wrote a memory: the author's id, else their name (None: nobody known)."""
    if source.author_id:
        return source.author_id
    return f"name:{source.author}" if source.author else None


def channel_key(source: Source) -> str | None:
    """Where a memory was said: the channel's (or thread's, or DM's) id, else its name (None: nowhere known)."""
    if source.channel_id:
        return source.channel_id
    return f"name:{source.channel}" if source.channel else None


def named(query: str, people: Iterable[tuple[str, str]]) -> set[str]:
    """The author keys among `people` ((author key, display name) pairs) that the query names."""
    mentioned = set(_MENTION.findall(query))
    raw = _WORD.findall(_MENTION.sub(" ", query))
    lower = [word.lower() for word in raw]
    found = set()
    for key, name in people:
        if key in mentioned or _says(raw, lower, _WORD.findall(name)):
            found.add(key)
    return found


def _says(raw: list[str], lower: list[str], name: list[str]) -> bool:
    """Whether the query's words hold the name, or its first word, by the rule above."""
    if not name:
        return False
    forms = [name] if len(name) == 1 else [name, name[:1]]
    for form in forms:
        if len(form) == 1 and _common(form[0]):
            if form[0] in raw:
                return True
        elif _within(lower, [word.lower() for word in form]):
            return True
    return False


def _common(word: str) -> bool:
    low = word.lower()
    return len(low) < 3 or low in STOP_WORDS or low in _COMMON_NAMES


def _within(words: list[str], part: list[str]) -> bool:
    size = len(part)
    return any(words[i:i + size] == part for i in range(len(words) - size + 1))
