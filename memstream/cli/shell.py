"""The chat shell's own parts: what the persona is doing while the user waits, and `/why`.

`/why` explains the last reply as the Discord context menu does: the memories its prompt held, each with its
score and the three parts the score is made of, and an insight's evidence down to the observations.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

from memstream.records import EvidenceNode, Memory
from memstream.render import short

if TYPE_CHECKING:  # the stream (numpy, the model clients) is loaded by the command that opens one
    from memstream.stream import MemoryStream, Reply

__all__ = ["STEPS", "spinner_wanted", "why_lines"]

# What MemoryStream.respond's steps look like to the person waiting.
STEPS = {"observing": "rating your message", "retrieving": "retrieving memories", "answering": "answering",
         "remembering": "remembering the reply"}


def spinner_wanted(json_output: bool) -> bool:
    """A spinner only for a person at a terminal: never into a pipe, a file or JSON output."""
    return not json_output and sys.stderr.isatty() and sys.stdout.isatty()


def _label(memory: Memory, width: int) -> str:
    kind = "insight" if memory.kind == "reflection" else memory.kind
    return (f"#{memory.id} {kind}, importance {memory.importance}, {memory.created_at:%Y-%m-%d %H:%M} UTC: "
            f"{short(memory.text, width)}")


def _evidence(node: EvidenceNode, depth: int) -> list[str]:
    lines = []
    for child in node.evidence:
        lines.append(f"{'     ' + '  ' * depth}↳ {_label(child.memory, 90 - 2 * depth)}")
        lines += _evidence(child, depth + 1)
    return lines


async def why_lines(memory: MemoryStream, reply: Reply | None) -> list[str]:
    """What the last reply was built from, with each memory's score breakdown."""
    if reply is None:
        return ["no reply yet: /why explains the persona's last reply"]
    found = await memory.explain_reply(trace_id=reply.trace_id)
    if found is None:
        return ["the last reply's trace is gone (a memory it rested on was forgotten since)"]
    c = memory.config
    lines = [f"asked: \"{short(found.trace.query, 100)}\"",
             f"score = {c.weight_recency:g} × recency + {c.weight_importance:g} × importance + {c.weight_relevance:g}"
             f" × relevance (profile {c.profile}; each part normalized to 0..1 over the stream)"]
    if not found.items:
        return [*lines, "the reply used no memory (none were stored yet)"]
    lines.append(f"{'':>2} {'score':>6} {'rec':>5} {'imp':>5} {'rel':>5}  memory")
    for n, (part, found_memory) in enumerate(found.items, 1):
        head = f"{n:>2} {part.score:6.3f} {part.recency:5.2f} {part.importance:5.2f} {part.relevance:5.2f}  "
        if found_memory is None:
            lines.append(head + f"#{part.memory_id} (forgotten since)")
            continue
        lines.append(head + _label(found_memory, 80))
        if found_memory.kind == "reflection":
            lines += _evidence(await memory.why(found_memory.id), 0)
    return lines
