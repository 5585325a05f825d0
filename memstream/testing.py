"""Public fakes for tests: a fake clock, a deterministic embedder and a scripted chat model.

They are part of the library so that users' tests can use them too; pass them through constructors.
"""

from __future__ import annotations

import hashlib
import math
import re
from collections.abc import AsyncGenerator, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

import numpy as np
import numpy.typing as npt

from memstream.errors import CompletionError
from memstream.models.llm import Completion

__all__ = ["FakeClock", "FakeEmbedder", "ScriptedChat", "hash_embedding"]

_WORD = re.compile(r"[a-z0-9']+")
_PIECE = re.compile(r"\s*\S+|\s+")


def hash_embedding(text: str, dim: int = 64) -> list[float]:
    """A deterministic unit vector: hashed bag of lower-cased words (texts sharing words are similar)."""
    vec = [0.0] * dim
    words = _WORD.findall(text.lower())
    for word in words:
        digest = hashlib.blake2b(word.encode(), digest_size=8).digest()
        index = int.from_bytes(digest[:4], "little") % dim
        vec[index] += 1.0 if digest[4] & 1 else -1.0
    norm = math.sqrt(sum(v * v for v in vec))
    if norm == 0.0:
        # No words: a fixed direction derived from the raw text, so every input embeds.
        digest = hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=8).digest()
        vec[int.from_bytes(digest[:4], "little") % dim] = 1.0
        return vec
    return [v / norm for v in vec]


class FakeClock:
    """A clock that only moves when told to."""

    def __init__(self, start: datetime | None = None) -> None:
        self._now = start or datetime(2023, 2, 13, 8, 0, tzinfo=UTC)
        if self._now.tzinfo is None:
            self._now = self._now.replace(tzinfo=UTC)

    def now(self) -> datetime:
        """The fake current time."""
        return self._now

    def set(self, moment: datetime) -> None:
        """Jump to a moment (naive means UTC)."""
        self._now = moment if moment.tzinfo else moment.replace(tzinfo=UTC)

    def advance(self, **delta: float) -> datetime:
        """Move forward by timedelta keywords (hours=3, days=1, ...); returns the new time."""
        self._now += timedelta(**delta)
        return self._now


class FakeEmbedder:
    """Deterministic embeddings (hash_embedding), with fixed vectors for chosen texts; counts calls."""

    def __init__(self, dim: int = 64, fixed: dict[str, Sequence[float]] | None = None) -> None:
        self.dim = dim
        self.fixed = dict(fixed or {})
        self.calls: list[list[str]] = []
        self.fail_with: Exception | None = None

    async def embed_batch(self, texts: Sequence[str]) -> npt.NDArray[np.float32]:
        """One row per text."""
        self.calls.append(list(texts))
        if self.fail_with is not None:
            raise self.fail_with
        rows = [list(self.fixed[t]) if t in self.fixed else hash_embedding(t, self.dim) for t in texts]
        return np.asarray(rows, dtype=np.float32).reshape(len(texts), self.dim)


Responder = Callable[[str, str], str]


@dataclass
class ScriptedChat:
    """A ChatModel that answers by rules: the first rule whose needle is in the prompt answers.

    A rule's answer is a string, a list of strings (used in turn, the last one repeating), or a function
    of (prompt, model). Every call is recorded in `calls` as (model, prompt). It streams too (`stream`: a word
    at a time); with `cut_after` a stream breaks after that many words, as a dropped connection does.
    """

    rules: list[tuple[str, str | list[str] | Responder]] = field(default_factory=list)
    default: str = "OK"
    calls: list[tuple[str, str]] = field(default_factory=list)
    fail_with: Exception | None = None
    cut_after: int | None = None
    _used: dict[int, int] = field(default_factory=dict)

    def on(self, needle: str, answer: str | list[str] | Responder) -> ScriptedChat:
        """Add a rule (earlier rules win); returns self for chaining."""
        self.rules.append((needle, answer))
        return self

    def calls_with(self, needle: str) -> list[str]:
        """The prompts of the calls that contained `needle`."""
        return [prompt for _, prompt in self.calls if needle in prompt]

    async def complete(self, prompt: str, *, model: str) -> Completion:
        """Answer by the first matching rule."""
        self.calls.append((model, prompt))
        if self.fail_with is not None:
            raise self.fail_with
        for index, (needle, answer) in enumerate(self.rules):
            if needle in prompt:
                return Completion(self._answer(index, answer, prompt, model), len(prompt.split()), 1)
        return Completion(self.default, len(prompt.split()), 1)

    async def stream(self, prompt: str, *, model: str) -> AsyncGenerator[str | Completion, None]:
        """The answer `complete` gives, a word (with the space before it) at a time, then the Completion."""
        done = await self.complete(prompt, model=model)
        for n, piece in enumerate(_PIECE.findall(done.text)):
            if self.cut_after is not None and n >= self.cut_after:
                raise CompletionError("the scripted stream broke off", retryable=True)
            yield piece
        yield done

    def _answer(self, index: int, answer: str | list[str] | Responder, prompt: str, model: str) -> str:
        if isinstance(answer, str):
            return answer
        if isinstance(answer, list):
            used = self._used.get(index, 0)
            self._used[index] = used + 1
            return answer[min(used, len(answer) - 1)]
        return answer(prompt, model)


def scores_of(items: Iterable[object]) -> list[float]:
    """The scores of ScoredMemory-like items (a helper for assertions)."""
    return [float(item.score) for item in items]  # type: ignore[attr-defined]
