"""A reply as the agent model writes it: its text piece by piece, then stored once, as it was shown."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

from memstream.errors import ProviderError
from memstream.records import Memory, ScoredMemory

__all__ = ["Reply", "ReplyDraft"]


@dataclass(frozen=True)
class Reply:
    """A persona's reply and what it was built from; `cut` if it broke off (or was stopped) before its end."""

    text: str
    prompt: str
    memories: list[ScoredMemory]
    trace_id: int
    memory: Memory | None
    cut: bool = False


# Stores a reply's text (and whether it was cut) with its trace, in one transaction.
SaveReply = Callable[[str, bool], Awaitable[Reply]]


class ReplyDraft:
    """A reply being written: `async for piece in draft.deltas()` shows it as it comes, then
    `await draft.finish()` stores it and its trace (exactly what `respond` stores for a whole reply).

    A model that fails before any text raises its ProviderError from `deltas`; one that breaks off after some
    text ends `deltas` quietly, with the error in `cut`: what came is the reply (the reader is told it was cut).
    """

    def __init__(self, pieces: AsyncGenerator[str, None], save: SaveReply, *, prompt: str,
                 memories: list[ScoredMemory]) -> None:
        self._pieces, self._save = pieces, save
        self.prompt, self.memories = prompt, memories
        self.text = ""  # what came so far, without the whitespace before its first word
        self.cut: ProviderError | None = None
        self.ended = False  # the model came to the end of its reply
        self.reply: Reply | None = None

    async def deltas(self) -> AsyncIterator[str]:
        """The reply's text as the model sends it (the first piece starts at a word)."""
        try:
            async for piece in self._pieces:
                if not self.text:
                    piece = piece.lstrip()
                if piece:
                    self.text += piece
                    yield piece
            self.ended = True
        except ProviderError as exc:
            if not self.text.strip():
                raise
            self.cut = exc

    async def close(self) -> None:
        """Stop asking the model (what came so far stays in `text`)."""
        with contextlib.suppress(RuntimeError):  # already running elsewhere: it is being stopped there
            await self._pieces.aclose()

    async def finish(self, shown: str | None = None) -> Reply:
        """Store the reply and its trace, once: `shown`, what the reader saw where that is less than what came
        (a send failed, or the reader stopped it), else all that came. Less than the whole reply is a cut one."""
        if self.reply is None:
            await self.close()
            text = (self.text if shown is None else shown).strip()
            self.reply = await self._save(text, not self.ended or text != self.text.strip())
        return self.reply
