"""A loading stream's texts, read for its lexical index and context as the load gets them (Gathering).

A stream loaded by reader processes (memstream.store.readers) comes a chunk of rows at a time: each chunk's words
are cut, counted into postings (postings.py) and looked at for times (cues.py) while the readers read the next,
so that what is left once the rows are in is to seal the postings and link the sources. StreamVectors.index
takes what was gathered and reads the texts the load did not hand over so.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from memstream.index.cues import hold_times
from memstream.index.postings import Postings
from memstream.index.words import words_of

__all__ = ["Gathering"]


class Gathering:
    """The postings (stemmed in `language`; None: no lexical index) and, with `context`, the time flags of the
    texts fed so far: rows 0 .. rows - 1 of a stream's load, in row order."""

    def __init__(self, language: str | None, context: bool) -> None:
        self.language, self.context = language, context
        self.postings = Postings(language) if language is not None else None
        self.rows = 0
        self._texts: list[str] = []
        self._timed: list[npt.NDArray[np.bool_]] = []
        self._kinds: dict[str, int] = {}  # the words seen, for the time flags (cues.hold_times)

    def feed(self, texts: Sequence[str]) -> None:
        """The texts of the next rows."""
        said = words_of(texts)
        if self.postings is not None:
            self.postings.feed(said)
        if self.context:
            self._timed.append(hold_times(texts, said, self._kinds))
        self._texts.extend(texts)
        self.rows += len(texts)

    def fed(self, texts: Sequence[str]) -> bool:
        """Whether what was fed is the start of `texts`, the very strings (a load that started over in another
        way, after a failure, gives others: what was gathered from them is not used)."""
        return self.rows <= len(texts) and all(map(operator.is_, self._texts, texts[:self.rows]))

    def timed(self) -> npt.NDArray[np.bool_]:
        """Whether each text fed holds a time (cues.holds_time)."""
        return np.concatenate(self._timed) if self._timed else np.zeros(0, np.bool_)
