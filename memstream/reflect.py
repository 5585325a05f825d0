"""The reflector: one questions call, one retrieval per question, one insights call."""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime

from memstream.clock import to_timestamp
from memstream.config import StreamConfig
from memstream.index.retriever import RetrieverLike
from memstream.models.roles import Models
from memstream.prompts import load_prompt, one_line, tag_safe
from memstream.records import Memory, ScoredMemory
from memstream.store import NewMemory, Store, deferred_touches

__all__ = ["Insight", "Reflection", "Reflector", "parse_citations", "parse_insights", "parse_questions"]

log = logging.getLogger("memstream.reflect")
QUESTIONS = 3
_BULLET = re.compile(r"^\s*(?:[-*•]+|\d+\s*[.):]|\(\d+\)|q\d*\s*[.:)])\s*", re.IGNORECASE)
_CITATION = re.compile(r"\((?:\s*because\s+of|\s*because|\s*citing|\s*see)?\s*([^()]*?)\)\s*[.;]?\s*$",
                       re.IGNORECASE)
_NUMBERS = re.compile(r"^[\d\s,;&\-–—]*(?:and[\d\s,;&\-–—]*)*$", re.IGNORECASE)


@dataclass(frozen=True)
class Insight:
    """A parsed insight: its text and the statement numbers it cites (1-based, in order)."""

    text: str
    citations: tuple[int, ...]


@dataclass
class Reflection:
    """What one reflection did."""

    stream: str
    questions: list[str]
    statements: list[Memory]
    insights: list[Memory] = field(default_factory=list)
    evidence: dict[int, list[int]] = field(default_factory=dict)
    dropped: list[str] = field(default_factory=list)
    skipped: str | None = None


def parse_questions(reply: str) -> list[str]:
    """Up to 3 questions, one per non-empty line (numbering and bullets tolerated and removed)."""
    questions = []
    for line in reply.splitlines():
        text = _BULLET.sub("", line).strip()
        if text:
            questions.append(text)
    return questions[:QUESTIONS]


def parse_citations(text: str, count: int) -> tuple[int, ...]:
    """Statement numbers in '1, 5, 3', '2-4' or '1 and 3'; out of range and repeats dropped."""
    found: list[int] = []
    for part in re.split(r"[,;&]|\band\b", text, flags=re.IGNORECASE):
        bounds = [int(n) for n in re.findall(r"\d+", part)]
        if len(bounds) == 2 and re.search(r"[-–—]", part) and bounds[0] <= bounds[1] and bounds[1] - bounds[0] < 100:
            numbers = list(range(bounds[0], bounds[1] + 1))
        else:
            numbers = bounds
        found.extend(n for n in numbers if 1 <= n <= count and n not in found)
    return tuple(found)


def parse_insights(reply: str, count: int) -> list[Insight]:
    """One insight per line, `insight (because of 1, 5, 3)`; a line without citations has none."""
    insights = []
    for line in reply.splitlines():
        text = _BULLET.sub("", line).strip()
        if not text:
            continue
        match = _CITATION.search(text)
        if match and _NUMBERS.match(match.group(1)):
            cited = parse_citations(match.group(1), count)
            text = text[: match.start()].rstrip(" .,;:-")
        else:
            cited = ()
        if text:
            insights.append(Insight(text, cited))
    return insights


class Reflector:
    """Runs the spec's reflection over one stream."""

    def __init__(self, store: Store, models: Models, retriever: RetrieverLike, config: StreamConfig, *,
                 agent_name: str) -> None:
        self.store, self.models, self.retriever, self.config = store, models, retriever, config
        self.agent_name = agent_name
        self.questions_prompt = load_prompt("reflection_questions")
        self.insights_prompt = load_prompt("reflection_insights")

    async def reflect(self, stream: str, *, at: datetime) -> Reflection:
        """One reflection. Insights, evidence, the importance reset and the last-access times its retrievals
        set are committed together: a reflection that fails or is killed changes nothing."""
        with deferred_touches() as touches:
            return await self._reflect(stream, at, touches)

    async def _reflect(self, stream: str, at: datetime, touches: dict[int, float]) -> Reflection:
        recent = list(reversed(await self.store.recent(stream, self.config.recent_for_questions)))
        if not recent:
            return Reflection(stream, [], [], skipped="the stream has no memories yet")
        listing = "\n".join(f"- {tag_safe(one_line(m.text))}" for m in recent)
        reply = await self.models.complete(
            "reflector", self.questions_prompt.render(agent_name=self.agent_name, recent_memories=listing),
            stream=stream,
        )
        questions = parse_questions(reply)
        if not questions:
            log.warning("reflection on %s skipped: the questions reply had no questions; it is tried again at "
                        "the next check", stream)
            await self.store.count_skipped_reflection(stream)
            return Reflection(stream, [], [], skipped="the reflector returned no questions")
        lines = sum(1 for line in reply.splitlines() if _BULLET.sub("", line).strip())
        if lines > QUESTIONS:
            log.warning("reflection on %s: the questions reply had %d lines, the first %d are used", stream, lines,
                        QUESTIONS)
            await self.store.count_fault(stream, "questions_trimmed")
        statements = await self._gather(questions, stream=stream, at=at)
        result = Reflection(stream, questions, statements)
        numbered = "\n".join(f"{i}. {tag_safe(one_line(m.text))}" for i, m in enumerate(statements, 1))
        reply = await self.models.complete("reflector", self.insights_prompt.render(
            agent_name=self.agent_name, questions="; ".join(f'"{tag_safe(one_line(q))}"' for q in questions),
            numbered_retrieved_memories=numbered,
        ), stream=stream)
        kept = self._keep(parse_insights(reply, len(statements)), result)
        if result.dropped:
            await self.store.count_fault(stream, "insight_dropped", len(result.dropped))
        await self._save(result, kept, at, touches)
        return result

    async def _gather(self, questions: Sequence[str], *, stream: str, at: datetime) -> list[Memory]:
        seen: dict[int, Memory] = {}
        for question in questions:
            found: list[ScoredMemory] = await self.retriever.retrieve(question, stream=stream, at=at)
            for item in found:
                seen.setdefault(item.memory.id, item.memory)
        return list(seen.values())

    def _keep(self, insights: list[Insight], result: Reflection) -> list[Insight]:
        kept = []
        for insight in insights:
            if len(insight.citations) < self.config.min_citations:
                log.warning("insight dropped, %d valid citation(s) < %d: %r", len(insight.citations),
                            self.config.min_citations, insight.text[:80])
                result.dropped.append(insight.text)
            else:
                kept.append(insight)
        return kept

    async def _save(self, result: Reflection, kept: list[Insight], at: datetime, touches: dict[int, float]) -> None:
        now = to_timestamp(at)
        vectors = await self.models.embed([i.text for i in kept], stream=result.stream) if kept else None
        rows = []
        for n, insight in enumerate(kept):
            cited = [result.statements[c - 1] for c in insight.citations]
            importance = round(sum(m.importance or 0 for m in cited) / len(cited))
            new = NewMemory(
                stream=result.stream, kind="reflection", text=insight.text, created_at=now,
                importance=min(10, max(1, importance)), importance_source="derived",
                depth=1 + max(m.depth for m in cited), embedding=None if vectors is None else vectors[n],
            )
            rows.append((new, [m.id for m in cited]))
        ids = await self.store.save_reflection(result.stream, rows, now, touches)
        result.evidence = {i: cited for i, (_, cited) in zip(ids, rows, strict=True)}
        result.insights = list((await self.store.get_many(ids)).values())
