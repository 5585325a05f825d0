"""Small records: a Memory, a ScoredMemory with its score parts, a Source, an Observation to make, an evidence
tree; a reply's trace (what it was built from); a stream's state, counts and model usage, a role's spend against
its daily budget, and its Stats."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal

from memstream.errors import MemoryNotFound

__all__ = ["DEFAULT_STREAM", "ID_MAX", "Counts", "EvidenceNode", "ExplainedReply", "Memory", "Observation",
           "PendingState", "RaterCheck", "ReplyTrace", "ResidentStats", "RoleBudget", "RoleUsage", "ScoredMemory",
           "Source", "Stats", "StreamState", "TraceItem", "storable_id"]

Kind = Literal["observation", "reflection"]
DEFAULT_STREAM = "default"
# The largest memory id (or stream number) either backend can hold (SQLite INTEGER, PostgreSQL bigint): a
# larger one, from a command line or a URL, names no memory.
ID_MAX = 2**63 - 1


def storable_id(memory_id: int, where: str = "") -> int:
    """An id (or a stream's number) a caller gave: one no database can hold (past ID_MAX, or below 1) names no
    memory (MemoryNotFound, as a forgotten one), never an overflow deep in a driver."""
    if not 1 <= memory_id <= ID_MAX:
        raise MemoryNotFound(f"no memory #{memory_id}{where}", memory_id=memory_id)
    return memory_id


@dataclass(frozen=True)
class Source:
    """Where an observation came from (all optional: a CLI line has none of it)."""

    author: str | None = None
    author_id: str | None = None
    channel: str | None = None
    channel_id: str | None = None
    message_id: str | None = None
    reply_to: str | None = None  # the Discord message it replies to, where Discord says so


@dataclass(frozen=True)
class Memory:
    """One entry of a memory stream."""

    id: int
    stream: str
    kind: Kind
    text: str
    created_at: datetime
    last_accessed_at: datetime
    importance: int | None
    importance_source: str | None
    depth: int = 0
    source: Source = field(default_factory=Source)
    status: str = "ready"
    number: int | None = None  # its number in its stream (#1, #2, ...): what a server is shown


@dataclass(frozen=True)
class ScoredMemory:
    """A memory with its three normalized score parts and its weighted score."""

    memory: Memory
    score: float
    recency: float
    importance: float
    relevance: float
    cosine: float


@dataclass(frozen=True)
class EvidenceNode:
    """A memory and, for a reflection, the evidence it cites (recursively)."""

    memory: Memory
    evidence: tuple[EvidenceNode, ...] = ()


@dataclass(frozen=True)
class Observation:
    """Something to observe: text, when, in which stream, from where, and optionally its importance."""

    text: str
    stream: str = DEFAULT_STREAM
    at: datetime | None = None
    importance: int | None = None
    source: Source = field(default_factory=Source)


@dataclass(frozen=True)
class TraceItem:
    """One memory a reply's prompt held, with the score parts it was ranked by (as a ScoredMemory had them)."""

    memory_id: int
    score: float
    recency: float
    importance: float
    relevance: float
    cosine: float

    @classmethod
    def of(cls, scored: ScoredMemory) -> TraceItem:
        """The trace item of a retrieved memory."""
        return cls(scored.memory.id, float(scored.score), float(scored.recency), float(scored.importance),
                   float(scored.relevance), float(scored.cosine))


@dataclass(frozen=True)
class ReplyTrace:
    """What a reply was built from (the memories its prompt held, in the order given) and what it answered."""

    id: int
    stream: str
    at: datetime
    query: str  # the message answered
    items: tuple[TraceItem, ...]
    reply_memory_id: int | None = None  # the reply's own memory
    message_id: str | None = None  # the first Discord message that carried the reply, once sent
    query_memory_id: int | None = None  # the memory made from the message answered
    query_message_id: str | None = None
    query_author_id: str | None = None


@dataclass(frozen=True)
class ExplainedReply:
    """A reply's trace and, for each of its items, the memory (None where it was forgotten since)."""

    trace: ReplyTrace
    items: tuple[tuple[TraceItem, Memory | None], ...]


@dataclass(frozen=True)
class StreamState:
    """A stream's progress towards its next reflection, and its reflections so far."""

    importance_since_reflection: int = 0
    last_reflection_at: datetime | None = None
    reflections: int = 0
    skipped_reflections: int = 0  # reflections that could not run (tried again later)


@dataclass(frozen=True)
class Counts:
    """Memories by kind and status, rated ones by importance (1..10, each present), fallback ratings."""

    observations: int = 0
    reflections: int = 0
    pending: int = 0
    fallback: int = 0
    histogram: Mapping[int, int] = field(default_factory=lambda: dict.fromkeys(range(1, 11), 0))


@dataclass(frozen=True)
class PendingState:
    """Memories waiting to be rated and embedded: how many, their failed attempts, the next retry due."""

    count: int = 0
    failed_attempts: int = 0
    next_retry_at: datetime | None = None


@dataclass(frozen=True)
class RoleUsage:
    """Model calls (failed ones among them) and tokens of one role."""

    calls: int = 0
    failures: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0


@dataclass(frozen=True)
class RaterCheck:
    """The rater's latest ratings against the flat-rater rule (memstream.calibration): how many were looked at
    (up to `window`), their standard deviation, the commonest value and its share, and the verdict."""

    ratings: int
    window: int
    spread: float
    value: int | None
    share: float
    flat: bool

    def text(self) -> str:
        """One line for an operator."""
        if self.ratings < self.window:
            return f"{self.ratings} of the {self.window} ratings the flat-rater check needs so far"
        if self.flat:
            return (f"the rater looks miscalibrated: {round(self.share * self.ratings)} of its last {self.ratings} "
                    f"ratings are {self.value} (standard deviation {self.spread:.2f}); importance no longer tells "
                    "memories apart, and retrieval falls back to recency and relevance")
        return (f"its last {self.ratings} ratings vary (standard deviation {self.spread:.2f}; the commonest, "
                f"{self.value}, {self.share:.0%})")

    def to_json(self) -> dict[str, Any]:
        """As JSON data."""
        return {"flat": self.flat, "ratings": self.ratings, "window": self.window, "spread": round(self.spread, 4),
                "value": self.value, "share": round(self.share, 4)}


@dataclass(frozen=True)
class RoleBudget:
    """One role's spend today against its daily budget (a limit of None: none on that count). The day is a UTC
    day: `day` is its 00:00 UTC, `renews_at` the next one."""

    role: str
    calls: int
    calls_per_day: int | None
    tokens: int  # prompt + completion
    tokens_per_day: int | None
    day: datetime
    renews_at: datetime

    @property
    def spent(self) -> bool:
        """Whether a limit is reached: no call of this role is made until `renews_at`."""
        return ((self.calls_per_day is not None and self.calls >= self.calls_per_day)
                or (self.tokens_per_day is not None and self.tokens >= self.tokens_per_day))

    def to_json(self) -> dict[str, Any]:
        """As JSON data (`memstream stats --json`, under "budget")."""
        return {"role": self.role, "calls": self.calls, "calls_per_day": self.calls_per_day, "tokens": self.tokens,
                "tokens_per_day": self.tokens_per_day, "spent": self.spent, "day": self.day.isoformat(),
                "renews_at": self.renews_at.isoformat()}


@dataclass(frozen=True)
class ResidentStats:
    """What one process holds in memory (memstream.index.resident): streams, their bytes and the largest one's,
    the budget (0: none), streams dropped for it and reloaded so far."""

    streams: int
    bytes: int
    budget: int
    largest: int
    drops: int
    reloads: int

    def to_json(self) -> dict[str, Any]:
        """The figures as a JSON object."""
        return asdict(self)

    def text(self) -> str:
        """One line: what this process holds, against its budget."""
        budget = f"of a {_mib(self.budget)} budget" if self.budget else "(no budget)"
        return (f"{self.streams} stream(s), {_mib(self.bytes)} {budget} ([memory] resident_mb); "
                f"{self.drops} dropped for it, {self.reloads} reloaded")


def _mib(n: int) -> str:
    if n % 2**20 == 0:
        return f"{n >> 20} MiB"
    return f"{n / 2**20:.1f} MiB" if n >= 2**20 else f"{n / 2**10:.1f} KiB"


@dataclass(frozen=True)
class Stats:
    """What MemoryStream.stats tells of one stream (with its reflection progress, `state`) or of all of them."""

    counts: Counts
    pending: PendingState
    usage: Mapping[str, RoleUsage]  # by role
    faults: Mapping[str, int]  # by kind
    retries: Mapping[str, int]  # requests the model client retried, by role
    reflection_threshold: int
    state: StreamState | None = None  # one stream's; None for the whole store
    rater: RaterCheck | None = None  # the flat-rater check of the same memories (None: switched off)
    budget: tuple[RoleBudget, ...] = ()  # the persona's spend today against its daily budget (every stream's)
    resident: ResidentStats | None = None  # the streams this process holds in memory (all of them: not per stream)

    def to_json(self) -> dict[str, Any]:
        """The stats as JSON data (`memstream stats --json`): these keys, in this order."""
        counts, pending = self.counts, self.pending
        out: dict[str, Any] = {
            "observations": counts.observations, "reflections": counts.reflections, "pending": pending.count,
            "fallback": counts.fallback, "histogram": {str(k): n for k, n in counts.histogram.items()},
            "failed_attempts": pending.failed_attempts,
            "next_retry_at": None if pending.next_retry_at is None else pending.next_retry_at.isoformat(),
            "usage": {role: asdict(use) for role, use in self.usage.items()}, "faults": dict(self.faults),
            "retries": dict(self.retries), "rater": None if self.rater is None else self.rater.to_json(),
            "resident": None if self.resident is None else self.resident.to_json()}
        if self.budget:  # with a [budget] only: without one, the keys are as they were
            out["budget"] = [line.to_json() for line in self.budget]
        state = self.state
        if state is not None:
            last = state.last_reflection_at
            out.update({"importance_since_reflection": state.importance_since_reflection,
                        "reflection_threshold": self.reflection_threshold,
                        "last_reflection_at": None if last is None else last.astimezone(UTC).isoformat(),
                        "reflections_run": state.reflections, "reflections_skipped": state.skipped_reflections})
        return out
