"""Case 5: runaway reflection. A long replay in which the reflector keeps writing insights about insights, and
what the `hybrid` profile's grounding guard (memstream/index/grounding.py) leaves of them in the top 5.

A channel of twelve people over DAYS days: each day every person says one fact ("Alice went kayaking at the
harbour with her sister") and some chatter; importance is given (no rater), so a reflection runs every
`reflection_threshold` points, as in the bot. The reflector is a scripted fake with the failure mode built in:
each reflection writes three insights, one citing only the reflections among its statements (the deepest it can:
an insight about insights), one citing reflections and observations, one citing observations; an insight's text
is the commonest words of what it cites, the drift of a summary of summaries towards everyone's keywords.

Then QUERIES questions about facts ("Who was with Alice when Alice went kayaking, and where?") and one open
question per person ("What has Alice been up to lately?") are ranked with `explain` (read-only) over that one
stream, with the guard off (grounding_weight 0) and at several weights, the default among them: the share of
depth >= 2 reflections in the top 5 slots of all of them, and hit@5 of the questions about facts (the fact that
answers it in the top 5).
A second replay with the guard on shows the stream grown with it (the reflector's own retrievals guarded too).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import re
import tempfile
from collections import Counter
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from bench.report import table
from memstream.config import StreamConfig
from memstream.models.roles import RoleModel
from memstream.records import Observation
from memstream.store import Store
from memstream.stream import MemoryStream
from memstream.testing import FakeClock, FakeEmbedder, ScriptedChat

STREAM = "guild:1/channel:1"
SEED = 27
DAYS = 60
QUERIES = 60
WEIGHTS = (0.0, 0.25, 0.5, 1.0)
PEOPLE = ["Alice", "Bruno", "Chiara", "Dmitri", "Elena", "Farid", "Greta", "Hiro", "Ines", "Jonas", "Kemal", "Lena"]
ACTIVITIES = [("went kayaking", "kayaking"), ("baked bread", "baking"), ("ran a race", "racing"),
              ("played chess", "chess"), ("painted a mural", "painting"), ("fixed a bicycle", "cycling"),
              ("planted tomatoes", "gardening"), ("sang in a choir", "singing"), ("built a birdhouse", "woodwork"),
              ("read a novel", "reading")]
PLACES = ["harbour", "bakery", "stadium", "library", "garden", "workshop", "museum", "station", "market", "beach"]
WITH = ["sister", "neighbour", "colleague", "cousin", "teacher", "dog", "friends", "father"]
CHATTER = ["lol", "good morning everyone", "anyone around tonight", "that is funny", "brb coffee", "nice one",
           "see you later", "same here", "what a week", "ok"]
_STATEMENT = re.compile(r"^(\d+)\. (.*)$", re.MULTILINE)
_WORD = re.compile(r"[A-Za-z]+")
_COMMON = {"pattern", "with", "went", "there", "lately"}
_MARK = "Pattern:"  # how the fake reflector recognizes its own insights among its statements


@dataclass(frozen=True)
class Fact:
    """One thing that happened, and the question it answers."""

    text: str
    question: str


def _conversation(rng: random.Random) -> tuple[list[list[tuple[str, int]]], list[Fact]]:
    """DAYS days of (text, importance), and every fact said."""
    days, facts = [], []
    for _ in range(DAYS):
        lines: list[tuple[str, int]] = []
        for person in PEOPLE:
            (did, _), place, who = rng.choice(ACTIVITIES), rng.choice(PLACES), rng.choice(WITH)
            fact = Fact(f"{person} {did} at the {place} with the {who}",
                        f"Who was with {person} when {person} {did}, and where?")
            facts.append(fact)
            lines.append((fact.text, rng.randint(4, 7)))
            lines += [(f"{person}: {rng.choice(CHATTER)}", 1) for _ in range(rng.randint(0, 2))]
        rng.shuffle(lines)
        days.append(lines)
    return days, facts


def _summary(texts: list[str]) -> str:
    """The drift: a generality about the person most named in what it cites, in the words of the question it
    answers ("Alice has been up to kayaking and baking lately"), whatever it rests on."""
    words = [w for t in texts for w in _WORD.findall(t.removeprefix(_MARK))]
    names = Counter(w for w in words if w in PEOPLE).most_common(1)
    rest = Counter(w.lower() for w in words if w not in PEOPLE and len(w) > 4 and w.lower() not in _COMMON)
    name = names[0][0] if names else "everyone"
    return f"{_MARK} {name} has been up to {' and '.join(w for w, _ in rest.most_common(2))} lately"


def _insights(prompt: str, model: str) -> str:
    """Three insights: about insights only, mixed, about observations only (as far as the statements allow)."""
    statements = [(int(n), text) for n, text in _STATEMENT.findall(prompt)]
    insights = [s for s in statements if s[1].startswith(_MARK)]
    observations = [s for s in statements if not s[1].startswith(_MARK)]
    picks = [insights[:3] or observations[:3], insights[:2] + observations[:2], observations[:4]]
    lines = []
    for cited in picks:
        if cited:
            lines.append(f"{_summary([t for _, t in cited])} (because of {', '.join(str(n) for n, _ in cited)})")
    return "\n".join(lines)


def _questions(prompt: str, model: str) -> str:
    """High-level questions about three of the people heard recently (the same prompt, the same three)."""
    rng = random.Random(prompt)
    names = rng.sample([p for p in PEOPLE if p in prompt] or PEOPLE, 3)
    return "\n".join(f"What has {name} been up to lately?" for name in names)


def _open_questions() -> list[str]:
    """What a channel asks the persona about someone (the reflector's own kind of question)."""
    return [f"What has {name} been up to lately?" for name in PEOPLE]


def _chat() -> ScriptedChat:
    return ScriptedChat().on("salient high-level", _questions).on("high-level insights", _insights)


def _memory(store: Store, config: StreamConfig, clock: FakeClock, chat: ScriptedChat) -> MemoryStream:
    return MemoryStream(store, FakeEmbedder(dim=96), rater=RoleModel(chat, "rater"),
                        reflector=RoleModel(chat, "reflector"), agent=RoleModel(chat, "agent"), name="Persona",
                        summary="A persona in a busy channel.", config=config, clock=clock)


async def _replay(path: Path, config: StreamConfig, days: list[list[tuple[str, int]]]) -> dict[str, Any]:
    """The conversation into a new store, reflecting whenever due; what the stream holds at the end."""
    start = datetime(2024, 1, 1, 9, tzinfo=UTC)
    clock, store = FakeClock(start), await Store.open(path)
    memory = _memory(store, config, clock, _chat())
    try:
        for day, lines in enumerate(days):
            for hour, chunk in enumerate(range(0, len(lines), 6)):
                clock.set(start + timedelta(days=day, hours=hour))
                await memory.observe_many([Observation(t, stream=STREAM, importance=i, at=clock.now())
                                           for t, i in lines[chunk:chunk + 6]])
        depths = Counter(m.depth for page in [p async for p in store.stream_pages(STREAM)] for m in page
                         if m.kind == "reflection")
        return {"reflections": sum(depths.values()), "deepest": max(depths, default=0),
                "depth_2_or_more": sum(n for d, n in depths.items() if d >= 2), "end": clock.now()}
    finally:
        memory.index.close()
        await store.close()


async def _score(path: Path, weight: float, facts: list[Fact], end: datetime) -> dict[str, float]:
    """Share of depth >= 2 reflections in the top 5 slots and hit@5, over the queries, with this weight."""
    store = await Store.open(path)
    memory = _memory(store, StreamConfig.for_profile("hybrid", grounding_weight=weight), FakeClock(end), _chat())
    deep = slots = hits = 0
    try:
        for question, answer in [*((f.question, f.text) for f in facts), *((q, None) for q in _open_questions())]:
            top = await memory.explain(question, stream=STREAM, k=5)
            deep += sum(1 for s in top if s.memory.kind == "reflection" and s.memory.depth >= 2)
            slots += len(top)
            hits += any(s.memory.text == answer for s in top)
    finally:
        memory.index.close()
        await store.close()
    return {"grounding_weight": weight, "deep_share": deep / max(slots, 1), "hit_at_5": hits / max(len(facts), 1),
            "questions": len(facts) + len(PEOPLE)}


async def run(days: int = DAYS, queries: int = QUERIES) -> dict[str, Any]:
    """The replay with the guard off, scored at every weight; the replay with it on, scored with it."""
    rng = random.Random(SEED)
    conversation, facts = _conversation(rng)
    conversation = conversation[:days]
    facts = rng.sample(facts[: days * len(PEOPLE)], min(queries, days * len(PEOPLE)))
    default = StreamConfig.for_profile("hybrid").grounding_weight
    with tempfile.TemporaryDirectory() as tmp:
        off_path, on_path = Path(tmp) / "off.db", Path(tmp) / "on.db"
        grown_off = await _replay(off_path, StreamConfig.for_profile("hybrid", grounding_weight=0.0), conversation)
        same_stream = [await _score(off_path, w, facts, grown_off["end"]) for w in sorted({*WEIGHTS, default})]
        grown_on = await _replay(on_path, StreamConfig.for_profile("hybrid"), conversation)
        guarded = await _score(on_path, default, facts, grown_on["end"])
    for grown in (grown_off, grown_on):
        grown.pop("end")
    return {"days": days, "queries": len(facts), "open_questions": len(PEOPLE), "default_weight": default,
            "stream_grown_without_guard": grown_off,
            "same_stream": same_stream, "stream_grown_with_guard": {**grown_on, **guarded}}


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.reflection", description=__doc__)
    parser.add_argument("--days", type=int, default=DAYS)
    parser.add_argument("--queries", type=int, default=QUERIES)
    args = parser.parse_args()
    result = asyncio.run(run(args.days, args.queries))
    print(json.dumps(result, indent=1))
    print(table({"reflection": result}))


if __name__ == "__main__":
    main()
