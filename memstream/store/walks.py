"""What both backends do the same way on top of their own queries: the evidence tree of a memory, the set of
memories a deletion takes with it (the cascade's walk), and a reply's trace by its id or by a message."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, Protocol

from memstream.records import EvidenceNode, Memory, ReplyTrace
from memstream.store.rowmap import trace_from_row

__all__ = ["CascadeWalk", "EvidenceWalk", "TraceLookup", "links"]


class _Reads(Protocol):
    async def get(self, memory_id: int, *, stream: str | None = None) -> Memory: ...
    async def get_many(self, ids: Sequence[int]) -> dict[int, Memory]: ...
    async def evidence(self, reflection_id: int) -> list[int]: ...


class EvidenceWalk:
    """evidence_tree over a backend's get, get_many and evidence."""

    async def evidence_tree(self: _Reads, memory_id: int, *, stream: str | None = None) -> EvidenceNode:
        """A memory with its evidence, down to observations."""
        return await _tree(self, await self.get(memory_id, stream=stream), set())


async def _tree(store: _Reads, memory: Memory, seen: set[int]) -> EvidenceNode:
    if memory.kind != "reflection" or memory.id in seen:
        return EvidenceNode(memory)
    cited = await store.evidence(memory.id)
    found = await store.get_many(cited)
    children = [await _tree(store, found[i], seen | {memory.id}) for i in cited if i in found]
    return EvidenceNode(memory, tuple(children))


def links(rows: Iterable[Sequence[Any]]) -> dict[int, list[int]]:
    """(reflection id, cited id or None) rows, in citation order, as each reflection's list of what it cites
    (empty for a reflection citing nothing)."""
    out: dict[int, list[int]] = {}
    for reflection_id, memory_id in rows:
        cited = out.setdefault(int(reflection_id), [])
        if memory_id is not None:
            cited.append(int(memory_id))
    return out


class _Links(Protocol):
    async def _drop_traces(self, messages: Sequence[str], author: tuple[str, str] | None) -> set[int]: ...
    async def _citing(self, ids: set[int]) -> set[int]: ...
    async def _replies_to(self, ids: set[int]) -> set[int]: ...
    async def _replies_using(self, ids: set[int]) -> set[int]: ...


class CascadeWalk:
    """The memories a deletion takes, over a backend's link queries (each deletes the traces it follows)."""

    async def _doomed(self: _Links, ids: Iterable[int], messages: Sequence[str], author: tuple[str, str] | None,
                      keep: Iterable[int]) -> list[int]:
        """`ids`, every reflection citing one of them and every reply answering or built from one, transitively
        (and the replies to the traces of `messages` and `author`), less `keep`; in id order."""
        doomed: set[int] = set()
        frontier = set(ids) | await self._drop_traces(messages, author)
        while frontier:
            doomed |= frontier
            frontier = (await self._citing(frontier) | await self._replies_to(frontier)
                        | await self._replies_using(frontier)) - doomed
        return sorted(doomed - set(keep))


class _TraceRows(Protocol):
    async def _trace_of_message(self, message_id: str) -> int | None: ...
    async def _trace_row(self, trace_id: int) -> Sequence[Any] | None: ...


class TraceLookup:
    """trace over a backend's two lookups: the trace of a message, and a trace's row (rowmap.TRACE_COLUMNS)."""

    async def trace(self: _TraceRows, *, trace_id: int | None = None,
                    message_id: str | None = None) -> ReplyTrace | None:
        """A reply trace by its id or by the Discord message id of any part of the reply."""
        if trace_id is None and message_id is not None:
            trace_id = await self._trace_of_message(message_id)
        if trace_id is None:
            return None
        row = await self._trace_row(trace_id)
        return None if row is None else trace_from_row(row)
