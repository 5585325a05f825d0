"""The importance rater: the Importance rating prompt, strict parsing, one retry, then a fallback."""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from typing import Protocol

from memstream.models.roles import Models
from memstream.prompts import load_prompt, one_line, tag_safe

__all__ = ["FALLBACK_IMPORTANCE", "FaultCounter", "Rater", "Rating", "parse_rating"]

log = logging.getLogger("memstream.rate")
FALLBACK_IMPORTANCE = 5
_INTEGER = re.compile(r"[+]?\d+")


@dataclass(frozen=True)
class Rating:
    """An importance and where it came from (`rater` or `fallback`)."""

    importance: int
    source: str


def parse_rating(reply: str) -> int | None:
    """An integer 1..10, white space around it allowed; anything else is None."""
    text = reply.strip()
    if not _INTEGER.fullmatch(text):
        return None
    value = int(text)
    return value if 1 <= value <= 10 else None


class FaultCounter(Protocol):
    """Where a degraded outcome is counted (the store: Store.count_fault)."""

    async def count_fault(self, stream: str, kind: str, count: int = 1) -> None:
        """Count `count` more of `kind` in `stream`."""


class Rater:
    """Rates an observation's poignancy for the persona; a fallback rating is counted in `faults`."""

    def __init__(self, models: Models, *, agent_name: str, faults: FaultCounter) -> None:
        self.models, self.agent_name, self.faults = models, agent_name, faults
        self.prompt = load_prompt("importance")

    def render(self, observation: str) -> str:
        """The rating prompt for one observation (the text cannot escape its <memory> tag)."""
        return self.prompt.render(agent_name=self.agent_name, observation=tag_safe(one_line(observation)))

    async def rate(self, observation: str, *, stream: str) -> Rating:
        """Two tries at a valid integer, then the fallback importance with a warning."""
        prompt = self.render(observation)
        replies = []
        for _ in range(2):
            reply = await self.models.complete("rater", prompt, stream=stream)
            value = parse_rating(reply)
            if value is not None:
                return Rating(value, "rater")
            replies.append(reply)
        log.warning("rater gave no integer 1..10 twice (%s); importance %d used as a fallback",
                    ", ".join(repr(r[:20]) for r in replies), FALLBACK_IMPORTANCE)
        await self.faults.count_fault(stream, "rating_fallback")
        return Rating(FALLBACK_IMPORTANCE, "fallback")
