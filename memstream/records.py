"""Small records: a Memory, a ScoredMemory with its score parts, a Source, an Observation to make, an evidence
tree."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Literal

__all__ = ["DEFAULT_STREAM", "EvidenceNode", "Memory", "Observation", "ScoredMemory", "Source"]

Kind = Literal["observation", "reflection"]
DEFAULT_STREAM = "default"


@dataclass(frozen=True)
class Source:
    """Where an observation came from (all optional: a CLI line has none of it)."""

    author: str | None = None
    author_id: str | None = None
    channel: str | None = None
    channel_id: str | None = None
    message_id: str | None = None


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
