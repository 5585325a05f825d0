"""Everything the bot shows, as text: reply splitting, memories, rankings, evidence trees."""

from __future__ import annotations

import re
from collections.abc import Sequence
from zoneinfo import ZoneInfo

from memstream import EvidenceNode, Memory, ScoredMemory
from memstream.render import short

__all__ = ["LIMIT", "evidence_lines", "fit", "jump_link", "memory_line", "ranking_lines", "split_message"]

LIMIT = 2000
FENCE = "```"
_FENCE = re.compile(r"```([\w+#.-]*)")


def split_message(text: str, limit: int = LIMIT) -> list[str]:
    """Parts of at most `limit` characters, cut at line or word ends; a code block cut in two is closed
    at the end of one part and reopened (same language) at the start of the next."""
    parts: list[str] = []
    rest = text
    opener = ""  # the fence line of a code block still open at the start of `rest`
    while rest:
        budget = limit - len(opener) - len(FENCE) - 2
        if len(opener) + len(rest) <= limit:
            parts.append(opener + rest)  # the rest fits: as it is (a fence the text leaves open stays open)
            break
        cut = _cut(rest, budget)
        piece, rest = opener + rest[:cut], rest[cut:]
        if rest[:1] == "\n":
            rest = rest.lstrip("\n")
        elif rest[:1] == " ":  # cut at a word end: the space becomes the break, it starts no part
            rest = rest[1:]
        still_open = _open_fence(piece)
        if still_open is not None:
            piece = piece.rstrip("\n") + "\n" + FENCE
            opener = still_open + "\n"
        else:
            opener = ""
        if piece.strip():
            parts.append(piece)
        if not rest.strip():
            break
    return parts or [""]


def _cut(text: str, budget: int) -> int:
    if len(text) <= budget:
        return len(text)
    window = text[:budget]
    for sep in ("\n", " "):
        at = window.rfind(sep)
        if at > budget // 2:
            return at
    cut = budget
    while cut > 1 and text[cut - 1] == "`":  # never cut through a fence
        cut -= 1
    return cut


def _open_fence(text: str) -> str | None:
    """The opening fence (e.g. ```python) if `text` ends inside a code block.

    Every ``` toggles a block, as Discord renders them, wherever it stands on the line.
    """
    opener = None
    for match in _FENCE.finditer(text):
        if opener is None:
            language = match.group(1) if text[match.end():match.end() + 1] == "\n" else ""
            opener = FENCE + language
        else:
            opener = None
    return opener


def jump_link(guild_id: int | None, channel_id: str | None, message_id: str | None) -> str | None:
    """A link that opens a Discord message."""
    if not channel_id or not message_id:
        return None
    return f"https://discord.com/channels/{guild_id or '@me'}/{channel_id}/{message_id}"


def _when(memory: Memory, tz: ZoneInfo) -> str:
    """Discord's timestamp markup: each viewer sees the time in their own zone, labelled by their client
    (the persona's zone, `tz`, is for its prompts, not for people reading a command's answer)."""
    return f"<t:{int(memory.created_at.timestamp())}:f>"


def _short(text: str, width: int) -> str:
    """One line, cut to `width`; backticks made quotes (they would open code in Discord's markup)."""
    return short(text.replace("`", "'"), width)


def memory_line(memory: Memory, tz: ZoneInfo, guild_id: int | None = None, width: int = 160) -> str:
    """One memory: its number in its stream (never the global id: a server learns nothing of the others), kind,
    importance, time, text, and a jump link where it came from a message."""
    link = jump_link(guild_id, memory.source.channel_id, memory.source.message_id)
    kind = "insight" if memory.kind == "reflection" else "obs"
    tail = f" [jump]({link})" if link else ""
    number = memory.number if memory.number is not None else "?"
    return f"`#{number}` {kind} · imp {memory.importance} · {_when(memory, tz)} — {_short(memory.text, width)}{tail}"


def evidence_lines(node: EvidenceNode, tz: ZoneInfo, guild_id: int | None = None, depth: int = 0) -> list[str]:
    """An evidence tree, indented by depth."""
    lines = [("　" * depth) + ("↳ " if depth else "") + memory_line(node.memory, tz, guild_id, 120 - 10 * depth)]
    for child in node.evidence:
        lines += evidence_lines(child, tz, guild_id, depth + 1)
    return lines


def ranking_lines(items: Sequence[ScoredMemory], tz: ZoneInfo, guild_id: int | None = None) -> list[str]:
    """A ranking with each memory's score and its recency / importance / relevance parts."""
    return [f"**{i}.** score {m.score:.2f} (rec {m.recency:.2f} · imp {m.importance:.2f} · rel {m.relevance:.2f}) "
            + memory_line(m.memory, tz, guild_id, 120) for i, m in enumerate(items, 1)]


def fit(lines: Sequence[str], limit: int = LIMIT, empty: str = "Nothing to show.") -> str:
    """Lines joined, cut to fit one message, saying how many were left out."""
    out: list[str] = []
    size = 0
    for n, line in enumerate(lines):
        if size + len(line) + 1 > limit - 30:
            out.append(f"… and {len(lines) - n} more")
            break
        out.append(line)
        size += len(line) + 1
    return "\n".join(out) or empty
