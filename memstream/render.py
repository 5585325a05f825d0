"""How memory is shown, the same in the terminal, the dashboard and Discord: compact ranges, one-line texts,
memories and evidence trees as JSON and as lines, rankings, the importance histogram, and the parts of the
stats and of a reflection's summary that every surface writes alike.

Light at import (no numpy, SDK or SQLite): the command line renders with it before anything heavy is loaded.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from memstream.records import EvidenceNode, Memory, PendingState, RoleBudget, ScoredMemory, Stats

if TYPE_CHECKING:
    from memstream.reflect import Reflection

__all__ = ["because_text", "budget_lines", "compact_ranges", "faults_text", "histogram_lines", "memory_json",
           "pending_text", "questions_text", "ranking_lines", "rater_alarm", "scored_json", "short", "tree_json",
           "tree_lines", "usage_lines"]


def compact_ranges(numbers: Iterable[int]) -> list[str]:
    """Sorted runs of consecutive numbers, each as "a-b" or "a" (nothing for no numbers)."""
    ordered = sorted(set(numbers))
    if not ordered:
        return []
    parts: list[str] = []
    start = prev = ordered[0]
    for n in [*ordered[1:], None]:
        if n is not None and n == prev + 1:
            prev = n
            continue
        parts.append(str(start) if start == prev else f"{start}-{prev}")
        if n is not None:
            start = prev = n
    return parts


def short(text: str, width: int = 90) -> str:
    """A text on one line (runs of whitespace as one space), cut to `width` characters with an ellipsis."""
    flat = " ".join(text.split())
    return flat if len(flat) <= width else flat[: width - 1] + "…"


# -- JSON ------------------------------------------------------------------------------------------


def memory_json(memory: Memory) -> dict[str, Any]:
    """A memory as JSON-ready data."""
    src = memory.source
    return {"id": memory.id, "stream": memory.stream, "kind": memory.kind, "text": memory.text,
            "created_at": memory.created_at.isoformat(), "last_accessed_at": memory.last_accessed_at.isoformat(),
            "importance": memory.importance, "importance_source": memory.importance_source,
            "depth": memory.depth, "status": memory.status,
            "source": {k: v for k, v in vars(src).items() if v is not None}}


def scored_json(item: ScoredMemory, rank: int) -> dict[str, Any]:
    """A ranked memory with its score parts."""
    return {"rank": rank, "score": round(item.score, 6), "recency": round(item.recency, 6),
            "importance": round(item.importance, 6), "relevance": round(item.relevance, 6),
            "cosine": round(item.cosine, 6), "memory": memory_json(item.memory)}


def tree_json(node: EvidenceNode) -> dict[str, Any]:
    """An evidence tree as nested JSON."""
    return {**memory_json(node.memory), "evidence": [tree_json(child) for child in node.evidence]}


# -- lines -----------------------------------------------------------------------------------------


def tree_lines(node: EvidenceNode, prefix: str = "", last: bool = True, root: bool = True) -> list[str]:
    """An evidence tree drawn with box characters."""
    m = node.memory
    label = (f"#{m.id} {m.kind} (importance {m.importance}"
             + (f", depth {m.depth}" if m.kind == "reflection" else "")
             + f") {m.created_at:%Y-%m-%d %H:%M} UTC {short(m.text, 80)}")
    lines = [label if root else f"{prefix}{'└── ' if last else '├── '}{label}"]
    child_prefix = "" if root else prefix + ("    " if last else "│   ")
    for i, child in enumerate(node.evidence):
        lines += tree_lines(child, child_prefix, i == len(node.evidence) - 1, root=False)
    return lines


def ranking_lines(items: Sequence[ScoredMemory]) -> list[str]:
    """A ranking as a table: each memory's score and its recency, importance and relevance parts."""
    lines = [f"{'#':>2} {'id':>6} {'kind':<11} {'score':>6} {'rec':>5} {'imp':>5} {'rel':>5}  "
             f"{'created (UTC)':<16}  text"]
    for rank, item in enumerate(items, 1):
        lines.append(f"{rank:>2} {item.memory.id:>6} {item.memory.kind:<11} {item.score:6.3f} {item.recency:5.2f} "
                     f"{item.importance:5.2f} {item.relevance:5.2f}  {item.memory.created_at:%Y-%m-%d %H:%M}  "
                     f"{short(item.memory.text)}")
    return lines


