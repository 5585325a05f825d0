"""The flat-rater alarm: the spec's *miscalibrated importance* ("the rater scores everything 5", and retrieval
falls back to recency and relevance alone), noticed from the ratings the store holds.

The rule: over the latest `window` observations the rater rated (StreamConfig.rater_alarm_window, 50 by
default; 0 switches the alarm off), the ratings are flat when their standard deviation is below SPREAD (0.5)
or one value makes up SHARE (90%) of them or more. Given, derived (reflections) and fallback importance are not
the rater's and are not counted. Fewer ratings than the window: no verdict yet.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence

from memstream.records import RaterCheck

__all__ = ["MIN_WINDOW", "SHARE", "SPREAD", "rater_check"]

SPREAD = 0.5  # a standard deviation below this: the ratings barely move
SHARE = 0.9  # one value this often or more: the rater gives one answer
MIN_WINDOW = 20  # the smallest window the persona file accepts (statistics of fewer ratings are noise)


def rater_check(ratings: Sequence[int], window: int) -> RaterCheck | None:
    """The verdict on the latest ratings (newest first; only the first `window` count); None when off."""
    if window <= 0:
        return None
    latest = [int(r) for r in ratings[:window]]
    if not latest:
        return RaterCheck(0, window, 0.0, None, 0.0, flat=False)
    mean = sum(latest) / len(latest)
    spread = math.sqrt(sum((r - mean) ** 2 for r in latest) / len(latest))
    value, count = min(Counter(latest).items(), key=lambda item: (-item[1], item[0]))
    share = count / len(latest)
    flat = len(latest) >= window and (spread < SPREAD or share >= SHARE)
    return RaterCheck(len(latest), window, spread, value, share, flat=flat)
