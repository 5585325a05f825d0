"""Edits and deletions of Discord messages, applied to the memory until they are in.

A change the store cannot take now (a full disk, a lock held too long, the database server away) waits here and
is tried again, in order, with memstream's one retry formula, until it is in: the newest change of a message
replaces an older one waiting, a deletion wins over an edit. A change the store refuses for good (text that
cannot be stored, a memory that is gone) is dropped with one log line: retrying it would change nothing.
Nothing here knows Discord: the observe cog hands changes in by message id.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

from memstream import MemoryNotFound, MemoryStream, MemstreamError, StoreError
from memstream.ingest import retry_delay

__all__ = ["Changes", "Edit", "lasting"]

log = logging.getLogger("bot.changes")
RETRY = 1.0  # seconds before the first retry, doubling up to RETRY_CAP
RETRY_CAP = 60.0


@dataclass(frozen=True)
class Edit:
    """A message's new text, for its stream."""

    stream: str
    text: str


def lasting(exc: MemstreamError) -> bool:
    """Whether the store's refusal will not change by trying again: bad text (ConfigError), a memory that is gone;
    a store that cannot write now (full, locked, away, damaged until repaired) is tried again."""
    return isinstance(exc, MemoryNotFound) or not isinstance(exc, StoreError)


class Changes:
    """The edits and deletions the store could not take yet, retried by `run` until they are in."""

    def __init__(self, memory: MemoryStream, *, retry: float = RETRY, cap: float = RETRY_CAP) -> None:
        self.memory = memory
        self.retry, self.cap = retry, cap
        self.waiting: OrderedDict[str, Edit | None] = OrderedDict()  # message id -> its edit; None: deleted
        self.failures = 0  # in a row
        self.retrying = False
        self.wake = asyncio.Event()
        self.applying = 0  # changes being applied now
        self._still = asyncio.Event()  # set while none is
        self._still.set()

    async def edit(self, message_id: str, edit: Edit) -> None:
        """Apply an edit now, or keep it to be tried again if the store cannot take it now."""
        if self.waiting or self.retrying:  # the store is failing: the change waits its turn, in order
            _merge(self.waiting, {message_id: edit})
            return
        await self._apply({message_id: edit})

    async def delete(self, message_ids: Sequence[str]) -> None:
        """Forget the memories of deleted messages now, or keep the deletion to be tried again."""
        changes: dict[str, Edit | None] = dict.fromkeys(message_ids)
        if self.waiting or self.retrying:
            _merge(self.waiting, changes)
            return
        await self._apply(changes)

    async def run(self) -> None:
        """Try the waiting changes again until they are all in (a task for the bot's lifetime)."""
        while True:
            await self.wake.wait()
            self.wake.clear()
            while self.waiting:
                await asyncio.sleep(retry_delay(self.failures, base=self.retry, cap=self.cap))
                changes, self.waiting = self.waiting, OrderedDict()
                self.retrying = True
                try:
                    await self._apply(changes, again=True)
                finally:
                    self.retrying = False

    async def still(self) -> None:
        """Wait until no change is being applied (a stop: the memory must outlive the changes at work)."""
        await self._still.wait()

    def settled(self) -> bool:
        """Whether nothing waits (and no retry is under way)."""
        return not self.waiting and not self.retrying

    def unsettled(self) -> str:
        """What is waiting, for the log of a stop."""
        return f"{len(self.waiting)} edit(s) or deletion(s) the store could not take were not applied" \
            if self.waiting else ""

    async def _apply(self, changes: dict[str, Edit | None], *, again: bool = False) -> None:
        self.applying += 1
        self._still.clear()
        try:
            await self._apply_now(changes, again=again)
        finally:
            self.applying -= 1
            if not self.applying:
                self._still.set()

    async def _apply_now(self, changes: dict[str, Edit | None], *, again: bool) -> None:
        steps = _steps(changes)
        for index, (keys, edit) in enumerate(steps):
            try:
                if edit is None:
                    await self._forget(keys)
                else:
                    await self._edit(keys[0], edit)
            except MemstreamError as exc:
                if not lasting(exc):
                    self._keep(changes, [k for later, _ in steps[index:] for k in later], exc)
                    return
                log.warning("the %s of message(s) %s is dropped: the store refuses it for good (%s)",
                            "edit" if edit else "deletion", ", ".join(keys), exc)
            except Exception:
                log.exception("the %s of message(s) %s failed; it is dropped", "edit" if edit else "deletion",
                              ", ".join(keys))
        if again and self.failures:
            log.warning("storing edits and deletions works again")
        self.failures = 0

    async def _forget(self, keys: list[str]) -> None:
        gone = await self.memory.forget_messages(keys)
        if gone:
            log.info("forgot %d memory(ies) for %d deleted message(s)", len(gone), len(keys))

    async def _edit(self, key: str, edit: Edit) -> None:
        memory = await self.memory.edit_message(edit.stream, key, edit.text)
        if memory is None:  # common (a message from before the persona came, a bot's): not worth more than DEBUG
            log.debug("the edit of message %s changes nothing: no memory was made from it (never stored, or "
                      "forgotten)", key)
        elif memory.status == "pending":
            log.info("the edit of message %s is stored, its old text gone; the memory waits for the models "
                     "(retried with backoff) before it is recalled again", key)

    def _keep(self, changes: dict[str, Edit | None], left: list[str], exc: MemstreamError) -> None:
        """Put what is left back at the head of the waiting changes (a change that came meanwhile is newer)."""
        if self.failures == 0:
            log.warning("could not store %d edit(s) or deletion(s) now; they are kept and tried again every %d s at "
                        "most: %s", len(left), round(self.cap), exc)
        self.failures += 1
        newer, self.waiting = self.waiting, OrderedDict((k, changes[k]) for k in left)
        _merge(self.waiting, newer)
        self.wake.set()


def _merge(waiting: OrderedDict[str, Edit | None], changes: dict[str, Edit | None]) -> None:
    """Newer changes into the waiting ones: the newest edit of a message wins, and a deletion over any edit."""
    for key, change in changes.items():
        if key in waiting and waiting[key] is None:
            continue
        waiting[key] = change


def _steps(changes: dict[str, Edit | None]) -> list[tuple[list[str], Edit | None]]:
    """The changes in order, consecutive deletions as one step (one transaction)."""
    steps: list[tuple[list[str], Edit | None]] = []
    for key, change in changes.items():
        if change is None and steps and steps[-1][1] is None:
            steps[-1][0].append(key)
        else:
            steps.append(([key], change))
    return steps