def histogram_lines(counts: Mapping[int, int], width: int = 40) -> list[str]:
    """One bar per importance, scaled to the largest count (a count above zero shows at least a sliver)."""
    top = max(counts.values(), default=0)
    lines = []
    for key, n in counts.items():
        cells = 0 if top == 0 else n * width * 8 // top
        bar = "█" * (cells // 8) + ("" if cells % 8 == 0 else chr(0x2590 - cells % 8))
        if n and not bar:
            bar = "▏"
        lines.append(f"  {key:>2} {bar:<{width}} {n}")
    return lines


# -- the parts of the stats and of a reflection that every surface writes alike --------------------------


def pending_text(pending: PendingState) -> str:
    """How many memories wait for their model calls, and when they are tried again: "3 (2 failed attempt(s),
    next retry now)"."""
    retry = "now" if pending.next_retry_at is None else pending.next_retry_at.isoformat()
    return f"{pending.count} ({pending.failed_attempts} failed attempt(s), next retry {retry})"


def usage_lines(stats: Stats, *, compact: bool = False) -> list[str]:
    """A line per model role: calls, failures, client retries and tokens (`compact`: prompt+completion)."""
    lines = []
    for role, usage in stats.usage.items():
        tokens = (f"{usage.prompt_tokens}+{usage.completion_tokens} tokens" if compact
                  else f"{usage.prompt_tokens} prompt + {usage.completion_tokens} completion tokens")
        lines.append(f"{role}: {usage.calls} call(s), {usage.failures} failed, "
                     f"{stats.retries.get(role, 0)} retried, {tokens}")
    return lines


def rater_alarm(stats: Stats) -> str | None:
    """The flat-rater alarm of these stats' memories (memstream.calibration), or None when the ratings vary,
    are too few yet, or the check is off."""
    check = stats.rater
    return check.text() if check is not None and check.flat else None


def _against(spent: int, limit: int | None, unit: str) -> str:
    return f"{spent} {unit}" if limit is None else f"{spent}/{limit} {unit}"


def budget_lines(budget: Sequence[RoleBudget]) -> list[str]:
    """The day's spend against the daily budget, a line per limited role under a heading (none when the budget
    is off): "rater: 2000/2000 calls, 51200 tokens: spent, no call until 2026-12-06 00:00 UTC"."""
    if not budget:
        return []
    lines = [f"budget today ({budget[0].day:%Y-%m-%d} UTC, every stream; renews at 00:00 UTC):"]
    for line in budget:
        spend = (f"{_against(line.calls, line.calls_per_day, 'calls')}, "
                 f"{_against(line.tokens, line.tokens_per_day, 'tokens')}")
        state = f": spent, no call until {line.renews_at:%Y-%m-%d %H:%M} UTC" if line.spent else ""
        lines.append(f"  {line.role}: {spend}{state}")
    return lines


def faults_text(faults: Mapping[str, int]) -> str:
    """Fault counts by kind: "rating fallback 2, insight dropped 1"."""
    return ", ".join(f"{kind.replace('_', ' ')} {n}" for kind, n in faults.items())


def questions_text(result: Reflection) -> str:
    """A reflection's questions on one line."""
    return "; ".join(result.questions) or "(none)"


def because_text(result: Reflection, insight_id: int, numbers: Mapping[int, int | None] | None = None) -> str:
    """What an insight of a reflection cites: "(because of #3, #7)": memory ids, or with `numbers` (id: the
    number its stream shows it as) the numbers, which tell nothing of other streams."""
    cited = result.evidence.get(insight_id, [])
    shown = cited if numbers is None else [numbers.get(i) or "?" for i in cited]
    return f"(because of {', '.join(f'#{i}' for i in shown)})"
