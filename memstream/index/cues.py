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
from collections.abc import Iterable

from memstream.index.lexical import STOP_WORDS
from memstream.records import Source

__all__ = ["asks_when", "author_key", "channel_key", "holds_time", "named"]

_WORD = re.compile(r"[^\W_]+")
_MENTION = re.compile(r"<@!?(\d+)>")
_DIGIT = re.compile(r"\d")
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
    if not TIME_WORDS.isdisjoint(_WORD.findall(text.lower())):
        return True
    return _DIGIT.search(text) is not None and _TIME_PATTERN.search(text) is not None  # (every pattern has a digit)


def asks_when(query: str) -> bool:
    """Whether a query asks when something happened (English)."""
    words = _WORD.findall(query.lower())
    for i, word in enumerate(words):
        if word == "when":
            return True
        following = words[i + 1] if i + 1 < len(words) else ""
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
